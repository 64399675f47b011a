"""A member of the groups benchmark in a process of its own, so that M members are not
limited by one Python process's CPU.

    python -m benchmarks.group_member --bootstrap HOST:PORT --group G --topic T \
        --name m1 --events /tmp/m1.events --stop /tmp/stop --work-ms 1

It subscribes (``keyrange`` assignor, individual commit) and for each poll's records waits
``--work-ms`` per record, one after another, the deadlines chained from the poll's return
(a slow service answering each call in that time: the event loop's timer granularity is
not counted as work, time spent in poll is). It marks every record processed and commits
in a background task after each poll, so the commit round trip overlaps the work.

Lines appended to ``--events`` (each a single ``os.write`` on an O_APPEND descriptor), with
``time.monotonic()`` times, one clock for every process on the machine (the Java member
``benchmarks/GroupMember.java`` writes the same lines):

    J <time>                                    subscribed
    P <first finish> <last finish> <count>      one poll's records processed
    S <time> <generation> <phase> <revoking> <assignment>   the member's group state changed
    A|R|L <time> <assignment>                   listener calls: assigned, revoked, lost

It stops (commits what it processed, then LeaveGroup on close) once ``--stop`` exists.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import trio

from proxy.client import Consumer, RebalanceListener, RetriableError
from proxy.client.group import describe


class _Events:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, *lines: str) -> None:
        if lines:
            os.write(self._fd, "".join(line + "\n" for line in lines).encode())


class _Listener(RebalanceListener):
    def __init__(self, events: _Events) -> None:
        self.events = events

    async def on_assigned(self, assignment: Any) -> None:
        self.events.write(f"A {time.monotonic():.6f} {describe(assignment)}")

    async def on_revoked(self, assignment: Any) -> None:
        self.events.write(f"R {time.monotonic():.6f} {describe(assignment)}")

    async def on_lost(self, assignment: Any) -> None:
        self.events.write(f"L {time.monotonic():.6f} {describe(assignment)}")


def _state(consumer: Consumer) -> tuple[object, ...]:
    meta = consumer.group_metadata()
    return meta["generation"], meta["phase"], int(bool(consumer.to_be_revoked())), describe(consumer.assignment())


async def run(args: argparse.Namespace) -> None:
    events = _Events(args.events)
    work = args.work_ms / 1000
    async with Consumer(args.bootstrap, group_id=args.group, client_id=args.name, allow_individual_commit=True,
                        auto_offset_reset="earliest", max_poll_records=args.max_poll_records,
                        heartbeat_interval_ms=500, session_timeout_ms=10_000) as consumer:
        consumer.subscribe([args.topic], _Listener(events))
        events.write(f"J {time.monotonic():.6f}")
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
                due = trio.current_time()
                first = last = 0.0
                for record in records:
                    due += work
                    await trio.sleep_until(due)  # the slow service call
                    consumer.mark_processed(record)
                    last = time.monotonic()
                    first = first or last
                lines = [f"P {first:.6f} {last:.6f} {len(records)}"] if records else []
                state = _state(consumer)
                if state != reported:
                    reported = state
                    lines.append(f"S {time.monotonic():.6f} " + " ".join(map(str, state)))
                events.write(*lines)
                if not committing:
                    committing = True
                    background.start_soon(commit)
        with trio.fail_after(30):
            while True:
                try:
                    await consumer.commit()
                    break
                except RetriableError:
                    await trio.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--stop", required=True)
    parser.add_argument("--work-ms", type=float, default=1.0)
    parser.add_argument("--max-poll-records", type=int, default=50)
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
