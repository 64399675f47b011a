"""Who gets which offsets of a cooperatively fetched partition: the marker, the leases and
what is handed out again (docs/wire-contract.md#37-cooperative-fetch). Sans I/O: times and
the group's committed offsets come in as values.

One ``PartitionLeases`` per (group, topic, partition). A fetch takes its turn (the feature
serialises them), asks ``next_span`` what to read, and reports what the read held with
``granted`` or ``returned``; between the two nothing else may change the marker, which is
what keeps chunks disjoint.

What is handed out comes from two places, in this order:

* ``redeliver``: offsets handed out before and not committed in time (expired leases), and
  the gaps in what the group had committed when this state began (a proxy restart);
* the marker: offsets nobody has had yet.

Committed offsets are told as a ``Committed`` (the group's (S, R)): a lease wholly below S
or inside R is done, and only its uncommitted parts are handed out again.
"""

from __future__ import annotations

import heapq
import itertools
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

from proxy.offset_sets import OffsetSet

OffsetRange = tuple[int, int]  # inclusive

ILLEGAL_GENERATION = 22


@dataclass(frozen=True)
class Committed:
    """The group's committed state of one partition: every offset below ``stable`` and
    every offset in ``ranges`` (sorted, disjoint, inclusive) is processed."""

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
        i = bisect_right(ranges, (at, float("inf"))) - 1
        if i < 0:
            i = 0
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


@dataclass
class Lease:
    """A chunk handed to ``member``: offsets [start, end], fetched with ``token`` (the
    request's FetchOffset), to be committed before ``expires``."""

    member: str
    token: int
    start: int
    end: int
    expires: float
    live: bool = True


@dataclass(frozen=True)
class Span:
    """What one fetch reads: from ``start``; to ``end`` inclusive, or open (None: from the
    marker, as far as the byte limits go). ``lease``: the outstanding chunk a retry gets
    again (the marker and the leases stay as they are)."""

    start: int
    end: int | None
    lease: Lease | None = None
    claim_from: int | None = None  # the chunk starts here, below ``start`` (see ``unclaimed_from``)

    @property
    def chunk_start(self) -> int:
        return self.start if self.claim_from is None else min(self.claim_from, self.start)


@dataclass
class Counts:
    """What happened, for the metrics (monotonic)."""

    leased: int = 0
    leased_offsets: int = 0
    redelivered: int = 0
    expired: int = 0
    retried: int = 0


