"""The poll-side steps of a group member's cooperative hand-off (KIP-983), part of
``proxy.client.group.GroupMember``: a revocation completes once every record of the
revoked ranges that a poll handed out is marked processed and committed; a partition that
grows takes on its new ranges once none of its records is out unmarked; and the
application's view of what is being revoked (``to_be_revoked``, ``delay_revoke``, ``lost``).

Kept in a class of its own so that the member reads by concern (the background task that
joins and heartbeats; the assignments it applies; these steps); ``GroupMember`` inherits it
and owns the state these methods use.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from proxy.client.connection import RETRIABLE_FAILURES
from proxy.client.errors import KafkaError
from proxy.client.group_assignor import Assignment
from proxy.client.membership import difference
from proxy.client.records import ConsumerRecord, TopicPartition
from proxy.ranges import KeyRange
from proxy.records.keyhash import key_hash

if TYPE_CHECKING:
    from proxy.client.assignment import AssignmentState
    from proxy.client.committer import Committer
    from proxy.client.membership import Membership

log = logging.getLogger(__name__)

# A commit before a hand-off that fails with one of these is tried again on the next poll.
COMMIT_RETRY: tuple[type[BaseException], ...] = (KafkaError, *RETRIABLE_FAILURES)


class RebalanceListener:
    """Override what you need; each runs inside ``poll``, in the application's task, with
    the partitions and their key ranges ([] = the whole partition)."""

    async def on_assigned(self, assignment: Assignment) -> None:
        """New ranges; they are fetched from the group's committed state."""

    async def on_revoked(self, assignment: Assignment) -> None:
        """Ranges handed on: with individual commit, every record of them this member was
        handed is processed and committed by now; without it, commit here."""

    async def on_lost(self, assignment: Assignment) -> None:
        """Ranges lost (the member was fenced, or did not poll in time): others may be
        processing them already; commit nothing of them."""


class HandedOut:
    """Records ``poll`` handed out and the application has not marked processed yet, by
    partition, with their key hashes: a range is done when none of them falls in it."""

    def __init__(self) -> None:
        self._by_tp: dict[TopicPartition, dict[int, int]] = {}

    def handed(self, records: Iterable[ConsumerRecord]) -> None:
        for r in records:
            self._by_tp.setdefault(TopicPartition(r.topic, r.partition), {})[r.offset] = key_hash(r.key, r.offset)

    def done(self, tp: TopicPartition, offset: int) -> None:
        out = self._by_tp.get(tp)
        if out is not None:
            out.pop(offset, None)

    def busy(self, tp: TopicPartition, ranges: Sequence[KeyRange]) -> bool:
        """Whether a handed-out record of ``tp`` in ``ranges`` ([] = all) is unfinished."""
        out = self._by_tp.get(tp)
        if not out:
            return False
        if not ranges:
            return True
        return any(any(h in r for r in ranges) for h in out.values())

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        for tp in tps:
            self._by_tp.pop(tp, None)

    def count(self) -> int:
        return sum(len(v) for v in self._by_tp.values())


