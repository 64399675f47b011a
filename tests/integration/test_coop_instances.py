"""Cooperative fetch across several proxy instances (docs/high-availability.md): two or
three port-per-broker proxies in front of one broker, the cooperative members of one group
spread over them as a load balancer in front of proxy replicas would spread them, records
written while they read (half of them under one key; the members start a third of the
way in, so that they catch up with asks before their reads, then ask after them at the log
end). Chunks are granted through
``__cooperative_fetch_grants``, so no record is handed out twice while no member fails;
with one instance killed -9 mid-stream and its members reconnecting to another, nothing is
lost and only what the dead instance's members held is handed out again. The kill is also
made to strike while the dead instance's members hold chunks they never commit (slow
members), once the grants log shows those leases: exactly what they held is handed out
again, and the log grants it again only once the leases ended. Exactly-once members
(chunks committed in transactions) spread over two instances write each record once.

``COOP_INSTANCE_RUNS=20`` runs the two- and the three-instance test that many times each in
one session (``-k 3-instances`` picks one of them)."""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass

import pytest
import trio

from harness.history import History, check
from harness.live import LiveProducer
from proxy.client import Consumer, TopicPartition
from proxy.coop.grant_log import GRANTS_TOPIC
from proxy.coop.grants import Grant, KeyGrants, decode_grant, decode_key
from proxy.protocol.groups import group_partition
from tests.integration.coop_members import cooperative_member, hot_key
from tests.integration.test_coop_wire import TransactionalMembers, check_exactly_once
from tests.integration.test_live_tail import _at_log_end, _until

pytestmark = pytest.mark.kafka

RECORDS = 6000
SECONDS = 8.0
DEADLINE = 120.0
MEMBERS = 3
RUNS = int(os.environ.get("COOP_INSTANCE_RUNS", "1"))


def _cases() -> list:
    return [pytest.param(instances, run, id=f"{instances}-instances-run{run}")
            for instances in (2, 3) for run in range(RUNS)]


