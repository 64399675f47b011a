"""Sets of offsets as sorted, disjoint inclusive ranges: what a consumer has processed and
not yet committed (``proxy.client.progress``).

Offsets mostly arrive in ascending order, so the set is two parallel sorted lists with a
bisect per operation, and appending the next offset extends the last range.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator

OffsetRange = tuple[int, int]


class OffsetSet:
    """A set of offsets as sorted, disjoint, non-adjacent inclusive ranges."""

    __slots__ = ("_starts", "_ends")

    def __init__(self, ranges: Iterable[OffsetRange] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        for start, end in ranges:
            self.add(start, end)

    def __len__(self) -> int:
        """The number of ranges (what a commit carries), not of offsets."""
        return len(self._starts)

    def __bool__(self) -> bool:
        return bool(self._starts)

    def __iter__(self) -> Iterator[OffsetRange]:
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

    def remove_all(self, ranges: list[OffsetRange]) -> None:
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

    def first(self, count: int) -> list[OffsetRange]:
        """The lowest ``count`` ranges."""
        return list(zip(self._starts[:count], self._ends[:count]))

    def pop_first(self) -> OffsetRange:
        """Remove and return the lowest range (the set must not be empty)."""
        return self._starts.pop(0), self._ends.pop(0)
