"""Key-range splits off the event loop.

The proxy's event loop runs on one thread; on a machine with a second core, the split of
a large broker read (hash every key, copy each range set's records, checksum the rebuilt
batches) is the one piece of its work that can go elsewhere, because the C kernel does
all of it without the GIL. ``SplitWorkers`` hands the splits of one response to a worker
thread in one trip and waits for them, while the loop keeps relaying other frames.

Small reads stay on the loop (a trip to a thread and back costs more than splitting a few
kilobytes), and so does everything when the C kernels are not built: the pure-Python
split holds the GIL, so a thread would only take turns with the loop.

Bounded: at most ``threads`` splits run at once (a ``CapacityLimiter``); a response
whose splits wait for a thread holds only the frame it already held.

Off by default (``key.range.split.threads=0``): measured on 2 cores, consumers sharing a
partition all wait for the one split of their read, so the loop has little to do while it
runs, and the trip to the thread and back costs more than it frees (docs/proxy.md).
"""

from __future__ import annotations

from collections.abc import Iterable

import trio

from proxy.keyrange.engine import SplitJob
from proxy.keyrange.metrics import KeyRangeMetrics
from proxy.records import kernels


class SplitWorkers:
    def __init__(self, threads: int, min_bytes: int, metrics: KeyRangeMetrics | None = None) -> None:
        """``threads`` 0: every split on the event loop."""
        self.threads = threads if whole_blob_in_c() else 0
        self.min_bytes = min_bytes
        self._limiter = trio.CapacityLimiter(self.threads) if self.threads else None
        self.metrics = metrics or KeyRangeMetrics()

    async def run(self, jobs: Iterable[SplitJob]) -> None:
        """Run the large ``jobs`` on a worker thread; the others are left for the caller
        (``KeyRangeEngine.complete`` runs what was not run)."""
        if self._limiter is None:
            return
        large = [job for job in jobs if job.size >= self.min_bytes]
        if not large:
            return
        await trio.to_thread.run_sync(_run_all, large, limiter=self._limiter)
        self.metrics.splits_offloaded.inc(len(large))
        self.metrics.split_offloaded_bytes.inc(sum(job.size for job in large))


def whole_blob_in_c() -> bool:
    """Whether ``split_records`` splits a whole read in one C call without the GIL."""
    return getattr(kernels, "split_blob", None) is not None


def _run_all(jobs: list[SplitJob]) -> None:
    for job in jobs:
        job.run()
