"""Consumers of ``python -m benchmarks coop``: ``--consumers`` of them in one process, as
trio tasks (the bench spreads N consumers over processes: one each without work, where each
needs a core, and over two with paced work, where N processes would spend the 2 cores
waking up, as the share harness runs its N consumers as threads of one JVM).

    python -m benchmarks.workloads.coop_worker --bootstrap HOST:PORT --topic T --group G \
        --index 0 --consumers 8 --members 16 --mode coop --work-ms 1 --chunk-bytes 16384 --out /tmp/w

Each a trio ``proxy.client.Consumer`` of group ``G`` (``allow_individual_commit``) on
partition 0 of ``T``, with its own connections. ``--bootstrap`` given R times names R proxy
instances: consumer ``i`` (its index among the members) goes through instance ``i mod R``, as
a load balancer in front of proxy replicas spreads the members of a group:

- ``--mode coop``: ``assign([tp], cooperative=True)``, chunks of offsets handed out by the
  proxy (docs/cooperative-fetch.md), ``max_partition_fetch_bytes`` = ``--chunk-bytes``;
- ``--mode keyrange``: ``assign({tp: [equal_shares(members)[index]]})``, the member's key
  range.

Either way it loops ``poll``, does ``--work-ms`` of paced work per record, one record after
another (the deadline of each record is one work time after the previous record's deadline,
restarting from now after an idle gap, as ``benchmarks/java/common`` Bench does; 0: no work),
``mark_processed(record)``, and commits with ``consumer.commit_processed()`` beside the
processing: after a poll, if marks are pending and no commit is on its way, one starts in
a task of its own (a KafkaShareConsumer likewise sends its acknowledgements with its next
fetch, without stopping the application); a retriable failure is counted and left to the
next commit, which carries the marks.

Start-up is kept out of the measurement: each consumer connects (``Consumer.__aenter__``)
and writes ``R <time>`` to ``<out><index>.progress``; the process waits for a line on stdin
before they assign and poll, so the parent starts all N together once all are ready. It
runs until SIGTERM.

``<out><index>.progress`` (single ``os.write`` calls of whole lines on an O_APPEND descriptor;
times are ``time.monotonic()``, one clock for every process of the machine):

- ``P <time> <records processed so far> <first>-<last>,...``: the offsets processed since
  the previous line, as contiguous runs; after every poll's records and, with work, every
  ``--line-every`` records within a poll;
- ``E <error>``: the loop failed (the exception follows on stderr).

``<out><index>.json``, written on exit: the consumer's ``metrics()``, the number of polls
and commits, the seconds spent in poll, in commit and in work, and the process's CPU
seconds shared evenly by its consumers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import trio

from benchmarks.workloads.stopping import until_signalled


class _Line:
    """Offsets processed since the last progress line, as contiguous runs."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.count = 0
        self.runs: list[list[int]] = []

    def add(self, offset: int) -> None:
        self.count += 1
        if self.runs and self.runs[-1][1] + 1 == offset:
            self.runs[-1][1] = offset
        else:
            self.runs.append([offset, offset])

    def flush(self) -> None:
        if not self.runs:
            return
        text = b",".join(b"%d-%d" % (first, last) for first, last in self.runs)
        os.write(self.fd, b"P %.6f %d %s\n" % (time.monotonic(), self.count, text))
        self.runs = []


async def work(args: argparse.Namespace, index: int, stats: dict, start: trio.Event) -> None:
    from proxy.client import Consumer, RetriableError, TopicPartition, equal_shares

    progress = os.open(f"{args.out}{index}.progress", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    line = _Line(progress)
    pace = args.work_ms / 1000
    tp = TopicPartition(args.topic, 0)
    settings = {"group_id": args.group, "client_id": f"{args.group}-{index}", "auto_offset_reset": "earliest",
                "allow_individual_commit": True}
    if args.chunk_bytes:
        settings["max_partition_fetch_bytes"] = args.chunk_bytes
    async with Consumer(args.bootstrap[index % len(args.bootstrap)], **settings) as consumer:
        os.write(progress, b"R %.6f\n" % time.monotonic())
        await start.wait()
        stats["started"] = time.monotonic()
        if args.mode == "coop":
            consumer.assign([tp], cooperative=True)
        else:
            consumer.assign({tp: [equal_shares(args.members)[index]] if args.members > 1 else []})
        due = trio.current_time()
        committing = False

        async def commit() -> None:
            nonlocal committing
            began = time.perf_counter()
            try:
                await consumer.commit_processed()
                stats["commits"] += 1
            except RetriableError as exc:  # the marks stay pending: the next commit carries them
                stats["commits_retriable"] = stats.get("commits_retriable", 0) + 1
                stats["last_retriable"] = repr(exc)
            finally:
                stats["commit_s"] += time.perf_counter() - began
                committing = False

        try:
            async with trio.open_nursery() as commits:
                while True:
                    began = time.perf_counter()
                    batch = await consumer.poll(0.5)
                    polled = time.perf_counter()
                    stats["poll_s"] += polled - began
                    stats["polls"] += 1
                    for i, record in enumerate(batch):
                        if pace:
                            now = trio.current_time()
                            if now - due > 2 * pace:  # idle (waiting for records): not made up
                                due = now
                            due += pace
                            await trio.sleep_until(due)  # the slow service call
                            if i % args.line_every == args.line_every - 1:
                                line.flush()
                        consumer.mark_processed(record)
                        line.add(record.offset)
                    line.flush()
                    stats["work_s"] += time.perf_counter() - polled
                    if not committing and consumer.pending_commit(tp):
                        committing = True
                        commits.start_soon(commit)
        except Exception as exc:
            os.write(progress, b"E %s\n" % repr(exc).encode(errors="replace")[:500])
            raise
        finally:
            stats["metrics"] = consumer.metrics()


async def main_async(args: argparse.Namespace, stats: list[dict]) -> None:
    start = trio.Event()

    async def consumers() -> None:
        async with trio.open_nursery() as nursery:
            for offset, own in enumerate(stats):
                nursery.start_soon(work, args, args.index + offset, own, start)
            await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)  # the start signal
            start.set()

    await until_signalled(consumers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True, action="append",
                        help="a proxy instance; given R times, consumer i goes through instance i mod R")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--index", type=int, required=True, help="the first consumer's index")
    parser.add_argument("--consumers", type=int, default=1,
                        help="consumers in this process, as trio tasks, indexes --index on")
    parser.add_argument("--members", type=int, required=True)
    parser.add_argument("--mode", choices=("coop", "keyrange"), required=True)
    parser.add_argument("--work-ms", type=float, default=0.0)
    parser.add_argument("--chunk-bytes", type=int, default=0, help="max_partition_fetch_bytes (0: the default)")
    parser.add_argument("--line-every", type=int, default=20, help="with work: a progress line every so many records")
    parser.add_argument("--out", required=True,
                        help="path prefix of the progress and stats files, the consumer's index appended")
    args = parser.parse_args(argv)
    stats: list[dict] = [{"polls": 0, "commits": 0, "poll_s": 0.0, "commit_s": 0.0, "work_s": 0.0}
                         for _ in range(args.consumers)]
    try:
        trio.run(main_async, args, stats)
    finally:
        cpu = sum(os.times()[:2])
        for offset, own in enumerate(stats):
            own["cpu_s"] = cpu / len(stats)  # the process's, shared evenly
            with open(f"{args.out}{args.index + offset}.json", "w") as out:
                json.dump(own, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
