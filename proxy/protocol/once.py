"""A cache for what must be built exactly once per key: the generated classes of a
message and the codecs made from them. ``functools.cache`` does not lock, so two threads
that ask for the same key first at the same moment may both build it; a second class for
one message makes values of the first fail the codecs' isinstance check."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def built_once(build: Callable[..., T]) -> Callable[..., T]:
    """``build`` memoised per arguments, each key built by one caller while others wait."""
    cache: dict[Any, T] = {}
    lock = threading.RLock()

    @functools.wraps(build)
    def cached(*args: Any, **kwargs: Any) -> T:
        key = (args, tuple(sorted(kwargs.items()))) if kwargs else args
        try:
            return cache[key]
        except KeyError:
            pass
        with lock:
            if key not in cache:
                cache[key] = build(*args, **kwargs)
            return cache[key]

    return cached
