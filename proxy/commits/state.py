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

A key may also hold the share watermarks of virtual range topics (``marks``,
docs/wire-contract.md#9-virtual-range-topics): W(i) per share i of K. Within an epoch they merge per share (the
higher sequence wins), and S moves to at least the lowest W once every share of a K has
one (``settle``); a plain commit (a reset) clears them with the ranges. A key holds at most
one watermark per (K, share), and K is at most ``MAX_SHARES``: ``checked_marks`` is what
both copies of the watermarks (the log's value, the coordinator's metadata) are read
through.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from proxy.commits import packed as kernels
from proxy.commits.gaps import Gaps, lift
from proxy.commits.packed import MAX_OFFSET, RANGE_SIZE, OffsetRange, invalid, pack, unpack
from proxy.records.stripes import STRIPED_MARKS
from proxy.records.stripes import share_count as striped_share_count

Marks = tuple[tuple[int, int, int, int], ...]  # sorted (K, share, W, sequence)

# The largest K of a share watermark. ``virtual.topic.max.shares`` cannot be set above it
# (the configuration refuses that), and a higher K is read from nowhere whatever this
# instance's setting is: the log and the coordinator's copy are read by every instance, and
# instances configured differently must agree on what is readable. 64: the coordinator
# keeps the watermarks in the committed offset's metadata, which Kafka caps at
# offset.metadata.max.bytes (4096 characters by default); every share of one K, each
# ``K/i=W@sequence`` with int64 W and sequence, fits in it up to 88 shares, and 64 leaves room.
MAX_SHARES = 64
# The smallest K of a virtual topic: one share would be the real partition.
MIN_SHARES = 2


__all__ = ["MAX_OFFSET", "MAX_SHARES", "MIN_SHARES", "STRIPED_MARKS", "CommitState", "Edit", "Floor", "MarkEdit", "Marks", "apply_edit", "apply_marks",
           "apply_packed", "apply_plain", "apply_ranges", "check", "check_held", "check_packed", "checked_marks",
           "join", "join_marks", "lift_marks", "normalise", "rebase", "rebase_commit", "settle", "share_count", "stable_after",
           "validate", "watermark_floor"]


class CommitState:
    """(S, R) of one key, and its reset epoch; immutable. ``CommitState(40, [(43, 45)])``
    from tuples, ``CommitState.from_packed(40, data)`` from packed ranges (kept as given).

    The epoch counts resets (a plain commit, a commit after a deletion). Within one epoch
    a state only grows (range commits add processed offsets), so two states of the same
    epoch combine as the union of what they hold (``join``); a higher epoch replaces a
    lower one. That is what lets instances that wrote the same key concurrently merge
    without losing what either acknowledged.

    ``marks``: the share watermarks of virtual range topics kept with the state
    (``proxy.commits.watermarks``), sorted (K, share, W, sequence) tuples; empty for a
    key no virtual topic committed in this epoch."""

    __slots__ = ("stable", "packed", "epoch", "marks")
    stable: int
    packed: bytes
    epoch: int
    marks: Marks

    def __init__(self, stable: int, ranges: Iterable[OffsetRange] = (), epoch: int = 0, marks: Marks = ()) -> None:
        object.__setattr__(self, "stable", stable)
        object.__setattr__(self, "packed", pack(ranges))
        object.__setattr__(self, "epoch", epoch)
        object.__setattr__(self, "marks", marks)

    @classmethod
    def from_packed(cls, stable: int, packed: bytes, epoch: int = 0, marks: Marks = ()) -> CommitState:
        state = object.__new__(cls)
        object.__setattr__(state, "stable", stable)
        object.__setattr__(state, "packed", packed)
        object.__setattr__(state, "epoch", epoch)
        object.__setattr__(state, "marks", marks)
        return state

    def __setattr__(self, name, value):
        raise AttributeError("CommitState is immutable")

    @property
    def ranges(self) -> tuple[OffsetRange, ...]:
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
        return self.stable == other.stable and self.packed == other.packed and self.epoch == other.epoch and \
            self.marks == other.marks

    def __hash__(self) -> int:
        return hash((self.stable, self.packed, self.epoch, self.marks))

    def __repr__(self) -> str:
        marks = f", marks={self.marks}" if self.marks else ""
        return f"CommitState(stable={self.stable}, ranges={self.ranges}, epoch={self.epoch}{marks})"


