"""Wait for a condition with a deadline, instead of sleeping and hoping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The condition did not hold before the deadline (an AssertionError, so tests fail)."""


def wait_until(
    condition: Callable[[], T],
    timeout: float = 30.0,
    *,
    interval: float = 0.1,
    what: str | Callable[[], str] = "condition",
) -> T:
    """Call ``condition`` until it returns something truthy and return that value.

    Exceptions raised by ``condition`` count as "not yet"; the last one is reported (and
    chained) if the deadline passes.  ``interval`` is only the back-off between polls.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = condition()
        except Exception as exc:  # noqa: BLE001 - retried, reported on timeout
            last_error = exc
        else:
            if value:
                return value
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            described = what() if callable(what) else what  # late: it may report progress
            raise WaitTimeout(f"{described} did not hold within {timeout:g} s{detail}") from last_error
        time.sleep(interval)
