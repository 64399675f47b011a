"""The ``keyrange`` PySpark source through the real proxy, against a real broker, in a real
local Spark session: batch reads equal a direct read and keep each share's order, streams
restart exactly from their checkpoint and commit progress for standard tools, and every bad
option fails with its own message."""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict

import pytest

from harness import java_tools
from harness.transactions import produce_transactions
from harness.wait import wait_until
from proxy.ranges import equal_share
from proxy.records.keyhash import key_hash
from tests.integration.spark_fixtures import spark  # noqa: F401 - the shared session fixture

COLUMNS = ("partition", "offset", "key", "value", "timestamp", "timestampType")
HOT_KEY = b"hot"


def _produce_mixed(bootstrap: str, topic: str) -> None:
    """Two partitions of everything a reader must get right: null keys, one hot key,
    batches compressed with each codec, and transactions, some aborted."""
    from kafka import KafkaProducer

    n = 0
    for codec in (None, "gzip", "lz4", "zstd"):
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20, compression_type=codec)
        for _ in range(150):
            n += 1
            key = None if n % 9 == 0 else HOT_KEY if n % 3 == 0 else f"key-{n % 53}".encode()
            producer.send(topic, key=key, value=f"{codec}:{n}".encode(), partition=n % 2)
        producer.flush(30)
        producer.close()
    rounds = [([(f"tx-{r}-{i}".encode() if i % 5 else None, f"tx{r}:{i}".encode()) for i in range(40)], r % 3 != 1)
              for r in range(6)]
    produce_transactions(bootstrap, topic, rounds)


def _direct(spark, bootstrap: str, topic: str, isolation: str) -> Counter:  # noqa: F811
    rows = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
            .option("kafka.isolation.level", isolation).load().select(*COLUMNS).collect())
    return Counter(tuple(row) for row in rows)


@pytest.fixture(scope="module")
def mixed_topic(kafka, topic_factory_module):
    topic = topic_factory_module(kafka, partitions=2)
    _produce_mixed(kafka.bootstrap_servers, topic)
    return topic


@pytest.fixture(scope="module")
def topic_factory_module(request):
    from tests.conftest import create_topic

    def create(cluster, partitions=1):
        name = f"spark-{uuid.uuid4().hex[:10]}"
        create_topic(cluster, name, partitions)
        return name

    return create


def _keyrange(spark, proxy, topic, splits, **options):  # noqa: F811
    reader = (spark.read.format("keyrange").option("kafka.bootstrap.servers", proxy.bootstrap_servers)
              .option("subscribe", topic).option("splits.per.partition", str(splits)))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


@pytest.mark.parametrize("splits", [1, 3, 8])
def test_batch_read_equals_direct_read_and_keeps_each_share_in_order(spark, kafka, proxy, mixed_topic, splits):  # noqa: F811
    from pyspark.sql.functions import spark_partition_id

    df = _keyrange(spark, proxy, mixed_topic, splits, **{"kafka.isolation.level": "read_committed"})
    assert df.rdd.getNumPartitions() == 2 * splits
    rows = df.withColumn("task", spark_partition_id()).collect()
    got = Counter(tuple(row[c] for c in COLUMNS) for row in rows)
    expected = _direct(spark, kafka.bootstrap_servers, mixed_topic, "read_committed")
    assert sum(expected.values()) == 4 * 150 + 4 * 40  # 4 committed transactions of 40
    assert got == expected

    by_task = defaultdict(list)
    for row in rows:
        by_task[row["task"]].append(row)
    for task_rows in by_task.values():
        first = task_rows[0]
        assert {(r["topic"], r["partition"], r["keyRangeStart"], r["keyRangeEnd"]) for r in task_rows} == \
            {(first["topic"], first["partition"], first["keyRangeStart"], first["keyRangeEnd"])}
        share = next(equal_share(i, splits) for i in range(splits)
                     if equal_share(i, splits).start == first["keyRangeStart"])
        assert share.end == first["keyRangeEnd"]
        assert all(share.start <= key_hash(r["key"], r["offset"]) <= share.end for r in task_rows)
        offsets = [r["offset"] for r in task_rows]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    hot = [r for r in rows if r["key"] == HOT_KEY]
    assert len({(r["partition"], r["keyRangeStart"]) for r in hot}) == len({r["partition"] for r in hot})