def normalise(ranges: Iterable[OffsetRange]) -> list[OffsetRange]:
    """Sorted, disjoint, non-adjacent union of inclusive ranges."""
    out: list[list[int]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1] + 1:
            if end > out[-1][1]:
                out[-1][1] = end
        else:
            out.append([start, end])
    return [(start, end) for start, end in out]


def _state(stable_and_packed: tuple[int, bytes], epoch: int, marks: Marks = ()) -> CommitState:
    stable, packed = stable_and_packed
    return CommitState.from_packed(stable, packed, epoch, marks)


def apply_packed(state: CommitState, commit: bytes) -> CommitState:
    """The merge rule: union, drop everything below S, then advance S over a range at S."""
    return _state(kernels.merge(state.stable, state.packed, commit), state.epoch, state.marks)


def join_marks(a: Marks, b: Marks) -> Marks:
    """Two sets of share watermarks of one epoch together: per (K, share) the one of the
    higher sequence (then the higher offset). A join: the result does not depend on the
    order, and joining again changes nothing."""
    if not b or a == b:
        return a
    if not a:
        return b
    best: dict[tuple[int, int], tuple[int, int, int, int]] = {}
    for mark in (*a, *b):
        slot = (mark[0], mark[1])
        held = best.get(slot)
        if held is None or (mark[3], mark[2]) > (held[3], held[2]):
            best[slot] = mark
    return tuple(sorted(best.values()))


def share_count(mark_k: int) -> int:
    """How many shares the watermarks kept under ``mark_k`` are of: K of ``<topic>.kr<K>``
    or of ``<topic>.coop<K>`` (``STRIPED_MARKS`` + K); 0 for a K no proxy writes."""
    return striped_share_count(mark_k, MAX_SHARES)


def checked_marks(marks: Iterable[tuple[int, int, int, int]]) -> Marks:
    """``marks`` (K, share, W, sequence) as a key holds them, sorted; ValueError when they
    are not what a proxy writes: K outside 1..MAX_SHARES (or its striped form,
    ``share_count``), a share outside 0..K-1, or two
    watermarks of one share. Both copies of a key's watermarks can come from anyone (any
    client may produce to the log, any group member may set its committed offset's
    metadata), and what reads them relies on these: ``per_share`` allocates K entries per
    K, and ``watermark_floor`` must not count a share twice."""
    ordered = sorted(marks)
    for index, (shares, share, _offset, _sequence) in enumerate(ordered):
        width = share_count(shares)
        if not width:
            raise ValueError(f"share watermark of {shares} shares: K is 1..{MAX_SHARES}")
        if not 0 <= share < width:
            raise ValueError(f"share watermark of share {share} of {shares}")
        if index and ordered[index - 1][:2] == (shares, share):
            raise ValueError(f"share watermark of share {share} of {shares} listed twice")
    return tuple(ordered)


def watermark_floor(marks: Marks) -> int:
    """The offset below which the watermarks show the whole partition processed: for each
    K whose every share has a watermark, the lowest of them; the highest such (-1: none).

    Shares are counted once each, and only 0..K-1: counting watermarks instead would let a
    K with one share listed twice (or a share that does not exist) pass for complete while
    a share has none, and S would move past records no member processed. A share listed
    twice counts with the lower of its watermarks."""
    floor = -1
    by_k: dict[int, dict[int, int]] = {}
    for shares, share, offset, _sequence in marks:
        if 0 <= share < share_count(shares):
            lowest = by_k.setdefault(shares, {})
            lowest[share] = min(offset, lowest.get(share, offset))
    for shares, lowest in by_k.items():
        if len(lowest) == share_count(shares):
            floor = max(floor, min(lowest.values()))
    return floor


def settle(state: CommitState) -> CommitState:
    """S moved to at least the watermarks' floor (as a processed range below it, so ranges
    above fold in as usual): S never moves back within an epoch."""
    floor = watermark_floor(state.marks) if state.marks else -1
    if floor <= state.stable:
        return state
    return _state(kernels.merge(floor, b"", state.packed), state.epoch, state.marks)


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
    marks = join_marks(high.marks, low.marks)
    if not low.packed and marks == high.marks:
        return high
    joined = _state(kernels.merge(high.stable, high.packed, low.packed), a.epoch, marks) if low.packed else \
        CommitState.from_packed(high.stable, high.packed, a.epoch, marks)
    return settle(joined)


