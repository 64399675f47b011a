"""The trio consumer sharing a partition by chunks (docs/cooperative-fetch.md) against a
real broker, with records written while it reads: assign mode with a hot key, a member
lost with chunks leased, and a consumer group with ``partition_sharing="cooperative"``.
Every test counts acknowledged against handed-out records."""

from __future__ import annotations

import pytest
import trio

from harness.history import History, check
from harness.live import LiveProducer
from proxy.client import Consumer, RetriableError, TopicPartition
from tests.integration.coop_members import hot_key
from tests.integration.test_live_tail import _at_log_end, _until

pytestmark = pytest.mark.kafka

RECORDS = 3000
SECONDS = 8.0
DEADLINE = 90.0


async def test_members_share_a_live_partition_evenly_whatever_the_keys(kafka, proxy, topic_factory):
    topic = topic_factory(kafka, partitions=1)
    tp = TopicPartition(topic, 0)
    group = f"coop-{topic}"
    history = History()
    producer = LiveProducer(kafka.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS, seed=31,
                            key_of=hot_key)
    stop = trio.Event()
    handed: dict[str, int] = {}

    async def member(name: str) -> None:
        async with Consumer(proxy.bootstrap_servers, group_id=group, client_id=name, auto_offset_reset="earliest",
                            allow_individual_commit=True,
                            max_partition_fetch_bytes=2048) as consumer:
            consumer.assign([tp], cooperative=True)
            while not stop.is_set():
                for record in await consumer.poll(0.3):
                    history.deliver(name, record.topic, record.partition, record.offset, record.key)
                    handed[name] = handed.get(name, 0) + 1
                    await trio.sleep(0.0005)  # the work: members that are busy fetch less
                    consumer.mark_processed(record)
                await consumer.commit_processed()

    async with trio.open_nursery() as nursery:
        for i in range(4):
            nursery.start_soon(member, f"m{i}")
        producer.start()
        await _until(lambda: producer.done and history.missing() == 0, SECONDS + DEADLINE)
        await _until(lambda: _at_log_end(kafka, group, topic, 1), 30)
        stop.set()
    producer.join()
    assert producer.failed == 0, producer.errors
    verdict = check(history, keyed_order=False)
    assert verdict.acknowledged == RECORDS
    assert verdict.ok(), verdict.summary()
    assert _at_log_end(kafka, group, topic, 1), "the group's committed offset did not reach the log end"
    assert len(handed) == 4 and min(handed.values()) >= RECORDS // 10, handed


async def test_a_member_lost_with_chunks_leased_loses_nothing(kafka, proxy_factory, topic_factory):
    proxy = proxy_factory(kafka, **{"cooperative.fetch.lease.ms": "2000"})
    topic = topic_factory(kafka, partitions=1)
    tp = TopicPartition(topic, 0)
    group = f"coop-{topic}"
    history = History()
    producer = LiveProducer(kafka.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS, seed=37)
    stop = trio.Event()
    lost: set[int] = set()

    async def member(name: str, *, dies_after: int | None = None) -> None:
        async with Consumer(proxy.bootstrap_servers, group_id=group, client_id=name, auto_offset_reset="earliest",
                            allow_individual_commit=True,
                            max_partition_fetch_bytes=2048) as consumer:
            consumer.assign([tp], cooperative=True)
            taken = 0
            while not stop.is_set():
                for record in await consumer.poll(0.3):
                    history.deliver(name, record.topic, record.partition, record.offset, record.key)
                    if dies_after is not None:
                        lost.add(record.offset)
                        taken += 1
                    else:
                        consumer.mark_processed(record)
                if dies_after is not None and taken >= dies_after:
                    return  # gone without committing: its chunks stay leased
                await consumer.commit_processed()

    async with trio.open_nursery() as nursery:
        producer.start()
        await _until(lambda: len(history.acks) > 300, 30)
        await member("dies", dies_after=100)
        for i in range(2):
            nursery.start_soon(member, f"m{i}")
        await _until(lambda: producer.done and history.missing() == 0, SECONDS + DEADLINE)
        await _until(lambda: _at_log_end(kafka, group, topic, 1), 30)
        stop.set()
    producer.join()
    verdict = check(history, keyed_order=False)
    assert not verdict.lost and not verdict.strays, verdict.summary()
    again = {rid[2] for rid in verdict.duplicates}
    assert lost and lost <= again, "the lost member's records are handed out again"
    assert _at_log_end(kafka, group, topic, 1)