def test_batches_larger_than_the_first_fetch_are_read_whole(spark, kafka, proxy, topic_factory_module):  # noqa: F811
    """A task's first Fetch asks for 64 KB and its answers grow from there; a batch larger
    than what a Fetch asks for still comes whole, between small ones."""
    from kafka import KafkaProducer

    topic = topic_factory_module(kafka, partitions=1)
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all", max_request_size=4 << 20)
    for n in range(60):
        size = 300_000 if n % 20 == 5 else 100
        producer.send(topic, key=f"key-{n % 7}".encode(), value=bytes([n]) * size)
    producer.flush(30)
    producer.close()
    rows = _keyrange(spark, proxy, topic, 3).select(*COLUMNS).collect()
    assert Counter(tuple(r) for r in rows) == _direct(spark, kafka.bootstrap_servers, topic, "read_uncommitted")
    assert sorted(len(r["value"]) for r in rows)[-3:] == [300_000] * 3


def test_read_uncommitted_sees_aborted_records_like_a_direct_read(spark, kafka, proxy, mixed_topic):  # noqa: F811
    rows = _keyrange(spark, proxy, mixed_topic, 4).select(*COLUMNS).collect()
    expected = _direct(spark, kafka.bootstrap_servers, mixed_topic, "read_uncommitted")
    assert Counter(tuple(r) for r in rows) == expected
    assert sum(expected.values()) == 4 * 150 + 6 * 40


def test_headers_column_when_asked(spark, kafka, proxy, topic_factory_module):  # noqa: F811
    from confluent_kafka import Producer

    topic = topic_factory_module(kafka)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "acks": "all"})
    producer.produce(topic, key=b"k", value=b"v", headers=[("h1", b"a"), ("h2", None)])
    assert producer.flush(30) == 0
    (row,) = _keyrange(spark, proxy, topic, 2, includeHeaders="true").collect()
    assert [(h["key"], h["value"]) for h in row["headers"]] == [("h1", b"a"), ("h2", None)]


# -- streaming ------------------------------------------------------------------------------

def _produce_numbered(bootstrap: str, topic: str, first: int, count: int) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    for n in range(first, first + count):
        producer.send(topic, key=None if n % 11 == 0 else f"c{n % 29}".encode(), value=str(n).encode(),
                      partition=n % 2)
    producer.flush(30)
    producer.close()


def test_stream_stopped_mid_way_restarts_from_its_checkpoint_exactly(spark, kafka, proxy, topic_factory_module,  # noqa: F811
                                                                      tmp_path):
    topic = topic_factory_module(kafka, partitions=2)
    group = f"spark-{uuid.uuid4().hex[:8]}"
    _produce_numbered(kafka.bootstrap_servers, topic, 0, 600)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start(trigger):
        stream = (spark.readStream.format("keyrange").option("kafka.bootstrap.servers", proxy.bootstrap_servers)
                  .option("subscribe", topic).option("splits.per.partition", "3")
                  .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "100")
                  .option("commit.group.id", group).load())
        return (stream.select("partition", "offset", "value", "keyRangeStart").writeStream.format("parquet")
                .option("path", str(out)).option("checkpointLocation", str(checkpoint)).trigger(**trigger).start())

    query = start({"processingTime": "200 milliseconds"})
    try:
        wait_until(lambda: sum(p["numInputRows"] for p in query.recentProgress) >= 150, timeout=120,
                   what="two micro-batches of the first run")
    finally:
        query.stop()
    first_run = sum(p["numInputRows"] for p in query.recentProgress)
    assert 150 <= first_run < 600, first_run  # stopped mid-stream: maxOffsetsPerTrigger holds batches to ~100
    assert max(p["numInputRows"] for p in query.recentProgress) <= 130

    _produce_numbered(kafka.bootstrap_servers, topic, 600, 300)
    query = start({"availableNow": True})
    assert query.awaitTermination(180)
    assert query.exception() is None

    rows = spark.read.parquet(str(out)).collect()
    counts = Counter(int(r["value"]) for r in rows)
    assert sorted(counts) == list(range(900)), "records lost"
    assert max(counts.values()) == 1, "records doubled"

    def committed():
        rows = java_tools.describe_group(kafka.bootstrap_servers, group, timeout=60)
        return {int(r["PARTITION"]): r for r in rows if r.get("TOPIC") == topic}

    by_partition = wait_until(lambda: len(committed()) == 2 and committed(), timeout=60, what="group offsets")
    for row in by_partition.values():
        assert row["CURRENT-OFFSET"] == row["LOG-END-OFFSET"] == "450" and row["LAG"] == "0", row


