"""The deployment every chaos cell runs on, and the levers its faults pull.

Three KRaft nodes on loopback (replication 3, ``min.insync.replicas`` 2, so one node may die
without losing an acknowledged record) and the proxy in front of them in one of two
topologies (docs/high-availability.md):

- ``sidecar`` (the default): one proxy per broker, and a Toxiproxy link in front of each
  sidecar: every address a client learns (bootstrap, Metadata, FindCoordinator) is a link,
  so network faults reach every connection a consumer makes.
- ``replicas``: R port-per-broker proxies (``replica-1`` ... ``replica-R``), each fronting
  every broker, behind a TCP load balancer (``harness.balancer``). The replicas listen on
  loopback addresses of their own (``127.0.0.2`` ...) on the same bootstrap port and node
  ports (``node.port.base + N``), and advertise the balancer's (``127.0.0.1``, the same
  ports): every address a client learns leads back to the balancer, which hands each new
  connection to the next replica in turn that is ready (its ``/readyz``).

On a cluster of its own, the proxies reach the brokers through links too (the brokers
advertise them on a listener of their own), so faults can also strike between the proxy
and the brokers. Producers write straight to the brokers (acks=all, idempotent): their
acknowledgements are the truth the consumers are held to, whatever dies on the consumers'
side.

Every proxy process has a name (``sidecar-<node>``, ``replica-<r>``) and is started again
on its own address and ports (clients reconnect to the address they know); a killed
broker is started again with its data. ``heal`` puts everything back between cells.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from harness.balancer import Balancer, free_port_block
from harness.kafka_cluster import KafkaCluster
from harness.toxiproxy import Proxy, ToxiproxyServer
from proxy.local_kafka import ProxyProcess, ProxyStartError

log = logging.getLogger("chaos")

NODES = 3
RELAYED = "RELAYED"  # the brokers' listener behind the proxy -> broker links
SIDECAR, REPLICAS = "sidecar", "replicas"
TOPOLOGIES = (SIDECAR, REPLICAS)
CLIENT_HOST = "127.0.0.1"  # where clients connect: the sidecars' links, or the balancer
PROXY_SETTINGS = {
    "virtual.topics.enabled": "true",
    "connections.max.idle.ms": "60000",
    "metrics.port": "0",  # /readyz, for the balancer and the rolling restart
}


def topology_label(topology: str, replicas: int) -> str:
    """How results name a topology: ``sidecar``, ``replicas-2``."""
    return SIDECAR if topology == SIDECAR else f"{REPLICAS}-{replicas}"


@dataclass
class ProxySlot:
    """One proxy of the deployment, and what it takes to start it again where it was."""

    name: str
    host: str  # the address it listens on
    upstream: str
    settings: dict[str, str]
    port: int = 0  # its listen port, kept across restarts (0 before its first start: any)
    process: ProxyProcess | None = None
    paused: bool = False

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.process.poll() is None

    @property
    def probe(self) -> tuple[str, int] | None:
        """Where its /readyz answers (its metrics port, on its own address)."""
        if self.process is None or not self.process.info.get("metrics_port"):
            return None
        return (self.host, int(self.process.info["metrics_port"]))


class ChaosEnv:
    def __init__(self, workdir: Path, seed: int, cluster: KafkaCluster | None = None, *,
                 topology: str = SIDECAR, replicas: int = 2) -> None:
        """``cluster``: three running nodes to use (and leave running) instead of starting
        some; ``topology``: ``sidecar`` or ``replicas`` (``replicas`` of them)."""
        if topology not in TOPOLOGIES:
            raise ValueError(f"topology {topology!r}: expected one of {', '.join(TOPOLOGIES)}")
        if topology == REPLICAS and not 2 <= replicas <= 8:
            raise ValueError(f"replicas {replicas}: expected 2 to 8")
        self.workdir = workdir
        self.seed = seed
        self.topology = topology
        self.replica_count = replicas if topology == REPLICAS else 0
        self.cluster: KafkaCluster | None = cluster
        self._owns_cluster = cluster is None
        self.toxiproxy: ToxiproxyServer | None = None
        self.links: dict[int, Proxy] = {}  # client -> sidecar, per node (sidecar topology)
        self.broker_links: dict[int, Proxy] = {}  # proxy -> broker, per node (a cluster of our own only)
        self.proxies: dict[str, ProxySlot] = {}
        self.balancer: Balancer | None = None
        self.bootstrap_port = 0  # replicas: the balancer's (and every replica's) bootstrap port
        self.paused_brokers: set[int] = set()

    @property
    def label(self) -> str:
        return topology_label(self.topology, self.replica_count)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> ChaosEnv:
        """Everything up; what did start is stopped again if something would not."""
        try:
            return self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> ChaosEnv:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.toxiproxy = ToxiproxyServer.start(workdir=self.workdir / "toxiproxy", seed=self.seed)
        if self.cluster is None:
            # The brokers advertise, on a listener of their own, a link per broker: the
            # proxies bootstrap there, so every connection they make to a broker crosses a link.
            for node_id in range(1, NODES + 1):
                self.broker_links[node_id] = self.toxiproxy.create_proxy(f"broker-{node_id}",
                                                                         upstream=("127.0.0.1", 9))
            self.cluster = KafkaCluster.start(
                NODES, workdir=self.workdir / "kafka", broker_properties={"min.insync.replicas": "2"},
                extra_listeners={RELAYED: "PLAINTEXT"},
                advertised_ports={RELAYED: {n: link.listen[1] for n, link in self.broker_links.items()}})
            for node in self.cluster.nodes:
                self.broker_links[node.node_id].set_upstream(("127.0.0.1", node.listener_ports[RELAYED]))
        elif len(self.cluster.nodes) != NODES:
            raise ValueError(f"the chaos deployment needs {NODES} nodes, the cluster given has "
                             f"{len(self.cluster.nodes)}")
        if self.topology == SIDECAR:
            self._start_sidecars()
        else:
            self._start_replicas()
        return self

    def _start_sidecars(self) -> None:
        for node in self.kafka.nodes:
            self.links[node.node_id] = self.toxiproxy_server.create_proxy(f"sidecar-{node.node_id}",
                                                                          upstream=("127.0.0.1", 9))
        mapping = ",".join(f"{n}@{link.address}" for n, link in sorted(self.links.items()))
        for node in self.kafka.nodes:
            upstream = (f"127.0.0.1:{self.broker_links[node.node_id].listen[1]}" if node.node_id in self.broker_links
                        else f"127.0.0.1:{node.port}")
            slot = ProxySlot(self.sidecar_name(node.node_id), CLIENT_HOST, upstream,
                             {**PROXY_SETTINGS, "topology": "sidecar", "sidecar.node.addresses": mapping})
            self.proxies[slot.name] = slot
            self._launch(slot)
            self.links[node.node_id].set_upstream(("127.0.0.1", slot.port))

    def _start_replicas(self) -> None:
        hosts = [f"127.0.0.{r + 1}" for r in range(1, self.replica_count + 1)]
        node_ids = self.node_ids()
        self.bootstrap_port, base = free_port_block([CLIENT_HOST, *hosts], max(node_ids))
        upstream = (",".join(f"127.0.0.1:{link.listen[1]}" for _, link in sorted(self.broker_links.items()))
                    or self.direct_bootstrap)
        for r, host in enumerate(hosts, 1):
            slot = ProxySlot(f"replica-{r}", host, upstream,
                             {**PROXY_SETTINGS, "topology": "port-per-broker", "listen.host": host,
                              "node.port.base": str(base), "advertised.host": CLIENT_HOST},
                             port=self.bootstrap_port)
            self.proxies[slot.name] = slot
            self._launch(slot)
        by_host = {slot.host: slot for slot in self.proxies.values()}
        self.balancer = Balancer(CLIENT_HOST, [self.bootstrap_port, *(base + n for n in node_ids)], hosts,
                                 probe=lambda host: by_host[host].probe).start()
        for name in self.proxies:
            self.wait_ready(name)

    def close(self) -> None:
        for slot in self.proxies.values():
            if slot.paused:
                self.resume_proxy(slot.name)
        for node_id in list(self.paused_brokers):
            self.resume_broker(node_id)
        if self.balancer is not None:
            self.balancer.stop()
        for slot in self.proxies.values():
            if slot.process is not None:
                with contextlib.suppress(Exception):
                    slot.process.stop(timeout=10)
        if self.toxiproxy is not None:
            self.toxiproxy.stop()
        if self.cluster is not None and self._owns_cluster:
            self.cluster.close()

    def __enter__(self) -> ChaosEnv:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- addresses -----------------------------------------------------------------------
    @property
    def kafka(self) -> KafkaCluster:
        assert self.cluster is not None, "start() first"
        return self.cluster

    @property
    def toxiproxy_server(self) -> ToxiproxyServer:
        assert self.toxiproxy is not None, "start() first"
        return self.toxiproxy

    @property
    def direct_bootstrap(self) -> str:
        return self.kafka.bootstrap_servers

    @property
    def proxy_bootstrap(self) -> str:
        """What consumers are given: every sidecar through its link, or the balancer."""
        if self.topology == REPLICAS:
            return f"{CLIENT_HOST}:{self.bootstrap_port}"
        return ",".join(link.address for _, link in sorted(self.links.items()))

    def node_ids(self) -> list[int]:
        return [node.node_id for node in self.kafka.nodes]

    # -- proxies -------------------------------------------------------------------------
    @staticmethod
    def sidecar_name(node_id: int) -> str:
        return f"sidecar-{node_id}"

    def proxy_names(self) -> list[str]:
        return list(self.proxies)

    def _launch(self, slot: ProxySlot) -> ProxyProcess:
        last: Exception | None = None
        for _ in range(10):
            try:
                process = ProxyProcess.start(slot.upstream, overrides=slot.settings, listen_port=slot.port,
                                             workdir=self.workdir / slot.name)
                break
            except ProxyStartError as exc:  # the old listener's port may still be held for a moment
                last = exc
                time.sleep(0.3)  # backoff before another attempt, not a synchronisation
        else:
            raise RuntimeError(f"proxy {slot.name} would not start on {slot.host}:{slot.port}: {last}")
        slot.process, slot.port, slot.paused = process, process.port, False
        return process

    def _process(self, name: str) -> ProxyProcess:
        process = self.proxies[name].process
        assert process is not None, f"{name} was never started"
        return process

    def kill_proxy(self, name: str) -> None:
        self._process(name).kill()

    def restart_proxy(self, name: str) -> None:
        """Start ``name`` again on its address and ports (it is not running)."""
        self._launch(self.proxies[name])

    def stop_proxy(self, name: str, timeout: float = 60.0) -> int:
        """SIGTERM: the proxy closes its listeners, answers what is in flight and exits;
        SIGKILL past ``timeout``. Its exit code."""
        return self._process(name).stop(timeout)

    def pause_proxy(self, name: str) -> None:
        os.kill(self._process(name).pid, signal.SIGSTOP)
        self.proxies[name].paused = True

    def resume_proxy(self, name: str) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._process(name).pid, signal.SIGCONT)
        self.proxies[name].paused = False

    def is_ready(self, name: str) -> bool:
        """Its /readyz answers 200."""
        probe = self.proxies[name].probe
        if probe is None:
            return False
        try:
            with urllib.request.urlopen(f"http://{probe[0]}:{probe[1]}/readyz", timeout=1.0) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, name: str, timeout: float = 60.0) -> float:
        """Wait until ``name`` is ready (and, behind the balancer, back in its rotation);
        the seconds it took."""
        began = time.monotonic()
        slot = self.proxies[name]
        while True:
            if not slot.alive:
                raise RuntimeError(f"{name} exited while starting: {self._process(name).log_text()[-2000:]}")
            if self.is_ready(name) and (self.balancer is None or slot.host in self.balancer.healthy):
                return time.monotonic() - began
            if time.monotonic() - began > timeout:
                raise RuntimeError(f"{name} not ready after {timeout:.0f} s")
            time.sleep(0.1)

    def balancer_counts(self) -> dict[str, int]:
        """Client connections the balancer handed to each replica so far; empty without a
        balancer."""
        if self.balancer is None:
            return {}
        return {name: self.balancer.connections[slot.host] for name, slot in self.proxies.items()}

    # -- brokers -------------------------------------------------------------------------
    def pause_broker(self, node_id: int) -> None:
        process = self.kafka.node(node_id).process
        assert process is not None
        os.kill(process.pid, signal.SIGSTOP)
        self.paused_brokers.add(node_id)

    def resume_broker(self, node_id: int) -> None:
        process = self.kafka.node(node_id).process
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
        self.paused_brokers.discard(node_id)

    def kill_broker(self, node_id: int) -> None:
        self.kafka.kill_node(node_id)

    def restart_broker(self, node_id: int, timeout: float = 90.0) -> None:
        self.kafka.start_node(node_id, wait=True, timeout=timeout)

    def leader_of(self, topic: str, partition: int) -> int:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.direct_bootstrap})
        metadata = admin.list_topics(topic, timeout=10)
        return metadata.topics[topic].partitions[partition].leader

    def coordinator_of(self, group: str) -> int:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.direct_bootstrap})
        description = admin.describe_consumer_groups([group], request_timeout=10)[group].result(15)
        return description.coordinator.id

    # -- between cells -------------------------------------------------------------------
    def heal(self, timeout: float = 120.0) -> None:
        """Every node and proxy running and reachable, no toxic in place."""
        self.toxiproxy_server.reset()
        for slot in self.proxies.values():
            if slot.paused:
                self.resume_proxy(slot.name)
        for node_id in list(self.paused_brokers):
            self.resume_broker(node_id)
        stopped = [node for node in self.kafka.nodes if not node.is_running]
        for node in stopped:
            self.kafka.start_node(node.node_id, wait=False)
        if stopped:
            self.kafka.wait_ready(timeout)
        restarted = [slot.name for slot in self.proxies.values() if not slot.alive]
        for name in restarted:
            self.restart_proxy(name)
        for name in restarted:
            self.wait_ready(name)

    def create_topic(self, name: str, partitions: int) -> str:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.direct_bootstrap})
        future = admin.create_topics([NewTopic(name, partitions, 3, config={"min.insync.replicas": "2"})])[name]
        future.result(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # every partition has a leader before anyone writes
            topics = admin.list_topics(name, timeout=10).topics
            if name in topics and len(topics[name].partitions) == partitions and all(
                    p.leader >= 0 for p in topics[name].partitions.values()):
                return name
            time.sleep(0.1)
        raise RuntimeError(f"topic {name} has no leader for every partition after 30 s")

    def log_end(self, topic: str, partitions: int) -> dict[int, int]:
        from confluent_kafka import Consumer, TopicPartition

        probe = Consumer({"bootstrap.servers": self.direct_bootstrap, "group.id": "chaos-probe"})
        try:
            return {p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
        finally:
            probe.close()

    def committed(self, group: str, topic: str, partitions: int) -> dict[int, int]:
        from confluent_kafka import Consumer, TopicPartition

        probe = Consumer({"bootstrap.servers": self.direct_bootstrap, "group.id": group})
        try:
            found = probe.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
            return {tp.partition: tp.offset for tp in found}
        finally:
            probe.close()