def apply_ranges(state: CommitState, commit: Iterable[OffsetRange]) -> CommitState:
    """``apply_packed`` with the commit as tuples (in any order, overlaps allowed)."""
    return apply_packed(state, pack(commit))


def stable_after(state: CommitState, commit: bytes) -> int:
    """``apply_packed(state, commit).stable`` without building R'."""
    return kernels.stable_after(state.stable, state.packed, commit)


def rebase_commit(ours: CommitState, newer: CommitState | None, commits: Iterable[Edit]) -> CommitState:
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
        base = apply_edit(base, commit)
    return base


def apply_edit(state: CommitState, edit: Edit) -> CommitState:
    """One commit's change to a key: packed ranges, share watermarks (``MarkEdit``), or a
    coordinator's committed offset (``Floor``)."""
    if isinstance(edit, MarkEdit):
        return apply_marks(state, edit)
    if isinstance(edit, Floor):
        return rebase(state, edit.stable) if state.epoch == edit.epoch else state
    return apply_packed(state, edit)


@dataclass(frozen=True, slots=True)
class Floor:
    """Every offset below ``stable`` is processed, in reset epoch ``epoch``: the
    coordinator's committed offset where it is above the log's S (a commit whose forward
    the broker accepted and whose log write never happened, its instance having died in
    between). Applied as ``rebase``; to a state of another epoch (reset or deleted since
    the coordinator's offset was read) it adds nothing."""

    stable: int
    epoch: int


class MarkEdit:
    """A commit of share watermarks of virtual topic K: ``marks`` share -> W(share).

    Sequences (``apply_marks``): by default one above any the key holds. ``exact`` sets a
    share's sequence to a given one: a transaction's watermark folded into the log keeps
    the sequence its shadow commit carried, so that a later transaction's shadow, numbered
    before this fold was written, still ranks above it. ``at_least`` raises a share's
    sequence to a floor: consecutive transactions of one share through one instance are
    numbered in order even before the earlier one is folded.

    ``gaps``: share -> stretches known to hold no record of that share
    (``proxy.commits.gaps``); once the marks are set, every share of K whose watermark
    lies in one of its gaps is lifted to the gap's end (``lift_marks``). Applied to the
    state the edit meets, under the key's lock and again after a merge, never to a copy
    read earlier: a lift is never computed from a watermark that has moved since."""

    __slots__ = ("shares", "marks", "exact", "at_least", "gaps")

    def __init__(self, shares: int, marks: dict[int, int], *, exact: dict[int, int] | None = None,
                 at_least: dict[int, int] | None = None, gaps: Mapping[int, Gaps] | None = None) -> None:
        self.shares = shares
        self.marks = dict(marks)
        self.exact = dict(exact or {})
        self.at_least = dict(at_least or {})
        self.gaps = dict(gaps or {})

    def __repr__(self) -> str:
        extra = (f", exact={self.exact}" if self.exact else "") + (f", at_least={self.at_least}" if self.at_least else "")
        extra += f", gaps={self.gaps}" if self.gaps else ""
        return f"MarkEdit(shares={self.shares}, marks={self.marks}{extra})"


Edit = bytes | MarkEdit | Floor  # one commit's change to a key


def apply_marks(state: CommitState, edit: MarkEdit) -> CommitState:
    """Set W(share) of ``edit``'s shares with the key's next sequence (one above any held in
    this epoch, so the newest commit of a share wins a merge), then settle S.

    A negative W (a client may commit any offset) is held as -1, which means the same
    everywhere (no watermark: the share reads S, and its K does not settle S) and is the
    lowest the coordinator's copy is read back with (``watermarks.decode_metadata``)."""
    sequence = max((mark[3] for mark in state.marks), default=0) + 1
    kept = [mark for mark in state.marks if not (mark[0] == edit.shares and mark[1] in edit.marks)]
    kept += [(edit.shares, share, max(offset, -1),
              edit.exact[share] if share in edit.exact else max(sequence, edit.at_least.get(share, 0)))
             for share, offset in edit.marks.items()]
    marks = tuple(sorted(kept))
    if edit.gaps:
        marks = lift_marks(marks, state.stable, edit.shares, edit.gaps)
    return settle(CommitState.from_packed(state.stable, state.packed, state.epoch, marks))