@pytest.mark.parametrize(("instances", "run"), _cases())
async def test_members_spread_over_instances_get_no_record_twice(kafka, proxy_factory, topic_factory, instances,
                                                                 run):
    proxies = [proxy_factory(kafka, metrics_port="0") for _ in range(instances)]
    try:
        topic = topic_factory(kafka, partitions=1)
        tp = TopicPartition(topic, 0)
        group = f"coop-ha-{topic}"
        history = History()
        producer = LiveProducer(kafka.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS,
                                seed=61 + run, key_of=hot_key)
        stop = trio.Event()
        handed: dict[str, int] = {}

        producer.start()
        # the members start behind (a third of the records written) and catch up while the
        # rest is written: chunks asked for before their reads, then reads before asks at the log end
        await _until(lambda: len(history.acks) >= RECORDS // 3, SECONDS + DEADLINE)
        async with trio.open_nursery() as nursery:
            for number in range(MEMBERS):  # 2 instances: m0, m2 on the first, m1 on the second
                nursery.start_soon(cooperative_member, proxies[number % instances].bootstrap_servers, group, tp,
                                   f"m{number}", history, handed, stop)
            await _until(lambda: producer.done and history.missing() == 0, SECONDS + DEADLINE)
            await _until(lambda: _at_log_end(kafka, group, topic, 1), 60)
            stop.set()
        producer.join()
        assert producer.failed == 0, producer.errors
        verdict = check(history, keyed_order=False)
        asks = {read: sum(proxy.metric("kafka_proxy_coop_asks_total", read=read) for proxy in proxies)
                for read in ("before", "after")}
        print(f"\n{instances} instances run {run}: {verdict.summary()}; handed out per member {handed}; "
              f"asks before / after the read {asks}")
        assert verdict.acknowledged == RECORDS
        assert not verdict.lost and not verdict.strays, verdict.summary()
        assert verdict.redelivered == 0, verdict.summary()
        assert _at_log_end(kafka, group, topic, 1), "the group's committed offset did not reach the log end"
        assert len(handed) == MEMBERS, handed
        # both ways of asking ran: before the read (offsets past the marker known), after it (the log end)
        assert asks["before"] > 0 and asks["after"] > 0, asks
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


# -- the kill while the dead instance's members hold leases -----------------------------------

LEASE_MS = 6000  # long enough to see the leases in the log and kill while they are live
DOOMED = ("m0", "m2")  # the members through the instance that dies; m1 goes through the other


@dataclass(frozen=True)
class LoggedGrant:
    """A record of the grants log for one key, with the chunk every instance assigns it."""

    offset: int
    ms: int  # log-append time
    grant: Grant
    chunk: tuple[int, int] | None

    @property
    def valid(self) -> bool:
        return self.chunk is not None

    def overlaps(self, other: LoggedGrant) -> bool:
        return self.chunk is not None and other.chunk is not None and \
            self.chunk[0] <= other.chunk[1] and other.chunk[0] <= self.chunk[1]

    def holds(self, offset: int) -> bool:
        return self.chunk is not None and self.chunk[0] <= offset <= self.chunk[1]


def _logged_grants(bootstrap: str, group: str, topic: str) -> list[LoggedGrant]:
    """The grants of (group, topic, 0) in ``__cooperative_fetch_grants`` up to its end, read
    straight from the broker and assigned their chunks in log order as the proxy does."""
    from confluent_kafka import Consumer as RdConsumer
    from confluent_kafka import TopicPartition as RdPartition

    probe = RdConsumer({"bootstrap.servers": bootstrap, "group.id": f"grants-probe-{uuid.uuid4().hex[:6]}",
                        "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        partitions = len(probe.list_topics(GRANTS_TOPIC, timeout=10).topics[GRANTS_TOPIC].partitions)
        index = group_partition(group, partitions)
        low, high = probe.get_watermark_offsets(RdPartition(GRANTS_TOPIC, index), timeout=10)
        probe.assign([RdPartition(GRANTS_TOPIC, index, low)])
        state, out, position = KeyGrants(), [], low
        deadline = time.monotonic() + 20
        while position < high:
            assert time.monotonic() < deadline, f"{GRANTS_TOPIC}-{index} not read to {high} in time (at {position})"
            message = probe.poll(0.5)
            if message is None or message.error() is not None:
                continue
            offset, key, value = message.offset(), message.key(), message.value()
            assert offset is not None
            position = offset + 1
            if key is None or value is None or decode_key(key) != (group, topic, 0):
                continue
            grant, ms = decode_grant(value), message.timestamp()[1]
            out.append(LoggedGrant(offset, ms, grant, state.apply(offset, ms, grant).chunk))
        return out
    finally:
        probe.close()


def _live_leases_cover(grants: list[LoggedGrant], member: str, offsets: set[int], now_ms: float) -> bool:
    """Whether valid grants of ``member``, live at ``now_ms``, hold every one of ``offsets``."""
    live = [g for g in grants if g.valid and g.grant.member == member and g.ms + g.grant.lease_ms > now_ms]
    return all(any(g.holds(offset) for g in live) for offset in offsets)


async def test_an_instance_killed_while_its_members_hold_leases_hands_out_only_those_again(
        kafka, proxy_factory, topic_factory):
    """The members through the instance that dies turn slow: each takes one more batch of
    records and never finishes (nor commits) it. Once the grants log shows those chunks
    leased to them and live, the instance is killed -9 and its members reconnect to the
    other. Nothing is lost; exactly the held records are handed out twice; and every valid
    grant that overlaps an earlier one comes ``cooperative.fetch.lease.ms`` after it or
    later (the held chunks are granted again only once their leases ended)."""
    settings = {"cooperative.fetch.lease.ms": str(LEASE_MS)}
    doomed, survivor = proxy_factory(kafka, **settings), proxy_factory(kafka, **settings)
    try:
        topic = topic_factory(kafka, partitions=1)
        tp = TopicPartition(topic, 0)
        group = f"coop-ha-held-{topic}"
        history = History()
        producer = LiveProducer(kafka.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS, seed=71,
                                key_of=hot_key)
        stop, hold, killed = trio.Event(), trio.Event(), trio.Event()
        ids: dict[str, str] = {}  # member name -> its cooperative member id (the grants' member)
        held: dict[str, set[int]] = {}  # doomed member -> offsets handed to it and never committed

        async def session(name: str, bootstrap: str, *, slow: bool) -> None:
            async with Consumer(bootstrap, group_id=group, client_id=name, auto_offset_reset="earliest",
                                allow_individual_commit=True, max_partition_fetch_bytes=2048,
                                retry_backoff_ms=50) as consumer:
                consumer.assign([tp], cooperative=True)
                ids[name] = consumer.cooperative_member_id
                while not stop.is_set():
                    if slow and hold.is_set():
                        with trio.fail_after(30):
                            records: list = []
                            while not records:
                                records = list(await consumer.poll(0.3))
                        for record in records:  # its work on these never ends
                            history.deliver(name, record.topic, record.partition, record.offset, record.key)
                        held[name] = {record.offset for record in records}
                        await killed.wait()
                        return
                    for record in await consumer.poll(0.3):
                        history.deliver(name, record.topic, record.partition, record.offset, record.key)
                        consumer.mark_processed(record)
                    await consumer.commit_processed()

        async def member(name: str) -> None:
            if name in DOOMED:
                try:
                    await session(name, doomed.bootstrap_servers, slow=True)
                except Exception:  # noqa: BLE001 - its instance died under it
                    pass
                await killed.wait()
                name = f"{name}-again"
            await session(name, survivor.bootstrap_servers, slow=False)

        async with trio.open_nursery() as nursery:
            for number in range(MEMBERS):
                nursery.start_soon(member, f"m{number}")
            producer.start()
            assert await _until(lambda: len(history.deliveries) > RECORDS // 4, 60), "the members did not start"
            hold.set()
            assert await _until(lambda: all(held.get(name) for name in DOOMED), 30), \
                f"the slow members took no records: {held}"

            def leased() -> bool:
                grants = _logged_grants(kafka.bootstrap_servers, group, topic)
                now_ms = time.time() * 1000 + 500  # still live a moment from now, when the kill lands
                return all(_live_leases_cover(grants, ids[name], held[name], now_ms) for name in DOOMED)

            assert await _until(leased, LEASE_MS / 2000), "the grants log does not show the slow members' leases"
            assert not producer.done, "the producer finished before the kill: not mid-stream"
            await trio.to_thread.run_sync(doomed.kill)
            killed.set()
            await _until(lambda: producer.done and history.missing() == 0, SECONDS + DEADLINE)
            await _until(lambda: _at_log_end(kafka, group, topic, 1), 60)
            stop.set()
        producer.join()
        assert producer.failed == 0, producer.errors
        verdict = check(history, keyed_order=False)
        grants = _logged_grants(kafka.bootstrap_servers, group, topic)
        valid = [g for g in grants if g.valid]
        early = [(a, b) for i, a in enumerate(valid) for b in valid[i + 1:]
                 if a.overlaps(b) and b.ms < a.ms + a.grant.lease_ms]
        held_offsets = set().union(*held.values())
        held_grants = [g for g in valid if g.grant.member in {ids[name] for name in DOOMED}
                       and any(g.holds(offset) for offset in held_offsets)]
        again = {offset for (_topic, _partition, offset) in verdict.duplicates}
        regrants = [(a, b) for a in held_grants for b in valid if b.offset > a.offset and a.overlaps(b)]
        print(f"\nkilled while holding: {verdict.summary()}; held {sorted(len(v) for v in held.values())} records in "
              f"{len(held_grants)} chunks, granted again "
              f"{sorted({round((b.ms - a.ms) / 1000, 1) for a, b in regrants})} s after their grant; "
              f"{len(valid)} valid grants of {len(grants)}")
        assert verdict.acknowledged == RECORDS
        assert not verdict.lost and not verdict.strays, verdict.summary()
        assert again == held_offsets, (f"handed out twice {sorted(again)[:10]}... ({len(again)}) is not what the "
                                       f"dead instance's members held {sorted(held_offsets)[:10]}... "
                                       f"({len(held_offsets)})")
        assert not early, f"granted again before the lease ended: {early[:3]}"
        assert {a.offset for a, _b in regrants} == {g.offset for g in held_grants}, "a held chunk was never granted again"
        assert _at_log_end(kafka, group, topic, 1), "the group's committed offset did not reach the log end"
    finally:
        doomed.kill()
        survivor.stop(timeout=10)


# -- exactly once with transactional chunk commits ---------------------------------------------

TXN_LEASE_MS = 6_000

def test_transactional_members_on_two_instances_process_every_record_exactly_once(kafka, proxy_factory,
                                                                                  topic_factory):
    """``test_coop_wire``'s exactly-once members (a chunk's output and its offsets in one
    transaction, every fourth aborted and its chunk handed out again after the lease),
    four of them spread over two instances: the committed output holds every input once.
    The lease is long against a transaction here (a few seconds at worst on 2 busy cores),
    as exactly once needs (docs/cooperative-fetch.md)."""
    settings = {"cooperative.fetch.lease.ms": str(TXN_LEASE_MS)}
    proxies = [proxy_factory(kafka, **settings) for _ in range(2)]
    try:
        members = TransactionalMembers(topic_factory(kafka, partitions=1), topic_factory(kafka, partitions=1),
                                       f"coop-ha-txn-{uuid.uuid4().hex[:8]}", lease_ms=TXN_LEASE_MS)
        history = History()
        producer = LiveProducer(kafka.bootstrap_servers, members.source, history, records=1200, seconds=10,
                                seed=73).start()
        threads = [members.start(name, proxies[number % 2].bootstrap_servers) for number, name in enumerate("abcd")]
        producer.join()
        assert producer.failed == 0, producer.errors

        def grants_of(offset: int) -> str:
            grants = _logged_grants(kafka.bootstrap_servers, members.group, members.source)
            return "grants of it in the log: " + "; ".join(
                f"{g.offset}@{g.ms % 1_000_000} {g.chunk or 'no chunk'} {g.grant}"
                for g in grants if g.holds(offset))

        check_exactly_once(kafka, proxies[0].bootstrap_servers, members, history, threads, explain=grants_of)
        print(f"\ntransactional members on two instances: {len(history.acks)} acknowledged, each once in the "
              f"committed output; transactions committed per member {members.committed}, "
              f"{len(members.aborted)} aborted ({members.late} of them late)")
        assert set(members.committed) == set("abcd"), members.committed
    finally:
        for proxy in proxies:
            proxy.stop(timeout=10)
