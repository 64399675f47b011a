"""Real consumers accept the record batches we filter.

A tap in front of a dedicated broker (harness/tap.py) rewrites every Fetch response
the way the proxy does for a key-range fetch: each partition's records go through
``split_records`` with one fixed range set (share 1 of 4), the response is re-encoded with
our codec and sent on. The log holds keyed and null-key records in batches of every
compression codec, batches in which no record matches the range (they reach the client as
batches with zero records) and a partition in which nothing matches at all.

The Java ConsoleConsumer, librdkafka and kafka-python, each in its own group, must receive
exactly the records whose key hash (docs/wire-contract.md#2-key-hash-and-ranges) lies in the range, in log order,
and move their position past the empty batches to the log end.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass, field

import pytest

from harness import java_tools
from harness.tap import TappedKafka
from harness.wait import wait_until
from proxy.protocol.messages import decode_request, decode_response, encode_response
from proxy.ranges import contains, equal_shares
from proxy.records.batch import RecordBatch, iter_batches
from proxy.records.keyhash import key_hash
from proxy.records.plan import RangePlan
from proxy.records.split import split_records

from .tapped import session_tapped_kafka

pytestmark = pytest.mark.kafka

RANGES = [equal_shares(4)[1]]
PLAN = RangePlan([RANGES])
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
ALL_CODECS = {0, 1, 2, 3, 4}  # attribute values of none .. zstd
MATCHING_PARTITION, EMPTY_PARTITION = 0, 1


@pytest.fixture(scope="session")
def tapped_kafka(request: pytest.FixtureRequest) -> TappedKafka:
    return session_tapped_kafka(request)


def _in_range(key: bytes | None, offset: int) -> bool:
    return contains(RANGES, key_hash(key, offset))


def _keys(matching: bool, count: int, start: int = 0) -> list[bytes]:
    """``count`` distinct keys whose hash does (or does not) fall in RANGES."""
    keys: list[bytes] = []
    i = start
    while len(keys) < count and i < start + 100_000:
        key = f"key-{i}".encode()
        if _in_range(key, 0) == matching:
            keys.append(key)
        i += 1
    assert len(keys) == count
    return keys


# --------------------------------------------------------------------------- the log


@dataclass
class Log:
    topic: str
    # partition -> [(offset, key, value)] in log order, as acknowledged by the broker
    records: dict[int, list[tuple[int, bytes | None, bytes]]] = field(default_factory=dict)

    def end_offset(self, partition: int) -> int:
        return self.records[partition][-1][0] + 1

    def expected(self) -> list[tuple[int, bytes | None, bytes]]:
        """Records a range consumer must get: matching partition only, in log order."""
        return [r for r in self.records[MATCHING_PARTITION] if _in_range(r[1], r[0])]


def _produce_kafka_python(bootstrap: str, topic: str, partition: int, codec: str,
                          records: list[tuple[bytes | None, bytes]]) -> list[tuple[int, bytes | None, bytes]]:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=200, batch_size=1 << 20,
                             compression_type=None if codec == "none" else codec)
    try:
        futures = [(producer.send(topic, key=k, value=v, partition=partition), k, v) for k, v in records]
        producer.flush(30)
        return [(f.get(30).offset, k, v) for f, k, v in futures]
    finally:
        producer.close()


def _produce_confluent(bootstrap: str, topic: str, partition: int, codec: str,
                       records: list[tuple[bytes | None, bytes]]) -> list[tuple[int, bytes | None, bytes]]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 200,
                         "enable.idempotence": True})
    acked: dict[bytes, int] = {}
    errors = []

    def on_delivery(err, msg):
        if err:
            errors.append(err)
        else:
            acked[msg.value()] = msg.offset()

    for k, v in records:
        producer.produce(topic, key=k, value=v, partition=partition, on_delivery=on_delivery)
    assert producer.flush(30) == 0 and not errors, errors
    return [(acked[v], k, v) for k, v in records]


PRODUCERS = {"none": _produce_kafka_python, "gzip": _produce_kafka_python, "snappy": _produce_kafka_python,
             "lz4": _produce_confluent, "zstd": _produce_confluent}


@pytest.fixture(scope="module")
def log(tapped_kafka) -> Log:
    """Produce the test log through the tap (unfiltered: no transform is installed yet)."""
    from kafka.admin import KafkaAdminClient, NewTopic

    bootstrap = tapped_kafka.bootstrap_servers
    topic = f"filtered-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="filtered-setup")
    try:
        admin.create_topics([NewTopic(topic, 2, 1)], timeout_ms=30000)
        wait_until(lambda: topic in admin.list_topics(), timeout=30, what=f"topic {topic} listed")
    finally:
        admin.close()

    result = Log(topic, {MATCHING_PARTITION: [], EMPTY_PARTITION: []})
    matching = iter(_keys(True, 200))
    other = iter(_keys(False, 400, start=1_000_000))
    for codec in CODECS:
        produce = PRODUCERS[codec]
        # A mixed batch: matching keys, other keys and null keys, whose offset decides. The
        # topic is fresh, so the offsets are known in advance (checked below): one null key
        # goes where the offset hash falls inside the range, others where they may not.
        base = len(result.records[MATCHING_PARTITION])
        inside = next((i for i in range(15) if _in_range(None, base + i)), None)
        nulls = {2, 12} | ({inside} if inside is not None else set())
        mixed: list[tuple[bytes | None, bytes]] = []
        for i in range(15):
            key = None if i in nulls else next(matching) if i % 3 == 0 else next(other)
            mixed.append((key, f"{codec}-mixed-{i}".encode()))
        result.records[MATCHING_PARTITION] += produce(bootstrap, topic, MATCHING_PARTITION, codec, mixed)
        # A batch in which no record matches: it reaches the consumer with zero records.
        none_match = [(next(other), f"{codec}-nomatch-{i}".encode()) for i in range(8)]
        result.records[MATCHING_PARTITION] += produce(bootstrap, topic, MATCHING_PARTITION, codec, none_match)
        # The other partition only ever holds records outside the range.
        result.records[EMPTY_PARTITION] += produce(
            bootstrap, topic, EMPTY_PARTITION, codec,
            [(next(other), f"{codec}-p1-{i}".encode()) for i in range(6)],
        )
    # The log ends with batches that match nothing, so the last thing a consumer fetches
    # from either partition is empty batches.
    for codec in ("none", "zstd"):
        result.records[MATCHING_PARTITION] += PRODUCERS[codec](
            bootstrap, topic, MATCHING_PARTITION, codec,
            [(next(other), f"tail-{codec}-{i}".encode()) for i in range(5)],
        )
    for partition, records in result.records.items():
        assert [o for o, _, _ in records] == list(range(len(records))), partition
    assert result.expected() and len(result.expected()) < len(result.records[MATCHING_PARTITION])
    # Null keys are hashed by offset: some of them must fall inside the range, some outside.
    null_offsets = [o for o, k, _ in result.records[MATCHING_PARTITION] if k is None]
    assert any(_in_range(None, o) for o in null_offsets)
    assert not all(_in_range(None, o) for o in null_offsets)
    assert not any(_in_range(k, o) for o, k, _ in result.records[EMPTY_PARTITION])
    return result


# --------------------------------------------------------------------------- the filter


@dataclass
class FilterStats:
    responses: int = 0
    partitions: int = 0
    records_kept: int = 0
    records_dropped: int = 0
    empty_batches: int = 0
    all_empty_partitions: int = 0  # partitions answered with batches none of which kept a record
    # codecs of the filtered batches that kept records but not all of them (rebuilt)
    rebuilt_codecs: set = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


class FetchFilter:
    """Tap response transform: filter every Fetch response's records to RANGES."""

    def __init__(self) -> None:
        self.stats = FilterStats()

    def __call__(self, api_key: int, version: int, frame: bytes) -> bytes:
        if api_key != 1:
            return frame
        header, body = decode_response(api_key, version, frame)
        stats = self.stats
        for topic in body.responses:
            for partition in topic.partitions:
                if partition.records is None or len(partition.records) == 0:
                    continue
                source = bytes(partition.records)
                split = split_records(source, PLAN)
                out = split.outputs[0]
                partition.records = out.records
                rebuilt = {
                    int(b.header.codec) for b in iter_batches(out.records)
                    if isinstance(b, RecordBatch) and 0 < b.header.record_count
                    and b.data not in source
                }
                with stats.lock:
                    stats.partitions += 1
                    stats.records_kept += out.stats.records_kept
                    stats.records_dropped += out.stats.records_dropped
                    stats.empty_batches += out.stats.empty_batches
                    if out.stats.records_kept == 0 and out.stats.batches_out:
                        stats.all_empty_partitions += 1
                    stats.rebuilt_codecs |= rebuilt
        with stats.lock:
            stats.responses += 1
        return encode_response(api_key, version, header, body)


