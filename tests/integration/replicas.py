"""Proxy replicas behind a load balancer (docs/high-availability.md): R port-per-broker
proxies, each fronting every broker of the cluster on a loopback address of its own
(127.0.0.2, ...) with the same ports, behind ``harness.balancer`` on 127.0.0.1, which they
advertise. A client given ``bootstrap_servers`` has each of its connections land on the
next ready replica; when one is killed its connections close and reconnect to the others.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from harness.balancer import Balancer, free_port_block
from harness.kafka_cluster import KafkaCluster
from harness.wait import wait_until
from proxy.local_kafka import ProxyProcess

BALANCER_HOST = "127.0.0.1"
READY_TIMEOUT = 30.0  # a replica answers /readyz once it reached the cluster (checked every 2 s)


def replica_host(index: int) -> str:
    return f"127.0.0.{2 + index}"


@dataclass
class Replicas:
    balancer: Balancer
    processes: list[ProxyProcess]

    @property
    def bootstrap_servers(self) -> str:
        return self.balancer.bootstrap_servers

    def connections(self) -> list[int]:
        """Connections the balancer handed to each replica so far."""
        return [self.balancer.connections[replica_host(i)] for i in range(len(self.processes))]

    def metric(self, index: int, name: str) -> float:
        """The sum of metric ``name`` (all its labels) on replica ``index``."""
        url = f"http://{replica_host(index)}:{self.processes[index].info['metrics_port']}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        return sum(float(match.group(1))
                   for match in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M))

    def kill(self, index: int) -> None:
        """kill -9 of replica ``index``: its connections close at once."""
        self.processes[index].kill()


@contextmanager
def replicas_behind_balancer(kafka: KafkaCluster, proxy_factory, count: int = 2,
                             **settings: str) -> Iterator[Replicas]:
    """``count`` replicas (each with ``settings``) behind a balancer, every one in its
    rotation when this yields; all stopped afterwards."""
    hosts = [replica_host(i) for i in range(count)]
    nodes = max(node.node_id for node in kafka.nodes)
    bootstrap, base = free_port_block([BALANCER_HOST, *hosts], nodes)
    processes: list[ProxyProcess] = []
    balancer: Balancer | None = None
    try:
        for host in hosts:
            processes.append(proxy_factory(kafka, listen_port=bootstrap, listen_host=host, node_port_base=str(base),
                                           advertised_host=BALANCER_HOST, metrics_port="0", **settings))
        probes = {host: (host, int(process.info["metrics_port"])) for host, process in zip(hosts, processes)}
        balancer = Balancer(BALANCER_HOST, [bootstrap, *(base + node.node_id for node in kafka.nodes)], hosts,
                            probe=probes.get).start()
        wait_until(lambda: balancer.healthy == set(hosts), timeout=READY_TIMEOUT,
                   what=lambda: f"every replica ready behind the balancer (ready: {sorted(balancer.healthy)})")
        yield Replicas(balancer, processes)
    finally:
        if balancer is not None:
            balancer.stop()
        for process in processes:
            process.stop(timeout=10)
