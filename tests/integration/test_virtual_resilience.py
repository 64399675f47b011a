"""Virtual range topics across restarts and special logs (docs/wire-contract.md#9-virtual-range-topics),
read by librdkafka (confluent-kafka) as ``<topic>.kr4``:

- a member that stops without committing what it read last resumes from its shares'
  watermarks W(i) (each lifted past offsets the proxy saw hold none of its share's
  records, docs/virtual-topics.md#lag): it gets again exactly what it read after its last
  commit;
- a proxy restart mid-stream loses and duplicates nothing (the new instance learns the
  watermarks from the coordinator);
- read_committed with aborted transactions gets only committed records, each once, and
  the positions reach the log end, also when a read_uncommitted consumer read the same
  partition for another share first;
- a compacted topic reads like its real partitions, gaps and all;
- a share whose position fell below the log start resets alone: another share of the same
  partition on the same consumer keeps its position and gets its records.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest

from harness.transactions import produce_transactions
from harness.wait import wait_until
from tests.integration import virtual_checks as checks
from tests.integration.virtual_checks import PARTITIONS, SHARES

pytestmark = pytest.mark.kafka

VIRTUAL_PARTITIONS = SHARES * PARTITIONS


def _consumer(bootstrap: str, group: str, **extra):
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                     "enable.auto.commit": False, "session.timeout.ms": 10000, "heartbeat.interval.ms": 500,
                     **extra})


def _poll_until(consumer, received: checks.Received, done: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll into ``received`` until ``done()``; a client error fails at once."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"{what} did not hold within {timeout:g} s ({len(received)} read; {_LAST})"
        message = consumer.poll(0.2)
        if message is None:
            continue
        assert not message.error(), str(message.error())
        received.append((message.partition(), message.offset(), message.key(), message.value()))


def _at_end(consumer, start: dict[int, int] | None = None) -> bool:
    """Every virtual partition's position is its high watermark. librdkafka reports no
    position for a partition it got nothing from, so one that started at its end (its
    committed offset, ``start``) counts as there."""
    start = start or {}
    assigned = consumer.assignment()
    if len(assigned) != VIRTUAL_PARTITIONS:
        _LAST["positions"] = f"{len(assigned)} assigned"
        return False
    state = [(tp.partition, tp.offset if tp.offset >= 0 else start.get(tp.partition, -1),
              consumer.get_watermark_offsets(tp, cached=True)[1]) for tp in consumer.position(assigned)]
    _LAST["positions"] = str(sorted(state))
    return all(0 <= position == high for _, position, high in state)


_LAST: dict[str, str] = {}  # what _at_end saw last, for failure messages


def _commit_read(consumer, topic: str, received: checks.Received) -> dict[int, int]:
    """Commit, per virtual partition, the offset after the last record read: W(i)."""
    from confluent_kafka import TopicPartition

    marks: dict[int, int] = {}
    for partition, offset, _, _ in received:
        marks[partition] = max(marks.get(partition, -1), offset + 1)
    consumer.commit(offsets=[TopicPartition(f"{topic}.kr{SHARES}", p, o) for p, o in sorted(marks.items())],
                    asynchronous=False)
    return marks


def _committed(consumer, topic: str) -> dict[int, int]:
    from confluent_kafka import TopicPartition

    asked = [TopicPartition(f"{topic}.kr{SHARES}", p) for p in range(VIRTUAL_PARTITIONS)]
    return {tp.partition: tp.offset for tp in consumer.committed(asked, timeout=10)}


def _at_or_lifted(committed: dict[int, int], marks: dict[int, int]) -> None:
    """Each virtual partition committed where ``marks`` says, or lifted beyond it (past
    offsets the proxy saw hold none of the share's records: what is resumed from there
    is checked to lose nothing); one without a mark has no committed offset."""
    assert set(committed) == set(range(VIRTUAL_PARTITIONS)), committed
    for partition, offset in committed.items():
        mark = marks.get(partition)
        assert offset == -1001 if mark is None else offset >= mark, (partition, offset, mark)


def _resume_and_check(bootstrap: str, topic: str, group: str, sent, before: checks.Received,
                      marks: dict[int, int]) -> None:
    """A new member of ``group`` reads to the end: it starts at each share's watermark, so
    what it gets plus what was read below the watermarks is everything, once."""
    consumer = _consumer(bootstrap, group)
    consumer.subscribe([f"{topic}.kr{SHARES}"])
    after: checks.Received = []
    try:
        start = _committed(consumer, topic)
        _at_or_lifted(start, marks)
        _poll_until(consumer, after, lambda: _at_end(consumer, start), 90, "the resumed member at the end")
        consumer.commit(asynchronous=False)  # the positions, past the other shares' records
    finally:
        consumer.close()
    kept = [r for r in before if r[1] < marks.get(r[0], 0)]
    assert all(r[1] >= marks.get(r[0], 0) for r in after), "a record below its share's watermark came again"
    checks.check_delivery(sent, [kept, after])


def test_member_resumes_from_its_shares_watermarks(kafka, proxy, topic_factory):
    topic = topic_factory(kafka, partitions=PARTITIONS)
    group = f"vr-{uuid.uuid4().hex[:8]}"
    sent = checks.produce(proxy.bootstrap_servers, topic, 1500)
    first = _consumer(proxy.bootstrap_servers, group, **{"max.partition.fetch.bytes": 4096})
    first.subscribe([f"{topic}.kr{SHARES}"])
    before: checks.Received = []
    try:
        _poll_until(first, before, lambda: len(before) >= 600, 60, "600 records")
        marks = _commit_read(first, topic, before)
        assert len(set(marks.values())) > 1  # the shares stand at different offsets
        _at_or_lifted(_committed(first, topic), marks)
        count = len(before)
        _poll_until(first, before, lambda: len(before) >= count + 200, 60, "200 more, not committed")
    finally:
        first.close()  # no commit: the next member reads those 200 again
    _resume_and_check(proxy.bootstrap_servers, topic, group, sent, before, marks)
    checks.check_group_at_end(proxy.bootstrap_servers, topic, group)


def test_proxy_restart_mid_stream_loses_and_duplicates_nothing(kafka, proxy_factory, topic_factory):
    from .conftest import free_ports

    topic = topic_factory(kafka, partitions=PARTITIONS)
    group = f"vr-{uuid.uuid4().hex[:8]}"
    listen, node_base = free_ports(2)
    ports = {"listen_port": listen, "node_port_base": str(node_base - kafka.nodes[0].node_id)}
    proxies = [proxy_factory(kafka, **ports)]
    bootstrap = proxies[0].bootstrap_servers
    sent = checks.produce(bootstrap, topic, 1500)
    consumer = _consumer(bootstrap, group, **{"max.partition.fetch.bytes": 4096, "reconnect.backoff.max.ms": 500})
    consumer.subscribe([f"{topic}.kr{SHARES}"])
    received: checks.Received = []
    try:
        _poll_until(consumer, received, lambda: len(received) >= 500, 60, "500 records")
        _commit_read(consumer, topic, received)
        proxies[0].stop()
        proxies.append(proxy_factory(kafka, **ports))
        _poll_until(consumer, received, lambda: len(received) >= 1000, 90, "1000 records after the restart")
        marks = _commit_read(consumer, topic, received)
        _at_or_lifted(_committed(consumer, topic), marks)
        count = len(received)
        _poll_until(consumer, received, lambda: len(received) >= count + 100, 60, "100 more, not committed")
    finally:
        consumer.close()
    assert len({(p, o) for p, o, _, _ in received}) == len(received), "a record came twice without a restart"
    _resume_and_check(bootstrap, topic, group, sent, received, marks)
    checks.check_group_at_end(bootstrap, topic, group)


def test_read_committed_with_aborted_transactions(kafka, proxy, topic_factory):
    topic = topic_factory(kafka, partitions=PARTITIONS)
    rounds = [([(f"key-{i % 31}".encode(), f"tx{round_}-{i}".encode()) for i in range(150)], round_ % 3 != 1)
              for round_ in range(8)]
    produce_transactions(proxy.bootstrap_servers, topic, rounds)
    committed: list[tuple[bytes, bytes]] = [record for records, commit in rounds if commit for record in records]
    group = f"vt-{uuid.uuid4().hex[:8]}"
    consumer = _consumer(proxy.bootstrap_servers, group, **{"isolation.level": "read_committed"})
    consumer.subscribe([f"{topic}.kr{SHARES}"])
    received: checks.Received = []
    try:
        _poll_until(consumer, received, lambda: len(received) >= len(committed) and _at_end(consumer), 90,
                    "every committed record, positions at the end")
        _commit_read(consumer, topic, received)
        consumer.commit(asynchronous=False)  # the positions, past the final markers
    finally:
        consumer.close()
    assert not [r for r in received if b"tx1-" in r[3] or b"tx4-" in r[3] or b"tx7-" in r[3]]
    checks.check_delivery(committed, [received])
    checks.check_group_at_end(proxy.bootstrap_servers, topic, group)


def test_read_committed_share_after_a_read_uncommitted_read_of_its_partition(kafka, proxy, topic_factory):
    """A read_uncommitted consumer of share 0 reads the partition first; its read is split
    into every share and cached. A read_committed consumer of share 1 then starts at the
    same position: it must not be served that read (it lists no aborted transaction, so
    the aborted records would be handed out), yet it gets every committed record."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    from proxy.records.keyhash import key_hash
    from proxy.virtual.names import share_ranges

    topic = topic_factory(kafka, partitions=1)
    rounds = [([(f"key-{i % 31}".encode(), f"tx{round_}-{i}".encode()) for i in range(120)], round_ % 3 != 1)
              for round_ in range(6)]
    produce_transactions(proxy.bootstrap_servers, topic, rounds)
    one, _ = share_ranges(2)

    def share_of(key: bytes) -> int:
        return 0 if one.start <= key_hash(key, 0) <= one.end else 1

    every = [record for records, _ in rounds for record in records]
    committed = [record for records, commit in rounds if commit for record in records]
    expected = {0: sorted(r for r in every if share_of(r[0]) == 0),
                1: sorted(r for r in committed if share_of(r[0]) == 1)}
    assert expected[0] and expected[1] and len(expected[1]) < len([r for r in every if share_of(r[0]) == 1])

    def read_share(share: int, isolation: str) -> list[tuple[bytes, bytes]]:
        consumer = _consumer(proxy.bootstrap_servers, f"vt-{uuid.uuid4().hex[:8]}", **{"isolation.level": isolation})
        consumer.assign([TopicPartition(f"{topic}.kr2", share, OFFSET_BEGINNING)])
        received: checks.Received = []
        try:
            def at_end() -> bool:
                (tp,) = consumer.position([TopicPartition(f"{topic}.kr2", share)])
                return len(received) >= len(expected[share]) and \
                    tp.offset == consumer.get_watermark_offsets(tp, cached=True)[1]
            _poll_until(consumer, received, at_end, 60, f"share {share} ({isolation}) at the end")
        finally:
            consumer.close()
        return sorted((key, value) for _, _, key, value in received)

    assert read_share(0, "read_uncommitted") == expected[0]  # aborted records included
    got = read_share(1, "read_committed")
    assert not [value for _, value in got if value.startswith((b"tx1-", b"tx4-"))], "aborted records handed out"
    assert got == expected[1]


