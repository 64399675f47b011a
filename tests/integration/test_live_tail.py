"""Every consumption path, with records written while the consumers read.

A producer (acks=all, idempotent) writes small bursts with pauses and idle gaps longer
than a fetch's wait, so consumers reach the log end, wait there and leave it again, and
two consumers of one partition read the same offset at different times and get different
amounts of data. Each test then checks, with ``harness.history``: every acknowledged
record was handed out, none twice, each key's records in offset order, and the group's
committed offset at the coordinator (what kafka-consumer-groups and lag exporters read)
reached the log end.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import trio

from harness.clients import rdkafka_virtual_member
from harness.history import History, check
from harness.live import LiveProducer
from proxy.client import Consumer, RetriableError, TopicPartition, equal_shares
from tests.integration import virtual_checks as checks

pytestmark = pytest.mark.kafka

RECORDS = 3000
SECONDS = 8.0
DEADLINE = 90.0  # seconds for the consumers to catch up after the producer is done


def _log_end(bootstrap: str, topic: str, partitions: int) -> dict[tuple[str, int], int]:
    from confluent_kafka import Consumer as RdConsumer
    from confluent_kafka import TopicPartition as RdPartition

    probe = RdConsumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4().hex[:6]}"})
    try:
        return {(topic, p): probe.get_watermark_offsets(RdPartition(topic, p), timeout=10)[1]
                for p in range(partitions)}
    finally:
        probe.close()


def _committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[tuple[str, int], int]:
    """The group's committed offsets as the coordinator holds them (read from the broker)."""
    from confluent_kafka import Consumer as RdConsumer
    from confluent_kafka import TopicPartition as RdPartition

    probe = RdConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        found = probe.committed([RdPartition(topic, p) for p in range(partitions)], timeout=10)
        return {(topic, tp.partition): tp.offset for tp in found}
    finally:
        probe.close()


def _at_log_end(kafka, group: str, topic: str, partitions: int) -> bool:
    return _committed(kafka.bootstrap_servers, group, topic, partitions) == _log_end(
        kafka.bootstrap_servers, topic, partitions)


async def _until(condition, timeout: float) -> bool:
    """Poll ``condition`` (a blocking call, run on a thread) until true or ``timeout``."""
    deadline = trio.current_time() + timeout
    while trio.current_time() < deadline:
        if await trio.to_thread.run_sync(condition):
            return True
        await trio.sleep(0.25)
    return False


def _verdict(kafka, history: History, topic: str, partitions: int, group: str | None):
    log_end = _log_end(kafka.bootstrap_servers, topic, partitions)
    committed = _committed(kafka.bootstrap_servers, group, topic, partitions) if group else None
    return check(history, committed=committed, log_end=log_end if group else None)


# -- assign mode (proxy.client.Consumer) -------------------------------------------------

ASSIGNED = {
    # members, groups ("one": one group for all, "each": a group per member, None: no commits)
    "two-members-one-group": (2, "one"),
    "two-members-a-group-each": (2, "each"),
    "two-members-no-commits": (2, None),
    "one-member-whole-partition": (1, "one"),
}


@pytest.mark.parametrize("variant", list(ASSIGNED))
async def test_assigned_range_members_hand_out_every_record_written_while_they_read(kafka, proxy, topic_factory,
                                                                                    variant):
    members, groups = ASSIGNED[variant]
    topic = topic_factory(kafka, partitions=1)
    tp = TopicPartition(topic, 0)
    history = History()
    producer = LiveProducer(proxy.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS, seed=22)
    stop = trio.Event()

    def group_of(i: int) -> str | None:
        return None if groups is None else f"live-{topic}" + (f"-{i}" if groups == "each" else "")

    async def member(i: int) -> None:
        group = group_of(i)
        options = {"group_id": group, "allow_individual_commit": True} if group else {}
        async with Consumer(proxy.bootstrap_servers, client_id=f"m{i}", auto_offset_reset="earliest",
                            **options) as consumer:
            consumer.assign({tp: [equal_shares(members)[i]] if members > 1 else []})
            while not stop.is_set():
                for record in await consumer.poll(0.3):
                    history.deliver(f"m{i}", record.topic, record.partition, record.offset, record.key)
                    if group:
                        consumer.mark_processed(record)
                if group:
                    await consumer.commit()

    async with trio.open_nursery() as nursery:
        for i in range(members):
            nursery.start_soon(member, i)
        producer.start()
        await _until(lambda: producer.done and history.missing() == 0, SECONDS + DEADLINE)
        if groups == "one":
            await _until(lambda: _at_log_end(kafka, group_of(0), topic, 1), 30)
        stop.set()
    producer.join()
    assert producer.failed == 0, producer.errors
    verdict = _verdict(kafka, history, topic, 1, group_of(0) if groups == "one" else None)
    assert verdict.acknowledged == RECORDS
    assert verdict.ok(), verdict.summary()


