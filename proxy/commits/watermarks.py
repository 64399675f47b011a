"""Share watermarks of virtual range topics beside the coordinator's committed offset, and
how the two copies combine, without I/O (docs/wire-contract.md#9-virtual-range-topics).

A virtual commit reaches the coordinator first, as the real partition's committed offset
S with the watermarks in its metadata string (``encode_metadata``), then the log's record
of the key. A proxy that dies between the two leaves the coordinator's copy newer than the
log's; ``combine`` takes, per share, whichever of the two is newer (the higher sequence of
one reset epoch), so what OffsetFetch answers never goes back behind either.

Metadata, version 2: ``keyrange.watermarks/2:<epoch>:<K>/<share>=<W>@<sequence>,...``.
Version 1 (``keyrange.watermarks/1:<K>:<W>,<W>,...``, -1 for none) was written by releases
that kept the watermarks only there; it reads as sequence 0 of an unknown epoch.
"""

from __future__ import annotations

from proxy.commits.state import (
    MAX_OFFSET,
    MAX_SHARES,
    CommitState,
    Marks,
    checked_marks,
    join_marks,
    rebase,
    settle,
    share_count,
)

__all__ = ["PREFIX", "ShadowMark", "combine", "decode_metadata", "encode_metadata", "fold", "newer", "overlay",
           "per_share", "sequences"]

# A transaction's shadow-group watermark (proxy.virtual.txn), committed:
# (K, share, W, reset epoch, sequence).
ShadowMark = tuple[int, int, int, int, int]

PREFIX = "keyrange.watermarks/"
_V1 = PREFIX + "1:"
_V2 = PREFIX + "2:"


def encode_metadata(state: CommitState) -> str:
    marks = ",".join(f"{shares}/{share}={offset}@{sequence}" for shares, share, offset, sequence in state.marks)
    return f"{_V2}{state.epoch}:{marks}"


def decode_metadata(metadata: str | None) -> tuple[int | None, Marks] | None:
    """(reset epoch, or None when unknown; the watermarks) of a committed offset's
    metadata; None when it holds none or is not ours (a client's own metadata).

    Any group member can set this metadata with a plain OffsetCommit, and OffsetFetch of
    every member reads it, so whatever it holds must not fail the reader: metadata that is
    not what ``encode_metadata`` writes (a number beyond int64, an offset below -1 or any
    other number below 0, a K beyond ``MAX_SHARES``, a share listed twice, ...) is read as
    none, and the log's copy alone counts. All of it, not just the wrong parts: a copy wrong anywhere is
    not a proxy's, and ignoring it can only make OffsetFetch answer older watermarks
    (records re-delivered), never newer ones than were processed."""
    if not metadata or not metadata.startswith(PREFIX):
        return None
    try:
        if metadata.startswith(_V2):
            epoch_text, _, rest = metadata[len(_V2):].partition(":")
            marks = []
            for item in filter(None, rest.split(",")):
                slot, _, value = item.partition("=")
                k_text, _, share_text = slot.partition("/")
                offset_text, _, sequence_text = value.partition("@")
                marks.append((_number(k_text, 1), _number(share_text, 0), _number(offset_text, -1),
                              _number(sequence_text, 0)))
            return _number(epoch_text, 0), checked_marks(marks)
        if metadata.startswith(_V1):
            shares_text, _, rest = metadata[len(_V1):].partition(":")
            shares = _number(shares_text, 1)
            if shares > MAX_SHARES:
                return None
            offsets = [_number(part, -1) for part in rest.split(",")]
            if len(offsets) != shares:
                return None
            return None, checked_marks([(shares, share, offset, 0) for share, offset in enumerate(offsets)
                                        if offset >= 0])
    except ValueError:
        return None
    return None


