"""Cooperative grants replicated through a Kafka log (DESIGN section 13): which chunk of
offsets of a (group, topic, partition) each member holds, decided the same way by every
proxy instance that reads the log. Sans I/O: records, offsets and log-append times come
in as values; ``proxy.coop.grant_log`` reads and writes the topic.

The log
-------
``__cooperative_fetch_grants``, compacted, ``message.timestamp.type=LogAppendTime``, keyed
by (group, topic, partition). An instance that wants a chunk for a member appends an *ask*
(record version 1): the member and its fetch token, where its read began (``read_from``),
how far it may go (``end``: the last offset of the complete batches the proposer read, or
less), the batches it read there (their last offsets and sizes) and the most bytes a chunk
may hold (``max_bytes``, the member's own limit), the lease length, and what the proposer
knew when it asked:

* ``base``, ``base_ms``: the offset and log-append time of the newest record it had applied
  of the key's log partition, any key's (the key has none between its own newest and that
  one); -1 when the partition had none, and then ``base_ms`` is the proposer's clock;
* ``held``, ``base_floor``: the leases and the committed floor of the key as it had them
  after applying ``base`` (its snapshot);
* ``floor``: the group's committed offset S as it had read it.

The chunk is not in the record: every reader computes it as it applies the ask (``assign``),
so that asks of several instances made from the same state never name the same offsets.

An ask made *before* its read (record version 2, ``offsets`` > 0) names no batches: ``end``
is the last offset the proposer knows the partition holds (below its high watermark, or its
last stable offset for a read_committed member) and ``offsets`` how many offsets a chunk
may span (the member's byte limit over the bytes per offset the proposer has seen). Its
chunk is placed by the same rules and read afterwards, from its first offset: an instance
reads what it hands out and nothing more, whichever instances ask at the same time. Asks at
the log end, where no offset past the member's position is known yet, read first.

Assignment
----------
Applied in log order, an ask at offset o with log-append time t gets a chunk iff it is
fresh (``t - base_ms <= lease_ms``: an ask after a quiet spell of its key is fresh as long
as its log partition is not quiet) and its range holds an offset nobody holds. An ask with
no base (its proposer had applied nothing of the log partition) is fresh only when its key
has no record within the lease length before it: it carries no snapshot, and placing the
key's recent records again from nothing would place them otherwise than they were placed,
around records older than that. The state an ask is placed in is rebuilt from the ask
alone: its snapshot (``held``, ``base_floor``), then every record of the key between
``base`` and o placed again in order the same way (``place``), each placement counting
the leases live at its own record's time. A stale ask rebuilds nothing. The chunk
then starts at the lowest offset at or above ``read_from`` and the floor that no live lease
holds (expired leases are offsets nobody holds: they go out first), and ends before the next
live lease, at ``end`` at most, on the last whole batch within ``max_bytes`` (at least one
batch), or after ``offsets`` offsets for an ask made before its read. An ask whose range
is all held gets no chunk (``TAKEN``).

A lease granted at t with length L is live at a record's time u iff u < t + L: expiry is a
matter of log-append times, the same for every reader whatever its clock.

Safety: a snapshot holds every lease live at ``base`` (the proposer's applied state), and
every lease granted after ``base`` is the chunk of a record between ``base`` and o, placed
again from that snapshot exactly as it was placed when it was applied. So the rebuilt state
is every lease live at t, and a chunk overlaps none of them. An ask with no base gets a
chunk only when no record of its key lies within a lease length before it, so no lease is
live (with one lease length for the group: a lease longer than the ask's, from a record
older than the ask's lease length, is not seen); its freshness relies on the proposer's
clock being within a lease length of the broker's less the time between its view and its
append. Records within a lease length of an ask young enough to matter are never
compacted away, so every reader judges it the same.

Determinism: an ask's chunk depends on the ask and on the asks between its base and itself,
nothing else (not on the reader's own state, nor on how the records between were placed
when applied: they are placed again). Every reader that holds those records decides the
same. A reader's state after an ask is the rebuilt one, so a reader that began on a
compacted log holds the true leases from its first ask whose records it all holds.

Version 0 records (a fixed chunk [start, end], written before version 1) still decode and
are judged as they were (``judge``): valid iff they overlap no live lease of ``held`` nor
any chunk of a record between their base and themselves, and start at or above the floor.

Compaction
----------
Compaction keeps only the newest record of a key, but never one younger than the topic's
``min.compaction.lag.ms`` (M), which the proxy sets to at least twice the lease length. A
fresh ask's base lies within ``lease_ms`` before it, so the records its chunk needs are
younger than M whenever the ask is younger than M - lease_ms >= lease_ms: a restarted
instance reading the compacted log places every ask that can still hold a live lease as
the running instances did, and so reaches the same live leases. Older asks may be placed
otherwise after compaction; their leases have expired, and what they held is either
committed or handed out again (offsets below the frontier that are neither committed nor
leased are handed out again), so no later chunk depends on them. Each record also carries
the proposer's frontier (the next offset never handed out) and floor, so the one record
left of a quiet key is enough to resume from.
"""

from __future__ import annotations

import itertools
import struct
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

GroupPartitionKey = tuple[str, str, int]  # (group, topic, partition)
OffsetRange = tuple[int, int]  # inclusive

_new_tuple = tuple.__new__  # builds a ``Lease`` from its fields without the Python-level __new__ (decoding)
_BELOW = -(1 << 63)  # below any offset or floor
_ABOVE = float("inf")  # sorts after any offset: (at, _ABOVE) bisects past every range starting at ``at``
_CROWD = 8  # the asks of an instance ``KeyGrants.ahead`` looks back on

