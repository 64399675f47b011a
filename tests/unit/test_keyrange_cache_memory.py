"""The result cache's byte cap (max.bytes.key.range.results) bounds the memory its shares
take, not only their buffers: a cache filled to its cap holds about its cap, counted by
tracemalloc, whatever kind of share fills it."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable, Iterator

import pytest

from proxy.keyrange.cache import CachedShare, ShareCache
from proxy.protocol import messages
from proxy.protocol.messages import ApiKey
from proxy.ranges import KeyRange

CAP = 4 << 20
UPPER = 1.25  # memory held at most this times the cap
LOWER = 0.7  # and at least this: a charge far above the cost would waste the cap
BASE_OFFSET = 5_000_000_000  # past 2**30, as offsets of a long-lived partition are
AbortedTransaction = messages.body_class(ApiKey.FETCH, "response").AbortedTransaction


def _share(i: int, ranges: tuple, *, offsets: int | None = None, records: int | None = None,
           aborted: int = 0) -> CachedShare:
    """Share ``i`` as the engine builds one from a read: every offset, metadata int and
    list its own (a decoded response's and the offset matcher's objects)."""
    start = BASE_OFFSET + i * 1000
    end = start + 1000
    return CachedShare(
        ("orders", i % 12), ranges, start, end, 1 if aborted else 0,
        records=None if records is None else (b"\x07" * records if records else bytes(0)),
        offsets=None if offsets is None else tuple(range(start, start + offsets)),
        high_watermark=end + 3, last_stable_offset=end + 1, log_start_offset=start - 5000,
        aborted_transactions=[AbortedTransaction(producer_id=10**12 + k, first_offset=start + k)
                              for k in range(aborted)],
    )


Kind = Callable[[int, tuple], CachedShare]

OFFSETS_ONLY: list[Kind] = [
    lambda i, r: _share(i, r, offsets=0),  # nothing of the set in the read: a position advance
    lambda i, r: _share(i, r, offsets=1),
    lambda i, r: _share(i, r, offsets=3),
    lambda i, r: _share(i, r, offsets=40),
]
SMALL_RECORDS: list[Kind] = [
    lambda i, r: _share(i, r, records=0),  # a position advance
    lambda i, r: _share(i, r, records=120),
    lambda i, r: _share(i, r, records=900),
    lambda i, r: _share(i, r, records=300, aborted=2),
]
MIXED: list[Kind] = [*OFFSETS_ONLY, *SMALL_RECORDS,
                     lambda i, r: _share(i, r, records=16 << 10),
                     lambda i, r: _share(i, r, records=100 << 10)]


def _shares(kinds: list[Kind], per_set: int) -> Iterator[CachedShare]:
    """Shares of the kinds in turn, ``per_set`` of them for each range set (a set made
    anew, as a request decodes it: a share may hold its own copy)."""
    ranges: tuple = ()
    i = 0
    while True:
        if i % per_set == 0:
            low = (1 << 62) + i * 64
            ranges = (KeyRange(low, low + 31),) if i % 3 else (KeyRange(low, low + 9), KeyRange(low + 20, low + 31))
        yield kinds[i % len(kinds)](i, ranges)
        i += 1


@pytest.mark.parametrize("per_set", [1, 6])
@pytest.mark.parametrize("kinds", [OFFSETS_ONLY, SMALL_RECORDS, MIXED], ids=["offsets-only", "records", "mixed"])
def test_a_full_cache_holds_about_its_cap_in_memory(kinds: list[Kind], per_set: int) -> None:
    _share(0, (), offsets=1, aborted=1)  # first uses (class caches) before the count starts
    started_here = not tracemalloc.is_tracing()
    gc.collect()
    if started_here:
        tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        cache = ShareCache(CAP)
        shares = _shares(kinds, per_set)
        # Fill it past the cap twice over, so the least recently used go and the cache's
        # tables have grown and churned as a full cache's do.
        while cache.stats.evictions < len(cache) * 2 or len(cache) < 100:
            assert cache.put(next(shares))
        del shares
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        if started_here:
            tracemalloc.stop()
    assert cache.bytes_held <= CAP
    assert held <= UPPER * CAP, f"{len(cache)} shares take {held} bytes for a cap of {CAP}"
    assert held >= LOWER * CAP, f"{len(cache)} shares take only {held} bytes of a cap of {CAP}"
