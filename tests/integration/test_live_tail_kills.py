"""Live production while processes die by SIGKILL: the proxy, or group members.

The producer writes straight to the broker (acks=all, idempotent), so its acknowledgements
are the truth the consumers are held to whatever dies on their side of it.

- The proxy is killed mid-stream (once or twice, on a seeded schedule) and started again on
  the same port, so the members (``proxy.client.Consumer``, in this process) find it again
  where they left it. Nothing the proxy held in memory may matter: the individual-commit
  state lives in Kafka, so every offset committed before a kill is still committed when
  the new process answers, and no member hands out a record it already committed.
- Group members run as processes of their own (``harness.group_member``) and one or
  two are killed mid-stream and replaced. A killed member commits nothing more, so the
  records it had been handed but not committed may be handed out again, to whoever takes
  its ranges over; nothing else may be.

Every delivery lands in one ``History`` (members in other processes report theirs in their
event files) and ``harness.history.check`` judges the run: nothing acknowledged lost,
nothing handed out that was never acknowledged, the group's committed offsets at the log
end; the re-delivery counts are in every assertion message.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable

import pytest
import trio

from harness.commit_client import CommitClient
from harness.group_member import Event, MemberProcesses, order_violations
from harness.history import History, Verdict
from harness.live import LiveProducer
from proxy.local_kafka import ProxyProcess, ProxyStartError
from tests.integration.conftest import free_ports
from tests.integration.test_live_tail import _at_log_end, _log_end, _until, _verdict
from tests.integration.test_live_tail_faults import Members, _wait, member

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]
log = logging.getLogger(__name__)

MEMBERS = 4
PARTITIONS = 3  # fewer than members: the assignor splits partitions into key ranges
SETTLE_TIMEOUT = 20.0
DELIVERY_DEADLINE = 30.0  # after the producer is done, for every acknowledged record to be handed out
COMMIT_DEADLINE = 20.0  # then for the group's committed offsets to reach the log end

# -- the proxy killed -------------------------------------------------------------------------

PROXY_RECORDS = 1500
PROXY_SECONDS = 14.0
PROXY_SEED = 41  # KEYRANGE_KILL_SEED=n replays or explores another schedule
PROGRESS = 30  # records handed out through a restarted proxy before the next kill may come
GAP_TIMEOUT = 3.0  # at most this long for committed ranges above a gap to kill the proxy on

Covered = dict[int, set[int]]  # partition -> the offsets the group has committed


def _covered(state: dict[int, tuple[int, list[tuple[int, int]]]]) -> Covered:
    """The committed offsets: below the stable offset, and in each (inclusive) range above."""
    out: Covered = {}
    for partition, (stable, ranges) in state.items():
        offsets = set(range(max(stable, 0)))
        for start, end in ranges:
            offsets.update(range(start, end + 1))
        out[partition] = offsets
    return out


def _state_with_gaps(bootstrap: str, group: str, topic: str,
                     timeout: float) -> dict[int, tuple[int, list[tuple[int, int]]]]:
    """The group's stable offsets and committed ranges as the proxy serves them (OffsetFetch),
    read again until some offsets are committed above a gap, or ``timeout``: a kill then has
    individual-commit state to lose, not only stable offsets. Gaps come and go as the members
    sharing a partition commit at different times."""
    deadline = time.monotonic() + timeout
    with CommitClient(bootstrap, group, timeout=10) as client:
        while True:
            state = client.fetch(topic, range(PARTITIONS))
            if any(ranges for _, ranges in state.values()) or time.monotonic() >= deadline:
                return state
            time.sleep(0.01)


def _restart(proxy_factory, kafka, port: int, settings: dict[str, str]) -> ProxyProcess:
    """A new proxy on ``port``; a few attempts, in case the old listener's port is not free yet."""
    for attempt in range(5):
        try:
            return proxy_factory(kafka, listen_port=port, **settings)
        except ProxyStartError as exc:
            if attempt == 4:
                raise
            log.warning("proxy restart on port %d failed (%s); trying again", port, str(exc)[-300:])
            time.sleep(0.5)  # backoff between attempts, not a synchronisation
    raise AssertionError("unreachable")