KEY_VERSION = 0
VALUE_VERSION = 2  # 2: an ask that may name a count of offsets; 1: an ask bounded by its batches; 0: a fixed chunk

_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_HEAD = struct.Struct(">hq")  # version, proposal
_BODY = struct.Struct(">qqqqiqqqqBi")  # token start end read_from lease_ms base base_ms floor frontier reset held
_HELD = struct.Struct(">Hqqqqi")  # member index, token, start, end, granted_ms, lease_ms
_ASK = struct.Struct(">iqi")  # max_bytes base_floor batches (version 1)
_BATCH = struct.Struct(">qi")  # a batch's last offset, its size in bytes
_OFFSETS = _I32  # the most offsets a chunk holds (version 2; 0: bounded by its batches)


@dataclass(frozen=True)
class Committed:
    """The group's committed state of one partition, as the proposer read it: every offset
    below ``stable`` and every offset in ``ranges`` (sorted, disjoint, inclusive) is
    processed. A lease it covers whole is over; only its uncommitted parts go out again."""

    stable: int = -1
    ranges: tuple[OffsetRange, ...] = ()

    def covers(self, start: int, end: int) -> bool:
        """Whether every offset of [start, end] is committed (``not uncommitted(start,
        end)``, without building the list: asked of every lease on every fetch)."""
        at = max(start, self.stable)
        if at > end:
            return True
        ranges = self.ranges
        i = bisect_right(ranges, (at, _ABOVE)) - 1
        if i < 0:
            return False
        for lo, hi in itertools.islice(ranges, i, None):
            if lo > at:
                return False
            if hi >= at:
                at = hi + 1
                if at > end:
                    return True
        return False

    def uncommitted(self, start: int, end: int) -> list[OffsetRange]:
        """The parts of [start, end] not committed, in order."""
        start = max(start, self.stable)
        if start > end:
            return []
        out: list[OffsetRange] = []
        at = start
        ranges = self.ranges
        i = max(bisect_right(ranges, (at, _ABOVE)) - 1, 0)
        for lo, hi in itertools.islice(ranges, i, None):
            if hi < at:
                continue
            if lo > end:
                break
            if lo > at:
                out.append((at, lo - 1))
            at = max(at, hi + 1)
            if at > end:
                return out
        if at <= end:
            out.append((at, end))
        return out


class GrantFormatError(ValueError):
    """A record of the grants log that this version cannot read."""


class Lease(NamedTuple):
    """A valid grant: ``member`` holds offsets [start, end] (fetched with FetchOffset
    ``token``) from log-append time ``granted_ms`` for ``lease_ms``. A tuple: every record
    of the log carries its key's leases, and every reader decodes and places them again:
    a tuple is built and read several times faster than a frozen dataclass."""

    member: str
    token: int
    start: int
    end: int
    granted_ms: int
    lease_ms: int

    def live_at(self, ms: int) -> bool:
        return ms < self.granted_ms + self.lease_ms

    def overlaps(self, start: int, end: int) -> bool:
        return self.start <= end and start <= self.end


@dataclass(frozen=True)
class Grant:
    """A record of the log (see the module docstring): an ask (version 1), or a fixed chunk
    (version 0)."""

    proposal: int  # unique per proposing instance: how it finds its chunk
    instance: str
    member: str
    token: int
    start: int  # the chunk's first offset at the earliest (below ``read_from``: a claim of skipped offsets)
    end: int  # version 1: the last offset the chunk may reach; version 0: the chunk's last offset
    read_from: int  # where the read began
    lease_ms: int
    base: int
    base_ms: int
    floor: int
    frontier: int  # the proposer's next offset never handed out (-1: none)
    reset: bool = False  # the log moved away: leases ending below ``read_from`` are gone
    held: tuple[Lease, ...] = ()
    max_bytes: int = 0  # version 1: the most bytes of whole batches a chunk holds (at least one batch)
    base_floor: int = -1  # version 1: the highest floor of the records up to ``base``
    batches: tuple[tuple[int, int], ...] = ()  # version 1: (last offset, bytes) of the batches read, in order
    version: int = VALUE_VERSION
    offsets: int = 0  # version 2: the most offsets a chunk holds, asked before any read (0: its batches bound it)

    @property
    def fixed(self) -> bool:
        """A version 0 record: its chunk is [start, end], valid or not."""
        return self.version == 0


# -- the wire format ----------------------------------------------------------------------------
def _put_str(out: list[bytes], text: str) -> None:
    raw = text.encode()
    if len(raw) > 0xFFFF:
        raise ValueError("string longer than 65535 bytes")
    out.append(_U16.pack(len(raw)))
    out.append(raw)


def _get_str(data: bytes | memoryview, at: int) -> tuple[str, int]:
    (size,) = _U16.unpack_from(data, at)
    at += 2
    if at + size > len(data):
        raise GrantFormatError("string past the end of the record")
    return bytes(data[at:at + size]).decode(), at + size


def encode_key(group: str, topic: str, partition: int) -> bytes:
    out = [_I16.pack(KEY_VERSION)]
    _put_str(out, group)
    _put_str(out, topic)
    out.append(_I32.pack(partition))
    return b"".join(out)