def lift_marks(marks: Marks, stable: int, shares: int, gaps: Mapping[int, Gaps]) -> Marks:
    """``marks`` with each share of ``shares`` (a K) whose committed offset lies in one of
    its ``gaps`` (share -> stretches holding none of its records) lifted to the gap's end
    (docs/virtual-topics.md#lag).

    A share's committed offset is its watermark, or S (``stable``) where it has none; a
    share without one whose S is lifted gets a watermark of sequence 0, which any commit
    of the share outranks. A lifted watermark keeps its sequence: it says what the one it
    replaces says, so a commit of the share made meanwhile elsewhere (a higher sequence)
    still wins a merge, and against the unlifted copy (same sequence) the higher offset,
    the lifted one, does. No commit (-1, or S -1) is never lifted: it is not an offset."""
    width = share_count(shares)
    held = {mark[1]: mark for mark in marks if mark[0] == shares}
    changed = False
    out = [mark for mark in marks if mark[0] != shares or not 0 <= mark[1] < width]
    for share in range(width):
        mark = held.get(share)
        share_gaps = gaps.get(share)
        if share_gaps:
            offset = mark[2] if mark is not None and mark[2] >= 0 else stable
            lifted = lift(offset, share_gaps)
            if lifted != offset:
                changed = True
                mark = (shares, share, lifted, mark[3] if mark is not None else 0)
        if mark is not None:
            out.append(mark)
    return tuple(sorted(out)) if changed else marks


def apply_plain(offset: int, previous: CommitState | None = None) -> CommitState:
    """A plain commit of ``offset``: S = offset, R cleared; a reset, so the epoch moves on."""
    return CommitState(offset, (), previous.epoch + 1 if previous is not None else 0)


def rebase(state: CommitState, stable: int) -> CommitState:
    """``state`` seen by a coordinator whose committed offset is ``stable``: S is the
    larger of the two, and ranges below it are dropped (then S advances as usual)."""
    if stable <= state.stable:
        return state
    return _state(kernels.merge(stable, b"", state.packed), state.epoch, state.marks)


def validate(committed_offset: int, ranges: Sequence[OffsetRange], max_ranges: int) -> str | None:
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


def check(committed_offset: int, ranges: Sequence[OffsetRange], max_ranges: int) -> tuple[str | None, list[OffsetRange]]:
    """``validate``, and the ranges sorted (valid ones are then disjoint and ascending).
    Ranges as tuples: the reference for ``check_packed``, and for offsets beyond int64."""
    reason = _refused(committed_offset, len(ranges), max_ranges)
    if reason is not None:
        return reason, []
    ordered = sorted(ranges)
    return invalid(ordered), ordered


def check_held(before: CommitState, after: CommitState, max_held: int) -> str | None:
    """Why ``after``, the state a commit would leave of a key that holds ``before``, may not
    be stored (INVALID_COMMIT_OFFSET_SIZE), or None if it may: more than ``max_held`` ranges
    above S (``max.individual.commit.ranges.held``), and more than ``before`` holds.

    A commit that adds no range (it closes gaps, extends a range, or moves S) is always
    accepted, even to a state already over the bound (the setting was lowered, or two
    instances' concurrent commits joined past it): that is how a state gets back under it,
    and refusing it would hold S back for good. Each committed range adds at most one, so
    ``before.held()`` plus the commit's ranges at most ``max_held`` needs no merge to tell."""
    held = after.held()
    if held <= max_held or held <= before.held():
        return None
    return f"{held} ranges held after the commit (now {before.held()}); at most {max_held} " \
           f"(max.individual.commit.ranges.held)"


def check_packed(committed_offset: int, commit: bytes, max_ranges: int) -> tuple[str | None, bytes]:
    """``check`` of a commit's packed ranges: (reason or None, the ranges sorted, packed)."""
    reason = _refused(committed_offset, len(commit) // RANGE_SIZE, max_ranges)
    if reason is not None:
        return reason, b""
    return kernels.sort_checked(commit)
