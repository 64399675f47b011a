"""Stretches of a partition known to hold no record of one share of a virtual topic, and
how a share's committed offset moves over them, without I/O
(docs/virtual-topics.md#lag).

A *gap* ``(start, end)`` is the half-open offset interval [start, end) of a real partition
in which the proxy has seen every offset and none holds a record of the share: the
stretch its control batch moved the share's consumers past (``proxy.virtual.fetch``).
A committed offset W of the share means "every record of the share below W is
processed"; when W lies in a gap, no record of the share lies in [W, end), so committing
``end`` says exactly the same. That is the lift: it never passes a record of the share,
whatever was delivered or committed, because it only passes offsets that hold none.

Gaps are kept sorted, disjoint and merged where they touch, so that a lift is one step
and two reads that met end to end (the second starting where the first's control batch
ended) read as one stretch.
"""

from __future__ import annotations

from bisect import bisect_right

Gap = tuple[int, int]  # [start, end): no record of the share in it
Gaps = tuple[Gap, ...]  # sorted, disjoint, non-adjacent

__all__ = ["Gap", "Gaps", "add_gap", "lift"]


def lift(offset: int, gaps: Gaps) -> int:
    """``offset`` moved to the end of the gap that holds it (unchanged outside every gap,
    and for a negative offset, which means no commit)."""
    if offset < 0 or not gaps:
        return offset
    index = bisect_right(gaps, offset, key=_start) - 1  # the last gap starting at or below it
    while 0 <= index < len(gaps) and gaps[index][0] <= offset < gaps[index][1]:
        offset = gaps[index][1]
        index += 1  # merged gaps never touch, but a caller's unmerged ones may
    return offset


def _start(gap: Gap) -> int:
    return gap[0]


def add_gap(gaps: Gaps, start: int, end: int, keep: int) -> Gaps:
    """``gaps`` with [start, end) added (merged with every gap it overlaps or touches),
    keeping the ``keep`` highest: the stretches near the log end are the ones committed
    offsets wait in. An empty or negative interval changes nothing."""
    if start >= end or start < 0:
        return gaps
    if gaps and start >= gaps[-1][0]:  # at the top, as reads come in order: no sort
        low, high = gaps[-1]
        if start > high:
            out = (*gaps, (start, end))
        elif end <= high:
            return gaps
        else:
            out = (*gaps[:-1], (low, end))
        return out[-keep:] if keep > 0 else ()
    kept: list[Gap] = []
    for low, high in gaps:
        if high < start or low > end:
            kept.append((low, high))
        else:
            start, end = min(start, low), max(end, high)
    kept.append((start, end))
    kept.sort()
    return tuple(kept[-keep:]) if keep > 0 else ()