def decode_key(data: bytes | memoryview) -> GroupPartitionKey:
    try:
        (version,) = _I16.unpack_from(data, 0)
        if version != KEY_VERSION:
            raise GrantFormatError(f"grant key version {version}")
        group, at = _get_str(data, 2)
        topic, at = _get_str(data, at)
        (partition,) = _I32.unpack_from(data, at)
    except struct.error as exc:
        raise GrantFormatError(str(exc)) from exc
    return group, topic, partition


def encode_grant(grant: Grant) -> bytes:
    members = list(dict.fromkeys(lease.member for lease in grant.held))
    index = {member: number for number, member in enumerate(members)}
    out = [_HEAD.pack(grant.version, grant.proposal)]
    _put_str(out, grant.instance)
    _put_str(out, grant.member)
    out.append(_BODY.pack(grant.token, grant.start, grant.end, grant.read_from, grant.lease_ms, grant.base,
                          grant.base_ms, grant.floor, grant.frontier, int(grant.reset), len(grant.held)))
    out.append(_U16.pack(len(members)))
    for member in members:
        _put_str(out, member)
    out.extend(_HELD.pack(index[lease.member], lease.token, lease.start, lease.end, lease.granted_ms, lease.lease_ms)
               for lease in grant.held)
    if grant.version >= 1:
        out.append(_ASK.pack(grant.max_bytes, grant.base_floor, len(grant.batches)))
        out.extend(_BATCH.pack(last, size) for last, size in grant.batches)
    if grant.version >= 2:
        out.append(_OFFSETS.pack(grant.offsets))
    return b"".join(out)


def peek_instance(data: bytes | memoryview) -> str:
    """The proposing instance of a record, nothing else decoded."""
    try:
        return _get_str(data, _HEAD.size)[0]
    except struct.error as exc:
        raise GrantFormatError(str(exc)) from exc


def decode_grant(data: bytes | memoryview, *, held: bool = True) -> Grant:
    """A record of any version (0: a fixed chunk; 1 and 2: an ask). ``held=False`` leaves
    its snapshot undecoded (``held`` empty; the lengths are still checked): a record of
    another instance is placed again from its own fields, and its snapshot is read only
    when this instance needs the state it ends in (``KeyGrants.note``)."""
    try:
        version, proposal = _HEAD.unpack_from(data, 0)
        if version not in (0, 1, 2):
            raise GrantFormatError(f"grant value version {version}")
        instance, at = _get_str(data, _HEAD.size)
        member, at = _get_str(data, at)
        token, start, end, read_from, lease_ms, base, base_ms, floor, frontier, reset, count = \
            _BODY.unpack_from(data, at)
        at += _BODY.size
        (names,) = _U16.unpack_from(data, at)
        at += 2
        members = []
        for _ in range(names):
            name, at = _get_str(data, at)
            members.append(name)
        stop = at + count * _HELD.size
        if stop > len(data) or (version == 0 and stop != len(data)):
            raise GrantFormatError("grant value of the wrong length")
        leases: tuple[Lease, ...] = ()
        if held:
            try:
                leases = tuple([_new_tuple(Lease, (members[who], h_token, h_start, h_end, granted, h_lease))
                                for who, h_token, h_start, h_end, granted, h_lease
                                in _HELD.iter_unpack(data[at:stop])])
            except IndexError:
                raise GrantFormatError("lease of an unknown member") from None
        at = stop
        max_bytes, base_floor, batches, offsets = 0, -1, [], 0
        if version >= 1:
            max_bytes, base_floor, number = _ASK.unpack_from(data, at)
            at += _ASK.size
            tail = _OFFSETS.size if version >= 2 else 0
            if number < 0 or at + number * _BATCH.size + tail != len(data):
                raise GrantFormatError("grant value of the wrong length")
            batches = list(_BATCH.iter_unpack(data[at:at + number * _BATCH.size]))
            if tail:
                (offsets,) = _OFFSETS.unpack_from(data, at + number * _BATCH.size)
                if offsets < 0:
                    raise GrantFormatError(f"grant asks for {offsets} offsets")
    except struct.error as exc:
        raise GrantFormatError(str(exc)) from exc
    return Grant(proposal, instance, member, token, start, end, read_from, lease_ms, base, base_ms, floor,
                 frontier, bool(reset), leases, max_bytes, base_floor, tuple(batches), version, offsets)


# -- verdicts and assignment ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Seen:
    """A record of the key as a version 0 verdict needs it: where, when, what it held."""

    offset: int
    ms: int
    start: int
    end: int
    lease_ms: int
    floor: int


STALE = "stale"
LEASED = "leased"
COMMITTED = "committed"
TAKEN = "taken"  # an ask whose whole range was held when it was applied


def judge(grant: Grant, ms: int, between: Iterable[Seen]) -> str | None:
    """The verdict on the version 0 record ``grant`` appended at log time ``ms``: None if
    valid, else why not. ``between``: the records of its key after its base and before it
    (for a grant with no base, those appended within its lease length before it)."""
    if grant.base >= 0 and ms - grant.base_ms > grant.lease_ms:
        return STALE
    start, end = grant.start, grant.end
    floor = grant.floor
    low = grant.read_from if grant.reset else None  # a reset drops what ends below its read
    for lease in grant.held:
        if (low is None or lease.end >= low) and lease.live_at(ms) and lease.overlaps(start, end):
            return LEASED
    for seen in between:
        floor = max(floor, seen.floor)
        if (low is None or seen.end >= low) and ms < seen.ms + seen.lease_ms and \
                seen.start <= end and start <= seen.end:
            return LEASED
    if start < floor and not grant.reset:
        return COMMITTED
    return None


