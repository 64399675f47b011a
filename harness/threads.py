"""Test workers run side by side in threads, their failures raised in the test's own thread."""

from __future__ import annotations

import threading
from collections.abc import Callable


def in_threads(worker: Callable[[int], object], count: int, timeout: float = 120.0,
               meanwhile: Callable[[], object] | None = None) -> None:
    """``worker(0)`` ... ``worker(count - 1)`` at the same time; ``meanwhile()`` once they
    have started (in the caller's thread); then waits up to ``timeout`` seconds for each,
    and raises the first exception any of them raised (a worker still running past it
    fails the test as well)."""
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            worker(index)
        except BaseException as exc:  # noqa: BLE001 - reported by the calling thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(index,), daemon=True) for index in range(count)]
    for thread in threads:
        thread.start()
    if meanwhile is not None:
        meanwhile()
    for thread in threads:
        thread.join(timeout)
    if errors:
        raise errors[0]
    assert not any(thread.is_alive() for thread in threads), "a worker is still running"
