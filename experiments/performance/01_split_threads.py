"""Whether the key-range split would use a second core from a worker thread as it is.

The C kernel releases the GIL only around its record walk; the batch loop around it (header
parse, CRC, decompression, rebuild) holds it. This runs the same passes over a ~1 MiB
Records blob (16 KiB batches of 100-byte records, 4 equal key ranges) on one thread, then
split between two, and prints both rates: a speed-up near 2 would mean the split can go
to a worker thread as it is; below 1, the threads only fight over the GIL, and the loop
has to move into C first.

    .venv/bin/python experiments/performance/01_split_threads.py
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.bench_split import make_blob  # noqa: E402
from proxy.ranges import equal_shares  # noqa: E402
from proxy.records.compression import Codec  # noqa: E402
from proxy.records.plan import RangePlan  # noqa: E402
from proxy.records.split import filter_by_offsets, match_offsets, split_records  # noqa: E402

PASSES = 40
ROUNDS = 5


def _passes(work, count: int) -> None:
    for _ in range(count):
        work()


def _wall(work, threads: int) -> float:
    workers = [threading.Thread(target=_passes, args=(work, PASSES // threads)) for _ in range(threads)]
    began = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return time.perf_counter() - began


def main() -> None:
    plan = RangePlan([[r] for r in equal_shares(4)])
    for codec in (Codec.NONE, Codec.LZ4):
        blob, count = make_blob(codec)
        cases = {
            "split_records": lambda blob=blob: split_records(blob, plan),
            "match+filter": lambda blob=blob: filter_by_offsets(blob, set(match_offsets(blob, plan).offsets[0])),
        }
        for name, work in cases.items():
            work()
            one = statistics.median(_wall(work, 1) for _ in range(ROUNDS))
            two = statistics.median(_wall(work, 2) for _ in range(ROUNDS))
            print(f"{codec.name:5} {name:14} one thread {PASSES * count / one / 1e6:5.2f} M records/s, "
                  f"two threads {PASSES * count / two / 1e6:5.2f} M records/s: {one / two:.2f} x")


if __name__ == "__main__":
    main()
