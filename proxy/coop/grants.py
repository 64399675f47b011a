"""Cooperative grants replicated through a Kafka log (DESIGN section 13): which chunk of
offsets of a (group, topic, partition) each member holds, decided the same way by every
proxy instance that reads the log. Sans I/O: records, offsets and log-append times come
in as values; ``proxy.coop.grant_log`` reads and writes the topic.

The log
-------
``__cooperative_fetch_grants``, compacted, ``message.timestamp.type=LogAppendTime``, keyed
by (group, topic, partition). An instance that wants to hand a chunk to a member appends a
``Grant``: the member and its fetch token, the chunk [start, end], the lease length, and
what the proposer knew when it proposed:

* ``base``, ``base_ms``: the offset and log-append time of the newest record of the key it
  had applied (-1: none);
* ``held``: the live leases of the key as it had them after applying ``base`` (its snapshot);
* ``floor``: the group's committed offset S as it had read it.

Validity
--------
Applied in log order, a grant at offset o with log-append time t is valid iff

1. it is fresh: ``t - base_ms <= lease_ms`` (a proposer that stalled between reading and
   appending proposes again);
2. its chunk overlaps no lease of ``held`` live at t, and no chunk *proposed* by a record of
   the key between ``base`` and o (valid or not) live at t; with no base, the records of the
   key appended within ``lease_ms`` before t;
3. it starts at or above every committed floor carried by those records and itself.

A lease granted at t with length L is live at a record's time u iff u < t + L: expiry is a
matter of log-append times, the same for every reader whatever its clock.

Safety: ``held`` holds every valid lease live at ``base`` (the proposer's applied state,
less only leases it has seen committed, which it never proposes again), and every valid
lease granted after ``base`` is the proposal of a record between ``base`` and o. So a valid
grant overlaps no valid live lease. Conflicts with invalid records only cost a new proposal.

Determinism: a grant's verdict depends on the grant and on the records between its base and
itself, nothing else (not on the reader's own state). Every reader that holds those records
decides the same.

Compaction
----------
Compaction keeps only the newest record of a key, but never one younger than the topic's
``min.compaction.lag.ms`` (M), which the proxy sets to at least twice the lease length. A
fresh grant's base lies within ``lease_ms`` before it, so the records its verdict needs are
younger than M whenever the grant is younger than M - lease_ms >= lease_ms: a restarted
instance reading the compacted log decides every grant that can still hold a live lease as
the running instances did, and so reaches the same live leases. Older grants may be decided
otherwise after compaction; their leases have expired, and what they held is either
committed or handed out again (offsets below the frontier that are neither committed nor
leased are handed out again), so no later verdict depends on them. Each record also carries
the proposer's frontier (the next offset never handed out) and floor, so the one record
left of a quiet key is enough to resume from.
"""

from __future__ import annotations

import itertools
import struct
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

GroupPartitionKey = tuple[str, str, int]  # (group, topic, partition)
OffsetRange = tuple[int, int]  # inclusive

KEY_VERSION = 0
VALUE_VERSION = 0

_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_HEAD = struct.Struct(">hq")  # version, proposal
_BODY = struct.Struct(">qqqqiqqqqBi")  # token start end read_from lease_ms base base_ms floor frontier reset held
_HELD = struct.Struct(">Hqqqqi")  # member index, token, start, end, granted_ms, lease_ms


@dataclass(frozen=True)
class Committed:
    """The group's committed state of one partition, as the proposer read it: every offset
    below ``stable`` and every offset in ``ranges`` (sorted, disjoint, inclusive) is
    processed. A lease it covers whole is over; only its uncommitted parts go out again."""

    stable: int = -1
    ranges: tuple[OffsetRange, ...] = ()

    def covers(self, start: int, end: int) -> bool:
        return not self.uncommitted(start, end)

    def uncommitted(self, start: int, end: int) -> list[OffsetRange]:
        """The parts of [start, end] not committed, in order."""
        start = max(start, self.stable)
        if start > end:
            return []
        out: list[OffsetRange] = []
        at = start
        ranges = self.ranges
        i = max(bisect_right(ranges, (at, float("inf"))) - 1, 0)
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


