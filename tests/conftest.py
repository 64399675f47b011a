"""Shared fixtures: real Kafka brokers (KRaft, started once per session) and fresh topics.

- ``kafka``: one combined broker+controller node, started on first use.
- ``kafka_cluster``: three combined nodes with a static quorum, started only when a test
  asks for it (tests using it are marked ``cluster``).
- ``topic_factory``: ``topic_factory(cluster, partitions=1, replication_factor=1,
  configs=None, name=None) -> str`` creates a uniquely named topic and waits until every
  partition has a leader.
- ``new_topic``: the name of a fresh one-partition topic on ``kafka``.
- ``any_kafka``: parametrized, runs a test once on ``kafka`` and once on ``kafka_cluster``.

Tests that use a Kafka fixture are marked ``kafka`` automatically, so ``-m "not kafka"``
runs only what needs no JVM.  Node work directories and logs are under pytest's basetemp
(``kafka-1node*/node-<id>/server.log``).  A test that stops a node need not restart it: the
next test that uses the cluster finds every node running again.
"""

from __future__ import annotations

import itertools
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping

import pytest

from harness.kafka_cluster import KafkaCluster
from proxy.local_kafka import LocalKafkaError

_start_times = pytest.StashKey[dict[str, float]]()
KAFKA_FIXTURES = ("kafka", "kafka_cluster", "any_kafka", "new_topic")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kafka: needs a real Kafka broker (a JVM); set automatically")
    config.addinivalue_line("markers", "cluster: needs the three-node Kafka cluster")
    config.stash[_start_times] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = getattr(item, "fixturenames", ())
        if any(name in names for name in KAFKA_FIXTURES):
            item.add_marker(pytest.mark.kafka)
        if "kafka_cluster" in names:
            item.add_marker(pytest.mark.cluster)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    times = config.stash.get(_start_times, {})
    if times:
        text = ", ".join(f"{name} started in {seconds:.1f} s" for name, seconds in times.items())
        terminalreporter.write_line(f"Kafka harness: {text}")


def _start(request: pytest.FixtureRequest, label: str, nodes: int) -> KafkaCluster:
    workdir = request.getfixturevalue("tmp_path_factory").mktemp(label)
    try:
        cluster = KafkaCluster.start(nodes, workdir=workdir)
    except LocalKafkaError as exc:
        pytest.fail(str(exc), pytrace=False)
    request.config.stash[_start_times][label] = cluster.start_seconds or 0.0
    return cluster


@pytest.fixture(scope="session")
def kafka(request: pytest.FixtureRequest) -> Iterator[KafkaCluster]:
    """One KRaft node in the combined role; ``kafka.bootstrap_servers`` to connect."""
    cluster = _start(request, "kafka-1node", 1)
    request.addfinalizer(cluster.close)
    yield cluster


@pytest.fixture(scope="session")
def kafka_cluster(request: pytest.FixtureRequest) -> Iterator[KafkaCluster]:
    """Three KRaft nodes in the combined role (static quorum); started on first use."""
    cluster = _start(request, "kafka-3nodes", 3)
    request.addfinalizer(cluster.close)
    yield cluster


def _ensure_all_running(cluster: KafkaCluster) -> None:
    """Restart any node an earlier test stopped or killed, and wait until all are ready."""
    stopped = [node for node in cluster.nodes if not node.is_running]
    if not stopped:
        return
    try:
        for node in stopped:
            cluster.start_node(node.node_id, wait=False)
        cluster.wait_ready(90)
    except LocalKafkaError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(autouse=True)
def _kafka_nodes_running(request: pytest.FixtureRequest) -> None:
    """Before a test that uses a session cluster, restart any node an earlier test stopped."""
    for name in ("kafka", "kafka_cluster"):
        if name in request.fixturenames:
            _ensure_all_running(request.getfixturevalue(name))


@pytest.fixture(
    params=[
        pytest.param("kafka", id="1node"),
        pytest.param("kafka_cluster", id="3nodes", marks=pytest.mark.cluster),
    ]
)
def any_kafka(request: pytest.FixtureRequest) -> KafkaCluster:
    """Runs the test twice: against ``kafka`` (one node) and ``kafka_cluster`` (three)."""
    cluster: KafkaCluster = request.getfixturevalue(request.param)
    _ensure_all_running(cluster)
    return cluster


_topic_counter = itertools.count(1)


def create_topic(
    cluster: KafkaCluster,
    topic: str,
    partitions: int = 1,
    replication_factor: int = 1,
    configs: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> None:
    """Create ``topic`` and wait until every partition has a leader.

    A fresh admin client each time: one kept across tests can hold metadata from before a
    node restart (kafka-python then aims at a controller id it no longer knows).  Retries
    until ``timeout`` while nodes are still coming back.
    """
    from kafka.admin import KafkaAdminClient
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    spec = {
        "num_partitions": partitions,
        "replication_factor": replication_factor,
        "configs": dict(configs or {}),
    }
    deadline = time.monotonic() + timeout
    attempt_sent = False
    while True:
        admin = None
        try:
            admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers, client_id="tests-admin")
            try:
                admin.create_topics({topic: spec}, timeout_ms=30000)
            except TopicAlreadyExistsError:
                if not attempt_sent:
                    raise
            attempt_sent = True
            admin.wait_for_topics([topic], timeout_ms=max(1000, int((deadline - time.monotonic()) * 1000)))
            return
        except TopicAlreadyExistsError:
            raise
        except KafkaError:
            attempt_sent = True  # the request may have reached the controller
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)
        finally:
            if admin is not None:
                admin.close()


TopicFactory = Callable[..., str]


@pytest.fixture
def topic_factory(request: pytest.FixtureRequest) -> TopicFactory:
    """Create uniquely named topics: ``topic_factory(cluster, partitions=1, ...) -> name``."""
    stem = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name).strip("-")[:60] or "topic"

    def create(
        cluster: KafkaCluster,
        partitions: int = 1,
        replication_factor: int = 1,
        configs: Mapping[str, str] | None = None,
        name: str | None = None,
    ) -> str:
        topic = name or f"{stem}-{next(_topic_counter)}-{uuid.uuid4().hex[:6]}"
        create_topic(cluster, topic, partitions, replication_factor, configs)
        return topic

    return create


@pytest.fixture
def new_topic(kafka: KafkaCluster, topic_factory: TopicFactory) -> str:
    """A fresh one-partition topic on the single-node ``kafka``."""
    return topic_factory(kafka)
