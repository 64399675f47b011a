"""Keep glibc from returning large buffers to the kernel after every frame, and give the
freed heap back on a timer instead.

Frames of a megabyte are the proxy's bread and butter. By default glibc serves each with
a fresh mmap and unmaps it when freed, so every frame pays a page fault per 4 KiB on
first touch: measured, that quadruples the cost of moving a 1 MB frame. Serving them from
the heap and keeping freed heap around avoids it.

The price is that the heap keeps its high-water mark: a burst (early fetches filling, a
consumer catching up) leaves its pages resident long after the buffers are gone, and each
new peak adds a step, which a soak sees as slow growth. ``HeapTrimmer`` calls
``malloc_trim`` every ``memory.trim.interval.ms``: freed pages anywhere in the heap go back
to the kernel, so resident memory follows what the proxy holds, while frames between two
trims still reuse warm pages (one refault per page per interval, not per frame).
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Callable

import trio

log = logging.getLogger("proxy.memory")

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 64 * 1024 * 1024  # buffers below this come from the heap
TRIM_THRESHOLD = 128 * 1024 * 1024  # free heap kept before giving memory back


def tune_malloc() -> bool:
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc: nothing to tune
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok &= mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    ok &= mallopt(_M_TOP_PAD, 16 * 1024 * 1024) == 1
    if not ok:
        log.warning("mallopt refused a setting; large frames will be slower")
    return ok


def resident_bytes() -> int:
    """This process's resident set size, from /proc/self/statm (0 where there is none)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class HeapTrimmer:
    """Returns freed heap pages to the kernel every ``interval`` seconds (see the module
    docstring). A no-op where the C library has no ``malloc_trim``."""

    def __init__(self, interval: float, metrics=None) -> None:
        self.interval = interval
        self.metrics = metrics
        self._trim: Callable[[int], int] | None
        try:
            self._trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            self._trim = None

    @property
    def available(self) -> bool:
        return self._trim is not None and self.interval > 0

    def trim_once(self) -> int:
        """Trims now; returns the resident bytes it gave back (0 if none or unknown)."""
        if self._trim is None:
            return 0
        before = resident_bytes()
        started = time.perf_counter()
        self._trim(0)
        returned = max(0, before - resident_bytes())
        if self.metrics is not None:
            self.metrics.memory_trims.inc()
            self.metrics.memory_trim_seconds.inc(time.perf_counter() - started)
            self.metrics.memory_returned_bytes.inc(returned)
        return returned

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if not self.available:
            return
        while True:
            await trio.sleep(self.interval)
            returned = self.trim_once()
            if returned >= 16 * 1024 * 1024:
                log.debug("returned freed heap to the kernel bytes=%d", returned)
