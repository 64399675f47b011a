"""One worker of the key-ordered workload in a process of its own (the issue's setup: N
workers, each a separate Python process), so N workers are not held to one process's core.

    python -m benchmarks.workloads.key_ordered_worker --bootstrap HOST:PORT --topic T \
        --group G --index 0 --workers 16 --work-ms 1 --out /tmp/w0 [--subscribe]

A range consumer (assign mode, share ``index`` of ``workers`` equal key-hash shares; or,
with ``--subscribe``, a member of the group ``G`` whose keyrange assignor cuts the
partition) that paces ``--work-ms`` per record like every other peer of the workload and
commits individually in the background after every poll. It runs until SIGTERM.

Files, so the parent can count and check across processes with one clock
(``time.monotonic()`` is the same for every process of the machine):

- ``<out>.progress``: ``C <time> <records processed>`` after the first record and after
  every poll's records (single ``os.write`` calls on an O_APPEND descriptor);
- ``<out>.log``: on exit, every processed record as three arrays of equal length (key
  number uint32, sequence uint32, finish time float64), preceded by their length (uint64).
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import time
from array import array

import trio

from benchmarks.workloads import data
from benchmarks.workloads.stopping import until_signalled

LENGTH = struct.Struct("<Q")


class _Processed:
    """The records this worker finished, in order, for the parent's order check and count."""

    def __init__(self) -> None:
        self.keys = array("I")
        self.sequences = array("I")
        self.times = array("d")

    def write(self, path: str) -> None:
        with open(path, "wb") as out:
            out.write(LENGTH.pack(len(self.keys)))
            for column in (self.keys, self.sequences, self.times):
                column.tofile(out)


def read_log(path: str) -> tuple[array, array, array]:
    """A worker's ``<out>.log``: (keys, sequences, finish times)."""
    with open(path, "rb") as source:
        (count,) = LENGTH.unpack(source.read(LENGTH.size))
        columns = (array("I"), array("I"), array("d"))
        for column in columns:
            column.fromfile(source, count)
    return columns


async def work(args: argparse.Namespace, processed: _Processed) -> None:
    from proxy.client import Consumer, RetriableError, TopicPartition, equal_shares

    progress = os.open(args.out + ".progress", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    pace = args.work_ms / 1000
    keys, sequences, times = processed.keys, processed.sequences, processed.times
    async with Consumer(args.bootstrap, group_id=args.group, client_id=f"{args.group}-{args.index}",
                        auto_offset_reset="earliest", allow_individual_commit=True,
                        max_poll_records=args.max_poll_records) as consumer:
        if args.subscribe:
            consumer.subscribe([args.topic])
        else:
            shares = equal_shares(args.workers)
            consumer.assign({TopicPartition(args.topic, 0): [shares[args.index]] if args.workers > 1 else []})
        committing = False
        due = trio.current_time()
        async with trio.open_nursery() as background:
            async def commit() -> None:
                nonlocal committing
                try:
                    await consumer.commit()
                except RetriableError:  # a rebalance is completing; the next commit carries them
                    pass
                finally:
                    committing = False

            while True:
                batch = await consumer.poll(1.0)
                first = not times
                for record in batch:
                    if pace:
                        now = trio.current_time()
                        if now - due > 2 * pace:  # idle (waiting for records): not made up
                            due = now
                        due += pace
                        await trio.sleep_until(due)  # the slow service call
                    key, sequence = data.sequence_of(record.value or b"")
                    keys.append(int(key))
                    sequences.append(sequence)
                    times.append(time.monotonic())
                    consumer.mark_processed(record)
                    if first:
                        first = False
                        os.write(progress, b"C %.6f %d\n" % (times[-1], len(times)))
                if batch:
                    os.write(progress, b"C %.6f %d\n" % (time.monotonic(), len(times)))
                    if not committing:
                        committing = True
                        background.start_soon(commit)


async def main_async(args: argparse.Namespace, processed: _Processed) -> None:
    await until_signalled(lambda: work(args, processed))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--work-ms", type=float, default=1.0)
    parser.add_argument("--max-poll-records", type=int, default=500)
    parser.add_argument("--subscribe", action="store_true")
    parser.add_argument("--out", required=True, help="path prefix of the progress and log files")
    args = parser.parse_args(argv)
    processed = _Processed()
    try:
        trio.run(main_async, args, processed)
    finally:
        processed.write(args.out + ".log")
    return 0


if __name__ == "__main__":
    sys.exit(main())