@pytest.fixture
def fetch_filter(tapped_kafka):
    tap = tapped_kafka.tap
    errors_before = len(tap.errors)
    filt = FetchFilter()
    tap.transform = filt
    try:
        yield filt
    finally:
        tap.transform = None
    assert tap.errors[errors_before:] == []
    assert filt.stats.partitions > 0 and filt.stats.records_dropped > 0
    # Both kinds of emptiness were really sent: empty batches among kept ones, and fetch
    # answers for a partition made only of empty batches.
    assert filt.stats.empty_batches > 0 and filt.stats.all_empty_partitions > 0


def _group() -> str:
    return f"filtered-{uuid.uuid4().hex[:8]}"


def _describe_at_log_end(bootstrap: str, group: str, log: Log) -> list[dict[str, str]]:
    rows = java_tools.describe_group(bootstrap, group, timeout=60)
    by_partition = {int(row["PARTITION"]): row for row in rows if row.get("TOPIC") == log.topic}
    assert set(by_partition) == {MATCHING_PARTITION, EMPTY_PARTITION}, rows
    for partition, row in by_partition.items():
        assert row["LOG-END-OFFSET"] == str(log.end_offset(partition)), row
        assert row["CURRENT-OFFSET"] == row["LOG-END-OFFSET"] and row["LAG"] == "0", row
    return rows


