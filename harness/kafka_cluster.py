"""Real Apache Kafka (KRaft) clusters for tests and benchmarks.

``KafkaCluster`` is several of ``proxy.local_kafka``'s nodes (``LocalKafka``: the same jars,
JVM, configuration and readiness probe the demo uses) in one static quorum, with what only
tests need: extra client listeners (SASL, TLS) and advertised ports, storage format
arguments, JVM options, nodes stopped, killed and started again by id, replication to match
the nodes, quick failover, and a fresh start on new ports when another process took one.

    with KafkaCluster.start(nodes=3) as cluster:
        cluster.kill_node(2)
        cluster.start_node(2)

The jars: the broker's (``proxy.local_kafka.fetch_jars``), and for the tests' Java tools
(``harness/java_tools.py``) Kafka's command-line tools with them (``fetch_tools_jars``,
kafka-dist/kafka-tools.pom.xml).

Command line: ``python -m harness.kafka_cluster run --nodes 3`` (a cluster until Ctrl-C or
SIGTERM); ``python -m harness.kafka_cluster fetch-jars`` (``make jars``): every jar the
suite needs (the broker's, Spark's Kafka connector, the Java tools) into the cache.
"""

from __future__ import annotations

import argparse
import atexit
import concurrent.futures
import contextlib
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from harness import processes
from proxy.local_kafka import (
    CLIENT_LISTENER,
    CONTROLLER_LISTENER,
    DEFAULT_JVM_OPTIONS,
    LocalKafka,
    LocalKafkaError,
    fetch_jars,
    fetch_pom_jars,
    fetch_spark_jars,
    free_port,
    kafka_version,
)

REPLICATION = ("offsets.topic.replication.factor", "transaction.state.log.replication.factor",
               "share.coordinator.state.topic.replication.factor")
MIN_ISR = ("transaction.state.log.min.isr", "share.coordinator.state.topic.min.isr")
# Fail over quickly when a node is stopped or killed.
FAILOVER = {"broker.session.timeout.ms": "6000", "broker.heartbeat.interval.ms": "1000",
            "controller.quorum.election.timeout.ms": "1000", "controller.quorum.fetch.timeout.ms": "2000",
            "controlled.shutdown.enable": "true"}


def fetch_tools_jars() -> Path:
    """Kafka's Java command-line tools and the broker's jars, one class path, in the cache
    (``<cache>/kafka-tools-<version>/libs``); fetched with Maven only the first time."""
    version = kafka_version()
    return fetch_pom_jars("kafka-tools.pom.xml", f"kafka-tools-{version}", f"Kafka {version} tools")


def _normalise_listeners(extra: Mapping[str, str] | Iterable[str] | None) -> dict[str, str]:
    if not extra:
        return {}
    if isinstance(extra, Mapping):
        listeners = {str(k).upper(): str(v).upper() for k, v in extra.items()}
    else:
        listeners = {str(name).upper(): str(name).upper() for name in extra}
    for name in listeners:
        if name in (CLIENT_LISTENER, CONTROLLER_LISTENER) or not re.fullmatch(r"[A-Z0-9_]+", name):
            raise LocalKafkaError(f"Extra listener name {name!r} is reserved or not valid.")
    return listeners


class ClusterNode(LocalKafka):
    """One node of a ``KafkaCluster``, in ``<cluster workdir>/node-<id>``: a voter of the
    cluster's quorum, with a port for each of its extra listeners (``listener_ports``)."""

    spawn = staticmethod(processes.spawn)

    def __init__(self, cluster: KafkaCluster, node_id: int) -> None:
        self.node_id = node_id
        super().__init__(cluster.workdir)
        self.cluster = cluster
        self.broker_properties = cluster.broker_properties  # shared: a change holds from the next (re)start
        self.jvm_options, self.format_args = cluster.jvm_options, cluster.format_args
        self.listener_ports = {CLIENT_LISTENER: self.port, **{name: free_port() for name in cluster.extra_listeners}}
        """Port of every client-facing listener by name: PLAINTEXT and any extra ones."""

    def _properties(self) -> dict[str, str]:
        props = super()._properties()
        nodes = self.cluster.nodes
        props["controller.quorum.voters"] = ",".join(node.voter for node in nodes)
        props.update(dict.fromkeys(REPLICATION, str(min(3, len(nodes)))))
        props.update(dict.fromkeys(MIN_ISR, str(min(2, len(nodes)))))
        for name, protocol in self.cluster.extra_listeners.items():
            port = self.listener_ports[name]
            advertised = self.cluster.advertised_ports.get(name, {}).get(self.node_id, port)
            props["listeners"] += f",{name}://{self.host}:{port}"
            props["advertised.listeners"] += f",{name}://{self.host}:{advertised}"
            props["listener.security.protocol.map"] += f",{name}:{protocol}"
        return {**props, **FAILOVER}


