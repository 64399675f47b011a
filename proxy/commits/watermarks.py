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

from proxy.commits.state import CommitState, Marks, join_marks, rebase, settle

__all__ = ["PREFIX", "combine", "decode_metadata", "encode_metadata", "per_share"]

PREFIX = "keyrange.watermarks/"
_V1 = PREFIX + "1:"
_V2 = PREFIX + "2:"


def encode_metadata(state: CommitState) -> str:
    marks = ",".join(f"{shares}/{share}={offset}@{sequence}" for shares, share, offset, sequence in state.marks)
    return f"{_V2}{state.epoch}:{marks}"


def decode_metadata(metadata: str | None) -> tuple[int | None, Marks] | None:
    """(reset epoch, or None when unknown; the watermarks) of a committed offset's
    metadata; None when it holds none or is not ours (a client's own metadata)."""
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
                marks.append((int(k_text), int(share_text), int(offset_text), int(sequence_text)))
            return int(epoch_text), _checked(marks)
        if metadata.startswith(_V1):
            shares_text, _, rest = metadata[len(_V1):].partition(":")
            shares = int(shares_text)
            offsets = [int(part) for part in rest.split(",")]
            if len(offsets) != shares:
                return None
            return None, _checked([(shares, share, offset, 0) for share, offset in enumerate(offsets) if offset >= 0])
    except ValueError:
        return None
    return None


def _checked(marks: list[tuple[int, int, int, int]]) -> Marks:
    for shares, share, _offset, _sequence in marks:
        if not 0 <= share < shares:
            raise ValueError(f"share {share} of {shares}")
    return tuple(sorted(marks))


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
    """K -> W per share of K (-1: that share has none)."""
    out: dict[int, list[int]] = {}
    for shares, share, offset, _sequence in marks:
        out.setdefault(shares, [-1] * shares)[share] = offset
    return out