async def test_range_members_starting_at_the_log_end_apart_commit_only_their_own_records(kafka, proxy,
                                                                                         topic_factory):
    """Two members of one group start at the log end ("latest", nothing committed) a moment
    apart while records are written. Neither commits the other's records as skipped: each
    hands out every record of its range from where it started, none written after its reset
    is skipped, and the group's committed offset still reaches the log end. (The second
    member may find the first one's commits and start at the group's S instead of resetting:
    then it hands out its records from there.)"""
    from proxy.records.keyhash import key_hash

    topic = topic_factory(kafka, partitions=1)
    tp = TopicPartition(topic, 0)
    group = f"live-{topic}"
    shares = equal_shares(2)
    history = History()
    producer = LiveProducer(proxy.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS, seed=26)
    stop = trio.Event()
    bounds: dict[int, tuple[int, int]] = {}  # member -> (log end before it started, after its reset)

    def log_end() -> int:
        return _log_end(kafka.bootstrap_servers, topic, 1)[(topic, 0)]

    async def member(i: int) -> None:
        before = await trio.to_thread.run_sync(log_end)
        async with Consumer(proxy.bootstrap_servers, group_id=group, client_id=f"m{i}", allow_individual_commit=True,
                            auto_offset_reset="latest") as consumer:
            consumer.assign({tp: [shares[i]]})
            while not stop.is_set():
                for record in await consumer.poll(0.3):
                    history.deliver(f"m{i}", record.topic, record.partition, record.offset, record.key)
                    consumer.mark_processed(record)
                if i not in bounds and consumer.position(tp) is not None:
                    bounds[i] = (before, await trio.to_thread.run_sync(log_end))
                await consumer.commit()

    async with trio.open_nursery() as nursery:
        producer.start()
        await _until(lambda: len(history.acks) > 200, 30)
        nursery.start_soon(member, 0)
        await _until(lambda: len(history.acks) > 260, 30)  # a few bursts later
        nursery.start_soon(member, 1)
        await _until(lambda: producer.done, SECONDS + DEADLINE)
        await _until(lambda: _at_log_end(kafka, group, topic, 1), DEADLINE)
        stop.set()
    producer.join()
    assert producer.failed == 0, producer.errors
    assert set(bounds) == {0, 1}
    for i, (before, after) in bounds.items():
        own = sorted(a.offset for a in history.acks
                     if shares[i].start <= key_hash(a.key, a.offset) <= shares[i].end)
        handed = sorted(d.offset for d in history.deliveries if d.member == f"m{i}")
        assert handed, f"member {i} handed out nothing"
        first = handed[0]
        if i == 0:
            assert before <= first, f"member 0 handed out {first}, written before it started (log end {before})"
        assert handed == [o for o in own if o >= first], f"member {i} skipped records of its own range after {first}"
        assert all(o < after for o in own if o < first), f"member {i} skipped its records written after its reset"
    verdict = _verdict(kafka, history, topic, 1, group)
    assert not verdict.duplicates and not verdict.strays and not verdict.order_violations, verdict.summary()
    assert not verdict.committed_behind, verdict.summary()


# -- consumer groups ----------------------------------------------------------------------

GROUPS = {
    # members, partitions
    "ranges-split": (4, 3),
    "whole-partitions": (3, 3),
}


@pytest.mark.parametrize("variant", list(GROUPS))
async def test_group_members_hand_out_every_record_written_while_they_read(kafka, proxy, topic_factory, variant):
    """Members join while records are written (the group rebalances under live traffic);
    each commits what it processed after every poll."""
    members, partitions = GROUPS[variant]
    topic = topic_factory(kafka, partitions=partitions)
    group = f"live-{topic}"
    history = History()
    producer = LiveProducer(proxy.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS, seed=23)
    stop = trio.Event()
    lost: list[object] = []

    async def member(i: int) -> None:
        async with Consumer(proxy.bootstrap_servers, group_id=group, client_id=f"m{i}", allow_individual_commit=True,
                            auto_offset_reset="earliest", heartbeat_interval_ms=500, session_timeout_ms=10_000,
                            max_poll_records=50) as consumer:
            consumer.subscribe([topic])
            while not stop.is_set():
                for record in await consumer.poll(0.3):
                    history.deliver(f"m{i}", record.topic, record.partition, record.offset, record.key)
                    consumer.mark_processed(record)
                try:
                    await consumer.commit()
                except RetriableError:
                    pass  # a rebalance is completing: the marks stay pending for the next commit
                if consumer.lost():
                    lost.append(consumer.lost())

    async with trio.open_nursery() as nursery:
        producer.start()
        for i in range(members):
            nursery.start_soon(member, i)
            await trio.sleep(0.5)  # members join one by one, while the producer writes
        await _until(lambda: producer.done and history.missing() == 0, SECONDS + DEADLINE)
        await _until(lambda: _at_log_end(kafka, group, topic, partitions), 30)
        stop.set()
    producer.join()
    assert producer.failed == 0, producer.errors
    assert not lost, lost
    verdict = _verdict(kafka, history, topic, partitions, group)
    assert verdict.acknowledged == RECORDS
    assert verdict.ok(), verdict.summary()