async def test_group_members_hand_out_every_record_written_while_the_proxy_is_killed_and_restarted(
        kafka, proxy_factory, topic_factory, caplog):
    caplog.set_level(logging.INFO, logger="proxy.client")
    caplog.set_level(logging.INFO, logger=__name__)
    seed = int(os.environ.get("KEYRANGE_KILL_SEED", PROXY_SEED))
    rng = random.Random(seed)
    kills = rng.choice((1, 2))
    gaps = [rng.uniform(2.0, 4.0) for _ in range(kills)]  # seconds of service before each kill
    downtimes = [rng.uniform(0.2, 1.5) for _ in range(kills)]  # nothing listens on the port meanwhile

    (port,) = free_ports(1)
    # A sidecar advertising its own port for the node: every address a client learns
    # (bootstrap, Metadata, FindCoordinator) is this one port, which the restarted proxy
    # takes over, so the clients' reconnects land on the new process.
    settings = {"topology": "sidecar",
                "sidecar_node_addresses": ",".join(f"{node.node_id}@127.0.0.1:{port}" for node in kafka.nodes)}
    proxy = proxy_factory(kafka, listen_port=port, **settings)
    address = proxy.bootstrap_servers
    topic = topic_factory(kafka, partitions=PARTITIONS)
    group = f"proxy-kills-{topic}"
    history = History()
    producer = LiveProducer(kafka.bootstrap_servers, topic, history, records=PROXY_RECORDS, seconds=PROXY_SECONDS,
                            seed=seed)
    members = Members()
    stop = trio.Event()
    began = trio.current_time()
    timeline: list[str] = []
    survived: list[str] = []  # per kill: committed offsets before it, and whether the new proxy still had them
    forgotten: list[str] = []
    gapped: list[int] = []  # per kill: offsets committed above a gap just before it
    generations: dict[str, int] = {}
    settled_mark: int | None = None  # deliveries recorded when the group had settled after the last restart

    def context() -> str:
        return (f"seed {seed}; kills {timeline}; commit state across kills {survived}; {members.report()}; "
                f"generations {generations}")

    async with trio.open_nursery() as nursery:
        producer.start()
        for i in range(MEMBERS):
            nursery.start_soon(member, i, address, group, topic, history, members, stop, began)
        settled = await _wait(lambda: members.settled(MEMBERS), SETTLE_TIMEOUT)
        generations["settled"] = members.generation()
        if settled:
            for n in range(kills):
                await trio.sleep(gaps[n])  # the schedule: this much service, then the kill
                before = await trio.to_thread.run_sync(_state_with_gaps, address, group, topic, GAP_TIMEOUT)
                at = trio.current_time() - began
                await trio.to_thread.run_sync(proxy.kill)
                await trio.sleep(downtimes[n])  # the schedule: how long nothing listens
                proxy = await trio.to_thread.run_sync(_restart, proxy_factory, kafka, port, settings)
                up = trio.current_time() - began
                restarted_at = len(history.deliveries)
                after = await trio.to_thread.run_sync(_state_with_gaps, address, group, topic, 0.0)
                old, new = _covered(before), _covered(after)
                missing = {p: sorted(old[p] - new.get(p, set())) for p in old if old[p] - new.get(p, set())}
                ranges = [r for _, rs in before.values() for r in rs]
                above = sum(end - start + 1 for start, end in ranges)
                gapped.append(above)
                survived.append(f"kill {n + 1}: stable offsets {[s for s, _ in before.values()]} and {above} offsets "
                                f"in {len(ranges)} ranges above them -> "
                                f"{'all kept' if not missing else f'{sum(map(len, missing.values()))} forgotten'}")
                if missing:
                    forgotten.append(f"kill {n + 1}: " + "; ".join(f"partition {p} offsets {o[:10]}"
                                                                   for p, o in missing.items()))
                progressed = await _wait(lambda mark=restarted_at: len(history.deliveries) >= mark + PROGRESS
                                         or producer.done, SETTLE_TIMEOUT)
                timeline.append(f"killed at {at:.1f}s, listening again at {up:.1f}s, records flowing again "
                                f"{'at' if progressed else 'not by'} {trio.current_time() - began:.1f}s")
            if await _wait(lambda: members.settled(MEMBERS), SETTLE_TIMEOUT):
                settled_mark = len(history.deliveries)
            generations["after the kills"] = members.generation()
            delivered = await _until(lambda: producer.done and history.missing() == 0, PROXY_SECONDS + DELIVERY_DEADLINE)
            committed = delivered and await _until(lambda: _at_log_end(kafka, group, topic, PARTITIONS),
                                                   COMMIT_DEADLINE)
            generations["end"] = members.generation()
            log.info("proxy kills: delivered %s, committed %s; %s", delivered, committed, context())
        stop.set()
    producer.join()
    proxy.stop(timeout=10)
    assert settled, f"the {MEMBERS} members did not settle into one generation within {SETTLE_TIMEOUT:g} s; {context()}"
    assert producer.failed == 0, producer.errors
    verdict = _verdict(kafka, history, topic, PARTITIONS, group)
    assert verdict.acknowledged == PROXY_RECORDS
    message = f"{verdict.summary()}\n{context()}"
    assert len(timeline) == kills, message
    assert members.metrics["reconnects"] > 0, f"the members never noticed the proxy die: {message}"
    assert not verdict.lost, message
    assert not verdict.strays, message
    assert not verdict.committed_behind, message
    assert not forgotten, f"the restarted proxy lost committed offsets: {forgotten}; {message}"
    assert any(gapped), f"no kill found offsets committed above a gap, only stable offsets: {message}"
    if verdict.duplicates:
        disrupted = bool(members.deaths or members.lost or generations["end"] > generations["settled"])
        assert disrupted, f"records handed out twice though the kills cost the group no member or rebalance: {message}"
        assert settled_mark is not None, f"the group did not settle after the last restart: {message}"
        late = _first_deliveries_after(history, verdict, settled_mark)
        assert not late, (f"records first handed out after the group had settled again were handed out twice: "
                          f"{late[:10]}; {message}")
    _assert_order(verdict, members.tainted, message)
    print(f"proxy kills: {verdict.redelivered} re-delivered ({len(verdict.duplicates)} records); {context()}")


