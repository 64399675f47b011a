"""A consumer-group member in a process of its own: for the tests and the chaos matrix that
SIGKILL members, and for the groups benchmark, so that M members are not limited by one
Python process's CPU.

    python -m harness.group_member --bootstrap HOST:PORT --group G --topic T \
        --name m1 --events /tmp/m1.events --stop /tmp/stop

It subscribes (``keyrange`` assignor, individual commit; ``--partition-sharing cooperative``:
members beyond the partitions share them in chunks the proxy grants), or with ``--assign`` takes
partitions itself (``share/of`` for share ``share`` of ``of`` equal key ranges of every
partition, or ``whole`` for every partition whole; commits then go to ``--group`` without
membership). Each record of a poll takes ``--work-ms`` plus a random time up to
``--delay-max-ms`` (seeded by ``--seed``), one after another, the deadlines chained from the
poll's return (a slow service answering each call in that time: the event loop's timer
granularity is not counted as work, time spent in poll is). It marks every record processed
and commits after every poll (``--commit-in-background``: in a task of its own, so the
commit round trip overlaps the work).

Lines appended to ``--events``, with ``time.monotonic()`` times (one system-wide clock on
Linux, so the events of several processes lie on one timeline); ``--events-per record``
(the default) writes H and F, ``--events-per poll`` writes P instead:

    H <name> <partition> <offset> <key-hex> <time>   handed out by poll
    F <name> <partition> <offset> <key-hex> <time>   finished processing
    P <first finish> <last finish> <count>           one poll's records processed
    A|R|L <name> <time> <assignment>                 assigned, revoked, lost
    J <time>                                         subscribed
    S <time> <generation> <phase> <revoking> <assignment>   the member's group state changed

The Java member of the groups benchmark (``benchmarks/GroupMember.java``) writes the same
J, P, A, R and L lines. Each write is a single ``os.write`` on an O_APPEND file descriptor,
so a SIGKILL leaves whole lines only. The member stops cleanly (commits what it processed,
then LeaveGroup) once the ``--stop`` file exists.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import trio

from harness import ROOT
from proxy.client import Consumer, RebalanceListener, RetriableError, TopicPartition, equal_shares
from proxy.client.group import describe


class _Events:
    def __init__(self, path: str, name: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.name = name

    def write(self, lines: list[str]) -> None:
        if lines:
            os.write(self._fd, "".join(line + "\n" for line in lines).encode())

    def records(self, kind: str, records: Any) -> None:
        now = time.monotonic()
        self.write([f"{kind} {self.name} {r.partition} {r.offset} {(r.key or b'').hex()} {now:.6f}" for r in records])

    def change(self, kind: str, assignment: Any) -> None:
        self.write([f"{kind} {self.name} {time.monotonic():.6f} {describe(assignment)}"])


class _Listener(RebalanceListener):
    def __init__(self, events: _Events) -> None:
        self.events = events

    async def on_assigned(self, assignment: Any) -> None:
        self.events.change("A", assignment)

    async def on_revoked(self, assignment: Any) -> None:
        self.events.change("R", assignment)

    async def on_lost(self, assignment: Any) -> None:
        self.events.change("L", assignment)


def _state(consumer: Consumer) -> tuple[object, ...]:
    meta = consumer.group_metadata()
    return meta["generation"], meta["phase"], int(bool(consumer.to_be_revoked())), describe(consumer.assignment())


async def run(args: argparse.Namespace) -> None:
    events = _Events(args.events, args.name)
    rng = random.Random(args.seed)
    per_record = args.events_per == "record"
    settings = dict(group_id=args.group, client_id=args.name, allow_individual_commit=not args.standard_commits,
                    auto_offset_reset="earliest", max_poll_records=args.max_poll_records,
                    heartbeat_interval_ms=args.heartbeat_interval_ms, session_timeout_ms=args.session_timeout_ms,
                    max_poll_interval_ms=args.max_poll_interval_ms, partition_sharing=args.partition_sharing)
    async with Consumer(args.bootstrap, **settings) as consumer:
        subscribed = args.assign is None
        if subscribed:
            consumer.subscribe([args.topic], _Listener(events))
            events.write([f"J {time.monotonic():.6f}"])
        else:
            consumer.assign(_assignment(args.topic, args.partitions, args.assign))
        reported: tuple[object, ...] = ()
        committing = False

        async def commit() -> None:
            nonlocal committing
            try:
                await consumer.commit()
            except RetriableError:
                pass  # a rebalance is completing; the marks stay pending for the next commit
            finally:
                committing = False

        async with trio.open_nursery() as background:
            while not os.path.exists(args.stop):
                records = await consumer.poll(0.2)
                if per_record:
                    events.records("H", records)
                due = trio.current_time()
                first = last = 0.0
                for record in records:
                    due += (args.work_ms + rng.random() * args.delay_max_ms) / 1000
                    await trio.sleep_until(due)  # the slow service call
                    if per_record:
                        events.records("F", [record])
                    if not args.standard_commits:
                        consumer.mark_processed(record)
                    last = time.monotonic()
                    first = first or last
                lines = [] if per_record or not records else [f"P {first:.6f} {last:.6f} {len(records)}"]
                if subscribed and (state := _state(consumer)) != reported:
                    reported = state
                    lines.append(f"S {time.monotonic():.6f} " + " ".join(map(str, state)))
                events.write(lines)
                if committing:
                    continue
                committing = True
                if args.commit_in_background:
                    background.start_soon(commit)
                else:
                    await commit()
        with trio.fail_after(30):
            while True:
                try:
                    await consumer.commit()
                    break
                except RetriableError:
                    await trio.sleep(0.1)


def _assignment(topic: str, partitions: int, spec: str) -> dict[TopicPartition, list]:
    """``whole`` or ``share/of`` (see the module docstring) over ``partitions`` partitions."""
    if spec == "whole":
        return {TopicPartition(topic, p): [] for p in range(partitions)}
    share, _, of = spec.partition("/")
    if not (share.isdigit() and of.isdigit() and 0 <= int(share) < int(of)):
        raise SystemExit(f"--assign: expected 'whole' or 'share/of' with 0 <= share < of, got {spec!r}")
    key_range = equal_shares(int(of))[int(share)]
    return {TopicPartition(topic, p): [key_range] for p in range(partitions)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--stop", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--assign", help="'whole' or 'share/of': assign instead of subscribing")
    parser.add_argument("--partitions", type=int, default=1, help="with --assign: the topic's partition count")
    parser.add_argument("--standard-commits", action="store_true",
                        help="commit the standard offset only (no individual commit)")
    parser.add_argument("--work-ms", type=float, default=0.0, help="the time each record takes")
    parser.add_argument("--delay-max-ms", type=float, default=4.0,
                        help="plus a random time up to this (0: every record takes --work-ms)")
    parser.add_argument("--events-per", choices=("record", "poll"), default="record",
                        help="H and F lines for every record, or one P line per poll")
    parser.add_argument("--commit-in-background", action="store_true",
                        help="commit in a task of its own, overlapping the next poll's work")
    parser.add_argument("--max-poll-records", type=int, default=10)
    parser.add_argument("--heartbeat-interval-ms", type=int, default=500)
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--max-poll-interval-ms", type=int, default=30000)
    parser.add_argument("--partition-sharing", choices=("keyrange", "cooperative"), default="keyrange",
                        help="how members share a partition once they outnumber the partitions")
    parser.add_argument("--profile", help="write a pyinstrument profile of the member (text) to this file")
    args = parser.parse_args(argv)
    if not args.profile:
        trio.run(run, args)
        return 0
    from pyinstrument import Profiler

    with Profiler(async_mode="disabled") as profiler:
        trio.run(run, args)
    with open(args.profile, "w") as out:
        out.write(profiler.output_text(unicode=False, show_all=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())


# -- reading the events back and checking them (the parent test) -------------------------
class Event(NamedTuple):
    """An H (handed out) or F (finished) line."""

    kind: str
    member: str
    partition: int
    offset: int
    key: str
    time: float


def read_events(paths: list[str]) -> list[Event]:
    """The H and F events of every file (a missing file has none yet)."""
    out: list[Event] = []
    for path in paths:
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            cells = line.split()
            if len(cells) == 6 and cells[0] in ("H", "F"):
                out.append(Event(cells[0], cells[1], int(cells[2]), int(cells[3]), cells[4], float(cells[5])))
    return out


def finished_count(events: list[Event]) -> int:
    return len({(e.partition, e.offset) for e in events if e.kind == "F"})


def order_violations(events: list[Event], ends: dict[int, int], killed: set[str]) -> list[str]:
    """What breaks the hand-off contract, on the events' global timeline:

    - a record of ``ends`` (partition -> end offset, all from 0) never finished: lost;
    - a record handed out again, though the member that had it was not killed;
    - a record handed out (the first time) before an earlier record of its key finished,
      unless that earlier record was handed to the same member no later and that member
      finished it first (a member processes what it is handed in order).

    Records handed out again after their member was killed are exempt from the last rule:
    re-delivery is what losing a member means.
    """
    handed: dict[tuple[int, int], list[tuple[float, str]]] = {}
    finished: dict[tuple[int, int], list[tuple[float, str]]] = {}
    keys: dict[tuple[int, int], str] = {}
    for e in events:
        (handed if e.kind == "H" else finished).setdefault((e.partition, e.offset), []).append((e.time, e.member))
        keys[e.partition, e.offset] = e.key
    problems: list[str] = []
    for p, end in sorted(ends.items()):
        missing = [o for o in range(end) if (p, o) not in finished]
        if missing:
            problems.append(f"partition {p}: {len(missing)} records never finished, first {missing[:5]}")
    for tp, outs in sorted(handed.items()):
        outs.sort()
        again = [who for _, who in outs[:-1] if who not in killed]
        if again:
            problems.append(f"{tp} handed out again although {again} was not killed: {outs}")
    by_key: dict[tuple[int, str], list[int]] = {}
    for (p, o), key in keys.items():
        if (p, o) in handed:
            by_key.setdefault((p, key), []).append(o)
    for (p, key), offsets in by_key.items():
        offsets.sort()
        for j, oj in enumerate(offsets):
            t, member = handed[p, oj][0]
            mine_j = [ft for ft, who in finished.get((p, oj), []) if who == member]
            for oi in offsets[:j]:
                if any(ft <= t for ft, _ in finished.get((p, oi), [])):
                    continue
                mine_i = [ft for ft, who in finished.get((p, oi), []) if who == member]
                with_it = any(ht <= t and who == member for ht, who in handed[p, oi])
                if with_it and (mine_i and (not mine_j or min(mine_i) <= min(mine_j))
                                or not mine_i and not mine_j and member in killed):
                    continue
                problems.append(f"partition {p} offset {oj} (key {key}) handed to {member} at {t:.3f} before "
                                f"offset {oi} of its key finished")
                break
    return problems


class MemberProcesses:
    """Member processes of one group, for the tests that SIGKILL them: started with
    ``options`` (more of this module's flags), killed or stopped by name, their event files
    read back; whatever still runs at the end is killed by its PID (``close``)."""

    def __init__(self, tmp: Path, bootstrap: str, group: str, topic: str, options: Sequence[str] = (),
                 module: str = "harness.group_member") -> None:
        self.tmp, self.bootstrap, self.group, self.topic = tmp, bootstrap, group, topic
        self.options = list(options)
        self.module = module  # the member program: this module, or harness.rdkafka_member
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.killed: dict[str, float] = {}  # name -> time.monotonic() once it is dead

    def events_path(self, name: str) -> str:
        return str(self.tmp / f"{name}.events")

    def stop_path(self, name: str) -> Path:
        return self.tmp / f"{name}.stop"

    def start(self, name: str, seed: int, options: Sequence[str] = ()) -> None:
        """Start member ``name``; ``options`` are flags of its own, after the fleet's."""
        with open(self.tmp / f"{name}.log", "wb") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", self.module, "--bootstrap", self.bootstrap,
                 "--group", self.group, "--topic", self.topic, "--name", name, "--events", self.events_path(name),
                 "--stop", str(self.stop_path(name)), "--seed", str(seed), *self.options, *options],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        self.killed[name] = time.monotonic()

    def leave(self, name: str) -> None:
        """Ask ``name`` to commit and leave, and wait for it to exit cleanly."""
        self.stop_path(name).touch()
        assert self.procs[name].wait(60) == 0, self.log_tail(name)

    def stop_all(self, timeout: float = 60.0) -> None:
        """``leave`` for every live member at once, within ``timeout`` in all."""
        running = self.alive()
        for name in running:
            self.stop_path(name).touch()
        deadline = time.monotonic() + timeout
        for name in running:
            code = self.procs[name].wait(max(0.1, deadline - time.monotonic()))
            assert code == 0, f"{name} exited with {code}:\n{self.log_tail(name)}"

    def alive(self) -> list[str]:
        return [name for name, proc in self.procs.items() if proc.poll() is None]

    def events(self) -> list[Event]:
        return read_events([self.events_path(name) for name in self.procs])

    def finished(self) -> int:
        return finished_count(self.events())

    def handed_out(self) -> dict[str, int]:
        """Records handed out so far, per member."""
        counts = dict.fromkeys(self.procs, 0)
        for event in self.events():
            if event.kind == "H":
                counts[event.member] += 1
        return counts

    def in_flight(self, name: str) -> int:
        """Records ``name`` was handed and has not finished processing (by its event file)."""
        events = read_events([self.events_path(name)])
        return sum(e.kind == "H" for e in events) - sum(e.kind == "F" for e in events)

    def log_tail(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:]

    def check_running(self) -> None:
        for name, proc in self.procs.items():
            if name not in self.killed and proc.poll() not in (None, 0):
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
