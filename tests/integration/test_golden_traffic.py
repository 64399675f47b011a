"""Golden traffic: what real clients and a real broker exchange, decoded and re-encoded by
our codec, must come back byte for byte.

The Java clients (ProducerPerformance, ConsoleConsumer in a group, ConsumerGroupCommand
--describe), librdkafka (idempotent producer, group consumer, admin list_topics) and
kafka-python (producer, group consumer, admin) talk to a dedicated broker through a
recording tap (harness/tap.py) that the broker advertises, so every connection is
recorded. Every request and response frame is then round-tripped; an (api key, version)
our schemas lack fails the test by name. The (api key, version) pairs covered are written
to ``<tmp>/golden-coverage.txt`` and the test's log; the terminal summary names the file.

A sample of the run is written to ``<tmp>/golden-traffic.jsonl``; with
``KEYRANGE_UPDATE_GOLDEN=1`` it also replaces ``tests/golden/kafka-traffic.jsonl``, which
tests/unit/test_golden_frames.py checks without a broker.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness import java_tools
from harness.golden import (
    GoldenExchange,
    RoundTrip,
    librdkafka_all_topics_metadata,
    roundtrip_request,
    roundtrip_response,
    select_exchanges,
    write_golden,
)
from harness.tap import TappedKafka
from harness.wait import wait_until
from proxy.local_kafka import kafka_version
from proxy.protocol.api_keys import api_name

from .tapped import session_tapped_kafka

pytestmark = pytest.mark.kafka
log = logging.getLogger(__name__)

GOLDEN_PATH = Path(__file__).resolve().parents[1] / "golden" / "kafka-traffic.jsonl"

TOPIC_PARTITIONS = 2
JAVA_RECORDS = 200
RDKAFKA_RECORDS = 150
KAFKA_PYTHON_RECORDS = 100


@pytest.fixture(scope="session")
def tapped_kafka(request: pytest.FixtureRequest) -> TappedKafka:
    return session_tapped_kafka(request)


def _run_java(bootstrap: str, topic: str) -> None:
    java_tools.producer_performance(
        bootstrap, topic, JAVA_RECORDS, record_size=64,
        producer_props={"acks": "all", "compression.type": "lz4", "linger.ms": "5"},
        timeout=90,
    )
    group = f"golden-java-{uuid.uuid4().hex[:8]}"
    result = java_tools.console_consumer(
        bootstrap, topic, group=group, max_messages=JAVA_RECORDS, timeout_ms=30000, timeout=90,
    )
    assert len(result.stdout.splitlines()) == JAVA_RECORDS
    rows = java_tools.describe_group(bootstrap, group, timeout=90)
    # Every partition has its row and is committed to its end: an empty or partial describe
    # must not pass for "no lag".
    partitions = sorted(int(row["PARTITION"]) for row in rows if row.get("TOPIC") == topic)
    assert partitions == list(range(TOPIC_PARTITIONS)), rows
    assert all(row.get("LAG") == "0" for row in rows), rows
    assert sum(int(row["CURRENT-OFFSET"]) for row in rows) == JAVA_RECORDS, rows


def _run_librdkafka(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "compression.type": "zstd", "linger.ms": 5})
    failures = []
    for i in range(RDKAFKA_RECORDS):
        key = None if i % 10 == 0 else f"rk-{i % 17}".encode()
        producer.produce(topic, key=key, value=f"rdkafka-{i}".encode(),
                         on_delivery=lambda err, msg: err and failures.append(err))
    assert producer.flush(30) == 0 and not failures
    total = JAVA_RECORDS + RDKAFKA_RECORDS
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"golden-rdk-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    received = []

    def drained() -> bool:
        message = consumer.poll(0.5)
        if message is not None and not message.error():
            received.append(message.offset())
        return len(received) >= total

    try:
        wait_until(drained, timeout=60, interval=0, what="librdkafka consumed every record")
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    assert topic in metadata.topics


def _run_kafka_python(bootstrap: str, topic: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", compression_type="gzip", linger_ms=5)
    for i in range(KAFKA_PYTHON_RECORDS):
        key = None if i % 9 == 0 else f"kp-{i % 11}".encode()
        producer.send(topic, key=key, value=f"kafka-python-{i}".encode())
    producer.flush(30)
    producer.close()
    total = JAVA_RECORDS + RDKAFKA_RECORDS + KAFKA_PYTHON_RECORDS
    group = f"golden-kp-{uuid.uuid4().hex[:8]}"
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False)
    received = []

    def drained() -> bool:
        for records in consumer.poll(timeout_ms=500).values():
            received.extend(records)
        return len(received) >= total

    try:
        wait_until(drained, timeout=60, interval=0, what="kafka-python consumed every record")
        consumer.commit()
    finally:
        consumer.close()
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="golden-admin")
    try:
        assert topic in admin.list_topics()
        admin.describe_topics([topic])
        admin.describe_groups([group])
        admin.list_groups()
        admin.describe_cluster()
        admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        offsets = admin.list_group_offsets({group: None})[group]
        assert sum(meta.offset for meta in offsets.values()) == total
    finally:
        admin.close()


CLIENTS = {
    "java": _run_java,
    "librdkafka": _run_librdkafka,
    "kafka-python": _run_kafka_python,
}


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    import confluent_kafka

    return {
        "kafka": kafka_version(),
        "librdkafka": confluent_kafka.libversion()[0],
        "confluent-kafka": version("confluent-kafka"),
        "kafka-python": version("kafka-python"),
    }


# (api key, version) pairs real clients send that our schemas cannot decode, each with why
# it is tolerated. docs/wire-contract.md#1-topology: keys the proxy does not decode travel as opaque
# bytes, so such a gap does not break the proxy, but the golden check cannot cover it.
KNOWN_GAPS = {
    (69, 1): "ConsumerGroupDescribe v1: ConsumerGroupCommand --describe tries it before "
    "DescribeGroups; kafka-python 3.0.12 ships no ConsumerGroupDescribe definition",
}


@dataclass
class Traffic:
    outcomes: list[tuple[str, RoundTrip]] = field(default_factory=list)
    coverage: dict[tuple[str, int, int], Counter] = field(default_factory=lambda: defaultdict(Counter))
    recorded: list[GoldenExchange] = field(default_factory=list)
    table_path: Path | None = None  # where the coverage table was written

    def pairs(self) -> list[tuple[int, int]]:
        return sorted({(k, v) for (_, k, v) in self.coverage})

    def table(self) -> str:
        lines = [f"golden traffic: {len(self.outcomes)} frames, {len(self.pairs())} (api key, version) pairs"]
        for k, v in self.pairs():
            clients = sorted(n for (n, kk, vv) in self.coverage if (kk, vv) == (k, v))
            req = sum(self.coverage[(n, k, v)]["request"] for n in clients)
            resp = sum(self.coverage[(n, k, v)]["response"] for n in clients)
            gap = "  NOT DECODABLE" if (k, v) in self.unsupported() else ""
            lines.append(f"  {k:>3} {api_name(k):<26} v{v:<3} requests {req:>4} responses {resp:>4}"
                         f"  {', '.join(clients)}{gap}")
        return "\n".join(lines)

    def unsupported(self) -> set[tuple[int, int]]:
        return {(o.api_key, o.api_version) for _, o in self.outcomes if o.status == "unsupported"}


def _create_topic(bootstrap: str, partitions: int) -> str:
    from kafka.admin import KafkaAdminClient, NewTopic

    topic = f"golden-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="golden-setup")
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)], timeout_ms=30000)
        wait_until(lambda: topic in admin.list_topics(), timeout=30, what=f"topic {topic} listed")
    finally:
        admin.close()
    return topic


@pytest.fixture(scope="module")
def traffic(tapped_kafka, tmp_path_factory) -> Traffic:
    """Run every client family through the tap once; round-trip every frame recorded."""
    tap = tapped_kafka.tap
    tap.clear()  # earlier tests' frames are not part of this run (and free the byte budget)
    bootstrap = tapped_kafka.bootstrap_servers
    # Run each client family in turn and label the frames that crossed the tap meanwhile.
    segments: list[tuple[str, int, int]] = []
    start = tap.mark()
    topic = _create_topic(bootstrap, partitions=TOPIC_PARTITIONS)
    segments.append(("kafka-python-setup", start, tap.mark()))
    for name, run in CLIENTS.items():
        start = tap.mark()
        run(bootstrap, topic)
        segments.append((name, start, tap.mark()))
    assert not tap.errors, tap.errors
    assert tap.dropped_frames == 0, "the tap's byte cap was reached; the run records too much"

    result = Traffic()
    for name, start, end in segments:
        for ex in tap.exchanges(start):
            request = ex.request
            if request.seq >= end:
                continue
            assert request.frame is not None
            key = (name, request.api_key, request.api_version)
            outcome = roundtrip_request(request.frame)
            if outcome.status == "decode" and (trimmed := librdkafka_all_topics_metadata(request.frame)):
                # A known librdkafka encoding bug (see golden.librdkafka_all_topics_metadata):
                # what the broker understood must still round-trip.
                again = roundtrip_request(trimmed)
                outcome = dataclasses.replace(
                    again, status="quirk" if again.ok else again.status,
                    detail=f"{outcome.detail}; the broker reads it without its last 3 bytes",
                )
            result.outcomes.append((name, outcome))
            result.coverage[key]["request"] += 1
            # A request still parked in a long poll when its client closed has no response.
            response = ex.response
            if response is not None and response.frame is not None:
                result.outcomes.append(
                    (name, roundtrip_response(request.api_key, request.api_version, response.frame))
                )
                result.coverage[key]["response"] += 1
            result.recorded.append(GoldenExchange(
                name, request.api_key, request.api_version, request.frame,
                None if response is None else response.frame,
            ))

    sample = select_exchanges(
        ex for ex in result.recorded
        if (ex.api_key, ex.api_version) not in result.unsupported()
        and roundtrip_request(ex.request).ok
    )
    directory = tmp_path_factory.mktemp("golden")
    write_golden(directory / "golden-traffic.jsonl", sample, _versions())
    if os.environ.get("KEYRANGE_UPDATE_GOLDEN") == "1":
        write_golden(GOLDEN_PATH, sample, _versions())
    result.table_path = directory / "golden-coverage.txt"
    result.table_path.write_text(result.table() + "\n")
    return result


class _CoverageSummary:
    """A plugin that names the coverage table in the terminal summary, after the run,
    rather than printing the table into the progress line."""

    def __init__(self, headline: str, path: Path) -> None:
        self.headline, self.path = headline, path

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        terminalreporter.write_line(f"{self.headline}: table in {self.path}")


def test_recorded_frames_roundtrip_byte_identical(traffic, request):
    table = traffic.table()
    log.info("%s", table)
    plugins = request.config.pluginmanager
    if not plugins.has_plugin(_CoverageSummary.__name__):
        plugins.register(_CoverageSummary(table.splitlines()[0], traffic.table_path), _CoverageSummary.__name__)
    failures = [
        f"{name}: {api_name(o.api_key)} v{o.api_version} {o.direction} {o.status}: {o.detail}"
        for name, o in traffic.outcomes
        if o.status not in ("ok", "unsupported", "quirk")
    ]
    assert not failures, f"{len(failures)} frames do not round-trip:\n" + "\n".join(failures[:20])
    assert sum(o.ok for _, o in traffic.outcomes) > 150


def test_client_encoding_quirks_are_the_known_ones(traffic):
    """Frames a client encodes differently from the schema, which the broker tolerates.

    The one known is librdkafka's padded all-topics Metadata request, which its admin
    ``list_topics`` sends in every run: none at all means its detection
    (``golden.librdkafka_all_topics_metadata``) no longer matches, or librdkafka fixed the
    encoding and the workaround can go. Either way the test says so rather than passing."""
    quirks = [(name, o) for name, o in traffic.outcomes if o.status == "quirk"]
    for name, o in quirks:
        log.info("client quirk (%s): %s v%d %s: %s", name, api_name(o.api_key), o.api_version, o.direction, o.detail)
    assert quirks, "librdkafka's all-topics Metadata request no longer shows its known padding"
    unknown = [
        f"{name}: {api_name(o.api_key)} v{o.api_version} {o.direction}: {o.detail}"
        for name, o in quirks
        if not (name == "librdkafka" and o.api_key == 3 and o.api_version >= 9 and o.direction == "request")
    ]
    assert not unknown, "unexpected client quirks:\n" + "\n".join(unknown)


def test_every_api_version_seen_is_decodable(traffic):
    missing = traffic.unsupported()
    described = ", ".join(f"{api_name(k)} (key {k}) v{v}" for k, v in sorted(missing))
    unexpected = missing - KNOWN_GAPS.keys()
    assert not unexpected, f"our schemas cannot decode what real clients send: {described}"
    if missing:
        pytest.xfail("known schema gaps: " + "; ".join(KNOWN_GAPS[p] for p in sorted(missing)))


def test_each_client_family_exercised_its_apis(traffic):
    seen = {(name, k) for (name, k, _) in traffic.coverage}
    for name in CLIENTS:
        # Produce, Fetch, Metadata, OffsetCommit, OffsetFetch, FindCoordinator, JoinGroup,
        # SyncGroup, ApiVersions
        for key in (0, 1, 3, 8, 9, 10, 11, 14, 18):
            assert (name, key) in seen, f"{name} sent no {api_name(key)} request"
    assert ("java", 15) in seen  # DescribeGroups from ConsumerGroupCommand --describe
    assert ("librdkafka", 22) in seen  # InitProducerId of the idempotent producer
