"""Key-range answers the native relay sends itself: the cached shares a consumer takes next,
published in the loop's table (``_cpump.Answers``) so that its Fetch is answered without a
trip through the event loop.

Why: with read-ahead, a range consumer's next share is almost always cached already, and
its Fetch cost the event loop about 130 us of Python and trio (decode, plan, encode, two
sockets) for a response that is bytes the cache holds. The event loop keeps every decision:
which shares the loop may hand out (``publish``), when they stop being its to hand out
(the share leaves the cache: served by the event loop, evicted by the cap, dropped with its
range set, replaced), and the bookkeeping of what the loop sent (``taken``: the cache's
hit, the range set's interest, the metrics), in batches at the end of each run.

A share is published only when serving it needs no decision of the event loop's: the
event loop's answer to the same request is these bytes (``answer_pieces``) and nothing else
happens then. Serving a share is when the event loop reads the partition ahead
(``KeyRangeEngine.prefetch``: from the position the share leaves its consumer at, unless
that position is the end of what there is to read, or a read of it is cached or on its
way); so a share whose next position has no read yet waits (``pending``) until one is
announced or cached, and the consumer who gets there first is served by the event loop,
whose read-ahead follows. What the loop answers (the request's shape, the partitions
served on the connection before) is in ``proxy/net/_cpump.c``.

Memory: the table holds the share's records object itself (no copy) and small buffers;
each published share is charged ``native_bytes`` on top of its size within the cache's cap
(``max.bytes.key.range.results``), from the moment it is cached.
"""

from __future__ import annotations

import itertools
import struct
import uuid
from collections.abc import Callable, Hashable
from typing import Any

from proxy.keyrange.cache import CachedShare, PartitionId, ShareCache
from proxy.keyrange.settings import KeyRangeTopicSettings
from proxy.protocol.primitives import uvarint_bytes

READ_COMMITTED = 1
TOPIC_ID_BYTES = 16
MAX_RANGES = 16  # the loop's ANSWER_MAX_RANGES: a set of more is the event loop's
_KEY = struct.Struct(">16siBq")  # topic id, partition, isolation level, fetch offset
_RANGE = struct.Struct(">qq")
_SERVED = struct.Struct(">16si")
_PARTITION = struct.Struct(">hqqq")  # error code, high watermark, last stable offset, log start offset
_ABORTED = struct.Struct(">qqB")  # producer id, first offset, no tagged field
_NO_PREFERRED_REPLICA = b"\xff\xff\xff\xff"
_EXTENSION_TAG = b"\x90\x4e"  # 10000 as an unsigned varint: KeyRangesApplied
# What a published share takes beyond its size: the loop's entry (its header, key and
# buffers, the allocator's rounding, a bucket) and this module's (two dict entries, a key
# object, a handle); per key range, its 16 bytes twice and the key's; per aborted
# transaction, its 17 bytes. Charged from the moment the share is cached.
_NATIVE_BYTES = 640
_NATIVE_RANGE_BYTES = 48
_NATIVE_ABORTED_BYTES = 24


def native_bytes(share: CachedShare) -> int:
    """What publishing ``share`` takes beyond ``share.size`` (0 for a share the loop never
    holds: offsets only)."""
    if share.records is None:
        return 0
    ranges = share.ranges
    count = len(ranges) if isinstance(ranges, tuple) else 1
    return _NATIVE_BYTES + _NATIVE_RANGE_BYTES * count + _NATIVE_ABORTED_BYTES * len(share.aborted_transactions)


def answer_key(topic_id: uuid.UUID, partition: int, isolation_level: int, fetch_offset: int, ranges) -> bytes:
    """The table's key of an answer, as the loop makes it from a request."""
    return _KEY.pack(topic_id.bytes, partition, isolation_level, fetch_offset) + b"".join(
        _RANGE.pack(r.start, r.end) for r in ranges)


def answer_pieces(share: CachedShare) -> tuple[bytes, bytes, bytes]:
    """A partition entry of the Fetch response (v13-v17) the event loop builds for a share
    served from the cache, after its partition index, in three pieces: the bytes before its
    records (error code, offsets, aborted transactions, no preferred replica, the records'
    length), the records, and its tagged fields (KeyRangesApplied: the share's ranges)."""
    records = share.records
    assert records is not None
    aborted = share.aborted_transactions
    prefix = b"".join((
        _PARTITION.pack(0, share.high_watermark, share.last_stable_offset, share.log_start_offset),
        uvarint_bytes(len(aborted) + 1),
        *(_ABORTED.pack(a.producer_id, a.first_offset, 0) for a in aborted),
        _NO_PREFERRED_REPLICA,
        uvarint_bytes(len(records) + 1),
    ))
    applied = uvarint_bytes(len(share.ranges) + 1) + b"".join(_RANGE.pack(r.start, r.end) + b"\x00" for r in share.ranges)
    suffix = b"\x01" + _EXTENSION_TAG + uvarint_bytes(len(applied)) + applied
    return prefix, bytes(records), suffix


def served_blob(served: set[bytes]) -> bytes:
    """The partitions the broker served a connection, as the loop reads them: 16-byte topic
    id and 4-byte partition each."""
    return b"".join(sorted(served))


def served_entry(topic_id: uuid.UUID, partition: int) -> bytes:
    return _SERVED.pack(topic_id.bytes, partition)


