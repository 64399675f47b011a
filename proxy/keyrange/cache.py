"""The key-range result cache (docs/wire-contract.md#5-result-cache).

One broker read of a partition is split once into every range set recently requested for
that partition; the requester takes its share now and the other shares wait here for
their consumers. A share is removed the moment it is served, or once its consumer is past
it; when the bytes held would pass ``max_bytes`` the least recently used shares go first,
so the bytes held never exceed the cap (a share larger than the cap is simply not kept).
The bytes held are what the shares take in memory, their objects and the cache's entries
for them included, not only their buffers (``CachedShare.size``): the cap bounds the
proxy's memory.
When a range set has not been requested for the interest time (its consumer left, or a
rebalance gave it other ranges) its shares are dropped with it: nobody would take them,
and without that they would stay until the cap pushed them out, the cache growing with
every departed consumer up to ``max_bytes``.

Two kinds of share, per topic (``reserve.message.value.range.fetch``):
- records: the filtered Records blob itself, so the broker is not read again;
- offsets: only which offsets of the read matched the range set; the consumer's own
  broker read is then filtered by offset lookup instead of hashing every key again.

A share is only served to a Fetch of the isolation level its read had. The broker answers
the two levels differently: a read_committed read stops at the last stable offset and
lists the aborted transactions it holds, a read_uncommitted one goes on to the high
watermark and lists none. A read_committed consumer served a read_uncommitted share would
hand out aborted and undecided records (nothing tells it to drop them) and move its
position past the last stable offset. The other way round would be correct (the records
are the same, and read_uncommitted clients ignore the aborted list) but stops at the last
stable offset, short of what the consumer's own read gets; an exact match is the one rule
that needs no such reasoning per client. Offsets-only shares follow it too, although which
offsets match a range does not depend on the level.

Pure state: the caller passes the clock in, so eviction is deterministic in tests.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from proxy.protocol.message_types import FetchResponse
from proxy.ranges import KeyRange, covers

RangeSet = tuple[KeyRange, ...]
PartitionId = tuple[str, int]  # (topic name, partition)

# What a share takes in memory, measured (CachedShare.size says how): the share with its key
# and its LRU entry; each key range of its range set; a bytes object's or a tuple's header
# with the allocator's rounding; each offset an offsets-only share lists; each aborted
# transaction its read listed. And a range set's entry in the index, charged once a set.
_SHARE_BYTES = 744
_RANGE_BYTES = 160
_BUFFER_BYTES = 48
_OFFSET_BYTES = 41
_ABORTED_BYTES = 176
SET_ENTRY_BYTES = 336


@dataclass(slots=True)
class CachedShare:
    """One range set's part of one broker read.

    ``start_offset``: the fetch offset of the read; ``next_offset``: the offset after its
    last complete batch. A consumer whose position lies in [start, next) can be served it,
    if it fetches at the read's ``isolation_level`` (0 read_uncommitted, 1 read_committed).
    The partition-level metadata of the read travels with it, so a response built from
    the cache tells the consumer the same high watermark and aborted transactions as the
    broker would have.
    """

    partition: PartitionId
    ranges: RangeSet
    start_offset: int
    next_offset: int
    isolation_level: int
    records: bytes | None = None  # records shares
    offsets: tuple[int, ...] | None = None  # offsets-only shares
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted_transactions: list = field(default_factory=list)

    @property
    def size(self) -> int:
        """The bytes this share takes in memory while cached, its range set's index entry
        aside (``ShareCache`` charges that once a set).

        The cap is meant to bound the proxy's memory, and most of a small share is not its
        buffer: charging the buffer and a guess at the rest (200 bytes, 8 an offset) let an
        offsets-only share of one offset take 1,317 bytes for a charge of 208, so a full
        cache of small shares held up to 6 times its cap. The constants are measured by
        ``benchmarks/bench_cache_memory.py`` (CPython 3.11, 64-bit): it fills a cache with
        20,000-90,000 shares built as the engine builds them, each from a read and for a
        range set of its own (every int, tuple, list and range set the share's own), and
        counts both ``tracemalloc``'s bytes and the resident set's growth per share. The
        resident figure is the larger (the allocator rounds to 16 bytes and keeps pool
        headers); the constants cover it where it peaks, just after the LRU's and the
        index's hash tables double. Per share: 744 for the share, its five offset ints,
        partition tuple, aborted-transaction list, LRU key and entry; 160 a key range
        (tuple slot, ``KeyRange``, two 63-bit ints); 48 a bytes or tuple header; 41 an
        offset (tuple slot and int); 176 an aborted transaction; 336 a range set's index
        entry. Resident against charged: offsets-only with none matched 1,237 / 1,288
        (tracemalloc 1,122), with one offset 1,317 / 1,329, with 1,000 41,383 / 42,288;
        records empty 1,237 / 1,288, 1 KiB 2,279 / 2,312, 16 KiB 17,641 / 17,672; 1 KiB
        with 3 aborted transactions 2,793 / 2,840, with 4 key ranges 2,745 / 2,792, in a set
        holding 50 shares 1,789 / 1,983. A buffer large enough for malloc to map it (128 KiB
        and up) can take up to a page more than charged, under 0.4 %.

        Charging above the cost only makes the cache hold less than it could: the shares
        of one read share their partition tuple, ints and aborted list (up to 290 bytes),
        and the shares of one set may share its range set.
        """
        ranges = self.ranges
        size = _SHARE_BYTES + _RANGE_BYTES * (len(ranges) if isinstance(ranges, tuple) else 1)
        if self.records is not None:
            size += _BUFFER_BYTES + len(self.records)
        if self.offsets is not None:
            size += _BUFFER_BYTES + _OFFSET_BYTES * len(self.offsets)
        return size + _ABORTED_BYTES * len(self.aborted_transactions)


@dataclass(slots=True)
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0  # by the byte cap (served shares are not counted)
    stored: int = 0
    rejected_too_large: int = 0
    expired: int = 0  # dropped with their range set, nobody having asked for it for the interest time


class CacheListener(Protocol):
    """Told of every share the cache keeps and lets go of (``proxy.keyrange.native``: the
    native relay's table follows the cache), and what holding it there costs on top."""

    def charge(self, share: CachedShare) -> int: ...

    def stored(self, key: Hashable, share: CachedShare) -> None: ...

    def removed(self, key: Hashable, share: CachedShare) -> None: ...


class ShareCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes_held = 0  # the shares' sizes and SET_ENTRY_BYTES for each set in the index
        self.stats = CacheStats()
        self._listener: CacheListener | None = None
        self._lru: OrderedDict[Hashable, CachedShare] = OrderedDict()
        # (partition, ranges, isolation level) -> keys of its shares, for lookup by position
        self._by_set: dict[tuple[PartitionId, RangeSet, int], dict[int, Hashable]] = {}
        # (partition, isolation level) -> the range sets it holds shares of (``_wider``)
        self._sets_of: dict[tuple[PartitionId, int], set[RangeSet]] = {}

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def listener(self) -> CacheListener | None:
        return self._listener

    @listener.setter
    def listener(self, listener: CacheListener | None) -> None:
        """Set while the cache is empty: what a share is charged must not change while it is held."""
        if self._lru:
            raise ValueError("a cache's listener is set while it holds no share")
        self._listener = listener

    def _size(self, share: CachedShare) -> int:
        listener = self._listener
        return share.size if listener is None else share.size + listener.charge(share)

    def resize(self, max_bytes: int) -> None:
        """A new cap (a reload): the least recently used shares leave until what is held fits."""
        self.max_bytes = max_bytes
        while self._lru and self.bytes_held > max_bytes:
            self._remove(next(iter(self._lru)))
            self.stats.evictions += 1

    def put(self, share: CachedShare) -> bool:
        """Keep ``share``, evicting the least recently used as needed. False if it alone
        (with an index entry for its set) is larger than the cap."""
        size = self._size(share)
        if size + SET_ENTRY_BYTES > self.max_bytes:
            self.stats.rejected_too_large += 1
            return False
        set_key = (share.partition, share.ranges, share.isolation_level)
        key = (*set_key, share.start_offset)
        if key in self._lru:
            self._remove(key)
        while self._lru and self.bytes_held + size + (0 if set_key in self._by_set else SET_ENTRY_BYTES) \
                > self.max_bytes:
            oldest = next(iter(self._lru))
            self._remove(oldest)
            self.stats.evictions += 1
        self._lru[key] = share
        per_set = self._by_set.get(set_key)
        if per_set is None:
            per_set = self._by_set[set_key] = {}
            self.bytes_held += SET_ENTRY_BYTES
            self._sets_of.setdefault((share.partition, share.isolation_level), set()).add(share.ranges)
        per_set[share.start_offset] = key
        self.bytes_held += size
        self.stats.stored += 1
        if self._listener is not None:
            self._listener.stored(key, share)
        return True

    def take(self, partition: PartitionId, ranges: RangeSet, position: int, isolation_level: int) -> CachedShare | None:
        """The share of ``ranges`` read at ``isolation_level`` that covers ``position``,
        removed from the cache."""
        starts = self._by_set.get((partition, ranges, isolation_level))
        if starts:
            for key in list(starts.values()):
                share = self._lru.get(key)
                if share is not None and share.start_offset <= position < share.next_offset:
                    self._remove(key)
                    self.stats.hits += 1
                    return share
                if share is not None and share.next_offset <= position:
                    # The consumer is past it already: it will never be served.
                    self._remove(key)
        self.stats.misses += 1
        return None

    def holds(self, partition: PartitionId, ranges: RangeSet, position: int, isolation_level: int) -> bool:
        """Whether a share of ``ranges`` read at ``isolation_level`` covers ``position``
        (nothing is taken, and no hit or miss counted)."""
        starts = self._by_set.get((partition, ranges, isolation_level))
        if not starts:
            return False
        for key in starts.values():
            share = self._lru.get(key)
            if share is not None and share.start_offset <= position < share.next_offset:
                return True
        return False

    def take_wider(self, partition: PartitionId, ranges: RangeSet, position: int,
                   isolation_level: int) -> CachedShare | None:
        """A share covering ``position`` of a range set holding all of ``ranges`` (not
        ``ranges`` itself), removed from the cache: the records of ``ranges`` are among
        its records (``KeyRangeEngine`` splits them out)."""
        key = self._wider(partition, ranges, position, isolation_level)
        if key is None:
            return None
        share = self._lru[key]
        self._remove(key)
        return share

    def has_records_of(self, partition: PartitionId, ranges: RangeSet, position: int, isolation_level: int) -> bool:
        """Whether the records of ``ranges`` at ``position`` are cached, in their own share
        or in a wider one (nothing is taken)."""
        return self.holds(partition, ranges, position, isolation_level) or \
            self._wider(partition, ranges, position, isolation_level) is not None

    def _wider(self, partition: PartitionId, ranges: RangeSet, position: int, isolation_level: int) -> Hashable | None:
        for held in self._sets_of.get((partition, isolation_level), ()):
            if held == ranges or not held or not covers(held, ranges):
                continue
            for key in self._by_set[(partition, held, isolation_level)].values():
                share = self._lru.get(key)
                if share is not None and share.start_offset <= position < share.next_offset:
                    return key
        return None

    def served(self, key: Hashable, share: CachedShare) -> None:
        """``share`` (cached under ``key``) was served elsewhere (the native relay): it leaves
        the cache if it is still there, and counts as a hit."""
        if self._lru.get(key) is share:
            self._remove(key)
        self.stats.hits += 1

    def _remove(self, key: Hashable) -> None:
        share = self._lru.pop(key)
        self.bytes_held -= self._size(share)
        if self._listener is not None:
            self._listener.removed(key, share)
        set_key = (share.partition, share.ranges, share.isolation_level)
        per_set = self._by_set.get(set_key)
        if per_set is not None:
            per_set.pop(share.start_offset, None)
            if not per_set:
                del self._by_set[set_key]
                self.bytes_held -= SET_ENTRY_BYTES
                held = self._sets_of.get((share.partition, share.isolation_level))
                if held is not None:
                    held.discard(share.ranges)
                    if not held:
                        del self._sets_of[(share.partition, share.isolation_level)]

    def drop_set(self, partition: PartitionId, ranges: RangeSet) -> int:
        """Drop every share of ``ranges`` on ``partition`` (at either isolation level); how many."""
        dropped = 0
        for level in (0, 1):
            starts = self._by_set.get((partition, ranges, level))
            if starts:
                for key in list(starts.values()):
                    if key in self._lru:
                        self._remove(key)
                        dropped += 1
        self.stats.expired += dropped
        return dropped

    def shares(self) -> Iterable[CachedShare]:
        return list(self._lru.values())


class ActiveRangeSets:
    """Which range sets have been requested for each partition recently.

    A read of a partition is split into all of them. A set not requested for
    ``ttl`` seconds is dropped, so consumers that left stop costing split work and cache:
    ``on_expire(partition, ranges)`` is told of every set dropped (the cache drops its
    shares). Sets expire when their partition's sets are read, and every ``ttl`` / 4 all
    partitions are swept (on the next ``touch``), so a partition nobody reads any more lets
    go of its sets too.
    """

    def __init__(self, ttl: float, max_sets_per_partition: int = 64,
                 on_expire: Callable[[PartitionId, RangeSet], object] | None = None) -> None:
        self.ttl = ttl
        self.max_sets = max_sets_per_partition
        self.on_expire = on_expire
        self._seen: dict[PartitionId, dict[RangeSet, float]] = {}
        # the offset after the furthest read split for a partition's sets (``frontier``)
        self._frontier: dict[PartitionId, int] = {}
        self._joined: dict[PartitionId, float] = {}  # when a set last joined a partition's
        self._foremost: dict[PartitionId, int] = {}  # the furthest position a consumer was served up to
        self._swept = -float("inf")

    def read(self, partition: PartitionId, next_offset: int) -> None:
        """A read of ``partition`` ending before ``next_offset`` was split for its sets."""
        if partition in self._seen and next_offset > self._frontier.get(partition, -1):
            self._frontier[partition] = next_offset

    def reach(self, partition: PartitionId, position: int) -> None:
        """A consumer of ``partition`` was served up to ``position``."""
        if partition in self._seen and position > self._foremost.get(partition, -1):
            self._foremost[partition] = position

    def foremost(self, partition: PartitionId) -> int:
        """The furthest position a consumer of ``partition`` was served up to (-1: none)."""
        return self._foremost.get(partition, -1)

    def settled(self, partition: PartitionId, now: float, seconds: float) -> bool:
        """Whether no range set has joined ``partition``'s in the last ``seconds``."""
        return now - self._joined.get(partition, -float("inf")) >= seconds

    def frontier(self, partition: PartitionId) -> int:
        """The offset after the furthest read of ``partition`` split while it had sets (-1:
        none): below it, a consumer is catching up with reads made for others."""
        return self._frontier.get(partition, -1)

    def touch(self, partition: PartitionId, ranges: RangeSet, now: float) -> None:
        if now - self._swept >= self.ttl / 4:
            self.sweep(now)
        sets = self._seen.setdefault(partition, {})
        if sets.pop(ranges, None) is None:
            self._joined[partition] = now
        sets[ranges] = now
        if len(sets) > self.max_sets:
            oldest = next(iter(sets))
            del sets[oldest]
            self._expired(partition, oldest)

    def active(self, partition: PartitionId, now: float) -> list[RangeSet]:
        sets = self._seen.get(partition)
        if not sets:
            return []
        self._expire(partition, sets, now)
        return list(sets)

    def sweep(self, now: float) -> None:
        """Expire the sets of every partition; forget partitions left with none."""
        self._swept = now
        for partition, sets in list(self._seen.items()):
            self._expire(partition, sets, now)
            if not sets:
                del self._seen[partition]
                self._frontier.pop(partition, None)
                self._joined.pop(partition, None)
                self._foremost.pop(partition, None)

    def _expire(self, partition: PartitionId, sets: dict[RangeSet, float], now: float) -> None:
        expired = [r for r, seen in sets.items() if now - seen > self.ttl]
        for r in expired:
            del sets[r]
            self._expired(partition, r)

    def _expired(self, partition: PartitionId, ranges: RangeSet) -> None:
        if self.on_expire is not None:
            self.on_expire(partition, ranges)


def copy_metadata(partition_data: FetchResponse.PartitionData) -> dict:
    return {
        "high_watermark": partition_data.high_watermark,
        "last_stable_offset": partition_data.last_stable_offset,
        "log_start_offset": partition_data.log_start_offset,
        "aborted_transactions": list(partition_data.aborted_transactions or ()),
    }
