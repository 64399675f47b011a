"""Per-key order across hand-offs when group members are SIGKILLed (docs/wire-contract.md
section 8): member processes (``proxy.testing.group_member``) join, leave cleanly and are
killed while the group consumes, each record taking a random time; their event logs, on
one system-wide monotonic clock, are checked afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from proxy.testing.group_member import finished_count, order_violations, read_events
from proxy.testing.wait import wait_until

from .test_consumer_group import _produce

REPO = Path(__file__).resolve().parents[2]


class Members:
    """Member processes of one group; every one still running is killed at the end."""

    def __init__(self, tmp: Path, bootstrap: str, group: str, topic: str) -> None:
        self.tmp, self.bootstrap, self.group, self.topic = tmp, bootstrap, group, topic
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.killed: dict[str, float] = {}

    def events_path(self, name: str) -> str:
        return str(self.tmp / f"{name}.events")

    def stop_path(self, name: str) -> Path:
        return self.tmp / f"{name}.stop"

    def start(self, name: str, seed: int) -> None:
        log = open(self.tmp / f"{name}.log", "wb")
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "proxy.testing.group_member", "--bootstrap", self.bootstrap, "--group", self.group,
             "--topic", self.topic, "--name", name, "--events", self.events_path(name),
             "--stop", str(self.stop_path(name)), "--seed", str(seed), "--delay-max-ms", "6",
             "--session-timeout-ms", "6000", "--heartbeat-interval-ms", "500", "--max-poll-interval-ms", "30000"],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        self.killed[name] = time.monotonic()

    def leave(self, name: str) -> None:
        self.stop_path(name).touch()
        assert self.procs[name].wait(60) == 0, self.log_tail(name)

    def events(self):
        return read_events([self.events_path(n) for n in self.procs])

    def finished(self) -> int:
        return finished_count(self.events())

    def handed_to(self, name: str) -> int:
        return sum(1 for e in read_events([self.events_path(name)]) if e.kind == "H")

    def log_tail(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:]

    def alive(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is None]

    def check_running(self) -> None:
        for name, proc in self.procs.items():
            if name not in self.killed and proc.poll() not in (None, 0):
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)


def test_per_key_order_holds_when_members_are_killed(kafka, proxy, topic_factory, tmp_path):
    topic = topic_factory(kafka, partitions=2)
    total = 4000
    _produce(kafka.bootstrap_servers, topic, 2, total, keys=50)
    members = Members(tmp_path, proxy.bootstrap_servers, f"g-{topic}", topic)

    def reached(count: int, what: str) -> None:
        def condition() -> bool:
            members.check_running()
            return members.finished() >= count
        wait_until(condition, timeout=120, interval=0.05, what=lambda: f"{what} ({members.finished()} of {total})")

    try:
        for i in range(3):
            members.start(f"m{i}", seed=i)
        reached(total // 8, "the first members process")
        members.kill("m1")  # mid-stream: its ranges stall until its session times out
        members.start("m3", seed=3)
        reached(3 * total // 8, "the group recovers from the first kill")
        members.leave("m0")  # a clean leave: its ranges are handed on cooperatively
        reached(total // 2, "after the clean leave")
        members.start("m4", seed=4)
        wait_until(lambda: members.handed_to("m4") > 0 or members.finished() >= total, timeout=60, interval=0.05,
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
