"""The trio key-range consumer (proxy.client) through the real proxy, against a real broker."""

from __future__ import annotations

from collections import defaultdict

import pytest
import trio

from harness.transactions import produce_transactions
from proxy.client import (
    Consumer,
    IllegalStateError,
    OffsetOutOfRangeError,
    RangeFetchNotSupportedError,
    TopicPartition,
    equal_shares,
)
from proxy.ranges import contains
from proxy.records.keyhash import key_hash

DEADLINE = 30  # seconds any one test may spend consuming


def _produce(bootstrap: str, topic: str, per_partition: dict[int, int], keys: int = 40) -> dict[int, list]:
    """Produce keyed records (values carry a per-key sequence number); returns per
    partition the (key, value) pairs in offset order."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    sent: dict[int, list] = {}
    sequence: dict[bytes, int] = defaultdict(int)
    for partition, count in per_partition.items():
        sent[partition] = []
        for i in range(count):
            key = None if i % 17 == 0 else f"key-{(i * 7) % keys}".encode()
            value = f"{partition}:{i}:{sequence[key] if key else -1}".encode()
            if key:
                sequence[key] += 1
            producer.send(topic, key=key, value=value, partition=partition)
            sent[partition].append((key, value))
        producer.flush(30)  # one partition at a time: offsets follow the send order
    producer.close()
    return sent


async def _consume_until(consumer: Consumer, done, *, timeout: float = DEADLINE) -> list:
    got = []
    with trio.fail_after(timeout):
        while not done(got):
            got.extend(await consumer.poll(0.5))
    return got


async def test_four_range_consumers_share_one_partition_exactly_once(kafka, proxy, topic_factory):
    topic = topic_factory(kafka)
    sent = _produce(kafka.bootstrap_servers, topic, {0: 600})[0]
    tp = TopicPartition(topic, 0)
    shares = equal_shares(4)
    per_share: list[list] = [[] for _ in shares]
    metrics = []

    async def member(i: int) -> None:
        async with Consumer(proxy.bootstrap_servers, client_id=f"member-{i}", auto_offset_reset="earliest",
                            max_poll_records=50, max_partition_fetch_bytes=4096) as consumer:
            assert consumer.range_fetch_supported
            consumer.assign({tp: [shares[i]]})
            with trio.fail_after(DEADLINE):
                while consumer.position(tp) != len(sent):
                    per_share[i].extend(await consumer.poll(0.5))
            metrics.append(consumer.metrics())

    async with trio.open_nursery() as nursery:
        for i in range(len(shares)):
            nursery.start_soon(member, i)

    owners = defaultdict(list)
    for i, records in enumerate(per_share):
        offsets = [r.offset for r in records]
        assert offsets == sorted(offsets)
        for record in records:
            assert contains([shares[i]], key_hash(record.key, record.offset))
            assert (record.key, record.value) == sent[record.offset]
            owners[record.offset].append(i)
    assert sorted(owners) == list(range(len(sent)))
    assert all(len(who) == 1 for who in owners.values()), "a record reached two consumers"
    # per-key order: each key's sequence numbers arrive 0, 1, 2, ... at its one consumer
    for records in per_share:
        seen = defaultdict(list)
        for record in records:
            if record.key is not None:
                seen[record.key].append(int(record.value.split(b":")[2]))
        for sequence in seen.values():
            assert sequence == list(range(len(sequence)))
    for m in metrics:
        assert m["records_outside_ranges"] == 0
        assert m["unfiltered_range_responses"] == 0


async def test_fair_polling_serves_cold_partitions_beside_a_hot_one(kafka, proxy, topic_factory):
    topic = topic_factory(kafka, partitions=4)
    _produce(kafka.bootstrap_servers, topic, {0: 400, 1: 5, 2: 5, 3: 5})
    partitions = [TopicPartition(topic, p) for p in range(4)]
    async with Consumer(proxy.bootstrap_servers, auto_offset_reset="earliest", max_poll_records=10) as consumer:
        consumer.assign(partitions)
        counts: dict[int, int] = defaultdict(int)
        polls = 0
        with trio.fail_after(DEADLINE):
            while any(counts[p] < 5 for p in (1, 2, 3)):
                batch = await consumer.poll(0.5)
                assert len(batch) <= 10
                polls += 1
                for record in batch:
                    counts[record.partition] += 1
        # the hot partition's 400 buffered records did not keep the cold ones waiting
        assert counts[0] < 100, dict(counts)
        # and the hot one is not starved either once the cold ones are drained
        with trio.fail_after(DEADLINE):
            while counts[0] < 400:
                for record in await consumer.poll(0.5):
                    counts[record.partition] += 1
        assert dict(counts) == {0: 400, 1: 5, 2: 5, 3: 5}


async def test_current_lag_matches_list_offsets(kafka, proxy, topic_factory):
    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition as KafkaTopicPartition

    topic = topic_factory(kafka)
    _produce(kafka.bootstrap_servers, topic, {0: 120})
    tp = TopicPartition(topic, 0)
    async with Consumer(proxy.bootstrap_servers, auto_offset_reset="earliest", max_poll_records=30) as consumer:
        consumer.assign([tp])
        assert consumer.current_lag(tp) is None  # nothing fetched yet: unknown, not zero
        got = await _consume_until(consumer, lambda got: len(got) > 0)
        position = consumer.position(tp)
        assert position == got[-1].offset + 1 == 30
        lag = consumer.current_lag(tp)
        end = KafkaConsumer(bootstrap_servers=kafka.bootstrap_servers).end_offsets([KafkaTopicPartition(topic, 0)])
        assert lag == list(end.values())[0] - position == 90
        # a poll served from the buffer reports the lag after what it returned
        batch = await consumer.poll(0)
        meta = batch.metadata()[tp]
        assert meta.position == consumer.position(tp) == 60
        assert meta.lag == consumer.current_lag(tp) == 60
        assert (meta.log_start_offset, meta.end_offset) == (0, 120)


async def test_offset_out_of_range_resets_per_policy(kafka, proxy, topic_factory):
    topic = topic_factory(kafka)
    _produce(kafka.bootstrap_servers, topic, {0: 20})
    tp = TopicPartition(topic, 0)
    async with Consumer(proxy.bootstrap_servers, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 1000)
        got = await _consume_until(consumer, lambda got: len(got) >= 20)
        assert [r.offset for r in got] == list(range(20))
    async with Consumer(proxy.bootstrap_servers, auto_offset_reset="latest") as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 1000)
        with trio.fail_after(DEADLINE):
            while consumer.position(tp) != 20:
                assert not await consumer.poll(0.2)
        assert consumer.metrics()["offset_resets"] == 1
    async with Consumer(proxy.bootstrap_servers, auto_offset_reset="none") as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 1000)
        with pytest.raises(OffsetOutOfRangeError) as caught:
            with trio.fail_after(DEADLINE):
                await consumer.poll(5)
        assert (caught.value.code, caught.value.name) == (1, "OFFSET_OUT_OF_RANGE")


async def test_ranges_refused_where_the_cluster_cannot_filter(kafka, topic_factory):
    topic = topic_factory(kafka)
    _produce(kafka.bootstrap_servers, topic, {0: 10})
    tp = TopicPartition(topic, 0)
    async with Consumer(kafka.bootstrap_servers, auto_offset_reset="earliest") as consumer:
        assert not consumer.range_fetch_supported
        with pytest.raises(RangeFetchNotSupportedError, match="keyrange.fetch"):
            consumer.assign({tp: [equal_shares(2)[0]]})
        consumer.assign({tp: []})  # the whole partition needs no extension
        got = await _consume_until(consumer, lambda got: len(got) >= 10)
        assert [r.offset for r in got] == list(range(10))


async def test_plain_commit_then_a_new_consumer_of_the_group_resumes(kafka, proxy, topic_factory):
    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition as KafkaTopicPartition

    topic = topic_factory(kafka)
    _produce(kafka.bootstrap_servers, topic, {0: 30})
    tp = TopicPartition(topic, 0)
    group = f"{topic}-group"
    async with Consumer(proxy.bootstrap_servers, group_id=group, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        assert await consumer.committed([tp]) == {tp: None}
        got = await _consume_until(consumer, lambda got: len(got) >= 30)
        assert [r.offset for r in got] == list(range(30))
        await consumer.commit()
        assert await consumer.committed([tp]) == {tp: 30}
        consumer.assign({tp: [equal_shares(2)[0]]})
        with pytest.raises(IllegalStateError, match="key ranges"):
            await consumer.commit({tp: 10})
    standard = KafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, group_id=group, enable_auto_commit=False)
    try:  # the broker itself holds the offset, as standard clients see it
        assert standard.committed(KafkaTopicPartition(topic, 0)) == 30
    finally:
        standard.close()
    _produce(kafka.bootstrap_servers, topic, {0: 5})
    async with Consumer(proxy.bootstrap_servers, group_id=group, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        got = await _consume_until(consumer, lambda got: len(got) >= 5)
        assert [r.offset for r in got] == list(range(30, 35))
        assert consumer.metrics()["offset_resets"] == 0  # started from the committed offset


async def test_a_dropped_connection_is_reopened(kafka, proxy, topic_factory):
    topic = topic_factory(kafka)
    _produce(kafka.bootstrap_servers, topic, {0: 40})
    tp = TopicPartition(topic, 0)
    async with Consumer(proxy.bootstrap_servers, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        got = await _consume_until(consumer, lambda got: len(got) >= 40)
        for connection in list(consumer._connections.by_node.values()):  # the broker side goes away
            await connection.conn._frames.aclose()
        _produce(kafka.bootstrap_servers, topic, {0: 10})
        got += await _consume_until(consumer, lambda more: len(got) + len(more) >= 50)
        assert [r.offset for r in got] == list(range(50))
        assert consumer.metrics()["reconnects"] == 1


async def test_read_committed_skips_aborted_transactions(kafka, proxy, topic_factory):
    topic = topic_factory(kafka)
    rounds = [([(f"k{i % 7}".encode(), f"r{round_number}-{i}".encode()) for i in range(20)], round_number % 2 == 0)
              for round_number in range(4)]
    produce_transactions(kafka.bootstrap_servers, topic, rounds)
    committed = [value for records, commit in rounds if commit for _, value in records]
    tp = TopicPartition(topic, 0)
    async with Consumer(proxy.bootstrap_servers, auto_offset_reset="earliest",
                        isolation_level="read_committed") as consumer:
        consumer.assign({tp: []})
        got = await _consume_until(consumer, lambda got: len(got) >= len(committed))
        # everything up to the last marker (offset 83) has been read: nothing more is coming
        with trio.fail_after(DEADLINE):
            while consumer.position(tp) < 84:
                got.extend(await consumer.poll(0.2))
        assert [r.value for r in got] == committed
        assert consumer.metrics()["aborted_records_dropped"] == 40
        assert consumer.current_lag(tp) == 0


async def test_the_next_records_are_fetched_while_the_application_works(kafka, proxy, topic_factory):
    topic = topic_factory(kafka)
    for _ in range(10):  # ten batches of 20 records; a fetch of 1 KB returns about one
        _produce(kafka.bootstrap_servers, topic, {0: 20})
    tp = TopicPartition(topic, 0)
    # at the end of the log the background fetch long-polls for 20 s; leaving the block
    # cancels it at once, well inside this deadline
    with trio.fail_after(DEADLINE):
        async with Consumer(proxy.bootstrap_servers, auto_offset_reset="earliest", max_poll_records=1000,
                            max_partition_fetch_bytes=1024, fetch_max_wait_ms=20_000) as consumer:
            consumer.assign([tp])
            first = await _consume_until(consumer, lambda got: len(got) > 0)
            # the poll emptied the buffer: the next slice is fetched in the background
            while not consumer._state.buffers.has_buffered(tp):
                await trio.sleep(0.01)
            assert consumer.metrics()["fetch_requests"] == 2
            rest = await _consume_until(consumer, lambda got: len(first) + len(got) >= 200)
            assert [r.offset for r in first + rest] == list(range(200))
            while not consumer._fetcher.background_running:
                assert not await consumer.poll(0)
    with pytest.raises(KeyError):  # an error in the block propagates as itself, not grouped
        async with Consumer(proxy.bootstrap_servers, auto_offset_reset="earliest") as consumer:
            consumer.assign([tp])
            await _consume_until(consumer, lambda got: len(got) > 0)
            raise KeyError("the application's own error")
