"""The deployment every chaos cell runs on, and the levers its faults pull.

Three KRaft nodes on loopback (replication 3, ``min.insync.replicas`` 2, so one node may die
without losing an acknowledged record), one proxy per broker as a sidecar (the shape that
scales with Kafka), and a Toxiproxy link in front of each sidecar: every address a client
learns (bootstrap, Metadata, FindCoordinator) is a link, so network faults reach every
connection a consumer makes. On a cluster of its own, the sidecars reach the brokers
through links too (the brokers advertise them on a listener of their own), so faults can
also strike between the proxy and the brokers. Producers write straight to the brokers (acks=all,
idempotent): their acknowledgements are the truth the consumers are held to, whatever
dies on the consumers' side.

A killed sidecar is started again on its own port (clients reconnect to the address they
know); a killed broker is started again with its data. ``heal`` puts everything back
between cells.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path

from harness.kafka_cluster import KafkaCluster
from harness.toxiproxy import Proxy, ToxiproxyServer
from proxy.local_kafka import ProxyProcess, ProxyStartError

log = logging.getLogger("chaos")

NODES = 3
RELAYED = "RELAYED"  # the brokers' listener behind the sidecar -> broker links
PROXY_SETTINGS = {
    "topology": "sidecar",
    "virtual.topics.enabled": "true",
    "connections.max.idle.ms": "60000",
}


class ChaosEnv:
    def __init__(self, workdir: Path, seed: int, cluster: KafkaCluster | None = None) -> None:
        """``cluster``: three running nodes to use (and leave running) instead of starting some."""
        self.workdir = workdir
        self.seed = seed
        self.cluster: KafkaCluster | None = cluster
        self._owns_cluster = cluster is None
        self.toxiproxy: ToxiproxyServer | None = None
        self.links: dict[int, Proxy] = {}  # client -> sidecar, per node
        self.broker_links: dict[int, Proxy] = {}  # sidecar -> broker, per node (a cluster of our own only)
        self.sidecars: dict[int, ProxyProcess] = {}
        self.sidecar_ports: dict[int, int] = {}
        self.paused: set[int] = set()  # sidecars stopped by SIGSTOP
        self.paused_brokers: set[int] = set()

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> ChaosEnv:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.toxiproxy = ToxiproxyServer.start(workdir=self.workdir / "toxiproxy", seed=self.seed)
        if self.cluster is None:
            # The brokers advertise, on a listener of their own, a link per broker: the
            # sidecars bootstrap there, so every connection they make to a broker crosses a link.
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
        for node in self.cluster.nodes:
            self.links[node.node_id] = self.toxiproxy.create_proxy(f"sidecar-{node.node_id}", upstream=("127.0.0.1", 9))
        for node in self.cluster.nodes:
            self._start_sidecar(node.node_id, listen_port=0)
            self.links[node.node_id].set_upstream(("127.0.0.1", self.sidecar_ports[node.node_id]))
        return self

    def close(self) -> None:
        for node_id in list(self.paused):
            self.resume_sidecar(node_id)
        for node_id in list(self.paused_brokers):
            self.resume_broker(node_id)
        for sidecar in self.sidecars.values():
            with contextlib.suppress(Exception):
                sidecar.stop(timeout=10)
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
    def direct_bootstrap(self) -> str:
        return self.kafka.bootstrap_servers

    @property
    def proxy_bootstrap(self) -> str:
        """Every sidecar, through its link: what consumers are given."""
        return ",".join(link.address for _, link in sorted(self.links.items()))

    def node_ids(self) -> list[int]:
        return [node.node_id for node in self.kafka.nodes]

    # -- sidecars ------------------------------------------------------------------------
    def _start_sidecar(self, node_id: int, listen_port: int) -> ProxyProcess:
        node = self.kafka.node(node_id)
        upstream = (f"127.0.0.1:{self.broker_links[node_id].listen[1]}" if node_id in self.broker_links
                    else f"127.0.0.1:{node.port}")
        mapping = ",".join(f"{n}@{link.address}" for n, link in sorted(self.links.items()))
        settings = {**PROXY_SETTINGS, "sidecar.node.addresses": mapping}
        last: Exception | None = None
        for _ in range(10):
            try:
                sidecar = ProxyProcess.start(upstream, overrides=settings,
                                             workdir=self.workdir / f"sidecar-{node_id}", listen_port=listen_port)
                break
            except ProxyStartError as exc:  # the old listener's port may still be held for a moment
                last = exc
                time.sleep(0.3)  # backoff before another attempt, not a synchronisation
        else:
            raise RuntimeError(f"sidecar of node {node_id} would not start on port {listen_port}: {last}")
        self.sidecars[node_id] = sidecar
        self.sidecar_ports[node_id] = sidecar.port
        return sidecar

    def kill_sidecar(self, node_id: int) -> None:
        self.sidecars[node_id].kill()

    def restart_sidecar(self, node_id: int) -> None:
        self._start_sidecar(node_id, listen_port=self.sidecar_ports[node_id])

    def pause_sidecar(self, node_id: int) -> None:
        os.kill(self.sidecars[node_id].pid, signal.SIGSTOP)
        self.paused.add(node_id)

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

    def resume_sidecar(self, node_id: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.sidecars[node_id].pid, signal.SIGCONT)
        self.paused.discard(node_id)

    # -- brokers -------------------------------------------------------------------------
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
        """Every node and sidecar running and reachable, no toxic in place."""
        assert self.toxiproxy is not None
        self.toxiproxy.reset()
        for node_id in list(self.paused):
            self.resume_sidecar(node_id)
        for node_id in list(self.paused_brokers):
            self.resume_broker(node_id)
        stopped = [node for node in self.kafka.nodes if not node.is_running]
        for node in stopped:
            self.kafka.start_node(node.node_id, wait=False)
        if stopped:
            self.kafka.wait_ready(timeout)
        for node_id, sidecar in self.sidecars.items():
            if sidecar.process.poll() is not None:
                self.restart_sidecar(node_id)

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