# --------------------------------------------------------------------------- the clients


def test_java_console_consumer_gets_exactly_the_range(tapped_kafka, log, fetch_filter):
    bootstrap = tapped_kafka.bootstrap_servers
    group = _group()
    # No --max-messages: the consumer runs until nothing arrives for timeout_ms, so it has
    # fetched (and skipped) the empty batches at the end of both partitions; closing commits.
    result = java_tools.console_consumer(
        bootstrap, log.topic, group=group, print_key=True, timeout_ms=6000, timeout=90,
        consumer_config={"check.crcs": "true", "fetch.max.wait.ms": "200"},
    )
    assert fetch_filter.stats.rebuilt_codecs == ALL_CODECS
    lines = result.stdout.splitlines()
    expected = [f"{'null' if k is None else k.decode()}\t{v.decode()}" for _, k, v in log.expected()]
    assert lines == expected
    _describe_at_log_end(bootstrap, group, log)


def test_librdkafka_consumer_gets_exactly_the_range(tapped_kafka, log, fetch_filter, capsys):
    from confluent_kafka import Consumer, TopicPartition

    bootstrap = tapped_kafka.bootstrap_servers
    group = _group()
    stats: dict[int, dict] = {}

    def on_stats(text: str) -> None:
        partitions = json.loads(text).get("topics", {}).get(log.topic, {}).get("partitions", {})
        for p in (MATCHING_PARTITION, EMPTY_PARTITION):
            if str(p) in partitions:
                stats[p] = partitions[str(p)]

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "check.crcs": True, "fetch.wait.max.ms": 200,
        "statistics.interval.ms": 200, "stats_cb": on_stats,
    })
    consumer.subscribe([log.topic])
    received: list[tuple[int, int, bytes | None, bytes]] = []
    errors: list = []
    ends = {p: log.end_offset(p) for p in (MATCHING_PARTITION, EMPTY_PARTITION)}
    expected = [(MATCHING_PARTITION, o, k, v) for o, k, v in log.expected()]

    def fetched_to_log_end() -> bool:
        message = consumer.poll(0.2)
        if message is not None:
            if message.error():
                errors.append(message.error())
            else:
                received.append((message.partition(), message.offset(), message.key(), message.value()))
        # next_offset: librdkafka's fetch position for the partition. Fetched records may
        # still wait in the local queue, so every expected record must have been polled too.
        return (len(received) >= len(expected) and len(stats) == 2
                and all(stats[p].get("next_offset") == ends[p] for p in ends))

    try:
        wait_until(fetched_to_log_end, timeout=60, interval=0,
                   what="librdkafka fetched both partitions to the log end")
        assert not errors, errors
        assert fetch_filter.stats.rebuilt_codecs == ALL_CODECS
        assert received == expected
        # position() is librdkafka's application position: the offset after the last
        # record it delivered, or OFFSET_INVALID (-1001) when it delivered none. It does not
        # move past empty batches; the fetch position above does.
        app_positions = {tp.partition: tp.offset for tp in consumer.position(
            [TopicPartition(log.topic, p) for p in ends])}
        last_match = log.expected()[-1][0]
        assert app_positions[MATCHING_PARTITION] in (last_match + 1, ends[MATCHING_PARTITION])
        assert app_positions[EMPTY_PARTITION] in (-1001, ends[EMPTY_PARTITION])
        # Commit the fetch positions, as an application that tracks its progress past
        # filtered batches must; the group is then at the log end.
        consumer.commit(offsets=[TopicPartition(log.topic, p, ends[p]) for p in ends], asynchronous=False)
    finally:
        consumer.close()
    _describe_at_log_end(bootstrap, group, log)
    if app_positions != ends:
        with capsys.disabled():
            print(f"\nlibrdkafka: fetch positions at the log ends {ends}, application positions "
                  f"{app_positions} (a plain commit() would leave the group behind the log end)")