def _cap(ask: Grant, start: int, limit: int) -> int:
    """The chunk's last offset from ``start``: ``ask.offsets`` offsets when it names a count
    (an ask before its read), else whole batches of ``ask.batches`` up to ``ask.max_bytes``
    (at least one); ``limit`` at most, and ``limit`` when the first batch reaches past it."""
    if ask.offsets:
        return min(limit, start + ask.offsets - 1)
    batches = ask.batches
    first = bisect_right(batches, (start - 1, 1 << 62))  # the first batch whose last offset >= start
    end, total = -1, 0
    for last, size in itertools.islice(batches, first, None):
        if last > limit:
            break
        total += size
        if end >= 0 and total > ask.max_bytes:
            break
        end = last
    return limit if end < 0 else end


def _free(ranges: Sequence[OffsetRange], start: int, end: int) -> bool:
    return not any(lo <= end and start <= hi for lo, hi in ranges)


def place(ask: Grant, ms: int, leases: Iterable[Lease], floor: int) -> OffsetRange | None:
    """The chunk of the version 1 ``ask`` appended at log time ``ms`` among ``leases`` (those
    live at ``ms`` count) above the committed ``floor`` (the ask's own included): None when
    nothing of its range is free.

    * A reset claims [start, its first batches] whole, or nothing: the leases ending below
      its read are gone, the floor does not hold (the log moved away from it).
    * A claim (``start`` below ``read_from``: offsets the member's reset policy skipped)
      claims from ``start`` when nothing from ``start`` to its read is held; otherwise it is
      an ask from ``read_from``.
    * Otherwise the chunk starts at the lowest offset at or above ``read_from`` and the
      floor that no live lease holds, and ends before the next live lease (``_cap``)."""
    low = ask.read_from if ask.reset else _BELOW
    live = sorted([(lease.start, lease.end) for lease in leases
                   if ms < lease.granted_ms + lease.lease_ms and lease.end >= low])
    if ask.reset:
        end = _cap(ask, ask.read_from, ask.end)
        return (ask.start, end) if _free(live, ask.start, end) else None
    start = max(ask.read_from, floor)
    for lo, hi in live:
        if hi < start:
            continue
        if lo > start:
            break
        start = hi + 1
    if start > ask.end:
        return None
    limit = min([ask.end] + [lo - 1 for lo, _ in live if lo > start])
    end = _cap(ask, start, limit)
    if ask.start < ask.read_from and start == ask.read_from and ask.start >= floor and \
            _free(live, ask.start, ask.read_from - 1):
        return ask.start, end
    return start, end


@dataclass(frozen=True, slots=True)
class Applied:
    """A record of the key as it was applied: its log place and time, and its chunk."""

    offset: int
    ms: int
    grant: Grant
    chunk: OffsetRange | None
    reason: str | None = None


@dataclass(frozen=True)
class Decision:
    """What applying a record decided: its chunk (None: no chunk, ``reason`` says why)."""

    chunk: OffsetRange | None
    reason: str | None = None
    redelivered: bool = False  # the chunk starts below the frontier: offsets handed out before


def _seen(record: Applied) -> Seen:
    """A record as a version 0 verdict counts it: a version 0 record by the chunk it named
    (valid or not), an ask by the chunk it got (if any)."""
    grant = record.grant
    start, end = (grant.start, grant.end) if grant.fixed else (record.chunk or (0, -1))
    return Seen(record.offset, record.ms, start, end, grant.lease_ms, grant.floor)


def _stale(ask: Grant, ms: int, between: Sequence[Applied]) -> bool:
    """Whether ``ask``'s view is older than its lease length at ``ms`` (the records its chunk
    needs might be gone from a compacted log). With no base (the log partition was empty
    in the proposer's view) its ``base_ms`` is the proposer's clock at that view, and it is
    stale as well when its key has records within a lease length (``between``): it carries
    no snapshot to place them again from."""
    return (ask.base_ms >= 0 and ms - ask.base_ms > ask.lease_ms) or (ask.base < 0 and bool(between))


def _lease(grant: Grant, chunk: OffsetRange, ms: int) -> Lease:
    return Lease(grant.member, grant.token, chunk[0], chunk[1], ms, grant.lease_ms)


def _taking(leases: list[Lease], floor: int, grant: Grant, chunk: OffsetRange | None, ms: int) -> list[Lease]:
    """``leases`` once ``grant`` at ``ms`` got ``chunk`` and raised the floor to ``floor``."""
    if chunk is not None:
        if grant.reset:
            leases = [lease for lease in leases if lease.end >= grant.read_from]
        leases = leases + [_lease(grant, chunk, ms)]
    return [lease for lease in leases if lease.end >= floor]


