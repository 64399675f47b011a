"""Whether the key-range split uses a second core from a worker thread.

The per-batch loop of ``split_records`` releases the GIL only around the C record walk;
its batch loop (header parse, CRC, decompression, rebuild) holds it. The whole-blob path
(``split_blob``, taken for uncompressed blobs) runs all of that in one C call that holds
the GIL only to allocate its outputs. This runs the same passes over a ~1 MiB Records blob
(16 KiB batches of 100-byte records, 4 equal key ranges) on one thread, then split between
two, and prints both rates (best of interleaved rounds) and how many cores the two threads
kept busy (process CPU time over wall time): a speed-up near 2 means the split can go to a
worker thread and use the second core; below 1, the threads only fight over the GIL. It
tunes malloc as the proxy does at start (``tune_malloc``); otherwise fresh output pages
fault in on every pass and cost about as much as the split itself.

Measured on the 2-core machine of benchmarks/results/split.json, while a CI run also used it:

* before ``split_blob`` (commit 21066c3, medians), every case: 0.63-0.95 x;
* uncompressed, whole blob: 1.88 x (36.5 -> 68.7 M records/s, 1.94 cores busy); the
  per-batch loop on the same blob in the same run: 0.67-0.70 x (12.4 -> 8.6 M records/s,
  1.15 cores busy);
* lz4 (no whole-blob path: the per-batch loop) and match+filter: 0.80-0.97 x, as before;
* when the CI run held one of the cores, every case stayed below one core busy (whole blob
  0.93 x): the column tells such a run apart.

    .venv/bin/python experiments/performance/01_split_threads.py
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.bench_split import make_blob  # noqa: E402
from proxy.ranges import equal_shares  # noqa: E402
from proxy.records import kernels  # noqa: E402
from proxy.records.compression import Codec  # noqa: E402
from proxy.records.plan import RangePlan  # noqa: E402
from proxy.records.split import filter_by_offsets, match_offsets, split_records  # noqa: E402
from proxy.server.memory import tune_malloc  # noqa: E402

PASSES = 200
ROUNDS = 7


def _passes(work, count: int) -> None:
    for _ in range(count):
        work()


def _wall(work, threads: int) -> tuple[float, float]:
    """Wall time of PASSES passes shared by ``threads`` threads, and the process CPU time."""
    workers = [threading.Thread(target=_passes, args=(work, PASSES // threads)) for _ in range(threads)]
    began, cpu = time.perf_counter(), time.process_time()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return time.perf_counter() - began, time.process_time() - cpu


def _compare(work) -> tuple[float, float, float]:
    """Best wall time on one thread and on two, rounds interleaved so that a change in the
    machine's other load hits both alike; and the cores the best two-thread round kept busy."""
    ones, twos = [], []
    for _ in range(ROUNDS):
        ones.append(_wall(work, 1))
        twos.append(_wall(work, 2))
    one = min(wall for wall, _ in ones)
    two, cpu = min(twos)
    return one, two, cpu / two


def main() -> None:
    tune_malloc()  # as the proxy does at start: outputs reuse heap pages instead of faulting fresh ones
    plan = RangePlan([[r] for r in equal_shares(4)])
    for codec in (Codec.NONE, Codec.LZ4):
        blob, count = make_blob(codec)
        cases = {  # name: (whole-blob path allowed, work)
            "split_records": (True, lambda blob=blob: split_records(blob, plan)),
            "split per-batch": (False, lambda blob=blob: split_records(blob, plan)),
            "match+filter": (True, lambda blob=blob: filter_by_offsets(blob, set(match_offsets(blob, plan).offsets[0]))),
        }
        for name, (whole_blob, work) in cases.items():
            if codec is not Codec.NONE and not whole_blob and kernels.split_blob is not None:
                continue  # compressed: split_records is the per-batch loop already
            with kernels.using("c" if kernels.ACCELERATED else "python", whole_blob=whole_blob):
                work()
                one, two, cores = _compare(work)
            print(f"{codec.name:5} {name:15} one thread {PASSES * count / one / 1e6:5.2f} M records/s, "
                  f"two threads {PASSES * count / two / 1e6:5.2f} M records/s: {one / two:.2f} x "
                  f"({cores:.2f} cores busy)")


if __name__ == "__main__":
    main()
