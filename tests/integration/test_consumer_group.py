"""Consumer groups that split partitions by key range (docs/wire-contract.md section 8),
through the real proxy against a real broker."""

from __future__ import annotations

from collections import defaultdict

import trio

from harness.java_tools import describe_group
from proxy.client import Consumer, RetriableError
from proxy.client.group import RebalanceListener

DEADLINE = 90  # seconds any one group test may spend consuming


def _produce(bootstrap: str, topic: str, partitions: int, count: int, keys: int = 60) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    for i in range(count):
        producer.send(topic, key=f"key-{i % keys}".encode(), value=str(i).encode(), partition=i % partitions)
    producer.flush(30)
    producer.close()


class Recorder(RebalanceListener):
    def __init__(self) -> None:
        self.assigned: list[dict] = []
        self.revoked: list[dict] = []
        self.lost: list[dict] = []

    async def on_assigned(self, assignment):
        self.assigned.append(assignment)

    async def on_revoked(self, assignment):
        self.revoked.append(assignment)

    async def on_lost(self, assignment):
        self.lost.append(assignment)


async def _commit(consumer: Consumer) -> None:
    try:
        await consumer.commit()
    except RetriableError:
        pass  # a rebalance is completing: the marks stay pending for the next commit


async def test_six_members_on_two_partitions_each_get_a_third(kafka, proxy, topic_factory):
    topic = topic_factory(kafka, partitions=2)
    group = f"g-{topic}"
    total = 1200
    _produce(kafka.bootstrap_servers, topic, 2, total)
    seen: dict[tuple[int, int], list[str]] = defaultdict(list)
    shares: dict[str, dict] = {}
    stop = trio.Event()
    formed = trio.Event()

    async def member(i: int) -> None:
        listener = Recorder()
        async with Consumer(proxy.bootstrap_servers, group_id=group, client_id=f"member-{i}",
                            allow_individual_commit=True, auto_offset_reset="earliest",
                            heartbeat_interval_ms=500, session_timeout_ms=10_000, max_poll_records=20) as consumer:
            consumer.subscribe([topic], listener)
            while not stop.is_set():
                records = await consumer.poll(0.2)
                for record in records:
                    seen[record.partition, record.offset].append(f"member-{i}")
                    consumer.mark_processed(record)
                await _commit(consumer)
                shares[f"member-{i}"] = consumer.assignment()
                if formed.is_set() is False and len(shares) == 6 and all(
                        len(a) == 1 and next(iter(a.values())) for a in shares.values()):
                    formed.set()
            assert not listener.lost

    async with trio.open_nursery() as nursery:
        for i in range(6):
            nursery.start_soon(member, i)
        with trio.fail_after(DEADLINE):
            await formed.wait()
            while len(seen) < total:
                await trio.sleep(0.2)
            # the group's committed offsets reach the end, as standard tools read them
            while True:
                rows = await trio.to_thread.run_sync(lambda: describe_group(kafka.bootstrap_servers, group))
                ends = {int(r["PARTITION"]): (r["CURRENT-OFFSET"], r["LOG-END-OFFSET"]) for r in rows
                        if r.get("TOPIC") == topic}
                if len(ends) == 2 and all(c == e for c, e in ends.values()):
                    break
                await trio.sleep(0.5)
        stop.set()

    assert sorted(seen) == sorted((p, o) for p in range(2) for o in range(total // 2))
    assert all(len(who) == 1 for who in seen.values()), "a record reached two members"
    # each member held a third of one partition
    third = (1 << 63) // 3
    for name, assignment in shares.items():
        (tp, ranges), = assignment.items()
        assert abs(sum(r.size for r in ranges) - third) <= 1, (name, assignment)


async def test_per_key_order_holds_across_joins_and_leaves(kafka, proxy, topic_factory):
    """Members join and leave while the group consumes one partition, each record taking a
    random time: on one global timeline, no record is handed out before every earlier
    record of its key has finished processing, and nothing is lost."""
    import random

    topic = topic_factory(kafka, partitions=1)
    group = f"g-{topic}"
    total = 1500
    _produce(kafka.bootstrap_servers, topic, 1, total, keys=40)
    rng = random.Random(7)
    handed: dict[int, list[tuple[float, int]]] = defaultdict(list)  # offset -> (time, member)
    finished: dict[int, float] = {}
    keys: dict[int, bytes] = {}
    done = trio.Event()

    async def member(i: int, leave: trio.Event) -> None:
        async with Consumer(proxy.bootstrap_servers, group_id=group, client_id=f"member-{i}",
                            allow_individual_commit=True, auto_offset_reset="earliest",
                            heartbeat_interval_ms=300, session_timeout_ms=10_000, max_poll_records=10) as consumer:
            consumer.subscribe([topic])
            while not (done.is_set() or leave.is_set()):
                records = await consumer.poll(0.2)
                now = trio.current_time()
                for record in records:
                    handed[record.offset].append((now, i))
                    keys[record.offset] = record.key
                for record in records:
                    await trio.sleep(rng.random() * 0.004)
                    finished.setdefault(record.offset, trio.current_time())
                    consumer.mark_processed(record)
                await _commit(consumer)
            while True:  # leaving: what was handed out is processed; commit it before going
                try:
                    await consumer.commit()
                    break
                except RetriableError:
                    await trio.sleep(0.1)

    leaves = [trio.Event() for _ in range(5)]
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            for i in range(2):
                nursery.start_soon(member, i, leaves[i])
            while len(finished) < total // 5:
                await trio.sleep(0.05)
            nursery.start_soon(member, 2, leaves[2])
            nursery.start_soon(member, 3, leaves[3])
            while len(finished) < total // 2:
                await trio.sleep(0.05)
            leaves[0].set()  # one member leaves
            while len(finished) < 3 * total // 4:
                await trio.sleep(0.05)
            nursery.start_soon(member, 4, leaves[4])
            while len(finished) < total:
                await trio.sleep(0.05)
            done.set()

    assert sorted(finished) == list(range(total)), "a record was lost"
    # a member processes its records one after another, so two records of a key handed to
    # the same member keep their order; a record handed to another member must wait until
    # every earlier record of its key is finished
    last: dict[bytes, tuple[float, int]] = {}  # key -> (finish time, member) of the latest record
    for offset in range(total):
        key = keys[offset]
        when, who = min(handed[offset])
        if key in last:
            finish, previous = last[key]
            if who == previous:
                assert finished[offset] >= finish, f"offset {offset} finished before an earlier record of its key"
            else:
                assert when >= finish, f"offset {offset} handed to member {who} before member {previous} finished " \
                                       f"an earlier record of its key"
        last[key] = (max(finished[offset], last.get(key, (0.0, who))[0]), who)
    redelivered = [o for o, h in handed.items() if len(h) > 1]
    assert not redelivered, f"records handed out twice without a lost member: {redelivered[:10]}"
