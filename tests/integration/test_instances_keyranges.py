"""Key ranges and individual commit across several proxy instances (docs/high-availability.md).

Two or three port-per-broker proxies behind a TCP balancer (``instance_checks``), the
members of one group (``proxy.client.Consumer``, individual commit) spread over them, and
records written while they read:

- assign mode: each member takes one of four equal key ranges of every partition itself;
- groups: the members subscribe, the assignor splits partitions into hash ranges (four
  members, three partitions), and they join one by one while records are written.

Each test counts acknowledged against handed out: every record once, each key's records in
offset order, the group's committed offsets (at the coordinator) at the log end. With one
instance killed -9 mid-stream, its members reconnect through the balancer to another (or, in
assign mode, drop their consumers as it dies and open new ones, which resume from what the
group committed, read by the other instance): nothing is lost, and what is handed out twice
is only what they had been handed and had not got committed when it died.
"""

from __future__ import annotations

import time

import pytest
import trio

from harness.history import History
from harness.live import LiveProducer
from proxy.client import Consumer, RetriableError, TopicPartition, equal_shares
from tests.integration.instance_checks import (
    Ledger,
    assert_kill_bound,
    assert_order_explained,
    member_names,
    spread,
    start_replicas,
)
from tests.integration.test_live_tail import _at_log_end, _until, _verdict

pytestmark = pytest.mark.kafka

RECORDS = 3000
SECONDS = 8.0
DEADLINE = 90.0  # for the members to catch up once the producer is done
MEMBERS = 4
PARTITIONS = {"assign": 2, "group": 3}  # groups: fewer partitions than members, so ranges are split
SEEDS = {"assign": 71, "group": 73}
WORK = 0.001  # seconds each record takes: a poll's records are held a while before their commit
BUSY_TIMEOUT = 10.0  # for the kill to find a member of the doomed instance holding records uncommitted


class Members:
    """What the members went through, for the assertion messages."""

    def __init__(self) -> None:
        self.retriable: dict[str, int] = {}
        self.lost: list[str] = []
        self.session_ended: dict[str, float] = {}  # member -> when its first session ended (started again)

    def tolerated(self, name: str, exc: RetriableError) -> None:
        key = f"{name} {type(exc).__name__}"
        self.retriable[key] = self.retriable.get(key, 0) + 1


async def member(name: str, index: int, mode: str, bootstrap: str, group: str, topic: str, history: History,
                 ledger: Ledger, members: Members, stop: trio.Event,
                 again: tuple[trio.Event, trio.Event] | None = None) -> None:
    """One member: hands out what each poll returns, processes it, marks it processed and
    commits it. Retriable errors (a rebalance completing, a connection its instance took
    down) leave the marks pending for the next commit. With ``again`` (two events: its
    instance dying, dead): as its instance dies the member drops its consumer wherever it is
    (polling, processing, committing), leaving what it holds uncommitted, and once it is dead
    opens a new one (through the balancer), which resumes from what the group committed."""
    settings = dict(group_id=group, client_id=name, auto_offset_reset="earliest", allow_individual_commit=True,
                    retry_backoff_ms=50)
    if mode == "group":
        settings.update(heartbeat_interval_ms=500, session_timeout_ms=10_000, max_poll_records=50)

    async def session() -> None:
        async with Consumer(bootstrap, **settings) as consumer:
            if mode == "assign":
                share = equal_shares(MEMBERS)[index]
                consumer.assign({TopicPartition(topic, p): [share] for p in range(PARTITIONS[mode])})
            else:
                consumer.subscribe([topic])
            while not stop.is_set():
                try:
                    records = await consumer.poll(0.3)
                except RetriableError as exc:
                    members.tolerated(name, exc)
                    continue
                for record in records:
                    history.deliver(name, record.topic, record.partition, record.offset, record.key)
                    ledger.hand(name, (record.topic, record.partition, record.offset))
                for record in records:
                    await trio.sleep(WORK)  # the record's processing
                    consumer.mark_processed(record)
                covered = ledger.count(name)
                try:
                    await consumer.commit()
                except RetriableError as exc:
                    members.tolerated(name, exc)
                else:
                    ledger.committed(name, covered)
                if mode == "group" and consumer.lost():
                    members.lost.append(f"{name} lost {sorted(consumer.lost())}")

    if again is not None:
        dying, dead = again
        with trio.CancelScope() as dropped:
            async with trio.open_nursery() as nursery:
                async def drop() -> None:
                    await dying.wait()
                    dropped.cancel()

                nursery.start_soon(drop)
                await session()
                nursery.cancel_scope.cancel()  # stopped without being dropped
        if stop.is_set():
            return
        members.session_ended[name] = time.monotonic()
        await dead.wait()
    await session()