def test_kafka_python_consumer_gets_exactly_the_range(tapped_kafka, log, fetch_filter):
    from kafka import KafkaConsumer, TopicPartition

    bootstrap = tapped_kafka.bootstrap_servers
    group = _group()
    # Assigned, not subscribed: what is under test is the fetch path, and a group join can
    # miss the new topic's metadata under load and wait a whole rebalance for it.
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False, check_crcs=True,
                             fetch_max_wait_ms=200)
    partitions = [TopicPartition(log.topic, p) for p in (MATCHING_PARTITION, EMPTY_PARTITION)]
    consumer.assign(partitions)
    received: list[tuple[int, int, bytes | None, bytes]] = []

    def at_log_end() -> bool:
        for records in consumer.poll(timeout_ms=200).values():
            received.extend((r.partition, r.offset, r.key, r.value) for r in records)
        assigned = consumer.assignment()
        return set(partitions) <= assigned and all(
            consumer.position(tp) == log.end_offset(tp.partition) for tp in partitions
        )

    try:
        wait_until(at_log_end, timeout=60, interval=0, what="kafka-python position at the log end")
        consumer.commit()
    finally:
        consumer.close()
    assert received == [(MATCHING_PARTITION, o, k, v) for o, k, v in log.expected()]
    assert fetch_filter.stats.rebuilt_codecs == ALL_CODECS
    _describe_at_log_end(bootstrap, group, log)


# --------------------------------------------------------------------------- many empty answers in a row

EMPTY_IN_A_ROW = 14  # librdkafka reacts from the 11th message-less answer on (see below)


class FetchWatcher:
    """Reads the consumer's Fetch requests off the tap: which offsets it asked for, and the
    largest PartitionMaxBytes it sent, for one topic partition."""

    def __init__(self, tap, topic: str, topic_id: uuid.UUID, partition: int = 0) -> None:
        self.tap, self.topic, self.topic_id, self.partition = tap, topic, topic_id, partition
        self.since = tap.mark()
        self.offsets: set[int] = set()
        self.max_partition_bytes = 0

    def update(self) -> None:
        frames = self.tap.frames(self.since)
        if frames:
            self.since = frames[-1].seq + 1
        for f in frames:
            if f.direction != "request" or f.api_key != 1 or f.frame is None:
                continue
            _, body = decode_request(f.frame)
            for t in body.topics:
                if t.topic == self.topic or t.topic_id == self.topic_id:
                    for p in t.partitions:
                        if p.partition == self.partition:
                            self.offsets.add(p.fetch_offset)
                            self.max_partition_bytes = max(self.max_partition_bytes, p.partition_max_bytes)

    def asked_for(self, offset: int) -> bool:
        self.update()
        return offset in self.offsets