@dataclass(frozen=True, slots=True)
class Lease:
    """A valid grant: ``member`` holds offsets [start, end] (fetched with FetchOffset
    ``token``) from log-append time ``granted_ms`` for ``lease_ms``."""

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
    """A proposal, as appended to the log (see the module docstring)."""

    proposal: int  # unique per proposing instance: how it finds its verdict
    instance: str
    member: str
    token: int
    start: int  # the chunk's first offset (it may claim offsets below ``read_from``)
    end: int
    read_from: int  # where the read began
    lease_ms: int
    base: int
    base_ms: int
    floor: int
    frontier: int  # the proposer's next offset never handed out, this chunk included (-1: none)
    reset: bool = False  # the log moved away: leases ending below ``read_from`` are gone
    held: tuple[Lease, ...] = ()


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
    out = [_HEAD.pack(VALUE_VERSION, grant.proposal)]
    _put_str(out, grant.instance)
    _put_str(out, grant.member)
    out.append(_BODY.pack(grant.token, grant.start, grant.end, grant.read_from, grant.lease_ms, grant.base,
                          grant.base_ms, grant.floor, grant.frontier, int(grant.reset), len(grant.held)))
    out.append(_U16.pack(len(members)))
    for member in members:
        _put_str(out, member)
    out.extend(_HELD.pack(index[lease.member], lease.token, lease.start, lease.end, lease.granted_ms, lease.lease_ms)
               for lease in grant.held)
    return b"".join(out)


def decode_grant(data: bytes | memoryview) -> Grant:
    try:
        version, proposal = _HEAD.unpack_from(data, 0)
        if version != VALUE_VERSION:
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
        if at + count * _HELD.size != len(data):
            raise GrantFormatError("grant value of the wrong length")
        held = []
        for _ in range(count):
            who, h_token, h_start, h_end, granted, h_lease = _HELD.unpack_from(data, at)
            at += _HELD.size
            if who >= len(members):
                raise GrantFormatError("lease of an unknown member")
            held.append(Lease(members[who], h_token, h_start, h_end, granted, h_lease))
    except struct.error as exc:
        raise GrantFormatError(str(exc)) from exc
    return Grant(proposal, instance, member, token, start, end, read_from, lease_ms, base, base_ms, floor,
                 frontier, bool(reset), tuple(held))


# -- verdicts -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Seen:
    """A record of the key as a later verdict needs it: where, when, and what it proposed."""

    offset: int
    ms: int
    start: int
    end: int
    lease_ms: int
    floor: int


STALE = "stale"
LEASED = "leased"
COMMITTED = "committed"