# -- virtual range topics ------------------------------------------------------------------

SHARES = 4
VIRTUAL_PARTITIONS = 2


def test_librdkafka_members_of_a_virtual_topic_hand_out_every_record_written_while_they_read(kafka, proxy,
                                                                                               topic_factory):
    topic = topic_factory(kafka, partitions=VIRTUAL_PARTITIONS)
    virtual = f"{topic}.kr{SHARES}"
    group = f"live-{topic}"
    history = History()
    producer = LiveProducer(proxy.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS, seed=24)
    stop = threading.Event()
    errors: list[str] = []

    threads = [threading.Thread(target=rdkafka_virtual_member, daemon=True,
                                args=(proxy.bootstrap_servers, group, virtual, topic, SHARES, history, f"m{i}", stop,
                                      errors))
               for i in range(3)]
    producer.start()
    for thread in threads:
        thread.start()
        time.sleep(0.5)  # members join one by one, while the producer writes
    deadline = time.monotonic() + SECONDS + DEADLINE
    while time.monotonic() < deadline and not (producer.done and history.missing() == 0):
        time.sleep(0.2)
    # the members go on until the real topic's committed offsets reach its end
    end = time.monotonic() + 30
    while time.monotonic() < end and not _at_log_end(kafka, group, topic, VIRTUAL_PARTITIONS):
        time.sleep(0.5)
    stop.set()
    for thread in threads:
        thread.join(60)
    producer.join()
    assert producer.failed == 0, producer.errors
    assert not errors, errors[:5]
    verdict = _verdict(kafka, history, topic, VIRTUAL_PARTITIONS, group)
    assert verdict.acknowledged == RECORDS
    assert verdict.ok(), verdict.summary()


def test_java_console_consumers_of_a_virtual_topic_hand_out_every_record_written_while_they_read(kafka, proxy,
                                                                                                  topic_factory):
    """Kafka's own console consumer, one JVM per member, auto-commit on; the group settles
    before the producer starts (auto-commit re-delivers across a rebalance, as it does
    against a broker), then every record is written while they read."""
    from confluent_kafka.admin import AdminClient

    topic = topic_factory(kafka, partitions=VIRTUAL_PARTITIONS)
    virtual = f"{topic}.kr{SHARES}"
    group = f"live-{topic}"
    members = 3
    history = History()
    outputs: list[checks.Received | BaseException] = [[] for _ in range(members)]

    def member(index: int) -> None:
        try:
            outputs[index] = checks.console_member(proxy.bootstrap_servers, virtual, group, idle_ms=12000)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            outputs[index] = exc

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})

    def settled() -> bool:
        description = admin.describe_consumer_groups([group])[group].result(10)
        sizes = [len(m.assignment.topic_partitions) for m in description.members]
        return len(sizes) == members and all(sizes) and sum(sizes) == SHARES * VIRTUAL_PARTITIONS

    threads = [threading.Thread(target=member, args=(i,), daemon=True) for i in range(members)]
    for thread in threads:
        thread.start()
    from harness.wait import wait_until

    wait_until(settled, timeout=120, interval=0.5, what="three console consumers sharing the virtual partitions")
    producer = LiveProducer(proxy.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS,
                            seed=25).start()
    producer.join()
    for thread in threads:
        thread.join(200)
    failures = [o for o in outputs if isinstance(o, BaseException)]
    assert not failures, failures
    for index, received in enumerate(outputs):
        assert not isinstance(received, BaseException)
        for partition, offset, key, _ in received:
            history.deliver(f"m{index}", topic, partition // SHARES, offset, key)
    assert producer.failed == 0, producer.errors
    verdict = check(history)
    assert verdict.acknowledged == RECORDS
    assert verdict.ok(), verdict.summary()
    wait_until(lambda: _at_log_end(kafka, group, topic, VIRTUAL_PARTITIONS), timeout=30,
               what=lambda: f"committed {_committed(kafka.bootstrap_servers, group, topic, VIRTUAL_PARTITIONS)} "
                            f"at the log end {_log_end(kafka.bootstrap_servers, topic, VIRTUAL_PARTITIONS)}")
