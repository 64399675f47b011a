"""Smoke tests of the Kafka harness itself: real brokers, real clients, real Java tools.

Nothing here goes through the proxy; these tests prove that the brokers the other tests
rely on behave, with kafka-python, confluent-kafka (librdkafka) and Kafka's own tools.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient

from harness import java_tools
from harness.kafka_cluster import KafkaCluster
from harness.wait import wait_until
from proxy.local_kafka import LocalKafkaError, fetch_jars, metadata_brokers

REPO = Path(__file__).resolve().parents[2]


# -- helpers --------------------------------------------------------------------------


def replication_for(cluster: KafkaCluster) -> int:
    return min(3, len(cluster.nodes))


def produce_keyed(bootstrap: str, topic: str, count: int, *, start: int = 0) -> None:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5,
        request_timeout_ms=15000, retries=2**31 - 1, delivery_timeout_ms=60000,
    )
    try:
        futures = [
            producer.send(topic, key=f"k{i % 7}".encode(), value=f"v{i}".encode())
            for i in range(start, start + count)
        ]
        producer.flush(timeout=60)
        for future in futures:
            future.get(timeout=60)  # raises if any record was not acknowledged
    finally:
        producer.close(timeout=10)


def consume_all(
    bootstrap: str, topic: str, count: int, *, group: str | None = None, timeout: float = 60
) -> list[tuple[bytes | None, bytes]]:
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    records: list[tuple[bytes | None, bytes]] = []
    try:
        deadline = time.monotonic() + timeout
        while len(records) < count and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend((r.key, r.value) for r in batch)
        if group:
            consumer.commit()
    finally:
        consumer.close()
    return records


def one_sentence(message: str) -> bool:
    return "\n" not in message and message.endswith(".") and ". " not in message[:-1]


# -- the harness ----------------------------------------------------------------------


def test_single_node_starts_fast(kafka: KafkaCluster, record_property) -> None:
    record_property("kafka_1node_start_seconds", kafka.start_seconds)
    print(f"single-node Kafka start (format + JVM + ready): {kafka.start_seconds:.1f} s")
    assert kafka.start_seconds is not None and kafka.start_seconds < 30
    (node,) = kafka.nodes
    assert node.is_running and node.pid and node.node_id == 1
    assert node.host == "127.0.0.1" and node.port != node.controller_port
    assert kafka.bootstrap_servers == f"127.0.0.1:{node.port}"
    assert node.log_path.is_file() and "Kafka Server started" in node.log_path.read_text()
    brokers, controller = metadata_brokers(node.host, node.port)
    assert brokers == {1: ("127.0.0.1", node.port)} and controller == 1


@pytest.mark.cluster
def test_three_nodes_form_one_cluster(kafka_cluster: KafkaCluster) -> None:
    assert [n.node_id for n in kafka_cluster.nodes] == [1, 2, 3]
    assert kafka_cluster.bootstrap_servers == ",".join(
        f"127.0.0.1:{n.port}" for n in kafka_cluster.nodes
    )
    for node in kafka_cluster.nodes:
        brokers, _ = metadata_brokers(node.host, node.port)
        assert set(brokers) == {1, 2, 3}
    assert len({n.pid for n in kafka_cluster.nodes}) == 3


# -- clients against one node and three -----------------------------------------------


def test_kafka_python_roundtrip(any_kafka: KafkaCluster, topic_factory) -> None:
    topic = topic_factory(any_kafka, partitions=3, replication_factor=replication_for(any_kafka))
    produce_keyed(any_kafka.bootstrap_servers, topic, 300)
    records = consume_all(any_kafka.bootstrap_servers, topic, 300)
    assert sorted(v for _, v in records) == sorted(f"v{i}".encode() for i in range(300))
    # Same key, same partition, in order: check per key that values are increasing.
    by_key: dict[bytes, list[int]] = {}
    for key, value in records:
        by_key.setdefault(key, []).append(int(value[1:]))
    assert all(values == sorted(values) for values in by_key.values())


def test_confluent_kafka_roundtrip(any_kafka: KafkaCluster, topic_factory) -> None:
    from confluent_kafka import Consumer, Producer

    topic = topic_factory(any_kafka, partitions=2, replication_factor=replication_for(any_kafka))
    delivered: list[object] = []
    errors: list[object] = []

    def on_delivery(err, msg) -> None:
        (errors if err else delivered).append(err or msg)

    producer = Producer({"bootstrap.servers": any_kafka.bootstrap_servers, "acks": "all",
                         "enable.idempotence": True})
    for i in range(200):
        producer.produce(topic, key=f"k{i % 5}", value=f"c{i}", on_delivery=on_delivery)
    assert producer.flush(60) == 0
    assert not errors and len(delivered) == 200

    consumer = Consumer({
        "bootstrap.servers": any_kafka.bootstrap_servers,
        "group.id": f"{topic}-group",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    values: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(values) < 200 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            values.append(msg.value())
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    assert sorted(values) == sorted(f"c{i}".encode() for i in range(200))


def test_java_tools_roundtrip(any_kafka: KafkaCluster, topic_factory) -> None:
    bootstrap = any_kafka.bootstrap_servers
    topic = f"java-tools-{os.getpid()}-{len(any_kafka.nodes)}-{time.monotonic_ns()}"
    java_tools.create_topic(
        bootstrap, topic, partitions=2, replication_factor=replication_for(any_kafka),
        configs={"min.insync.replicas": "1"},
    )
    described = java_tools.topics(bootstrap, "--describe", "--topic", topic).stdout
    assert f"Topic: {topic}" in described and "PartitionCount: 2" in described

    perf = java_tools.producer_performance(
        bootstrap, topic, 500, record_size=64, producer_props={"acks": "all"}
    )
    assert "500 records sent" in perf.stdout

    group = f"{topic}-console"
    consumed = java_tools.console_consumer(bootstrap, topic, max_messages=500, group=group)
    assert len(consumed.stdout.splitlines()) == 500
    assert "Processed a total of 500 messages" in consumed.stderr

    # ProducerPerformance sends null keys (sticky partitioner): the 500 records may all be
    # in one partition, and the group has committed offsets only where it read something.
    rows = java_tools.describe_group(bootstrap, group)
    assert rows and {row["PARTITION"] for row in rows} <= {"0", "1"}, rows
    assert sum(int(row["CURRENT-OFFSET"]) for row in rows) == 500, rows
    assert all(row["LAG"] == "0" for row in rows), rows


def test_group_consumer_visible_to_consumer_group_command(
    any_kafka: KafkaCluster, topic_factory
) -> None:
    bootstrap = any_kafka.bootstrap_servers
    topic = topic_factory(any_kafka, partitions=2, replication_factor=replication_for(any_kafka))
    group = f"{topic}-live"
    produce_keyed(bootstrap, topic, 50)
    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, client_id="live-member",
        auto_offset_reset="earliest", enable_auto_commit=False,
    )
    try:
        seen = 0
        deadline = time.monotonic() + 60
        while seen < 50 and time.monotonic() < deadline:
            seen += sum(len(b) for b in consumer.poll(timeout_ms=500).values())
        assert seen == 50
        consumer.commit()
        rows = java_tools.describe_group(bootstrap, group)
        assert {row["PARTITION"] for row in rows} == {"0", "1"}
        assert all(row["CLIENT-ID"] == "live-member" for row in rows)
        assert all(row["CONSUMER-ID"] != "-" for row in rows)
        assert sum(int(row["CURRENT-OFFSET"]) for row in rows) == 50
        listed = java_tools.consumer_groups(bootstrap, "--list").stdout.split()
        assert group in listed
    finally:
        consumer.close()


# -- broker restarts on the three-node cluster ----------------------------------------


def _leader(admin: KafkaAdminClient, topic: str, partition: int) -> int:
    (desc,) = admin.describe_topics([topic])
    for p in desc["partitions"]:
        if p["partition_index"] == partition:
            return p["leader_id"]
    raise AssertionError(f"no partition {partition} in {desc}")


def _isr_complete(admin: KafkaAdminClient, topic: str, replicas: int) -> bool:
    (desc,) = admin.describe_topics([topic])
    return all(len(p["isr_nodes"]) == replicas for p in desc["partitions"])


@pytest.mark.cluster
def test_acks_all_survives_broker_stop_and_kill(kafka_cluster: KafkaCluster, topic_factory) -> None:
    cluster = kafka_cluster
    bootstrap = cluster.bootstrap_servers
    topic = topic_factory(cluster, partitions=3, replication_factor=3,
                          configs={"min.insync.replicas": "2"})
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        produce_keyed(bootstrap, topic, 100, start=0)

        # Graceful stop of the leader of partition 0: leadership moves, acks=all still works.
        first_leader = _leader(admin, topic, 0)
        cluster.stop_node(first_leader)
        assert not cluster.node(first_leader).is_running
        new_leader = wait_until(
            lambda: (leader := _leader(admin, topic, 0)) not in (-1, first_leader) and leader,
            30, what="a new leader for partition 0",
        )
        produce_keyed(bootstrap, topic, 100, start=100)

        cluster.start_node(first_leader)
        assert cluster.node(first_leader).is_running
        wait_until(lambda: _isr_complete(admin, topic, 3), 60, what="all replicas back in sync")

        # A crash (SIGKILL) of the current leader: still no acknowledged record is lost.
        crashed = _leader(admin, topic, 0)
        cluster.kill_node(crashed)
        produce_keyed(bootstrap, topic, 100, start=200)
        cluster.start_node(crashed)
        wait_until(lambda: _isr_complete(admin, topic, 3), 60, what="all replicas back in sync")
        assert new_leader != first_leader
    finally:
        admin.close()

    records = consume_all(bootstrap, topic, 300, group=f"{topic}-after-restarts")
    assert sorted(v for _, v in records) == sorted(f"v{i}".encode() for i in range(300))


# -- command line and clean-up --------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_cli_run_prints_bootstrap_and_stops_on_sigterm(tmp_path: Path, kafka: KafkaCluster) -> None:
    # kafka is requested only so that the jars are known to be fetched already.
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.kafka_cluster", "run", "--nodes", "1",
         "--workdir", str(tmp_path / "cli")],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        lines: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("bootstrap.servers="):
                break
        bootstrap = lines[-1].strip().split("=", 1)[1]
        host, port = bootstrap.split(":")
        brokers, _ = metadata_brokers(host, int(port))
        assert set(brokers) == {1}
        jvm_pid = int(next(line for line in lines if " pid " in line).split(" pid ")[1].split()[0])
        assert _pid_alive(jvm_pid)
        proc.terminate()
        assert proc.wait(timeout=60) == 0
        assert not _pid_alive(jvm_pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_close_stops_every_node(tmp_path: Path, kafka: KafkaCluster) -> None:
    cluster = KafkaCluster.start(1, workdir=tmp_path / "short-lived")
    with cluster:
        pids = [n.pid for n in cluster.nodes]
        assert all(pid and _pid_alive(pid) for pid in pids)
    assert not any(_pid_alive(pid) for pid in pids if pid)
    assert not any(n.is_running for n in cluster.nodes)
    cluster.close()  # idempotent


# -- one-sentence errors ----------------------------------------------------------------


def test_missing_java_is_one_sentence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    monkeypatch.setenv("PATH", str(empty_bin))
    with pytest.raises(LocalKafkaError) as info:
        KafkaCluster.start(1, workdir=tmp_path / "kafka")
    message = str(info.value)
    assert one_sentence(message), message
    assert "openjdk-17-jre-headless" in message

    cli = subprocess.run(
        [sys.executable, "-m", "harness.kafka_cluster", "run", "--nodes", "1"],
        cwd=REPO, env={**os.environ, "PATH": str(empty_bin)}, capture_output=True, text=True,
        timeout=60,
    )
    assert cli.returncode == 2
    assert cli.stdout == ""
    assert cli.stderr.strip() == f"error: {message}"


def test_missing_maven_with_empty_cache_is_one_sentence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    monkeypatch.setenv("PATH", str(empty_bin))
    with pytest.raises(LocalKafkaError) as info:
        fetch_jars(tmp_path / "empty-cache")
    message = str(info.value)
    assert one_sentence(message), message
    assert "install maven" in message


def test_unreachable_maven_central_with_empty_cache_is_one_sentence(tmp_path: Path) -> None:
    settings = tmp_path / "settings.xml"
    settings.write_text(textwrap.dedent("""\
        <settings>
          <mirrors>
            <mirror>
              <id>nowhere</id>
              <mirrorOf>*</mirrorOf>
              <url>http://127.0.0.1:1/maven2</url>
            </mirror>
          </mirrors>
        </settings>
        """))
    cache = tmp_path / "empty-cache"
    env = {**os.environ, "KEYRANGE_CACHE": str(cache), "KEYRANGE_MAVEN_SETTINGS": str(settings)}
    cli = subprocess.run(
        [sys.executable, "-m", "proxy.local_kafka", "fetch-jars"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert cli.returncode == 2, cli.stderr
    assert cli.stdout == ""
    line = cli.stderr.strip()
    assert line.startswith("error: ") and "Traceback" not in line
    assert one_sentence(line), line
    assert "Maven Central is unreachable" in line
    assert not list(cache.glob("kafka-*/libs"))  # nothing that could pass for complete jars
