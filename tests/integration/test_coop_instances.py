"""Cooperative fetch across several proxy instances (docs/high-availability.md): two or
three port-per-broker proxies in front of one broker, the cooperative members of one group
spread over them as a load balancer in front of proxy replicas would spread them, records
written while they read (half of them under one key). Chunks are granted through
``__cooperative_fetch_grants``, so no record is handed out twice while no member fails;
with one instance killed -9 mid-stream and its members reconnecting to another, nothing is
lost and only what the dead instance's members held is handed out again.

``COOP_INSTANCE_RUNS=20`` runs the two-instance test that many times in one session."""

from __future__ import annotations

import os
import random

import pytest
import trio

from harness.history import History, check
from harness.live import LiveProducer
from proxy.client import Consumer, TopicPartition
from tests.integration.test_live_tail import _at_log_end, _until

pytestmark = pytest.mark.kafka

RECORDS = 6000
SECONDS = 8.0
DEADLINE = 120.0
MEMBERS = 3
RUNS = int(os.environ.get("COOP_INSTANCE_RUNS", "1"))


def hot_key(seq: int, rng: random.Random, keys: int) -> bytes:
    """Half the records have one key."""
    return b"hot" if rng.random() < 0.5 else f"user-{rng.randrange(keys)}".encode()


def _cases() -> list:
    return [pytest.param(2, run, id=f"2-instances-run{run}") for run in range(RUNS)] + \
        [pytest.param(3, 0, id="3-instances")]


@pytest.mark.parametrize(("instances", "run"), _cases())
async def test_members_spread_over_instances_get_no_record_twice(kafka, proxy_factory, topic_factory, instances,
                                                                 run):
    proxies = [proxy_factory(kafka) for _ in range(instances)]
    try:
        topic = topic_factory(kafka, partitions=1)
        tp = TopicPartition(topic, 0)
        group = f"coop-ha-{topic}"
        history = History()
        producer = LiveProducer(kafka.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS,
                                seed=61 + run, key_of=hot_key)
        stop = trio.Event()
        handed: dict[str, int] = {}

        async def member(name: str, bootstrap: str) -> None:
            async with Consumer(bootstrap, group_id=group, client_id=name, auto_offset_reset="earliest",
                                allow_individual_commit=True, max_partition_fetch_bytes=2048) as consumer:
                consumer.assign([tp], cooperative=True)
                while not stop.is_set():
                    for record in await consumer.poll(0.3):
                        history.deliver(name, record.topic, record.partition, record.offset, record.key)
                        handed[name] = handed.get(name, 0) + 1
                        await trio.sleep(0.0002)  # the work
                        consumer.mark_processed(record)
                    await consumer.commit_processed()

        async with trio.open_nursery() as nursery:
            for number in range(MEMBERS):  # 2 instances: m0, m2 on the first, m1 on the second
                nursery.start_soon(member, f"m{number}", proxies[number % instances].bootstrap_servers)
            producer.start()
            await _until(lambda: producer.done and history.missing() == 0, SECONDS + DEADLINE)
            await _until(lambda: _at_log_end(kafka, group, topic, 1), 60)
            stop.set()
        producer.join()
        assert producer.failed == 0, producer.errors
        verdict = check(history, keyed_order=False)
        print(f"\n{instances} instances run {run}: {verdict.summary()}; handed out per member {handed}")
        assert verdict.acknowledged == RECORDS
        assert not verdict.lost and not verdict.strays, verdict.summary()
        assert verdict.redelivered == 0, verdict.summary()
        assert _at_log_end(kafka, group, topic, 1), "the group's committed offset did not reach the log end"
        assert len(handed) == MEMBERS, handed
    finally:
        for proxy in proxies:
            proxy.stop(timeout=10)


async def test_an_instance_killed_mid_stream_loses_nothing(kafka, proxy_factory, topic_factory):
    """kill -9 of one of two instances while its members hold chunks: they reconnect to the
    other; nothing is lost, and what is handed out twice was held by the dead instance's
    members (their leases end after ``cooperative.fetch.lease.ms``)."""
    settings = {"cooperative.fetch.lease.ms": "3000"}
    doomed, survivor = proxy_factory(kafka, **settings), proxy_factory(kafka, **settings)
    try:
        topic = topic_factory(kafka, partitions=1)
        tp = TopicPartition(topic, 0)
        group = f"coop-ha-kill-{topic}"
        history = History()
        producer = LiveProducer(kafka.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS, seed=67,
                                key_of=hot_key)
        stop = trio.Event()
        killed = trio.Event()
        through_dead: set[int] = set()  # offsets handed to members while they went through the killed instance

        async def session(name: str, bootstrap: str, *, dies: bool) -> None:
            async with Consumer(bootstrap, group_id=group, client_id=name, auto_offset_reset="earliest",
                                allow_individual_commit=True, max_partition_fetch_bytes=2048,
                                retry_backoff_ms=50) as consumer:
                consumer.assign([tp], cooperative=True)
                while not stop.is_set() and not (dies and killed.is_set()):
                    for record in await consumer.poll(0.3):
                        history.deliver(name, record.topic, record.partition, record.offset, record.key)
                        if dies:
                            through_dead.add(record.offset)
                        consumer.mark_processed(record)
                    await consumer.commit_processed()

        async def member(name: str, dies: bool) -> None:
            if dies:
                try:
                    with trio.move_on_after(SECONDS + DEADLINE):
                        await session(name, doomed.bootstrap_servers, dies=True)
                except Exception:  # noqa: BLE001 - its instance died under it
                    pass
                await killed.wait()
            await session(f"{name}-again" if dies else name, survivor.bootstrap_servers, dies=False)

        async with trio.open_nursery() as nursery:
            for number in range(MEMBERS):  # m0 and m2 through the instance that dies
                nursery.start_soon(member, f"m{number}", number % 2 == 0)
            producer.start()
            await _until(lambda: len(history.deliveries) > RECORDS // 3, 60)
            await trio.to_thread.run_sync(doomed.kill)
            killed.set()
            await _until(lambda: producer.done and history.missing() == 0, SECONDS + DEADLINE)
            await _until(lambda: _at_log_end(kafka, group, topic, 1), 60)
            stop.set()
        producer.join()
        assert producer.failed == 0, producer.errors
        verdict = check(history, keyed_order=False)
        print(f"\nkilled instance: {verdict.summary()}; {len(through_dead)} records went through it")
        assert verdict.acknowledged == RECORDS
        assert not verdict.lost and not verdict.strays, verdict.summary()
        again = {offset for (_topic, _partition, offset) in verdict.duplicates}
        assert again <= through_dead, f"handed out twice beyond the dead instance's: {sorted(again - through_dead)[:10]}"
        assert _at_log_end(kafka, group, topic, 1), "the group's committed offset did not reach the log end"
    finally:
        doomed.kill()
        survivor.stop(timeout=10)