class HandOff:
    """A member's hand-off steps (see the module's docstring)."""

    if TYPE_CHECKING:  # the member's, which these steps use
        membership: Membership
        handed: HandedOut
        listener: RebalanceListener
        _state: AssignmentState
        _committer: Committer
        _metrics: Counter[str]
        _commit_supported: Callable[[], Awaitable[bool]]
        _to_revoke: Assignment
        _revoke_bounds: dict[TopicPartition, int]
        _commit_wanted: bool
        _delayed: set[TopicPartition]
        _growing: Assignment
        _parked: set[TopicPartition]
        _lost_last: set[TopicPartition]

        def wake(self) -> None: ...
        def _state_assignment(self) -> Assignment: ...
        def _set_state(self, ranges: Mapping[TopicPartition, Sequence[KeyRange]],
                       paused: Iterable[TopicPartition]) -> None: ...
        def _paused(self, ranges: Mapping[TopicPartition, Sequence[KeyRange]]) -> list[TopicPartition]: ...

    async def _commit(self) -> bool:
        """Commit what is marked (individual commit); False when it must wait for a later poll."""
        if not self._state.tracking:
            return True
        try:
            await self._committer.commit_processed(await self._commit_supported())
        except COMMIT_RETRY as exc:
            log.info("group %s: commit before a hand-off failed (%r); retrying on the next poll",
                     self.membership.group, exc)
            self._metrics["retriable_errors"] += 1
            return False
        return True

    async def _complete_revocations(self) -> None:
        tracking = self._state.tracking
        done = {tp: ranges for tp, ranges in self._to_revoke.items()
                if tp not in self._delayed and not (tracking and self.handed.busy(tp, ranges))}
        if tracking and done:
            # the application's own commits usually carry the marks already; else the
            # background task commits, and a later poll completes the revocation, so this
            # poll never waits for a commit
            acknowledged = {tp: ranges for tp, ranges in done.items() if self._acknowledged(tp)}
            if len(acknowledged) < len(done):
                self._commit_wanted = True
                self.wake()
            done = acknowledged
        if done:
            for tp in done:
                self._revoke_bounds.pop(tp, None)
            await self.listener.on_revoked(done)
            self._to_revoke = difference(self._to_revoke, done)
            self.membership.revoked(done)
            self._metrics["revocations"] += 1
            self.wake()
        grown = await self._grow()
        if not done and not grown and not self._growing and not self._parked:
            return
        current = self._state_assignment()
        rest = difference(current, {tp: r for tp, r in done.items() if tp not in self._growing})
        for tp in grown:
            rest[tp] = current[tp]
        # a placeholder whose growth was called off (a later assignment took the partition
        # elsewhere) goes once nothing of the partition is being revoked any more
        for tp in [tp for tp in self._parked if tp not in self._growing and tp not in self._to_revoke]:
            self._parked.discard(tp)
            rest.pop(tp, None)
        self.handed.forget(tp for tp in current if tp not in rest)
        self._set_state(rest, self._paused(rest))

    def _acknowledged(self, tp: TopicPartition) -> bool:
        """Whether every mark of ``tp`` up to the last record handed out before its
        revocation arrived is carried by an acknowledged commit."""
        progress = self._state.progress.get(tp)
        if progress is None or not progress.pending:
            return True
        first_pending = progress.pending.first(1)[0][0]
        return first_pending > self._revoke_bounds.get(tp, -1)

    async def _grow(self) -> list[TopicPartition]:
        """Growing partitions with no record out unmarked take on their new ranges: they
        start over at the group's (S, R), read now (their previous owners committed before
        handing them on), with this member's own marks held as done (even those a commit
        has not carried yet), so no commit waits and the ranges kept never pause. Without
        individual commit the partition is simply re-read from the group's offset."""
        ready = [tp for tp in self._growing if not self.handed.busy(tp, [])]
        if not ready:
            return []
        try:
            committed = await self._committer.committed_ranges(ready)
        except COMMIT_RETRY as exc:
            log.info("group %s: reading the committed offsets of grown ranges failed (%r); retrying on the next poll",
                     self.membership.group, exc)
            self._metrics["retriable_errors"] += 1
            return []
        for tp in ready:
            stable, ranges = committed[tp]
            self._state.grow(tp, self._growing.pop(tp), stable, ranges)
            self._parked.discard(tp)
        return ready

    # -- KIP-983 -------------------------------------------------------------------------
    def to_be_revoked(self) -> set[TopicPartition]:
        return set(self._to_revoke)

    def to_be_revoked_ranges(self) -> Assignment:
        return {tp: list(r) for tp, r in self._to_revoke.items()}

    def lost(self) -> set[TopicPartition]:
        return set(self._lost_last)

    def delay_revoke(self, partitions: Iterable[TopicPartition]) -> bool:
        partitions = set(partitions)
        if not partitions <= set(self._to_revoke):
            return False
        self._delayed |= partitions
        return True