class _Placing:
    """The leases of one assignment while the records of its window are placed again: as
    ``_taking`` leaves them, and indexed by start with the running maximum of their ends,
    so that placing a record costs a bisection and the few leases around its read instead
    of sorting every lease again (a snapshot holds every lease of the key not yet below the
    floor: hundreds while commits lag). The module's ``place`` is the rule: this one
    decides the same (a property test holds it to that), and hands a reset to the rule.

    The floor filter of ``_taking`` is left until the list is needed whole: floors only
    rise, and a lease below the floor never changes a placement that starts at or above it."""

    def __init__(self, leases: list[Lease]) -> None:
        self.leases = leases
        self.filtered = _BELOW  # every lease of the list ends at or above it
        self.floor = _BELOW  # the floor the list is to be filtered by (``_taking``'s; none yet)
        self._index()

    def _index(self) -> None:
        self.spans = sorted([(lease.start, lease.end, lease.granted_ms + lease.lease_ms) for lease in self.leases])
        self.reach = list(itertools.accumulate([end for _, end, _ in self.spans], max))

    def exact(self) -> list[Lease]:
        """The leases as ``_taking`` leaves them."""
        if self.floor > self.filtered:
            self.leases = [lease for lease in self.leases if lease.end >= self.floor]
            self.filtered = self.floor
        return self.leases

    def place(self, ask: Grant, ms: int, floor: int) -> OffsetRange | None:
        if ask.reset:
            return place(ask, ms, self.exact(), floor)
        spans, start = self.spans, max(ask.read_from, floor)
        at, count = bisect_left(self.reach, start), len(spans)  # every span before ends below start
        while at < count:
            lo, hi, until = spans[at]
            if ms < until and hi >= start:
                if lo > start:
                    break
                start = hi + 1
            at += 1
        if start > ask.end:
            return None
        limit = ask.end if at >= count else min(ask.end, spans[at][0] - 1)  # the next live lease
        end = _cap(ask, start, limit)
        if ask.start < ask.read_from and start == ask.read_from and ask.start >= floor and \
                not any(ms < until and lo < ask.read_from and ask.start <= hi for lo, hi, until in spans):
            return ask.start, end
        return start, end

    def take(self, grant: Grant, chunk: OffsetRange | None, ms: int, floor: int) -> None:
        """``_taking``: ``grant`` at ``ms`` got ``chunk`` and raised the floor to ``floor``."""
        if chunk is not None:
            lease = _lease(grant, chunk, ms)
            if grant.reset:
                self.leases = [held for held in self.exact() if held.end >= grant.read_from] + [lease]
                self.filtered = min(self.filtered, lease.end)
                self.floor = floor
                self._index()
                return
            self.leases.append(lease)
            self.filtered = min(self.filtered, lease.end)
            span = (lease.start, lease.end, ms + lease.lease_ms)
            at = bisect_right(self.spans, span)
            self.spans.insert(at, span)
            reach = self.reach
            reach.insert(at, lease.end if at == 0 else max(reach[at - 1], lease.end))
            for later in range(at + 1, len(reach)):
                if reach[later] >= reach[later - 1]:
                    break
                reach[later] = reach[later - 1]
        self.floor = floor


def assign(ask: Grant, ms: int, between: Sequence[Applied]) -> tuple[Decision, list[Lease] | None, int]:
    """The chunk of the version 1 ``ask`` appended at log time ``ms``, with the leases live
    then and the floor once it is applied (None: a stale ask, which rebuilds nothing: the
    leases stay as the reader had them). ``between``: the records of its key after its
    base and before it (with no base, those within its lease length before it). The state is
    rebuilt from the ask's snapshot and those records, each placed again in order; records
    of version 0 keep the chunk they were judged to hold, stale asks none (``_stale``)."""
    if _stale(ask, ms, between):
        return Decision(None, STALE), None, ask.floor
    placing = _Placing(list(ask.held))  # each placement counts those live at its own time
    floor = ask.base_floor
    for record in between:
        grant = record.grant
        floor = max(floor, grant.floor)
        if grant.fixed:
            chunk = record.chunk
        elif record.reason == STALE:  # decided from its own window: the same for every reader
            chunk = None
        else:
            chunk = placing.place(grant, record.ms, floor)
        placing.take(grant, chunk, record.ms, floor)
    floor = max(floor, ask.floor)
    chunk = placing.place(ask, ms, floor)
    leases = [lease for lease in placing.exact() if ms < lease.granted_ms + lease.lease_ms]
    if chunk is None:
        return Decision(None, TAKEN), _taking(leases, floor, ask, None, ms), floor
    return Decision(chunk), _taking(leases, floor, ask, chunk, ms), floor


@dataclass(frozen=True)
class Span:
    """What one fetch reads: from ``start``; to ``end`` inclusive, or open (None). ``lease``:
    the member's outstanding chunk a retry gets again (no record). ``claim_from``: the
    chunk starts there, below ``start`` (offsets skipped by the reset policy of the member
    whose fetch starts the partition, so that its commit lets S pass them). ``reset``: the
    log moved away from what was leased."""

    start: int
    end: int | None
    lease: Lease | None = None
    claim_from: int | None = None
    reset: bool = False

    @property
    def chunk_start(self) -> int:
        return self.start if self.claim_from is None else min(self.claim_from, self.start)


@dataclass
class Counts:
    """What happened, for the metrics (monotonic)."""

    valid: int = 0
    invalid: int = 0
    expired: int = 0
    redelivered: int = 0


