"""Real Apache Kafka (KRaft) clusters for tests and benchmarks.

``KafkaCluster`` is ``proxy.local_kafka``'s nodes (the same jars, JVMs, configuration and
readiness probe the demo uses) with what only tests need: any number of nodes in a static
quorum, extra client listeners (SASL, TLS) and advertised ports, storage format arguments,
JVM options, and nodes stopped, killed and started again by id.

    with KafkaCluster.start(nodes=3) as cluster:
        cluster.kill_node(2)
        cluster.start_node(2)

Command line: ``python -m harness.kafka_cluster run --nodes 3`` (a cluster until Ctrl-C or
SIGTERM); the jars: ``python -m proxy.local_kafka fetch-jars``.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from proxy.local_kafka import (
    CLIENT_LISTENER,
    CONTROLLER_LISTENER,
    DEFAULT_JVM_OPTIONS,
    KafkaNode,
    KafkaNodes,
    LocalKafkaError,
    free_port,
    kafka_version,
)


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


class KafkaCluster(KafkaNodes):
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
        cache_dir: Path | None = None,
        advertised_ports: Mapping[str, Mapping[int, int]] | None = None,
    ) -> None:
        extra = _normalise_listeners(extra_listeners)
        advertised = {name.upper(): dict(ports) for name, ports in (advertised_ports or {}).items()}
        unknown = set(advertised) - set(extra)
        if unknown:
            raise LocalKafkaError(f"advertised_ports names listeners that are not extra listeners: {sorted(unknown)}")
        super().__init__(nodes, workdir, broker_properties, cache_dir=cache_dir)
        self.extra_listeners = extra
        self.advertised_ports = advertised
        self.format_args = list(format_args)
        self.jvm_options = list(jvm_options)
        for node in self.nodes:
            for name in self.extra_listeners:
                node.listener_ports[name] = free_port()

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
        cache_dir: Path | None = None,
        timeout: float = 120.0,
        advertised_ports: Mapping[str, Mapping[int, int]] | None = None,
    ) -> KafkaCluster:
        """Format and start ``nodes`` KRaft nodes and wait until all are ready.

        ``broker_properties`` override anything the harness writes into server.properties.
        ``extra_listeners`` adds client listeners besides PLAINTEXT, as {name: security
        protocol} (or names that are also their protocol, e.g. ["SASL_PLAINTEXT"]); each
        node gets a port for each, see ``KafkaNode.listener_ports`` and
        :meth:`bootstrap_servers_for`.  ``advertised_ports`` makes an extra listener
        advertise another port, as {listener: {node id: port}} (something else listening
        there, e.g. a relay, passes the traffic on).  ``format_args`` are appended to ``StorageTool
        format`` (e.g. ``--add-scram``, ``--feature``).  On any failure, whatever was
        started is stopped before the error propagates.
        """
        return cls._start(lambda: cls(nodes, workdir, broker_properties, extra_listeners, format_args=format_args,
                                      jvm_options=jvm_options, cache_dir=cache_dir,
                                      advertised_ports=advertised_ports), timeout)

    def _client_listeners(self, node: KafkaNode) -> list[tuple[str, str, int, int]]:
        listeners = super()._client_listeners(node)
        for name, protocol in self.extra_listeners.items():
            port = node.listener_ports[name]
            listeners.append((name, protocol, port, self.advertised_ports.get(name, {}).get(node.node_id, port)))
        return listeners

    # -- addresses ---------------------------------------------------------------------

    def bootstrap_servers_for(self, listener: str) -> str:
        listener = listener.upper()
        return ",".join(f"{n.host}:{n.listener_ports[listener]}" for n in self.nodes)

    def node(self, node_id: int) -> KafkaNode:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no Kafka node {node_id} in this cluster")

    # -- node life cycle ---------------------------------------------------------------

    def start_node(self, node_id: int, *, wait: bool = True, timeout: float = 60.0) -> KafkaNode:
        """Start a stopped node again with the same ports and data; wait until ready."""
        node = self.node(node_id)
        self._launch(node)
        if wait:
            self.wait_ready(timeout)
        return node

    def stop_node(self, node_id: int, timeout: float = 30.0) -> None:
        """SIGTERM the node (a controlled shutdown), SIGKILL it if still alive after ``timeout``."""
        node = self.node(node_id)
        node._expected_running = False
        self._terminate([node], timeout)

    def kill_node(self, node_id: int) -> None:
        """SIGKILL the node at once, as a crash would."""
        node = self.node(node_id)
        node._expected_running = False
        self._terminate([node], 0.0)


# --------------------------------------------------------------------------------------
# Command line


def serve(start: Callable[[], KafkaNodes]) -> int:
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
            dead = [n for n in cluster.nodes if n._expected_running and not n.is_running]
            if dead:
                print(f"Kafka node {dead[0].node_id} exited; see {dead[0].log_path}", file=sys.stderr)
                return 1
        print("stopping", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.kafka_cluster")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="start a cluster and run it until Ctrl-C or SIGTERM")
    run.add_argument("--nodes", type=int, default=1)
    run.add_argument("--workdir", help="keep node data here (default: a temporary directory)")
    run.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                     help="broker property, may be repeated")
    args = parser.parse_args(argv)
    props = dict(kv.split("=", 1) for kv in args.override)
    workdir = Path(args.workdir) if args.workdir else None
    try:
        return serve(lambda: KafkaCluster.start(args.nodes, workdir=workdir, broker_properties=props))
    except LocalKafkaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