def test_compacted_topic_reads_like_its_real_partitions(kafka, proxy, topic_factory):
    from confluent_kafka import TopicPartition

    topic = topic_factory(kafka, partitions=PARTITIONS, configs={
        "cleanup.policy": "compact", "segment.ms": "200", "min.cleanable.dirty.ratio": "0.001",
        "min.compaction.lag.ms": "0", "delete.retention.ms": "0"})
    checks.produce(proxy.bootstrap_servers, topic, 2000, keys=40)
    def read_all(bootstrap: str, name: str, partitions: int) -> checks.Received:
        consumer = _consumer(bootstrap, f"vc-{uuid.uuid4().hex[:8]}")
        consumer.assign([TopicPartition(name, p, 0) for p in range(partitions)])
        out: checks.Received = []
        try:
            def at_end() -> bool:
                positions = consumer.position([TopicPartition(name, p) for p in range(partitions)])
                return all(tp.offset == consumer.get_watermark_offsets(tp, cached=True)[1] for tp in positions)

            _poll_until(consumer, out, at_end, 90, f"{name} read to its end")
        finally:
            consumer.close()
        return out

    # Roll the segments (a record after segment.ms) until the cleaner has compacted both.
    def compacted() -> bool:
        if len(read_all(kafka.bootstrap_servers, topic, PARTITIONS)) < 1000:
            return True
        checks.produce(proxy.bootstrap_servers, topic, 2, keys=40, start=2000)
        return False

    wait_until(compacted, timeout=120, interval=2.0, what="the cleaner compacted the topic")
    virtual = read_all(proxy.bootstrap_servers, f"{topic}.kr{SHARES}", VIRTUAL_PARTITIONS)
    by_real = sorted((p // SHARES, o, k, v) for p, o, k, v in virtual)
    compacted_now = read_all(kafka.bootstrap_servers, topic, PARTITIONS)
    assert by_real == sorted(compacted_now)
    checks.check_order(virtual)


def test_leader_stop_on_three_nodes_loses_and_duplicates_nothing(kafka_cluster, cluster_proxy, topic_factory):
    from confluent_kafka import Producer

    from .test_proxy_failover import _leader

    topic = topic_factory(kafka_cluster, partitions=PARTITIONS, replication_factor=3,
                          configs={"min.insync.replicas": "2"})
    bootstrap = cluster_proxy.bootstrap_servers
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, "message.timeout.ms": 120000})
    sent: list[tuple[bytes, bytes]] = []

    def produce(stem: str) -> None:
        for i in range(800):
            key, value = f"key-{i % 53}".encode(), f"{stem}-{i}".encode()
            producer.produce(topic, key=key, value=value)
            sent.append((key, value))
            producer.poll(0)
        assert producer.flush(120) == 0

    group = f"vl-{uuid.uuid4().hex[:8]}"
    consumer = _consumer(bootstrap, group)
    consumer.subscribe([f"{topic}.kr{SHARES}"])
    received: checks.Received = []
    try:
        produce("before")
        _poll_until(consumer, received, lambda: len(received) >= 800, 90, "the first 800")
        _commit_read(consumer, topic, received)
        leader = _leader(kafka_cluster, topic)
        kafka_cluster.stop_node(leader)
        produce("after")
        _poll_until(consumer, received, lambda: len(received) >= 1600 and _at_end(consumer), 120,
                    "every record after the leader stopped, positions at the end")
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    checks.check_delivery(sent, [received])
    checks.check_group_at_end(bootstrap, topic, group, timeout=60)