async def _holding(ledger: Ledger, names: list[str], timeout: float) -> bool:
    """Wait until one of ``names`` holds records it was handed and has not got committed
    (the kill then strikes while it does), or ``timeout``."""
    with trio.move_on_after(timeout):
        while not any(ledger.uncommitted_at(name, time.monotonic()) for name in names):
            await trio.sleep(0.001)
        return True
    return False


# kill: None, or how the killed instance's members go on: "reconnect" (the consumer reconnects
# through the balancer by itself) or "start-again" (the application drops its consumer as
# the instance dies, what it holds uncommitted, and opens a new one)
CASES = [pytest.param(2, mode, None, id=f"{mode}-2-instances") for mode in ("assign", "group")] + [
    pytest.param(3, "group", None, id="group-3-instances"),
    pytest.param(2, "assign", "reconnect", id="assign-2-instances-one-killed"),
    pytest.param(2, "assign", "start-again", id="assign-2-instances-one-killed-members-start-again"),
    pytest.param(2, "group", "reconnect", id="group-2-instances-one-killed")]


@pytest.mark.parametrize(("instances", "mode", "kill"), CASES)
async def test_key_range_members_spread_over_instances(kafka, proxy_factory, topic_factory, tmp_path, instances,
                                                       mode, kill):
    names = member_names(MEMBERS)
    replicas = start_replicas(kafka, proxy_factory, tmp_path, instances, spread(names, instances))
    try:
        partitions = PARTITIONS[mode]
        topic = topic_factory(kafka, partitions=partitions)
        group = f"ha-{mode}-{topic}"
        history = History()
        ledger = Ledger()
        members = Members()
        producer = LiveProducer(kafka.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS,
                                seed=SEEDS[mode] + instances + (10 if kill else 0) + (kill == "start-again"))
        stop = trio.Event()
        dying, dead = trio.Event(), trio.Event()
        busy, killed_at = False, 0  # a kill struck while records were held; records handed out by then
        async with trio.open_nursery() as nursery:
            producer.start()
            for index, name in enumerate(names):
                again = (dying, dead) if kill == "start-again" and name in replicas.members_of(0) else None
                nursery.start_soon(member, name, index, mode, replicas.bootstrap, group, topic, history, ledger,
                                   members, stop, again)
                if mode == "group":
                    await trio.sleep(0.5)  # members join one by one, while the producer writes
            if kill:
                assert await _until(lambda: len(history.deliveries) > RECORDS // 3, 60), "no progress to kill into"
                busy = await _holding(ledger, replicas.members_of(0), BUSY_TIMEOUT)
                dying.set()  # members that start again drop their sessions as their instance dies
                await trio.to_thread.run_sync(replicas.kill, 0)
                dead.set()
                killed_at = len(history.deliveries)
            await _until(lambda: producer.done and history.missing() == 0, SECONDS + DEADLINE)
            await _until(lambda: _at_log_end(kafka, group, topic, partitions), 60)
            stop.set()
        producer.join()
        assert producer.failed == 0, producer.errors
        verdict = _verdict(kafka, history, topic, partitions, group)
        handed = {name: ledger.count(name) for name in names}
        message = (f"{verdict.summary()}\nhanded out per member {handed}; retriable errors {members.retriable}; "
                   f"lost partitions {members.lost}")
        print(f"\n{mode}, {instances} instances{f', one killed ({kill})' if kill else ''}: {verdict.summary()}; "
              f"handed out per member {handed}")
        assert verdict.acknowledged == RECORDS
        assert not verdict.lost and not verdict.strays, message
        assert not verdict.committed_behind, message
        assert all(handed.values()), message
        replicas.check_spread()
        if not kill:
            assert not members.lost, message
            assert verdict.ok(), message
            return
        replicas.check_reconnected(0)
        dead = replicas.members_of(0)
        if mode == "assign":  # each keeps its own key range: it went on through the other instance
            assert all(ledger.handed_after(name, replicas.killed[0]) for name in dead), message
        assert busy, f"no member of the killed instance held records uncommitted within {BUSY_TIMEOUT:g} s; {message}"
        if kill == "start-again":
            assert sorted(members.session_ended) == sorted(dead), message
            held_at = members.session_ended
        else:
            held_at = dict.fromkeys(dead, replicas.killed[0])
        allowed = assert_kill_bound(verdict, ledger, held_at, message)
        assert_order_explained(verdict, message)
        print(f"killed with {killed_at} of {RECORDS} records handed out; handed out twice {verdict.redelivered} "
              f"({len(verdict.duplicates)} records), allowed at most {allowed}: what {dead} held uncommitted when "
              f"their instance died")
    finally:
        replicas.close()