async def test_group_members_beyond_the_partitions_share_them_cooperatively(kafka, proxy_factory, topic_factory):
    # a chunk held by a member that lost it in a rebalance comes back after its lease
    proxy = proxy_factory(kafka, **{"cooperative.fetch.lease.ms": "5000"})
    topic = topic_factory(kafka, partitions=2)
    group = f"coop-group-{topic}"
    history = History()
    producer = LiveProducer(kafka.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS, seed=41)
    stop = trio.Event()
    handed: dict[str, int] = {}

    async def member(name: str) -> None:
        async with Consumer(proxy.bootstrap_servers, group_id=group, client_id=name, auto_offset_reset="earliest",
                            allow_individual_commit=True, partition_sharing="cooperative",
                            max_partition_fetch_bytes=4096) as consumer:
            consumer.subscribe([topic])
            while not stop.is_set():
                for record in await consumer.poll(0.3):
                    history.deliver(name, record.topic, record.partition, record.offset, record.key)
                    handed[name] = handed.get(name, 0) + 1
                    consumer.mark_processed(record)
                await consumer.commit_processed()

    async with trio.open_nursery() as nursery:
        for i in range(5):
            nursery.start_soon(member, f"m{i}")
        producer.start()
        await _until(lambda: producer.done and history.missing() == 0, SECONDS + DEADLINE)
        await _until(lambda: _at_log_end(kafka, group, topic, 2), 30)
        stop.set()
    producer.join()
    verdict = check(history, keyed_order=False)
    assert verdict.acknowledged == RECORDS
    assert not verdict.lost and not verdict.strays, verdict.summary()
    # joins and rebalances at the start may hand a chunk out twice (a lease ends with its
    # member's generation); never more than a few chunks' worth
    assert verdict.redelivered <= RECORDS // 20, verdict.summary()
    assert _at_log_end(kafka, group, topic, 2)
    assert len(handed) == 5, handed


async def test_the_partition_leader_killed_on_three_nodes_loses_nothing(kafka_cluster, proxy_factory, topic_factory):
    """kill -9 of the partition's leader while three members share it and records are
    written: the members follow the new leader through the proxy, the marker and leases
    stay with the proxy, and every acknowledged record is handed out."""
    from .test_proxy_failover import _leader

    proxy = proxy_factory(kafka_cluster, **{"cooperative.fetch.lease.ms": "5000"})
    topic = topic_factory(kafka_cluster, partitions=1, replication_factor=3, configs={"min.insync.replicas": "2"})
    tp = TopicPartition(topic, 0)
    group = f"coop-{topic}"
    history = History()
    producer = LiveProducer(kafka_cluster.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS,
                            seed=43, config={"message.timeout.ms": 120_000})
    stop = trio.Event()
    killed: list[int] = []

    async def member(name: str) -> None:
        async with Consumer(proxy.bootstrap_servers, group_id=group, client_id=name, auto_offset_reset="earliest",
                            allow_individual_commit=True, max_partition_fetch_bytes=2048,
                            retry_backoff_ms=50) as consumer:
            consumer.assign([tp], cooperative=True)
            while not stop.is_set():
                for record in await consumer.poll(0.3):
                    history.deliver(name, record.topic, record.partition, record.offset, record.key)
                    consumer.mark_processed(record)
                try:
                    await consumer.commit_processed()
                except RetriableError:
                    pass  # the coordinator moved with the killed broker: the next commit carries them

    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(member, f"m{i}")
        producer.start()
        await _until(lambda: len(history.deliveries) > RECORDS // 4, 60)
        killed.append(await trio.to_thread.run_sync(_leader, kafka_cluster, topic))
        await trio.to_thread.run_sync(kafka_cluster.kill_node, killed[0])
        await _until(lambda: producer.done and history.missing() == 0, SECONDS + DEADLINE)
        await _until(lambda: _at_log_end(kafka_cluster, group, topic, 1), 60)
        stop.set()
    producer.join()
    assert producer.failed == 0, producer.errors
    verdict = check(history, keyed_order=False)
    assert verdict.acknowledged == RECORDS
    assert not verdict.lost and not verdict.strays, verdict.summary()
    assert _at_log_end(kafka_cluster, group, topic, 1), "the group's committed offset did not reach the log end"
