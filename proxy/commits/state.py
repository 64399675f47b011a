"""Individual-commit state, sans I/O (docs/wire-contract.md#33-offsetcommit).

The state of one (group, topic, partition) is (S, R):

* S, the stable offset: every offset below S is processed; it is the standard committed
  offset the real group coordinator holds.
* R: sorted, disjoint, non-adjacent inclusive ranges of processed offsets, each starting
  above S (a range starting at S would have been folded into S).

A range commit C gives R' = merge(R, C) with everything below S dropped; then, while R'
has a range starting at S, S moves past its end and the range is dropped. A plain commit
of offset O sets S = O and clears R (standard Kafka semantics).

R is held packed (``proxy.commits.packed``): the bytes a commit's ranges arrive in, which
the kernels merge and turn into the log's value as they are, so the hot path never builds
a Python object per range. ``ranges`` gives the tuples for everything else.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from proxy.commits import packed as kernels
from proxy.commits.packed import MAX_OFFSET, RANGE_SIZE, Range, invalid, pack, unpack

__all__ = ["MAX_OFFSET", "CommitState", "apply_packed", "apply_plain", "apply_ranges", "check", "check_packed",
           "join", "normalise", "rebase", "rebase_commit", "stable_after", "validate"]


class CommitState:
    """(S, R) of one key, and its reset epoch; immutable. ``CommitState(40, [(43, 45)])``
    from tuples, ``CommitState.from_packed(40, data)`` from packed ranges (kept as given).

    The epoch counts resets (a plain commit, a commit after a deletion). Within one epoch
    a state only grows (range commits add processed offsets), so two states of the same
    epoch combine as the union of what they hold (``join``); a higher epoch replaces a
    lower one. That is what lets instances that wrote the same key concurrently merge
    without losing what either acknowledged."""

    __slots__ = ("stable", "packed", "epoch")
    stable: int
    packed: bytes
    epoch: int

    def __init__(self, stable: int, ranges: Iterable[Range] = (), epoch: int = 0) -> None:
        object.__setattr__(self, "stable", stable)
        object.__setattr__(self, "packed", pack(ranges))
        object.__setattr__(self, "epoch", epoch)

    @classmethod
    def from_packed(cls, stable: int, packed: bytes, epoch: int = 0) -> CommitState:
        state = object.__new__(cls)
        object.__setattr__(state, "stable", stable)
        object.__setattr__(state, "packed", packed)
        object.__setattr__(state, "epoch", epoch)
        return state

    def __setattr__(self, name, value):
        raise AttributeError("CommitState is immutable")

    @property
    def ranges(self) -> tuple[Range, ...]:
        return tuple(unpack(self.packed))

    def held(self) -> int:
        return len(self.packed) // RANGE_SIZE

    def processed(self, offset: int) -> bool:
        if offset < self.stable:
            return True
        return any(start <= offset <= end for start, end in self.ranges)

    def __eq__(self, other) -> bool:
        if not isinstance(other, CommitState):
            return NotImplemented
        return self.stable == other.stable and self.packed == other.packed and self.epoch == other.epoch

    def __hash__(self) -> int:
        return hash((self.stable, self.packed, self.epoch))

    def __repr__(self) -> str:
        return f"CommitState(stable={self.stable}, ranges={self.ranges}, epoch={self.epoch})"


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


def _state(stable_and_packed: tuple[int, bytes], epoch: int) -> CommitState:
    stable, packed = stable_and_packed
    return CommitState.from_packed(stable, packed, epoch)


def apply_packed(state: CommitState, commit: bytes) -> CommitState:
    """The merge rule: union, drop everything below S, then advance S over a range at S."""
    return _state(kernels.merge(state.stable, state.packed, commit), state.epoch)


def join(a: CommitState, b: CommitState) -> CommitState:
    """What two states of a key hold together: the one of the higher epoch (a reset
    happened after the other was computed), or, in one epoch, the union of their
    processed offsets."""
    if a.epoch != b.epoch:
        return a if a.epoch > b.epoch else b
    if a.stable >= b.stable:
        high, low = a, b
    else:
        high, low = b, a
    if not low.packed:
        return high
    return _state(kernels.merge(high.stable, high.packed, low.packed), a.epoch)


def apply_ranges(state: CommitState, commit: Iterable[Range]) -> CommitState:
    """``apply_packed`` with the commit as tuples (in any order, overlaps allowed)."""
    return apply_packed(state, pack(commit))


def stable_after(state: CommitState, commit: bytes) -> int:
    """``apply_packed(state, commit).stable`` without building R'."""
    return kernels.stable_after(state.stable, state.packed, commit)


def rebase_commit(ours: CommitState, newer: CommitState | None, commits: Iterable[bytes]) -> CommitState:
    """``ours`` (a state with ``commits`` applied) brought up to ``newer``, a record of the
    key another instance wrote meanwhile (None: it deleted the state). In one epoch the
    two join; after a reset (a higher epoch, or the deletion) the commits apply to it;
    a record of a lower epoch (written before a reset this instance saw) adds nothing."""
    if newer is None:
        base = CommitState(0, (), ours.epoch + 1)
    elif newer.epoch > ours.epoch:
        base = newer
    else:
        return join(ours, newer)
    for commit in commits:
        base = apply_packed(base, commit)
    return base


def apply_plain(offset: int, previous: CommitState | None = None) -> CommitState:
    """A plain commit of ``offset``: S = offset, R cleared; a reset, so the epoch moves on."""
    return CommitState(offset, (), previous.epoch + 1 if previous is not None else 0)


def rebase(state: CommitState, stable: int) -> CommitState:
    """``state`` seen by a coordinator whose committed offset is ``stable``: S is the
    larger of the two, and ranges below it are dropped (then S advances as usual)."""
    if stable <= state.stable:
        return state
    return _state(kernels.merge(stable, b"", state.packed), state.epoch)


def validate(committed_offset: int, ranges: Sequence[Range], max_ranges: int) -> str | None:
    """Why a partition's range commit is invalid (INVALID_REQUEST), or None if it is valid."""
    return check(committed_offset, ranges, max_ranges)[0]


def _refused(committed_offset: int, count: int, max_ranges: int) -> str | None:
    if not count:
        return "no ranges"
    if committed_offset != -1:
        return f"CommittedOffset is {committed_offset}; it must be -1 with OffsetRanges"
    if count > max_ranges:
        return f"{count} ranges; at most {max_ranges} (max.individual.commit.ranges)"
    return None


def check(committed_offset: int, ranges: Sequence[Range], max_ranges: int) -> tuple[str | None, list[Range]]:
    """``validate``, and the ranges sorted (valid ones are then disjoint and ascending).
    Ranges as tuples: the reference for ``check_packed``, and for offsets beyond int64."""
    reason = _refused(committed_offset, len(ranges), max_ranges)
    if reason is not None:
        return reason, []
    ordered = sorted(ranges)
    return invalid(ordered), ordered


def check_packed(committed_offset: int, commit: bytes, max_ranges: int) -> tuple[str | None, bytes]:
    """``check`` of a commit's packed ranges: (reason or None, the ranges sorted, packed)."""
    reason = _refused(committed_offset, len(commit) // RANGE_SIZE, max_ranges)
    if reason is not None:
        return reason, b""
    return kernels.sort_checked(commit)
