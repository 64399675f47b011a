"""The lock every benchmark holds while it runs (``/tmp/keyrange-bench.lock``, flock), so
benchmarks started by different people on one machine never overlap: a second one waits."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Callable, Iterator
from pathlib import Path

LOCK = Path("/tmp/keyrange-bench.lock")


@contextlib.contextmanager
def bench_lock(say: Callable[[str], None]) -> Iterator[None]:
    with open(LOCK, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for {LOCK} (another benchmark is running)")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