@dataclass
class PartitionLeases:
    """The cooperative state of one (group, topic, partition)."""

    marker: int
    lease_seconds: float
    max_leases_per_member: int
    redeliver: OffsetSet = field(default_factory=OffsetSet)
    counts: Counts = field(default_factory=Counts)

    # Offsets from here to the marker nobody will be handed: skipped by the reset policy of
    # the member whose fetch started the marker (a group with nothing committed, or the log
    # moved away under the marker). The next chunk from the marker starts here instead, so
    # its member commits them and S can pass them.
    unclaimed_from: int | None = None
    reset_pending: bool = False  # the broker said the marker is out of range

    def __post_init__(self) -> None:
        self._by_member: dict[str, list[Lease]] = {}
        self._latest: dict[str, Lease] = {}
        self._expiry: list[tuple[float, int, Lease]] = []
        self._order = itertools.count()

    @classmethod
    def starting(cls, committed: Committed, fetch_offset: int, *, lease_seconds: float,
                 max_leases_per_member: int) -> PartitionLeases:
        """The state of a partition nobody here has fetched cooperatively yet: the marker
        past everything the group committed, the gaps below it handed out first; a group
        that committed nothing starts where the first fetch asks (its reset policy)."""
        if committed.stable < 0 and not committed.ranges:
            return cls(max(fetch_offset, 0), lease_seconds, max_leases_per_member, unclaimed_from=0)
        stable = max(committed.stable, 0)
        marker = max([stable] + [end + 1 for _, end in committed.ranges])
        state = cls(marker, lease_seconds, max_leases_per_member)
        for start, end in committed.uncommitted(stable, marker - 1):
            state.redeliver.add(start, end)
        return state

    # -- questions ----------------------------------------------------------------------------
    @property
    def leases(self) -> int:
        return sum(len(held) for held in self._by_member.values())

    @property
    def members(self) -> int:
        return len(self._by_member)

    def outstanding(self, member: str) -> list[Lease]:
        return list(self._by_member.get(member, ()))

    def retry_of(self, member: str, token: int) -> Lease | None:
        """The chunk a fetch of ``member`` with FetchOffset ``token`` must get again: its
        latest, still leased, fetched with the same token, unless that chunk ends right
        below the token (then the same token also follows its receipt: not a retry)."""
        lease = self._latest.get(member)
        if lease is None or not lease.live or lease.token != token or lease.end + 1 == token:
            return None
        return lease

    def at_limit(self, member: str) -> bool:
        return len(self._by_member.get(member, ())) >= self.max_leases_per_member

    # -- events --------------------------------------------------------------------------------
    def release_committed(self, committed: Committed, member: str | None = None) -> int:
        """Drop the leases (``member``'s, or everyone's) the group has committed whole."""
        dropped = 0
        for name in [member] if member is not None else list(self._by_member):
            held = self._by_member.get(name)
            if not held:
                continue
            keep = []
            for lease in held:
                if committed.covers(lease.start, lease.end):
                    lease.live = False
                    dropped += 1
                else:
                    keep.append(lease)
            self._set_held(name, keep)
        self.redeliver.discard_below(committed.stable)
        if dropped:
            self._expiry = [item for item in self._expiry if item[2].live]
            heapq.heapify(self._expiry)
        return dropped

    def expire(self, now: float, committed: Committed) -> int:
        """Leases past their time: their uncommitted offsets are handed out again."""
        expired = 0
        while self._expiry and self._expiry[0][0] <= now:
            _, _, lease = heapq.heappop(self._expiry)
            if not lease.live:
                continue
            lease.live = False
            held = self._by_member.get(lease.member, [])
            self._set_held(lease.member, [other for other in held if other is not lease])
            for start, end in committed.uncommitted(lease.start, lease.end):
                self.redeliver.add(start, end)
            expired += 1
        self.counts.expired += expired
        return expired

    def next_span(self, member: str, token: int, committed: Committed) -> Span | None:
        """What ``member``'s fetch with FetchOffset ``token`` reads; None: nothing for it now
        (it holds its limit of uncommitted chunks)."""
        lease = self.retry_of(member, token)
        if lease is not None:
            self.counts.retried += 1
            return Span(lease.start, lease.end, lease)
        if self.at_limit(member):
            return None
        if self.reset_pending:
            self._reset(token, committed)
        while self.redeliver:
            start, end = self.redeliver.pop_first()
            todo = committed.uncommitted(start, end)
            if not todo:
                continue
            for lo, hi in todo[1:]:
                self.redeliver.add(lo, hi)
            return Span(todo[0][0], todo[0][1])
        return Span(self.marker, None, claim_from=self.unclaimed_from)

    def out_of_range(self) -> None:
        """The broker answered OFFSET_OUT_OF_RANGE at the marker (records deleted by
        retention, or the log truncated). The answer does not say where the log is (the
        broker sends -1 for both ends); the member's reset policy does: the next fetch's
        FetchOffset becomes the marker."""
        self.reset_pending = True

    def _reset(self, token: int, committed: Committed) -> None:
        """Start again at ``token``: what was leased or to be handed out again below it is
        gone from the log, or skipped by the reset; the next chunk claims everything from
        the group's S."""
        self.reset_pending = False
        for held in self._by_member.values():
            for lease in held:
                lease.live = False
        self._by_member.clear()
        self._latest.clear()
        self._expiry.clear()
        self.redeliver = OffsetSet()
        self.marker = max(token, 0)
        self.unclaimed_from = max(committed.stable, 0)

    def granted(self, span: Span, member: str, token: int, chunk_end: int, now: float) -> Lease:
        """``span``'s read held a chunk [span.start, chunk_end]: lease it to ``member``."""
        if span.lease is not None:
            return span.lease  # a retry: the same chunk, the same lease and time
        if chunk_end < span.start:
            raise ValueError(f"chunk end {chunk_end} is below its start {span.start}")
        if span.end is None:
            self.marker = max(self.marker, chunk_end + 1)
            self.unclaimed_from = None
        else:
            if chunk_end > span.end:
                raise ValueError(f"chunk end {chunk_end} is past its span's end {span.end}")
            if chunk_end < span.end:
                self.redeliver.add(chunk_end + 1, span.end)  # what the byte limits left
            self.counts.redelivered += 1
        lease = Lease(member, token, span.chunk_start, chunk_end, now + self.lease_seconds)
        self._by_member.setdefault(member, []).append(lease)
        self._latest[member] = lease
        heapq.heappush(self._expiry, (lease.expires, next(self._order), lease))
        self.counts.leased += 1
        self.counts.leased_offsets += chunk_end - span.chunk_start + 1
        return lease

    def returned(self, span: Span) -> None:
        """``span``'s read held nothing, or failed: what it would have handed out stays
        to be handed out."""
        if span.lease is None and span.end is not None:
            self.redeliver.add(span.start, span.end)

    # -- internals ------------------------------------------------------------------------------
    def _set_held(self, member: str, held: Sequence[Lease]) -> None:
        if held:
            self._by_member[member] = list(held)
        else:
            self._by_member.pop(member, None)
            latest = self._latest.get(member)
            if latest is not None and not latest.live:
                del self._latest[member]


def generation_error(newest: int, generation: int) -> int:
    """0, or ILLEGAL_GENERATION for a member of a generation older than ``newest`` (the
    newest seen in the group's cooperative fetches); -1 (assign mode) is never refused."""
    if generation < 0 or generation >= newest:
        return 0
    return ILLEGAL_GENERATION