class NativeShares:
    """The cache's shares as the loop's table holds them: published, pending, or neither.
    Listens to the cache (``ShareCache.listener``): ``stored``, ``removed``, ``charge``."""

    def __init__(self, table: Any, cache: ShareCache, *, topic_id: Callable[[str], uuid.UUID | None],
                 topic_settings: Callable[[str], KeyRangeTopicSettings], reads_ahead: bool,
                 in_flight: Callable[[tuple[str, int, int, int]], bool]) -> None:
        self.table = table
        self.cache = cache
        self.topic_id = topic_id
        self.topic_settings = topic_settings
        self.reads_ahead = reads_ahead
        self.in_flight = in_flight
        self._handles = itertools.count(1)
        self.published: dict[Hashable, tuple[int, bytes]] = {}  # cache key -> (handle, table key)
        # published, or taken by a run and not yet reported: handle -> (cache key, share)
        self.by_handle: dict[int, tuple[Hashable, CachedShare]] = {}
        # (partition, isolation level, next offset) -> cache keys of the shares waiting for a
        # read of that position to be announced or cached
        self.pending: dict[tuple[PartitionId, int, int], set[Hashable]] = {}
        self._pending_of: dict[Hashable, tuple[PartitionId, int, int]] = {}
        self._starts: dict[tuple[PartitionId, int, int], int] = {}  # records shares cached per read position
        self.answered = 0  # answers the loop sent (shares it took)

    # -- the cache's listener ----------------------------------------------------------------------
    def charge(self, share: CachedShare) -> int:
        return native_bytes(share)

    def stored(self, key: Hashable, share: CachedShare) -> None:
        if share.records is None or not isinstance(share.ranges, tuple):
            return  # offsets only (never served from the cache), or a stripe
        position = (share.partition, share.isolation_level, share.start_offset)
        self._starts[position] = self._starts.get(position, 0) + 1
        self.covered(*position)  # a read of this position is cached: the shares ending here need no read-ahead
        if self._needs_no_read(share):
            self._publish(key, share)
        else:
            waiting = (share.partition, share.isolation_level, share.next_offset)
            self.pending.setdefault(waiting, set()).add(key)
            self._pending_of[key] = waiting

    def removed(self, key: Hashable, share: CachedShare) -> None:
        if share.records is None or not isinstance(share.ranges, tuple):
            return
        position = (share.partition, share.isolation_level, share.start_offset)
        left = self._starts.get(position, 0) - 1
        if left > 0:
            self._starts[position] = left
        else:
            self._starts.pop(position, None)
        waiting = self._pending_of.pop(key, None)
        if waiting is not None:
            keys = self.pending.get(waiting)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self.pending[waiting]
        published = self.published.pop(key, None)
        if published is not None:
            handle, table_key = published
            if self.table.remove(table_key) is not None:
                del self.by_handle[handle]
            # else a run took it: its report (``taken``) comes, and finds it served

    # -- decisions -------------------------------------------------------------------------------
    def covered(self, partition: PartitionId, isolation_level: int, position: int) -> None:
        """A read of ``position`` is cached or on its way: the shares whose consumers it
        serves next need no read-ahead, and are published."""
        keys = self.pending.pop((partition, isolation_level, position), None)
        if not keys:
            return
        lru = self.cache._lru
        for key in keys:
            self._pending_of.pop(key, None)
            share = lru.get(key)
            if share is not None:
                self._publish(key, share)

    def _needs_no_read(self, share: CachedShare) -> bool:
        """Whether serving ``share`` makes the event loop read nothing ahead (as
        ``KeyRangeEngine.prefetch`` decides for the position it leaves its consumer at)."""
        if not self.reads_ahead:
            return True
        position = share.next_offset
        end = share.last_stable_offset if share.isolation_level == READ_COMMITTED else share.high_watermark
        if position >= end:
            return True
        name, partition = share.partition
        return bool(self._starts.get((share.partition, share.isolation_level, position))) or \
            self.in_flight((name, partition, position, share.isolation_level))

    def _publish(self, key: Hashable, share: CachedShare) -> None:
        name, partition = share.partition
        ranges = share.ranges
        if not 0 < len(ranges) <= MAX_RANGES or not isinstance(share.records, bytes) or key in self.published:
            return
        topic_id = self.topic_id(name)
        settings = self.topic_settings(name)
        if topic_id is None or not settings.fetch_enabled or not settings.cache_records:
            return
        table_key = answer_key(topic_id, partition, share.isolation_level, share.start_offset, ranges)
        handle = next(self._handles)
        prefix, records, suffix = answer_pieces(share)
        self.table.put(table_key, handle, prefix, share.records, suffix)
        self.published[key] = (handle, table_key)
        self.by_handle[handle] = (key, share)

    def withdraw(self) -> None:
        """Take every published share back (the topics' settings changed): the event loop
        serves them. Shares cached from now on are published as before."""
        for key, (handle, table_key) in list(self.published.items()):
            if self.table.remove(table_key) is not None:
                del self.by_handle[handle]
            del self.published[key]

    # -- what the loop sent -------------------------------------------------------------------
    def taken(self, handles: list[int], touch: Callable[[PartitionId, tuple, float], None], now: float) -> int:
        """Account for the shares the loop sent (their handles, in order): each is served as
        the event loop serves a cached share (it leaves the cache, counted as a hit) and its
        range set is asked for (its interest renewed). How many."""
        cache = self.cache
        served = 0
        for handle in handles:
            entry = self.by_handle.pop(handle, None)
            if entry is None:
                continue
            key, share = entry
            served += 1
            published = self.published.get(key)
            if published is not None and published[0] == handle:
                del self.published[key]
            cache.served(key, share)
            touch(share.partition, share.ranges, now)
        self.answered += served
        return served