# -- bad options ----------------------------------------------------------------------------

def _error_of(action) -> str:
    with pytest.raises(Exception) as caught:
        action()
    return str(caught.value)


@pytest.mark.parametrize("options, message", [
    ({"splits.per.partition": "0"}, "splits.per.partition must be between 1 and 1024, got 0"),
    ({"splits.per.partition": "5000"}, "splits.per.partition must be between 1 and 1024, got 5000"),
    ({"splits.per.partition": "two"}, "splits.per.partition must be an integer, got 'two'"),
    ({"startingOffsets": "yesterday"}, "startingOffsets must be one of earliest, latest; got 'yesterday'"),
    ({"kafka.isolation.level": "dirty"}, "kafka.isolation.level must be one of read_uncommitted, read_committed"),
    ({"maxOffsetsPerTrigger": "10"}, "maxOffsetsPerTrigger: only for streaming reads"),
    ({"kafka.group.id": "g"}, "unknown option(s) kafka.group.id"),
])
def test_bad_batch_option_fails_with_its_message(spark, proxy, mixed_topic, options, message):  # noqa: F811
    assert message in _error_of(lambda: _keyrange(spark, proxy, mixed_topic, 1, **options).collect())


def test_unknown_topic_and_missing_subscribe(spark, proxy):  # noqa: F811
    missing = f"no-such-topic-{uuid.uuid4().hex[:6]}"
    assert f"subscribe: topic '{missing}' does not exist at {proxy.bootstrap_servers}" in \
        _error_of(lambda: _keyrange(spark, proxy, missing, 2).collect())
    assert "option subscribe is required" in _error_of(
        lambda: spark.read.format("keyrange").option("kafka.bootstrap.servers", proxy.bootstrap_servers).load()
        .collect())


def test_broker_without_keyrange_fetch_is_refused_for_shares(spark, kafka, mixed_topic):  # noqa: F811
    def read(splits):
        return (spark.read.format("keyrange").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
                .option("subscribe", mixed_topic).option("splits.per.partition", str(splits)).load())

    assert "does not advertise keyrange.fetch" in _error_of(lambda: read(4).collect())
    assert read(1).count() == 4 * 150 + 6 * 40  # one share is the whole partition: any Kafka will do


def test_bootstrap_that_does_not_answer(spark, mixed_topic):  # noqa: F811
    from tests.integration.conftest import free_ports

    (port,) = free_ports(1)
    # tried again and again until the request timeout, then refused with what the last tries said
    message = _error_of(lambda: spark.read.format("keyrange").option("kafka.bootstrap.servers", f"127.0.0.1:{port}")
                        .option("kafka.request.timeout.ms", "2000")
                        .option("subscribe", mixed_topic).load().collect())
    assert f"kafka.bootstrap.servers: no server answered within 2 s (last tries: 127.0.0.1:{port}" in message


def test_bad_stream_options(spark, proxy, mixed_topic):  # noqa: F811
    def stream(**options):
        reader = (spark.readStream.format("keyrange").option("kafka.bootstrap.servers", proxy.bootstrap_servers)
                  .option("subscribe", mixed_topic))
        for key, value in options.items():
            reader = reader.option(key, value)
        query = reader.load().writeStream.format("memory").queryName(f"q{uuid.uuid4().hex[:6]}").start()
        try:
            query.awaitTermination(60)
        finally:
            query.stop()

    assert "maxOffsetsPerTrigger must be positive, got 0" in _error_of(lambda: stream(maxOffsetsPerTrigger="0"))
    assert "endingOffsets: only for batch reads" in _error_of(lambda: stream(endingOffsets="latest"))