class KafkaCluster:
    """A set of KRaft nodes started by this process; see the module docstring.

    Build one with :meth:`start`.  Every node runs in combined mode (``process.roles =
    broker,controller``) and is a voter of a static quorum.
    """

    def __init__(
        self,
        nodes: int = 1,
        workdir: Path | None = None,
        broker_properties: Mapping[str, str] | None = None,
        extra_listeners: Mapping[str, str] | Iterable[str] | None = None,
        *,
        format_args: Sequence[str] = (),
        jvm_options: Sequence[str] = DEFAULT_JVM_OPTIONS,
        advertised_ports: Mapping[str, Mapping[int, int]] | None = None,
    ) -> None:
        if nodes < 1:
            raise LocalKafkaError("A Kafka cluster needs at least one node.")
        self.extra_listeners = _normalise_listeners(extra_listeners)
        self.advertised_ports = {name.upper(): dict(ports) for name, ports in (advertised_ports or {}).items()}
        unknown = set(self.advertised_ports) - set(self.extra_listeners)
        if unknown:
            raise LocalKafkaError(f"advertised_ports names listeners that are not extra listeners: {sorted(unknown)}")
        self._owns_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="keyrange-kafka-"))
        self.broker_properties = dict(broker_properties or {})
        self.format_args, self.jvm_options = list(format_args), list(jvm_options)
        self.nodes = [ClusterNode(self, node_id) for node_id in range(1, nodes + 1)]
        self.cluster_id = self.nodes[0].cluster_id
        for node in self.nodes:
            node.cluster_id = self.cluster_id
        self.start_seconds: float | None = None
        self._closed = False

    @classmethod
    def start(
        cls,
        nodes: int = 1,
        workdir: Path | None = None,
        broker_properties: Mapping[str, str] | None = None,
        extra_listeners: Mapping[str, str] | Iterable[str] | None = None,
        *,
        format_args: Sequence[str] = (),
        jvm_options: Sequence[str] = DEFAULT_JVM_OPTIONS,
        timeout: float = 120.0,
        advertised_ports: Mapping[str, Mapping[int, int]] | None = None,
    ) -> KafkaCluster:
        """Format and start ``nodes`` KRaft nodes and wait until all are ready.

        ``broker_properties`` override anything the harness writes into server.properties.
        ``extra_listeners`` adds client listeners besides PLAINTEXT, as {name: security
        protocol} (or names that are also their protocol, e.g. ["SASL_PLAINTEXT"]); each
        node gets a port for each, see ``ClusterNode.listener_ports`` and
        :meth:`bootstrap_servers_for`.  ``advertised_ports`` makes an extra listener
        advertise another port, as {listener: {node id: port}} (something else listening
        there, e.g. a relay, passes the traffic on).  ``format_args`` are appended to ``StorageTool
        format`` (e.g. ``--add-scram``, ``--feature``).  On a port another process took
        meanwhile, it starts over on new ports (three tries); on any failure, whatever was
        started is stopped before the error propagates.
        """
        for attempt in range(1, 4):
            cluster = cls(nodes, workdir, broker_properties, extra_listeners, format_args=format_args,
                          jvm_options=jvm_options, advertised_ports=advertised_ports)
            try:
                cluster._boot(timeout)
                return cluster
            except LocalKafkaError:
                # Another process may have taken a port between our probe and the JVM's bind:
                # start over on new ports (the node directories are ours to wipe).
                clash = cluster._port_clash()
                cluster.close(timeout=5.0)
                if attempt == 3 or not clash:
                    raise
                for node in cluster.nodes:
                    shutil.rmtree(node.node_dir, ignore_errors=True)
            except BaseException:
                cluster.close(timeout=5.0)
                raise
        raise AssertionError("unreachable")

    def _boot(self, timeout: float) -> None:
        began = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(len(self.nodes)) as pool:  # each format is a JVM start
            list(pool.map(lambda node: node.format(timeout), self.nodes))
        for node in self.nodes:
            node.launch()
        atexit.register(self.close, 5.0)  # at exit before the nodes' own (LIFO): SIGTERM to all at once
        self.wait_ready(timeout)
        self.start_seconds = time.monotonic() - began

    def _port_clash(self) -> bool:
        for node in self.nodes:
            with contextlib.suppress(OSError):
                if "Address already in use" in node.log_path.read_text(errors="replace"):
                    return True
        return False

    def __enter__(self) -> KafkaCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- addresses ---------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:p1,127.0.0.1:p2,...`` of the PLAINTEXT listeners of all nodes."""
        return ",".join(node.address for node in self.nodes)

    def bootstrap_servers_for(self, listener: str) -> str:
        listener = listener.upper()
        return ",".join(f"{n.host}:{n.listener_ports[listener]}" for n in self.nodes)

    def node(self, node_id: int) -> ClusterNode:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no Kafka node {node_id} in this cluster")

    @property
    def running_nodes(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.is_running]

    # -- node life cycle ---------------------------------------------------------------

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until every launched node answers Metadata, lists every launched node and knows
        a controller. LocalKafkaError if one exits unexpectedly, or when ``timeout`` passes."""
        launched = [node for node in self.nodes if node.process is not None]
        if not launched:
            raise LocalKafkaError("No Kafka node of this cluster is running.")
        deadline, peers = time.monotonic() + timeout, [node.node_id for node in launched]
        for node in launched:
            node.wait_ready(max(0.0, deadline - time.monotonic()), peers)

    def start_node(self, node_id: int, *, wait: bool = True, timeout: float = 60.0) -> ClusterNode:
        """Start a stopped node again with the same ports and data; wait until ready."""
        if self._closed:
            raise LocalKafkaError("This Kafka cluster has been closed.")
        node = self.node(node_id)
        if not node.is_running:
            node.launch()
        if wait:
            self.wait_ready(timeout)
        return node

    def stop_node(self, node_id: int, timeout: float = 30.0) -> None:
        """SIGTERM the node (a controlled shutdown), SIGKILL it if still alive after ``timeout``."""
        self.node(node_id).close(timeout)

    def kill_node(self, node_id: int) -> None:
        """SIGKILL the node at once, as a crash would."""
        node = self.node(node_id)
        if node.process is not None:
            node.process.kill()
        node.close(0.0)

    def close(self, timeout: float = 15.0) -> None:
        """Stop every node by PID: SIGTERM all at once (the quorum shuts down together), SIGKILL
        those still alive past ``timeout``.

        Safe to call more than once.  Removes the work directory if the cluster made it.
        """
        self._closed = True
        atexit.unregister(self.close)
        for process in [node.process for node in self.nodes if node.process is not None]:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            node.close(max(0.0, deadline - time.monotonic()))
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self.running_nodes)}/{len(self.nodes)} running"
        return f"<{type(self).__name__} {self.bootstrap_servers} {state}>"