def _first_deliveries_after(history: History, verdict: Verdict, mark: int) -> list[tuple[str, int, int]]:
    """Re-delivered records whose first hand-out is at or past ``mark`` (an index into the
    deliveries): a kill cannot explain those."""
    first: dict[tuple[str, int, int], int] = {}
    for index, delivery in enumerate(history.deliveries):
        first.setdefault(delivery.record, index)
    return sorted(record for record in verdict.duplicates if first[record] >= mark)


def _assert_order(verdict: Verdict, tainted: set[str], message: str) -> None:
    """Order violations are re-delivery's doing when a record of the pair was handed out
    again, or one of the members that handed them out was killed or lost its partitions;
    any other fails."""
    unexplained = [(key, earlier, later) for key, earlier, later in verdict.order_violations
                   if not ({earlier.record, later.record} & verdict.duplicates.keys()
                           or {earlier.member, later.member} & tainted)]
    assert not unexplained, (f"{len(unexplained)} order violations not due to re-delivery, e.g. "
                             f"{[(k, e.offset, e.member, x.offset, x.member) for k, e, x in unexplained[:5]]}; "
                             f"{message}")


# -- members killed ---------------------------------------------------------------------------

MEMBER_RECORDS = 1500
MEMBER_SECONDS = 16.0
MEMBER_SEED = 44
BUSY_TIMEOUT = 3.0
DELAY_MAX_MS = 10  # per record processed: a poll's records take long enough for a kill to land among them
SESSION_TIMEOUT_MS = 6000  # the broker's minimum: a killed member's ranges wait this long for a new owner


def _history_of(events: list[Event], topic: str, history: History) -> None:
    """Replay the members' hand-outs, on their shared monotonic clock, into ``history``.

    A member hands out a whole poll at once and then processes it in order, so each record
    counts as processed when handed out; ``group_member.order_violations`` checks the
    finishing times."""
    for event in sorted(events, key=lambda e: e.time):  # stable: a poll's records stay in offset order
        if event.kind == "H":
            history.deliver(event.member, topic, event.partition, event.offset, bytes.fromhex(event.key))


