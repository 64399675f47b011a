"""Per-key order across hand-offs when group members are SIGKILLed (docs/wire-contract.md
section 8): member processes (``harness.group_member``) join, leave cleanly and are
killed while the group consumes, each record taking a random time; their event logs, on
one system-wide monotonic clock, are checked afterwards."""

from __future__ import annotations

from harness.group_member import MemberProcesses, order_violations
from harness.wait import wait_until

from .test_consumer_group import _produce


def test_per_key_order_holds_when_members_are_killed(kafka, proxy, topic_factory, tmp_path):
    topic = topic_factory(kafka, partitions=2)
    total = 4000
    _produce(kafka.bootstrap_servers, topic, 2, total, keys=50)
    members = MemberProcesses(tmp_path, proxy.bootstrap_servers, f"g-{topic}", topic, options=[
        "--delay-max-ms", "6", "--session-timeout-ms", "6000", "--heartbeat-interval-ms", "500",
        "--max-poll-interval-ms", "30000"])

    def reached(count: int, what: str) -> None:
        def condition() -> bool:
            members.check_running()
            return members.finished() >= count
        wait_until(condition, timeout=120, interval=0.05, what=lambda: f"{what} ({members.finished()} of {total})")

    try:
        for i in range(3):
            members.start(f"m{i}", seed=i)
        reached(total // 8, "the first members process")
        # m1 joined last: its ranges may come a rebalance later than the others' (their owners
        # revoke first), and on a busy machine later than the first records' processing
        wait_until(lambda: members.handed_out()["m1"] > 0, timeout=60, interval=0.05, what="m1 gets records")
        members.kill("m1")  # mid-stream: its ranges stall until its session times out
        members.start("m3", seed=3)
        reached(3 * total // 8, "the group recovers from the first kill")
        members.leave("m0")  # a clean leave: its ranges are handed on cooperatively
        reached(total // 2, "after the clean leave")
        members.start("m4", seed=4)
        wait_until(lambda: members.handed_out()["m4"] > 0 or members.finished() >= total, timeout=60, interval=0.05,
                   what="m4 gets records")
        members.kill("m2")  # right after a rebalance handed m4 its share
        members.start("m5", seed=5)
        reached(total, "every record processed")
        for name in members.alive():
            members.leave(name)
        events = members.events()
    finally:
        members.close()

    problems = order_violations(events, {0: total // 2, 1: total // 2}, set(members.killed))
    assert not problems, "\n".join(problems[:20])
    # the killed members' keys were taken over: those with records still to process at the
    # kill were handed to someone else after it (a member may have finished its whole share
    # before it was killed; nothing lost is checked above)
    for name, when in members.killed.items():
        assert any(e.member == name and e.kind == "H" for e in events), f"{name} was handed nothing before it was killed"
        left = _keys_with_work_left(events, name, when)
        taken = {(e.partition, e.key) for e in events if e.kind == "H" and e.member != name and e.time > when}
        assert left <= taken, f"nobody took over these keys of {name}: {sorted(left - taken)[:10]}"


def _keys_with_work_left(events, name: str, when: float) -> set[tuple[int, str]]:
    """The (partition, key) pairs ``name`` was the last to be handed a record of before
    ``when`` and of which some record had not finished by then."""
    last_holder: dict[tuple[int, str], str] = {}
    for e in sorted((e for e in events if e.kind == "H" and e.time <= when), key=lambda e: e.time):
        last_holder[e.partition, e.key] = e.member
    done = {(e.partition, e.offset) for e in events if e.kind == "F" and e.time <= when}
    return {(e.partition, e.key) for e in events
            if last_holder.get((e.partition, e.key)) == name and (e.partition, e.offset) not in done}