# --------------------------------------------------------------------------------------
# Command line


def serve(start: Callable[[], KafkaCluster]) -> int:
    """``start()`` a cluster, print where it listens and keep it running until SIGTERM or
    Ctrl-C; 1 if a node exits meanwhile."""
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with start() as cluster:
        print(f"Kafka {kafka_version()}: {len(cluster.nodes)} node(s) ready in {cluster.start_seconds:.1f} s")
        for node in cluster.nodes:
            print(f"  node {node.node_id}: {node.address} pid {node.pid} log {node.log_path}")
        print(f"bootstrap.servers={cluster.bootstrap_servers}", flush=True)
        while not stop.wait(0.5):
            dead = [n for n in cluster.nodes if n.process is not None and not n.is_running]
            if dead:
                print(f"Kafka node {dead[0].node_id} exited; see {dead[0].log_path}", file=sys.stderr)
                return 1
        print("stopping", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.kafka_cluster")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch-jars", help="download every jar the suite needs into the cache (once)")
    run = sub.add_parser("run", help="start a cluster and run it until Ctrl-C or SIGTERM")
    run.add_argument("--nodes", type=int, default=1)
    run.add_argument("--workdir", help="keep node data here (default: a temporary directory)")
    run.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                     help="broker property, may be repeated")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch-jars":
            for fetch in (fetch_jars, fetch_spark_jars, fetch_tools_jars):
                print(fetch())
            return 0
        props = dict(kv.split("=", 1) for kv in args.override)
        workdir = Path(args.workdir) if args.workdir else None
        return serve(lambda: KafkaCluster.start(args.nodes, workdir=workdir, broker_properties=props))
    except LocalKafkaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
