"""Precomputed lookup from a key hash to the range sets (requesters) that want it.

Every range boundary of every set cuts the hash space; between two consecutive cuts the
membership is constant. So a lookup is one ``bisect`` over the cuts plus a table read,
whatever the number of sets and ranges, which is what the split hot loop needs.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from proxy.ranges import HASH_MAX, KeyRange, effective_ranges


class RangePlan:
    """The elementary intervals of several range sets.

    ``bounds`` is the sorted list of cut points in (0, 2^63 - 1]; interval ``i`` is
    ``[bounds[i-1], bounds[i])`` (with 0 and 2^63 at the ends), and ``members[i]`` is the
    tuple of set indices whose ranges contain it. ``bisect_right(bounds, h)`` gives ``i``.
    A set given as None or an empty list means the whole space, as on the wire.
    """

    __slots__ = ("sets", "bounds", "members", "full_sets", "disjoint")

    def __init__(self, range_sets: Sequence[Sequence[KeyRange] | None]) -> None:
        self.sets: tuple[tuple[KeyRange, ...], ...] = tuple(
            tuple(effective_ranges(rs)) for rs in range_sets
        )
        cuts: set[int] = set()
        for ranges in self.sets:
            for r in ranges:
                if r.start > 0:
                    cuts.add(r.start)
                if r.end < HASH_MAX:
                    cuts.add(r.end + 1)
        self.bounds: list[int] = sorted(cuts)
        starts = [[r.start for r in ranges] for ranges in self.sets]
        members = []
        for i in range(len(self.bounds) + 1):
            point = self.bounds[i - 1] if i else 0
            members.append(
                tuple(
                    k
                    for k, ranges in enumerate(self.sets)
                    if _in_sorted(ranges, starts[k], point)
                )
            )
        self.members: list[tuple[int, ...]] = members
        self.full_sets = frozenset(
            k for k, ranges in enumerate(self.sets) if ranges == (KeyRange(0, HASH_MAX),)
        )
        self.disjoint = all(len(m) <= 1 for m in members)

    def __len__(self) -> int:
        return len(self.sets)

    def sets_for(self, key_hash: int) -> tuple[int, ...]:
        """Indices of the sets whose ranges contain ``key_hash``."""
        return self.members[bisect_right(self.bounds, key_hash)]


def _in_sorted(ranges: Sequence[KeyRange], starts: list[int], point: int) -> bool:
    i = bisect_right(starts, point) - 1
    return i >= 0 and point <= ranges[i].end