def _wait_until(condition: Callable[[], bool], timeout: float, check: Callable[[], None], *,
                interval: float = 0.1) -> bool:
    """``condition`` until true or ``timeout``; ``check`` first each time (raises if a
    member that nobody killed has died)."""
    deadline = time.monotonic() + timeout
    while True:
        check()
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def test_group_members_hand_out_every_record_written_while_members_are_killed(kafka, proxy, topic_factory,
                                                                              tmp_path):
    seed = int(os.environ.get("KEYRANGE_KILL_SEED", MEMBER_SEED))
    rng = random.Random(seed)
    kills = rng.choice((1, 2))
    gaps = [rng.uniform(1.5, 3.5) for _ in range(kills)]  # seconds of service before each kill
    topic = topic_factory(kafka, partitions=PARTITIONS)
    group = f"member-kills-{topic}"
    history = History()
    producer = LiveProducer(kafka.bootstrap_servers, topic, history, records=MEMBER_RECORDS,
                            seconds=MEMBER_SECONDS, seed=seed)
    members = MemberProcesses(tmp_path, proxy.bootstrap_servers, group, topic, options=[
        "--delay-max-ms", str(DELAY_MAX_MS), "--max-poll-records", "50", "--session-timeout-ms", str(SESSION_TIMEOUT_MS),
        "--heartbeat-interval-ms", "500", "--max-poll-interval-ms", "30000"])
    names = [f"m{i}" for i in range(MEMBERS)]
    timeline: list[str] = []
    began = time.monotonic()

    def finished_records() -> set[tuple[int, int]]:
        return {(e.partition, e.offset) for e in members.events() if e.kind == "F"}

    def all_finished() -> bool:
        done = finished_records()
        return producer.done and all((a.partition, a.offset) in done for a in history.acks)

    def context() -> str:
        return f"seed {seed}; kills {timeline}; handed out per member {members.handed_out()}"

    delivered = committed = False
    try:
        producer.start()
        for i, name in enumerate(names):
            members.start(name, seed=seed * 100 + i)
        settled = _wait_until(lambda: all(members.handed_out()[n] > 0 for n in names), SETTLE_TIMEOUT,
                              members.check_running)
        if settled:
            for n in range(kills):
                time.sleep(gaps[n])  # the schedule: this much service, then the kill
                victim = rng.choice([name for name in names if name not in members.killed])
                # the kill lands while the victim is processing a poll (records handed out,
                # not yet committed) when that comes within a moment, as most kills would
                # if the members were busier
                busy = _wait_until(lambda v=victim: members.in_flight(v) > 0, BUSY_TIMEOUT, members.check_running,
                                   interval=0.002)
                members.kill(victim)
                handed = members.handed_out()[victim]
                replacement = f"m{MEMBERS + n}"
                members.start(replacement, seed=seed * 100 + MEMBERS + n)
                names.append(replacement)
                at = members.killed[victim] - began
                # the next kill comes once the group is whole again (the replacement works)
                recovered = _wait_until(lambda r=replacement: members.handed_out()[r] > 0 or all_finished(),
                                        SESSION_TIMEOUT_MS / 1000 + SETTLE_TIMEOUT, members.check_running)
                timeline.append(f"{victim} killed at {at:.1f}s after {handed} records"
                                f"{' while processing' if busy else ''}; {replacement} "
                                f"{'working' if recovered else 'idle'} at {time.monotonic() - began:.1f}s")
            delivered = _wait_until(all_finished, MEMBER_SECONDS + DELIVERY_DEADLINE, members.check_running)
            committed = delivered and _wait_until(lambda: _at_log_end(kafka, group, topic, PARTITIONS),
                                                  COMMIT_DEADLINE, members.check_running)
        members.stop_all()
        events = members.events()
    finally:
        producer.stop()
        members.close()
    producer.join()
    log.info("member kills: delivered %s, committed %s; %s", delivered, committed, context())
    assert settled, f"the {MEMBERS} members were not all handed records within {SETTLE_TIMEOUT:g} s; {context()}"
    assert producer.failed == 0, producer.errors
    _history_of(events, topic, history)
    verdict = _verdict(kafka, history, topic, PARTITIONS, group)
    assert verdict.acknowledged == MEMBER_RECORDS
    message = f"{verdict.summary()}\n{context()}"
    assert len(members.killed) == kills, message
    assert not verdict.lost, message
    assert not verdict.strays, message
    assert not verdict.committed_behind, message

    # Only a killed member's records may be handed out again: its uncommitted ones, to
    # whoever took its ranges over. Each hand-out of such a record but the last must be
    # the killed member's, and before it died.
    handouts: dict[tuple[int, int], list[Event]] = {}
    for event in sorted(events, key=lambda e: e.time):
        if event.kind == "H":
            handouts.setdefault((event.partition, event.offset), []).append(event)
    unexplained = [(tp, [(e.member, round(e.time - began, 2)) for e in outs]) for tp, outs in sorted(handouts.items())
                   if len(outs) > 1 and any(e.member not in members.killed or e.time > members.killed[e.member]
                                            for e in outs[:-1])]
    assert not unexplained, f"records handed out again though their member was not killed: {unexplained[:10]}; {message}"

    # The killed members' ranges were taken over: every record of a key a killed member
    # held that it had not finished before it died was handed to another member.
    for victim in members.killed:
        held = {(e.partition, e.key) for e in events if e.member == victim and e.kind == "H"}
        done = {(e.partition, e.offset) for e in events if e.member == victim and e.kind == "F"}
        elsewhere = {(e.partition, e.offset) for e in events if e.kind == "H" and e.member != victim}
        assert held, f"{victim} was handed nothing before it was killed: {message}"
        orphaned = [(a.partition, a.offset) for a in history.acks
                    if (a.partition, (a.key or b"").hex()) in held and (a.partition, a.offset) not in done
                    and (a.partition, a.offset) not in elsewhere]
        assert not orphaned, (f"nobody took over {len(orphaned)} records of {victim}'s keys, e.g. {orphaned[:10]}; "
                              f"{message}")
    ends = {p: end for (_, p), end in _log_end(kafka.bootstrap_servers, topic, PARTITIONS).items()}
    problems = order_violations(events, ends, set(members.killed))
    assert not problems, f"{len(problems)} hand-off problems, e.g. {problems[:10]}; {message}"
    _assert_order(verdict, set(members.killed), message)
    print(f"member kills: {verdict.redelivered} re-delivered ({len(verdict.duplicates)} records); {context()}")
