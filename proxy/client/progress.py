"""Processed offsets of one partition, for individual commit, sans I/O.

The group's state (docs/wire-contract.md#33-offsetcommit) is (S, R): every offset below S is processed, and R
holds processed ranges above S. The consumer keeps its own view of it:

* ``stable`` and ``committed``: S as the group last told us (OffsetFetch on start,
  StableOffset on every acknowledged commit) and R as OffsetFetch gave it when the
  partition was assigned. A record in them is never handed out again.
* ``pending``: offsets the application marked processed (and gaps nobody will process) that
  no commit has carried to the group yet. A commit sends them as OffsetRanges; they leave
  ``pending`` only when the commit is acknowledged, so a failed commit loses nothing.

Marks arrive one record at a time, mostly in ascending order, so the set is two parallel
sorted lists with a bisect per operation: appending the next offset extends the last range.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator

Range = tuple[int, int]


class OffsetSet:
    """A set of offsets as sorted, disjoint, non-adjacent inclusive ranges."""

    __slots__ = ("_starts", "_ends")

    def __init__(self, ranges: Iterable[Range] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        for start, end in ranges:
            self.add(start, end)

    def __len__(self) -> int:
        """The number of ranges (what a commit carries), not of offsets."""
        return len(self._starts)

    def __bool__(self) -> bool:
        return bool(self._starts)

    def __iter__(self) -> Iterator[Range]:
        return zip(self._starts, self._ends)

    def __repr__(self) -> str:
        return f"OffsetSet({list(self)!r})"

    def __contains__(self, offset: int) -> bool:
        i = bisect_right(self._starts, offset) - 1
        return i >= 0 and self._ends[i] >= offset

    def add(self, start: int, end: int | None = None) -> None:
        """Add [start, end] (inclusive), merging with every range it touches or abuts."""
        end = start if end is None else end
        if start > end:
            raise ValueError(f"range start {start} is above its end {end}")
        starts, ends = self._starts, self._ends
        if not ends or start > ends[-1] + 1:  # above everything: the common case, in order
            starts.append(start)
            ends.append(end)
            return
        if start == ends[-1] + 1:  # extends the last range
            ends[-1] = end
            return
        first = bisect_left(ends, start - 1)  # first range ending at or after start - 1
        last = bisect_right(starts, end + 1)  # ranges before this start at or before end + 1
        if first < last:
            start = min(start, starts[first])
            end = max(end, ends[last - 1])
        starts[first:last] = [start]
        ends[first:last] = [end]

    def remove(self, start: int, end: int) -> None:
        """Remove [start, end] (inclusive); the parts of ranges outside it stay."""
        starts, ends = self._starts, self._ends
        first = bisect_left(ends, start)
        last = bisect_right(starts, end)
        if first >= last:
            return
        new_starts, new_ends = [], []
        if starts[first] < start:
            new_starts.append(starts[first])
            new_ends.append(start - 1)
        if ends[last - 1] > end:
            new_starts.append(end + 1)
            new_ends.append(ends[last - 1])
        starts[first:last] = new_starts
        ends[first:last] = new_ends

    def remove_all(self, ranges: list[Range]) -> None:
        """Remove every range of ``ranges`` (sorted, disjoint). When they are this set's
        lowest ranges exactly (what a commit of ``first`` sends back acknowledged), they go
        in one cut instead of a list shift per range."""
        count = len(ranges)
        if count and count <= len(self._starts) and ranges[-1] == (self._starts[count - 1], self._ends[count - 1]) \
                and list(zip(self._starts[:count], self._ends[:count])) == ranges:
            del self._starts[:count]
            del self._ends[:count]
            return
        for start, end in ranges:
            self.remove(start, end)

    def discard_below(self, offset: int) -> None:
        """Drop every offset below ``offset``."""
        if self._starts and self._starts[0] < offset:
            self.remove(self._starts[0], offset - 1)

    def last_end(self) -> int:
        """The highest offset in the set (the set must not be empty)."""
        return self._ends[-1]

    def first(self, count: int) -> list[Range]:
        """The lowest ``count`` ranges."""
        return list(zip(self._starts[:count], self._ends[:count]))


class PartitionProgress:
    """The consumer's view of one partition's (S, R) and what it has yet to commit."""

    __slots__ = ("stable", "committed", "pending")

    def __init__(self, stable: int | None = None, committed: Iterable[Range] = ()) -> None:
        self.stable = stable
        self.committed = OffsetSet(committed)
        self.pending = OffsetSet()
        if stable is not None:
            self.committed.discard_below(stable)

    def already_committed(self, offset: int) -> bool:
        """Whether the group holds ``offset`` as processed (so it must not be handed out)."""
        if self.stable is not None and offset < self.stable:
            return True
        return offset in self.committed

    def covers_from(self, offset: int) -> bool:
        """Whether anything at or above ``offset`` may already be committed (S above it, or
        a range of R ending at or above it)."""
        if self.stable is not None and offset < self.stable:
            return True
        return bool(self.committed) and self.committed.last_end() >= offset

    def mark(self, start: int, end: int | None = None) -> None:
        """``[start, end]`` is processed (or is a gap nobody will process)."""
        end = start if end is None else end
        if self.stable is not None:
            if end < self.stable:
                return
            start = max(start, self.stable)
        self.pending.add(start, end)

    def to_commit(self, limit: int) -> list[Range]:
        """The ranges a range commit carries now: the lowest ``limit`` pending ones."""
        return self.pending.first(limit)

    def acknowledged(self, sent: Iterable[Range], stable: int) -> None:
        """A range commit of ``sent`` was acknowledged; the group's S is now ``stable``."""
        self.pending.remove_all(list(sent))
        # What this consumer committed lies below its position, where it fetches no more;
        # remembering it would only grow while S waits for a slower member.
        self._advance(stable)

    def contiguous(self) -> int | None:
        """For a plain commit (the proxy offers no individual commit): the offset below
        which everything is processed, if that moves S; else None."""
        if self.stable is None:
            return None
        reached = self.stable
        for start, end in sorted((*self.committed, *self.pending)):
            if start > reached:
                break
            reached = max(reached, end + 1)
        return reached if reached > self.stable else None

    def acknowledged_plain(self, offset: int) -> None:
        """A plain commit of ``offset`` was acknowledged: S = offset, R cleared."""
        self.stable = offset
        self.committed = OffsetSet()
        self.pending.discard_below(offset)

    def _advance(self, stable: int) -> None:
        if stable >= 0 and (self.stable is None or stable > self.stable):
            self.stable = stable
        if self.stable is not None:
            self.committed.discard_below(self.stable)
            self.pending.discard_below(self.stable)