def _number(text: str, lowest: int) -> int:
    """An integer of the metadata: ``lowest`` (-1 for an offset, meaning none) up to int64's
    highest, as the coordinator's offsets and the log's fields are."""
    value = int(text)
    if not lowest <= value <= MAX_OFFSET:
        raise ValueError(f"{value} is outside {lowest}..{MAX_OFFSET}")
    return value


def combine(logged: CommitState | None, committed: int, metadata: str | None) -> CommitState:
    """The key's state as the log's record (``logged``, None: none) and the coordinator's
    committed offset and metadata show it together: S is the larger; the watermarks are
    the log's joined per share with the coordinator's when those belong to the same reset
    epoch (a coordinator copy of an older epoch was reset since; of a newer one, the log
    write after it never happened, and it is the newest)."""
    decoded = decode_metadata(metadata)
    stable = max(committed, -1)  # -1: nothing committed yet (a share then reads -1, as the coordinator does)
    if logged is None:
        if decoded is None:
            return CommitState(stable)
        epoch, marks = decoded
        return settle(CommitState(stable, (), epoch or 0, marks))
    base = rebase(logged, committed)
    if decoded is None:
        return base
    epoch, marks = decoded
    if epoch is None:
        epoch = base.epoch if not base.marks else -1  # legacy copy: only where the log has none
    if epoch < base.epoch:
        return base
    if epoch > base.epoch:
        return settle(CommitState.from_packed(base.stable, base.packed, epoch, marks))
    return settle(CommitState.from_packed(base.stable, base.packed, base.epoch, join_marks(base.marks, marks)))


def per_share(marks: Marks) -> dict[int, list[int]]:
    """K -> W per share of K (-1: that share has none).

    A list is as long as its K says, so a K is listed only up to ``MAX_SHARES`` (or its
    striped form, ``share_count``; and a share only below its K): marks read from the log or the coordinator never hold another
    (``checked_marks``), and the guard keeps a K no virtual topic can have from costing
    memory should one be built some other way."""
    out: dict[int, list[int]] = {}
    for shares, share, offset, _sequence in marks:
        width = share_count(shares)
        if 0 <= share < width:
            out.setdefault(shares, [-1] * width)[share] = offset
    return out


# -- shadow watermarks of transactional commits -------------------------------------------------


def sequences(state: CommitState) -> dict[tuple[int, int], int]:
    """(K, share) -> the sequence of the share's watermark in ``state``."""
    return {(mark[0], mark[1]): mark[3] for mark in state.marks}


def newer(state: CommitState, shadow: ShadowMark) -> bool:
    """Whether a committed shadow watermark is newer than ``state``'s watermark of its share:
    of the state's reset epoch (or a later one) with a higher sequence. Ties go to the log:
    folding a shadow gives the share a sequence at least the shadow's."""
    shares, share, offset, epoch, sequence = shadow
    if offset < 0 or epoch < state.epoch:
        return False
    if epoch > state.epoch:
        return True
    return sequence > sequences(state).get((shares, share), 0)


def overlay(state: CommitState, shadows: list[ShadowMark]) -> CommitState:
    """``state`` with every newer shadow watermark in place of its share's."""
    taken = {(s[0], s[1]): (s[0], s[1], s[2], s[4]) for s in shadows if newer(state, s)}
    if not taken:
        return state
    kept = tuple(mark for mark in state.marks if (mark[0], mark[1]) not in taken)
    return settle(CommitState.from_packed(state.stable, state.packed, state.epoch,
                                          join_marks(kept, tuple(sorted(taken.values())))))


def fold(state: CommitState, shadows: list[ShadowMark]) -> dict[int, dict[int, tuple[int, int]]]:
    """What brings ``state`` up to its newer shadows: K -> share -> (W, the shadow's
    sequence, which the log keeps for it)."""
    edits: dict[int, dict[int, tuple[int, int]]] = {}
    for shadow in shadows:
        if newer(state, shadow):
            edits.setdefault(shadow[0], {})[shadow[1]] = (shadow[2], shadow[4])
    return edits
