"""Processed offsets of one partition, for individual commit, sans I/O.

The group's state (docs/wire-contract.md#33-offsetcommit) is (S, R): every offset below S is processed, and R
holds processed ranges above S. The consumer keeps its own view of it:

* ``stable`` and ``committed``: S as the group last told us (OffsetFetch on start,
  StableOffset on every acknowledged commit) and R as OffsetFetch gave it when the
  partition was assigned. A record in them is never handed out again.
* ``pending``: offsets the application marked processed (and gaps nobody will process) that
  no commit has carried to the group yet. A commit sends them as OffsetRanges; they leave
  ``pending`` only when the commit is acknowledged, so a failed commit loses nothing.

Marks arrive one record at a time, mostly in ascending order: ``proxy.offset_sets.OffsetSet``
keeps them as ranges and extends the last one in the common case.
"""

from __future__ import annotations

from collections.abc import Iterable

from proxy.offset_sets import OffsetSet

OffsetRange = tuple[int, int]


class PartitionProgress:
    """The consumer's view of one partition's (S, R) and what it has yet to commit."""

    __slots__ = ("stable", "committed", "pending")

    def __init__(self, stable: int | None = None, committed: Iterable[OffsetRange] = ()) -> None:
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

    def to_commit(self, limit: int) -> list[OffsetRange]:
        """The ranges a range commit carries now: the lowest ``limit`` pending ones."""
        return self.pending.first(limit)

    def acknowledged(self, sent: Iterable[OffsetRange], stable: int) -> None:
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
