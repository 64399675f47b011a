"""Proxy fixtures: the real ``keyrange-proxy`` process in front of the real brokers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.kafka_cluster import KafkaCluster
from harness.toxiproxy import ToxiproxyError, ToxiproxyServer
from proxy.local_kafka import ProxyProcess

ProxyFactory = Callable[..., ProxyProcess]


@pytest.fixture(scope="session")
def proxy_factory(tmp_path_factory) -> Iterator[ProxyFactory]:
    """``proxy_factory(cluster, **overrides) -> ProxyProcess`` (``config_file``: a properties
    file, under the overrides); every proxy started is stopped at the end of the session
    (earlier if the test stops it)."""
    started: list[ProxyProcess] = []

    def start(
        cluster: KafkaCluster, bootstrap: str | None = None, listen_port: int = 0, config_file: Path | None = None,
        **overrides: str
    ) -> ProxyProcess:
        # Virtual range topics on, as a deployment that uses them runs: every feature is
        # tested beside them.
        settings = {"virtual.topics.enabled": "true",
                    **{key.replace("_", "."): str(value) for key, value in overrides.items()}}
        process = ProxyProcess.start(
            bootstrap or cluster.bootstrap_servers,
            overrides=settings,
            workdir=tmp_path_factory.mktemp("proxy"),
            listen_port=listen_port,
            config_file=config_file,
        )
        started.append(process)
        return process

    start.started = started  # type: ignore[attr-defined]  # read by the failure report below
    yield start
    for process in started:
        process.stop(timeout=10)


LOG_TAIL_CHARS = 6000


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed integration test's report carries the tail of the log of every proxy it used
    (its own fixtures' and those the factory started during the test), so that a failure in
    CI, where the temporary directories are gone afterwards, can still be read."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    processes: list[ProxyProcess] = [v for v in item.funcargs.values() if isinstance(v, ProxyProcess)]
    factory = item.funcargs.get("proxy_factory")
    processes += [p for p in getattr(factory, "started", ())[-4:] if p not in processes]
    for process in processes:
        try:
            text = process.log_path.read_text(errors="replace")
        except OSError as exc:
            text = f"(log unreadable: {exc})"
        report.sections.append((f"proxy log tail {process.log_path.name}", text[-LOG_TAIL_CHARS:]))


@pytest.fixture(scope="session")
def proxy(kafka: KafkaCluster, proxy_factory: ProxyFactory) -> ProxyProcess:
    """One proxy (port per broker) in front of the single-node ``kafka``."""
    return proxy_factory(kafka, metrics_port="0")


@pytest.fixture(scope="session")
def cluster_proxy(kafka_cluster: KafkaCluster, proxy_factory: ProxyFactory) -> ProxyProcess:
    """One proxy (port per broker) in front of the three-node ``kafka_cluster``."""
    return proxy_factory(kafka_cluster)


@pytest.fixture(scope="session")
def toxiproxy(tmp_path_factory) -> Iterator[ToxiproxyServer]:
    """One Toxiproxy server (built into the cache on first use) for every test that puts
    network faults between a client and what it talks to; stopped by its PID at the end."""
    try:
        server = ToxiproxyServer.start(workdir=tmp_path_factory.mktemp("toxiproxy"))
    except ToxiproxyError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()


def real_ports(cluster: KafkaCluster) -> set[int]:
    return {node.port for node in cluster.nodes}


def proxy_ports(process: ProxyProcess) -> set[int]:
    return {process.port, *process.node_ports.values()}


def free_ports(count: int) -> list[int]:
    """Ports that were free a moment ago (for processes that must know each other's ports)."""
    import socket

    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
