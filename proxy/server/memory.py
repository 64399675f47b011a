"""Keep glibc from returning large buffers to the kernel after every frame.

Frames of a megabyte are the proxy's bread and butter. By default glibc serves each with
a fresh mmap and unmaps it when freed, so every frame pays a page fault per 4 KiB on
first touch: measured, that quadruples the cost of moving a 1 MB frame. Serving them from
the heap and keeping a bounded amount of freed heap around avoids it; the memory kept is
bounded by the trim threshold.
"""

from __future__ import annotations

import ctypes
import logging

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