@dataclass
class KeyGrants:
    """One key's grants as this instance applied them, and what it asks for next.

    Every instance reads every record of the key, but places only those it must know the
    chunk of when they come (``apply``: its own asks, resets, version 0 records). Another
    instance's ask is only noted (``note``): its fields, kept for the asks after it that
    place it again, and its snapshot left undecoded. The leases are rebuilt when something
    reads them (a fetch of this instance, an ask it makes, the metrics), from the newest
    noted ask alone, as ``assign`` rebuilds any ask's state: its snapshot and the records
    between its base and itself placed again, then the stale asks after it. That is the
    state placing every record in turn reaches (``assign`` makes the state after an ask
    depend on that ask and its window only), so each instance decodes and places about
    twice its own asks instead of every ask of every instance."""

    offset: int = -1  # the newest record applied or noted
    ms: int = -1  # its log-append time
    floor: int = -1  # the highest committed floor carried by the records
    reset_pending: bool = False  # the broker said the read position is out of range
    counts: Counts = field(default_factory=Counts)
    # this instance's asks on their way through the log (proposal -> the chunk it expects):
    # its next spans go around them, so that it asks for the next chunk without waiting for
    # the last; an expectation, not a lease, that no other reader knows of
    proposed: dict[int, OffsetRange] = field(default_factory=dict)
    done: Committed = field(default_factory=Committed)  # the group's commits as this instance last read them

    def __post_init__(self) -> None:
        self._leases: list[Lease] = []  # live by the newest record's time, as the log has them (once rebuilt)
        self._frontier: int | None = None  # the next offset never handed out (once rebuilt)
        # noted and not yet rebuilt from: the newest ask that is not stale (offset, log
        # time, its record), and the stale asks after it (log time, floor), which only
        # drop what expired or fell below their floor
        self._anchor: tuple[int, int, bytes] | None = None
        self._stale_after: list[tuple[int, int]] = []
        self._reset_ms = -1  # log time of the newest reset that got a chunk: it set the frontier
        self._recent: list[Applied] = []
        self._keep_ms = 0
        # per instance, for its latest asks: how many live leases took offsets of its read
        # below its own chunk (all of it: no chunk), all placed since the read was decided
        # around what was held then: how many chunks further a read must reach to find one
        self._crowd: dict[str, deque[int]] = {}

    # -- applying the log -------------------------------------------------------------------
    def between(self, grant: Grant, offset: int, ms: int) -> list[Applied]:
        """The records of the key ``grant`` needs: those after its base; with no base,
        those within its lease length before it (an ask with no base gets a chunk only when
        there are none)."""
        recent = self._recent
        if grant.base >= 0:
            first = bisect_right(recent, grant.base, key=lambda seen: seen.offset)
            return [seen for seen in recent[first:] if seen.offset < offset]
        return [seen for seen in recent if seen.offset < offset and seen.ms >= ms - grant.lease_ms]

    @property
    def leases(self) -> list[Lease]:
        self._rebuild()
        return self._leases

    @property
    def frontier(self) -> int | None:
        self._rebuild()
        return self._frontier

    def note(self, offset: int, ms: int, grant: Grant, record: bytes) -> None:
        """Take in another instance's ask of version 1 or 2, not a reset, at ``offset``
        (log-append time ``ms``) without placing it: ``grant`` decoded without its snapshot
        (``decode_grant(..., held=False)``), ``record`` its encoded value, decoded again
        only if the state is next read from it. What it changes is rebuilt when read."""
        if offset <= self.offset:
            raise ValueError(f"record {offset} noted after {self.offset}")
        if grant.fixed or grant.reset or grant.held:
            raise ValueError("only an ask of another instance, not a reset, decoded without its snapshot, is noted")
        # the window matters to the rule only for an ask with no base (rarely: listed then)
        stale = _stale(grant, ms, self.between(grant, offset, ms) if grant.base < 0 else ())
        if stale:
            self._stale_after.append((ms, grant.floor))
            floor = grant.floor
        else:
            self._anchor, self._stale_after = (offset, ms, record), []
            floor = max(grant.floor, grant.base_floor)  # the records between were applied or noted here
        if self._frontier is None and grant.frontier >= 0:
            self._frontier = grant.frontier  # a reader that starts here (a compacted log)
        # a chunk unknown until rebuilt: reason None with no chunk (placed asks without a
        # chunk say TAKEN); placed again from its fields by the asks after it
        self._recent.append(Applied(offset, ms, grant, None, STALE if stale else None))
        self._keep_ms = max(self._keep_ms, grant.lease_ms)
        self.offset = offset
        self.ms = max(self.ms, ms)
        self.floor = max(self.floor, floor)
        anchor = self._anchor
        if anchor is not None and ms - anchor[1] > self._keep_ms:
            self._rebuild()  # before its window falls out of what is kept (``_prune``)
        self._prune(ms)

    def _rebuild(self) -> None:
        """The state after the newest record noted, from its newest ask that is not stale."""
        anchor, stale_after = self._anchor, self._stale_after
        if anchor is None and not stale_after:
            return
        self._anchor, self._stale_after = None, []
        before = self._leases
        leases = before
        if anchor is not None:
            offset, ms, record = anchor
            grant = decode_grant(record)
            decision, rebuilt, _floor = assign(grant, ms, self.between(grant, offset, ms))
            assert rebuilt is not None  # noted as not stale
            leases = rebuilt
            if decision.chunk is not None:
                self._frontier = max(self._frontier or 0, decision.chunk[1] + 1)
        for ms, floor in stale_after:
            leases = [lease for lease in leases if ms < lease.granted_ms + lease.lease_ms and lease.end >= floor]
        newest = self.ms
        self.counts.expired += sum(1 for lease in before if newest >= lease.granted_ms + lease.lease_ms)
        # the chunks the leases show, those granted since the newest reset (which set the
        # frontier below what it left): a chunk granted and over between two rebuilds is not
        # seen, and the frontier may lag by it (it only says which reads are redeliveries)
        ends = [lease.end for lease in leases if lease.granted_ms >= self._reset_ms]
        if ends:
            self._frontier = max(self._frontier or 0, max(ends) + 1)
        self._leases = leases

    def _recovered(self, between: list[Applied]) -> list[Applied]:
        """``between`` with the chunks of the noted asks filled in from the leases (a
        chunk's lease carries its ask's member, fetch token and log time), for the verdict
        on a version 0 record (written by builds before asks). A chunk no longer leased is
        left out: an expired one counts for no verdict anyway, and one below the floor
        only names another reason (COMMITTED for LEASED), except for a version 0 reset
        reaching into it, which a reader that placed the ask refuses and this one may not."""
        if not any(record.chunk is None and record.reason is None for record in between):
            return between
        chunks = {(lease.member, lease.token, lease.granted_ms): (lease.start, lease.end) for lease in self.leases}
        return [replace(record, chunk=chunks.get((record.grant.member, record.grant.token, record.ms)))
                if record.chunk is None and record.reason is None else record for record in between]

    def apply(self, offset: int, ms: int, grant: Grant) -> Decision:
        """Apply the record at ``offset`` (log-append time ``ms``): the chunk it gets, if any."""
        if offset <= self.offset:
            raise ValueError(f"record {offset} applied after {self.offset}")
        self._rebuild()
        between = self.between(grant, offset, ms)
        frontier = self._frontier
        expired = sum(1 for lease in self._leases if ms >= lease.granted_ms + lease.lease_ms)
        if grant.fixed:
            verdict = judge(grant, ms, [_seen(record) for record in self._recovered(between)])
            decision = Decision(None if verdict is not None else (grant.start, grant.end), verdict)
            floor = max(self.floor, grant.floor)
            leases = _taking([lease for lease in self._leases if lease.live_at(ms)], floor, grant, decision.chunk, ms)
        else:
            decision, rebuilt, floor = assign(grant, ms, between)
            crowd = self._crowd.get(grant.instance)
            if crowd is None:
                crowd = self._crowd[grant.instance] = deque(maxlen=_CROWD)
            if rebuilt is not None:  # the leases over its read: placed since the read was decided
                top = grant.end if decision.chunk is None else decision.chunk[0] - 1
                # all of it taken: at least one more than that was needed
                low = grant.read_from
                crowd.append(sum(1 for lease in rebuilt if lease.start <= top and low <= lease.end)
                             + (decision.chunk is None))
            leases = rebuilt if rebuilt is not None else \
                [lease for lease in self._leases if ms < lease.granted_ms + lease.lease_ms and lease.end >= floor]
        chunk = decision.chunk
        if chunk is not None and frontier is not None and chunk[0] < frontier and not grant.reset:
            decision = Decision(chunk, None, True)
        # kept for the asks after it, which place it again from its own fields: its snapshot
        # is never read again, and kept it would hold every lease of the key once per record
        # of the last two lease lengths (a heap the garbage collector walks again and again)
        kept = replace(grant, held=()) if grant.held else grant
        self._recent.append(Applied(offset, ms, kept, chunk, decision.reason))
        self._keep_ms = max(self._keep_ms, grant.lease_ms)
        self.offset = offset
        self.ms = max(self.ms, ms)
        self._prune(ms)
        self.counts.expired += expired
        self._leases = leases
        self.floor = max(self.floor, floor)
        if self._frontier is None and grant.frontier >= 0:
            self._frontier = grant.frontier  # a reader that starts here (a compacted log)
        if chunk is not None:
            self.counts.valid += 1
            self.counts.redelivered += decision.redelivered
            self._frontier = chunk[1] + 1 if grant.reset else max(self._frontier or 0, chunk[1] + 1)
            if grant.reset:
                self._reset_ms = ms
        else:
            self.counts.invalid += 1
        return decision

    def _prune(self, ms: int) -> None:
        """Forget records no assignment can need any more."""
        horizon = ms - 2 * self._keep_ms
        recent = self._recent
        drop = 0
        while drop < len(recent) - 1 and recent[drop].ms < horizon:
            drop += 1
        if drop:
            del recent[:drop]

    def instances(self) -> int:
        """How many instances asked for chunks of the key lately (within twice the lease)."""
        return len({record.grant.instance for record in self._recent}) or 1

    def ahead(self, instance: str) -> int:
        """How many chunks a read of ``instance`` should hold so that its ask finds one free:
        one more than the most chunks that took offsets of the read of one of its latest
        asks before it was applied (one when none did, as when an instance is alone); before
        it asked, one per instance asking lately."""
        crowd = self._crowd.get(instance)
        if not crowd:
            return self.instances()
        return 1 + max(crowd)

    # -- what this instance asks for ----------------------------------------------------------
    def hold(self, proposal: int, expected: OffsetRange) -> None:
        """The ask ``proposal`` of this instance is on its way and expects ``expected``:
        until ``settle``, the spans this instance reads next go around it. The log still
        decides: the chunk it gets may lie elsewhere, and offsets it does not get are left
        to the lowest-first rule of ``next_span``."""
        self.proposed[proposal] = expected

    def settle(self, proposal: int) -> None:
        """The ask ``proposal`` is applied (or never will be): its chunk is the log's."""
        self.proposed.pop(proposal, None)

    def live(self, now_ms: int) -> list[Lease]:
        """The leases live at ``now_ms`` the group has not committed whole (as last read)."""
        done = self.done
        stable = done.stable
        if not done.ranges:
            return [lease for lease in self.leases if now_ms < lease.granted_ms + lease.lease_ms and lease.end >= stable]
        covers = done.covers
        return [lease for lease in self.leases if now_ms < lease.granted_ms + lease.lease_ms and lease.end >= stable
                and not covers(lease.start, lease.end)]

    def uncommitted(self) -> int:
        """The leases as the log has them that the group has not committed whole (as last read)."""
        done = self.done
        return sum(1 for lease in self.leases if not done.covers(lease.start, lease.end))

    def held_by(self, member: str, now_ms: int, live: list[Lease] | None = None) -> int:
        """How many live chunks ``member`` holds (``live``: ``live(now_ms)``, when known)."""
        return sum(1 for lease in (self.live(now_ms) if live is None else live) if lease.member == member)

    def retry_of(self, member: str, token: int, now_ms: int, live: list[Lease] | None = None) -> Span | None:
        """What a fetch of ``member`` with FetchOffset ``token`` reads of a chunk it holds:
        its latest live lease again when fetched with that token (unless that chunk ends
        right below the token: then the token follows the chunk's receipt, not a retry);
        the rest of it when the token lies inside it (the member got the chunk only up to
        there: a read asked for before it was made may come back short). ``live``:
        ``live(now_ms)``, when known."""
        for lease in reversed(self.live(now_ms) if live is None else live):
            if lease.member == member:
                if lease.token == token and lease.end + 1 != token:  # first: a retry loses nothing
                    return Span(lease.start, lease.end, lease)
                if lease.start < token <= lease.end:
                    return Span(token, lease.end, lease)
                return None
        return None

    def release(self, committed: Committed) -> None:
        """The group committed ``committed``: the leases it covers whole are over here (they
        stay in the snapshots this instance writes: the log's state is the log's)."""
        self.done = committed

    def next_span(self, member: str, token: int, committed: Committed, now_ms: int,
                  max_leases: int) -> Span | None:
        """What ``member``'s fetch with FetchOffset ``token`` reads; None when it holds
        ``max_leases`` live chunks already."""
        live = self.live(now_ms)
        held = self.retry_of(member, token, now_ms, live)
        if held is not None:
            return held
        if self.held_by(member, now_ms, live) >= max_leases:
            return None
        low = max(committed.stable, self.floor, 0)
        if self.reset_pending:
            return Span(max(token, 0), None, claim_from=low, reset=True)
        if self.frontier is None and not live and not self.proposed and committed.stable < 0 and self.floor < 0 \
                and not committed.ranges:
            # nothing handed out, nothing committed: start where the member's reset policy says
            return Span(max(token, 0), None, claim_from=0)
        blocked = sorted([(lease.start, lease.end) for lease in live] + list(self.proposed.values())
                         + list(committed.ranges))
        start = low
        for lo, hi in blocked:
            if hi < start:
                continue
            if lo > start:
                return Span(start, lo - 1)
            start = hi + 1
        return Span(start, None)

    def redelivery(self, span: Span) -> bool:
        """Whether ``span`` hands out offsets handed out before."""
        return self.frontier is not None and span.chunk_start < self.frontier and not span.reset

    def ask(self, span: Span, member: str, token: int, batches: Sequence[tuple[int, int]], end: int,
            max_bytes: int, committed: Committed, *, lease_ms: int, instance: str, proposal: int,
            now_ms: int, view: tuple[int, int] = (-1, -1), offsets: int = 0) -> Grant:
        """The record that asks the log for ``member``'s next chunk within what its read
        holds: from ``span`` to ``end``, ``batches`` the (last offset, bytes) of the batches
        read there, at most ``max_bytes`` of them (at least one). Before a read: no
        batches, ``end`` the last offset known to exist, ``offsets`` the most offsets the
        chunk spans. ``view``: the offset and
        log-append time of the newest record this instance applied of the key's log
        partition (any key): its base when newer than the key's own (the key has no record
        between them), so that an ask after a quiet spell of the key is still fresh. With no
        record in the partition at all, no base, and the time of the view is ``now_ms``,
        this instance's clock."""
        if end < span.start or (span.end is not None and end > span.end):
            raise ValueError(f"ask end {end} outside its span {span}")
        if offsets < 0 or (offsets and batches):
            raise ValueError("an ask names batches it read or a count of offsets before its read, not both")
        base, base_ms = max((self.offset, self.ms), view)
        if base < 0:
            base_ms = now_ms
        # the snapshot: every lease applied, as the log has them (not thinned by the commits
        # this instance read, nor by its clock, which may run ahead of the broker's)
        return Grant(proposal, instance, member, token, span.chunk_start, end, span.start, lease_ms, base,
                     base_ms, max(committed.stable, self.floor, -1), -1 if self.frontier is None else self.frontier,
                     span.reset, tuple(self.leases), max_bytes, self.floor, tuple(batches), offsets=offsets)

    def expect(self, ask: Grant, now_ms: int) -> OffsetRange | None:
        """The chunk ``ask`` would get if nothing else reached the log first (what this
        instance's next spans go around until it is applied)."""
        others = [Lease("", -1, lo, hi, now_ms, 1) for lo, hi in self.proposed.values()]
        return place(ask, now_ms, self.live(now_ms) + others, max(self.floor, ask.floor))


def overlapping(leases: Sequence[Lease], ms: int) -> list[tuple[Lease, Lease]]:
    """Pairs of ``leases`` live at ``ms`` that overlap (for checks: none may)."""
    live = sorted((lease for lease in leases if lease.live_at(ms)), key=lambda lease: lease.start)
    return [(a, b) for a, b in zip(live, live[1:]) if b.start <= a.end]