def test_a_share_below_the_log_start_resets_alone(kafka, proxy, topic_factory):
    """One consumer holds both shares of a partition: share 0 at offset 10, below the log
    start (records deleted up to 100), share 1 at 150. The proxy reads the partition once
    from 10 and the broker refuses it; only share 0 may be reset (here to the log end, the
    clients' default): share 1 gets every one of its records from 150 on."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from proxy.records.keyhash import key_hash
    from proxy.virtual.names import share_ranges

    topic = topic_factory(kafka, partitions=1)
    sent = checks.produce(proxy.bootstrap_servers, topic, 300)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    (future,) = admin.delete_records([TopicPartition(topic, 0, 100)]).values()
    assert future.result(timeout=30).low_watermark == 100
    one, _ = share_ranges(2)
    expected = [(offset, key) for offset, (key, _) in enumerate(sent)
                if offset >= 150 and not one.start <= key_hash(key, 0) <= one.end]
    consumer = _consumer(proxy.bootstrap_servers, f"vt-{uuid.uuid4().hex[:8]}", **{"auto.offset.reset": "latest"})
    consumer.assign([TopicPartition(f"{topic}.kr2", 0, 10), TopicPartition(f"{topic}.kr2", 1, 150)])
    received: list[tuple[int, int, bytes]] = []
    errors: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while len([r for r in received if r[0] == 1]) < len(expected):
            assert time.monotonic() < deadline, f"share 1 got {len(received)} of {len(expected)}; errors {errors}"
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error():
                errors.append(str(message.error()))  # a client may report share 0's reset
                continue
            received.append((message.partition(), message.offset(), message.key()))
        time.sleep(1)  # anything share 0 would still get
        while (message := consumer.poll(0.2)) is not None:
            if not message.error():
                received.append((message.partition(), message.offset(), message.key()))
    finally:
        consumer.close()
    assert [(offset, key) for partition, offset, key in received if partition == 1] == expected
    assert not [r for r in received if r[0] == 0], "share 0 reset to the log end: nothing more was written"
