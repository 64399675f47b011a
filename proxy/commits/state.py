"""Individual-commit state, sans I/O (DESIGN.md section 3, OffsetCommit).

The state of one (group, topic, partition) is (S, R):

* S, the stable offset: every offset below S is processed; it is the standard committed
  offset the real group coordinator holds.
* R: sorted, disjoint, non-adjacent inclusive ranges of processed offsets, each starting
  above S (a range starting at S would have been folded into S).

A range commit C gives R' = merge(R, C) with everything below S dropped; then, while R'
has a range starting at S, S moves past its end and the range is dropped. A plain commit
of offset O sets S = O and clears R (standard Kafka semantics).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import le, lt
from typing import Iterable, Sequence

INVALID_REQUEST = 42
MAX_OFFSET = (1 << 63) - 1

Range = tuple[int, int]


@dataclass(frozen=True, slots=True)
class CommitState:
    stable: int
    ranges: tuple[Range, ...] = ()

    def held(self) -> int:
        return len(self.ranges)

    def processed(self, offset: int) -> bool:
        if offset < self.stable:
            return True
        return any(start <= offset <= end for start, end in self.ranges)


EMPTY = CommitState(0, ())


def normalise(ranges: Iterable[Range]) -> list[Range]:
    """Sorted, disjoint, non-adjacent union of inclusive ranges."""
    out: list[list[int]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1] + 1:
            if end > out[-1][1]:
                out[-1][1] = end
        else:
            out.append([start, end])
    return [(start, end) for start, end in out]


def apply_ranges(state: CommitState, commit: Iterable[Range]) -> CommitState:
    """The merge rule: union, drop everything below S, then advance S over a range at S."""
    stable = state.stable
    merged = sorted((*state.ranges, *commit))
    # Starts ascend: S absorbs a prefix of the union (what starts at or below it) ...
    count = len(merged)
    index = 0
    while index < count:
        start, end = merged[index]
        if start > stable:
            break
        if end >= stable:
            stable = end + 1
        index += 1
    if index == count:
        return CommitState(stable, ())
    # ... and the rest, all above S, coalesces in one pass.
    kept: list[Range] = []
    cur_start, cur_end = merged[index]
    for start, end in merged[index + 1:]:
        if start > cur_end + 1:
            kept.append((cur_start, cur_end))
            cur_start, cur_end = start, end
        elif end > cur_end:
            cur_end = end
    kept.append((cur_start, cur_end))
    return CommitState(stable, tuple(kept))


def stable_after(state: CommitState, commit: Sequence[Range]) -> int:
    """``apply_ranges(state, commit).stable`` without building R'. ``commit`` must be sorted
    (as ``check`` returns it); when its first range starts above S, S stays (the held
    ranges all start above S), with no pass over the ranges at all."""
    stable = state.stable
    if not commit or commit[0][0] > stable:
        return stable
    for start, end in sorted((*state.ranges, *commit)):
        if start > stable:
            break
        if end >= stable:
            stable = end + 1
    return stable


def apply_plain(offset: int) -> CommitState:
    """A plain commit of ``offset``: S = offset, R cleared."""
    return CommitState(offset, ())


def rebase(state: CommitState, stable: int) -> CommitState:
    """``state`` seen by a coordinator whose committed offset is ``stable``: S is the
    larger of the two, and ranges below it are dropped (then S advances as usual)."""
    if stable <= state.stable:
        return state
    return apply_ranges(CommitState(stable, ()), state.ranges)


def validate(committed_offset: int, ranges: Sequence[Range], max_ranges: int) -> str | None:
    """Why a partition's range commit is invalid (INVALID_REQUEST), or None if it is valid."""
    return check(committed_offset, ranges, max_ranges)[0]


def check(committed_offset: int, ranges: Sequence[Range], max_ranges: int) -> tuple[str | None, list[Range]]:
    """``validate``, and the ranges sorted (valid ones are then disjoint and ascending)."""
    if not ranges:
        return "no ranges", []
    if committed_offset != -1:
        return f"CommittedOffset is {committed_offset}; it must be -1 with OffsetRanges", []
    if len(ranges) > max_ranges:
        return f"{len(ranges)} ranges; at most {max_ranges} (max.individual.commit.ranges)", []
    ordered = sorted(ranges)
    starts, ends = zip(*ordered)
    if starts[0] >= 0 and all(map(le, starts, ends)) and all(map(lt, ends, starts[1:])) and ends[-1] < MAX_OFFSET:
        return None, ordered  # the usual case, checked without a Python loop; otherwise, why:
    if ordered[0][0] < 0:
        start, end = ordered[0]
        return f"negative offset in range [{start}, {end}]", ordered
    previous = -1
    for start, end in ordered:  # one pass: starts ascend, so every end is checked too
        if end < 0:
            return f"negative offset in range [{start}, {end}]", ordered
        if start > end:
            return f"range start {start} is above its end {end}", ordered
        if start <= previous:
            return f"ranges overlap at offset {start}", ordered
        previous = end
    if previous >= MAX_OFFSET:
        return f"range end {previous} is beyond the largest offset", ordered
    return None, ordered