def judge(grant: Grant, ms: int, between: Iterable[Seen]) -> str | None:
    """The verdict on ``grant`` appended at log time ``ms``: None if valid, else why not.
    ``between``: the records of its key after its base and before it (for a grant with no
    base, those appended within its lease length before it)."""
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
    """One key's grants as this instance applied them, and what it proposes next."""

    leases: list[Lease] = field(default_factory=list)  # valid, not known committed or expired
    offset: int = -1  # the newest record applied
    ms: int = -1  # its log-append time
    frontier: int | None = None  # the next offset never handed out
    floor: int = -1  # the highest committed floor carried by the records
    reset_pending: bool = False  # the broker said the read position is out of range
    counts: Counts = field(default_factory=Counts)
    # this instance's proposals on their way through the log (proposal -> its chunk): its
    # next spans go around them, so that it proposes the next chunk without waiting for the
    # verdict on the last; a proposal, not a lease, that no other reader knows of
    proposed: dict[int, OffsetRange] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._recent: list[Seen] = []
        self._keep_ms = 0

    # -- applying the log -------------------------------------------------------------------
    def between(self, grant: Grant, offset: int, ms: int) -> list[Seen]:
        recent = self._recent
        if grant.base >= 0:
            first = bisect_right(recent, grant.base, key=lambda seen: seen.offset)
            return [seen for seen in recent[first:] if seen.offset < offset]
        return [seen for seen in recent if seen.offset < offset and seen.ms >= ms - grant.lease_ms]

    def apply(self, offset: int, ms: int, grant: Grant) -> str | None:
        """Apply the record at ``offset`` (log-append time ``ms``); its verdict (None: valid)."""
        if offset <= self.offset:
            raise ValueError(f"record {offset} applied after {self.offset}")
        verdict = judge(grant, ms, self.between(grant, offset, ms))
        self._recent.append(Seen(offset, ms, grant.start, grant.end, grant.lease_ms, grant.floor))
        self._keep_ms = max(self._keep_ms, grant.lease_ms)
        self.offset = offset
        self.ms = max(self.ms, ms)
        self._prune(ms)
        if self.frontier is None and grant.frontier >= 0:
            self.frontier = grant.frontier  # a reader that starts here (a compacted log)
        if verdict is None:
            self.counts.valid += 1
            if grant.reset:
                self.leases = [lease for lease in self.leases if lease.end >= grant.read_from]
                self.frontier = grant.end + 1
            else:
                self.frontier = max(self.frontier or 0, grant.end + 1)
            self.leases.append(Lease(grant.member, grant.token, grant.start, grant.end, ms, grant.lease_ms))
        else:
            self.counts.invalid += 1
        if grant.floor > self.floor:
            self.floor = grant.floor
            self.leases = [lease for lease in self.leases if lease.end >= grant.floor]
        return verdict

    def _prune(self, ms: int) -> None:
        """Forget records no verdict can need any more, and leases past their time."""
        horizon = ms - 2 * self._keep_ms
        recent = self._recent
        drop = 0
        while drop < len(recent) - 1 and recent[drop].ms < horizon:
            drop += 1
        if drop:
            del recent[:drop]
        if any(not lease.live_at(ms) for lease in self.leases):
            kept = [lease for lease in self.leases if lease.live_at(ms)]
            self.counts.expired += len(self.leases) - len(kept)
            self.leases = kept

    # -- what this instance proposes ----------------------------------------------------------
    def hold(self, grant: Grant) -> None:
        """``grant``, proposed by this instance, is on its way: until ``settle``, the spans
        this instance proposes next go around its chunk. The log still decides: a proposal
        that loses leaves its offsets to the lowest-first rule of ``next_span``."""
        self.proposed[grant.proposal] = (grant.start, grant.end)

    def settle(self, proposal: int) -> None:
        """The verdict on ``proposal`` is in (or will never come): its chunk is the log's."""
        self.proposed.pop(proposal, None)

    def live(self, now_ms: int) -> list[Lease]:
        return [lease for lease in self.leases if lease.live_at(now_ms)]

    def held_by(self, member: str, now_ms: int) -> int:
        return sum(1 for lease in self.leases if lease.member == member and lease.live_at(now_ms))

    def retry_of(self, member: str, token: int, now_ms: int) -> Lease | None:
        """The chunk a fetch of ``member`` with FetchOffset ``token`` gets again: its latest
        live lease fetched with that token, unless that chunk ends right below the token
        (then the token follows the chunk's receipt: not a retry)."""
        for lease in reversed(self.leases):
            if lease.member == member:
                if lease.token == token and lease.end + 1 != token and lease.live_at(now_ms):
                    return lease
                return None
        return None

    def release(self, committed: Committed) -> int:
        """Forget the leases ``committed`` covers whole (the group processed them)."""
        kept = [lease for lease in self.leases if not committed.covers(lease.start, lease.end)]
        dropped = len(self.leases) - len(kept)
        self.leases = kept
        return dropped

    def next_span(self, member: str, token: int, committed: Committed, now_ms: int,
                  max_leases: int) -> Span | None:
        """What ``member``'s fetch with FetchOffset ``token`` reads; None when it holds
        ``max_leases`` live chunks already."""
        lease = self.retry_of(member, token, now_ms)
        if lease is not None:
            return Span(lease.start, lease.end, lease)
        if self.held_by(member, now_ms) >= max_leases:
            return None
        low = max(committed.stable, self.floor, 0)
        if self.reset_pending:
            return Span(max(token, 0), None, claim_from=low, reset=True)
        live = self.live(now_ms)
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

    def propose(self, span: Span, member: str, token: int, chunk_end: int, committed: Committed, *,
                lease_ms: int, instance: str, proposal: int, now_ms: int) -> Grant:
        """The record that asks the log for [span.chunk_start, chunk_end] for ``member``."""
        start = span.chunk_start
        if chunk_end < start or (span.end is not None and chunk_end > span.end):
            raise ValueError(f"chunk end {chunk_end} outside its span {span}")
        frontier = chunk_end + 1 if span.reset else max(self.frontier or 0, chunk_end + 1)
        # every lease applied and not expired by log time: the proposer's clock may run ahead
        # of the broker's, so its own idea of what expired must not thin the snapshot
        return Grant(proposal, instance, member, token, start, chunk_end, span.start, lease_ms, self.offset,
                     self.ms, max(committed.stable, self.floor, -1), frontier, span.reset, tuple(self.leases))


def overlapping(leases: Sequence[Lease], ms: int) -> list[tuple[Lease, Lease]]:
    """Pairs of ``leases`` live at ``ms`` that overlap (for checks: none may)."""
    live = sorted((lease for lease in leases if lease.live_at(ms)), key=lambda lease: lease.start)
    return [(a, b) for a, b in zip(live, live[1:]) if b.start <= a.end]