class JavaDriver:
    """ConsoleConsumer in a thread, until it has printed one record."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.result = None
        self.error: BaseException | None = None
        self.errors: list = []

        def run() -> None:
            try:
                self.result = java_tools.console_consumer(
                    bootstrap, topic, group=group, print_key=True, max_messages=1, timeout_ms=60000,
                    timeout=120, consumer_config={"fetch.max.wait.ms": "200"},
                )
            except BaseException as exc:  # noqa: BLE001 - re-raised in finish()
                self.error = exc

        self.thread = threading.Thread(target=run, name="console-consumer", daemon=True)
        self.thread.start()

    def pump(self) -> None:
        if self.error is not None:
            raise self.error

    def finish(self) -> list[tuple[bytes | None, bytes]]:
        self.thread.join(120)
        assert not self.thread.is_alive(), "ConsoleConsumer did not exit"
        if self.error is not None:
            raise self.error
        rows = []
        for line in self.result.stdout.splitlines():
            key, value = line.split("\t", 1)
            rows.append((None if key == "null" else key.encode(), value.encode()))
        return rows


class LibrdkafkaDriver:
    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        from confluent_kafka import Consumer

        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                  "auto.offset.reset": "earliest", "fetch.wait.max.ms": 200})
        self.consumer.subscribe([topic])
        self.received: list[tuple[bytes | None, bytes]] = []
        self.errors: list = []

    def pump(self) -> None:
        message = self.consumer.poll(0.05)
        if message is None:
            return
        if message.error():
            self.errors.append(message.error())
        else:
            self.received.append((message.key(), message.value()))

    def finish(self) -> list[tuple[bytes | None, bytes]]:
        wait_until(lambda: self.pump() or self.received, timeout=30, interval=0, what="librdkafka got the record")
        self.consumer.close()  # auto commit of the consumed position
        return self.received


class KafkaPythonDriver:
    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        from kafka import KafkaConsumer

        self.consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                      auto_offset_reset="earliest", enable_auto_commit=False,
                                      fetch_max_wait_ms=200)
        self.received: list[tuple[bytes | None, bytes]] = []
        self.errors: list = []

    def pump(self) -> None:
        for records in self.consumer.poll(timeout_ms=50).values():
            self.received.extend((r.key, r.value) for r in records)

    def finish(self) -> list[tuple[bytes | None, bytes]]:
        wait_until(lambda: self.pump() or self.received, timeout=30, interval=0, what="kafka-python got the record")
        self.consumer.commit()
        self.consumer.close()
        return self.received


DRIVERS = {"java": JavaDriver, "librdkafka": LibrdkafkaDriver, "kafka-python": KafkaPythonDriver}


@pytest.mark.parametrize("client", list(DRIVERS))
def test_consumer_moves_through_many_all_empty_answers(tapped_kafka, fetch_filter, client, capsys):
    """EMPTY_IN_A_ROW fetch answers in a row hold only a batch with zero records: the
    consumer must ask for the offset after each, then receive the next matching record.

    librdkafka (rdkafka_msgset_reader.c, rd_kafka_msgset_reader_run) takes a partition
    answer that yields no message and no control batch for a too-small size limit: it
    doubles that partition's PartitionMaxBytes (from fetch.message.max.bytes, never reset)
    up to 1 GiB, and from then on reports each such answer to the application as a
    non-fatal MSG_SIZE_TOO_LARGE error. It still moves its fetch position past the batch.
    This test tolerates exactly that error and reports it.
    """
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    bootstrap = tapped_kafka.bootstrap_servers
    topic = f"empties-{client}-{uuid.uuid4().hex[:6]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="empties-setup")
    try:
        admin.create_topics([NewTopic(topic, 1, 1)], timeout_ms=30000)
        described = wait_until(lambda: admin.describe_topics([topic]), timeout=30, what="topic described")
        topic_id = described[0]["topic_id"]
    finally:
        admin.close()
    topic_id = topic_id if isinstance(topic_id, uuid.UUID) else uuid.UUID(str(topic_id))
    watcher = FetchWatcher(tapped_kafka.tap, topic, topic_id)
    group = _group()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    driver = DRIVERS[client](bootstrap, topic, group)
    try:
        def fetching_at(offset: int):
            return lambda: driver.pump() or watcher.asked_for(offset)

        wait_until(fetching_at(0), timeout=60, interval=0, what=f"{client} fetching from offset 0")
        others = _keys(False, EMPTY_IN_A_ROW, start=2_000_000)
        for i, key in enumerate(others):
            end = producer.send(topic, key=key, value=f"empty-{i}".encode()).get(30).offset + 1
            # The answer holds one batch with zero records; the next request must ask past it.
            wait_until(fetching_at(end), timeout=30, interval=0,
                       what=f"{client} fetching from offset {end} after an all-empty answer")
        key = _keys(True, 1, start=2_000_000)[0]
        last = producer.send(topic, key=key, value=b"the-match").get(30).offset
        received = driver.finish()
    finally:
        producer.close()
    assert received == [(key, b"the-match")]
    assert last == EMPTY_IN_A_ROW
    rows = java_tools.describe_group(bootstrap, group, timeout=60)
    assert [(r["CURRENT-OFFSET"], r["LOG-END-OFFSET"], r["LAG"]) for r in rows] == [
        (str(last + 1), str(last + 1), "0")
    ], rows

    size_errors = [e for e in driver.errors if e.code() == 10]  # MSG_SIZE_TOO_LARGE
    assert driver.errors == size_errors, driver.errors
    if size_errors:
        with capsys.disabled():
            print(f"\n{client}: {len(size_errors)} MSG_SIZE_TOO_LARGE errors after {EMPTY_IN_A_ROW} "
                  f"all-empty answers; PartitionMaxBytes grew to {watcher.max_partition_bytes}: "
                  f"{size_errors[0].str()}")
