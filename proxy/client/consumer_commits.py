"""The committed-offset side of ``proxy.client.Consumer``: ``commit`` (offsets, or what was
marked), ``mark_processed``, ``pending_commit``, ``commit_processed``, ``committed`` and
``committed_ranges``.

A part of the consumer's public API, kept in a class of its own so that the consumer reads
by concern; ``Consumer`` inherits it. The work is the ``Committer``'s
(``proxy.client.committer``); these methods check what the application asked against the
consumer's assignment and group state, and turn a commit that raced a rebalance into the
retriable error an application expects.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from proxy.client.commit_protocol import OffsetRange
from proxy.client.errors import (
    CommitFailedError,
    IllegalGenerationError,
    IllegalStateError,
    RebalanceInProgressError,
    UnknownMemberIdError,
)
from proxy.client.records import ConsumerRecord, TopicPartition

if TYPE_CHECKING:
    from proxy.client.assignment import AssignmentState
    from proxy.client.committer import Committer
    from proxy.client.config import ConsumerConfig
    from proxy.client.connection import NodeConnection
    from proxy.client.group import GroupMember


class ConsumerCommits:
    """The consumer's committed-offset methods (see the module's docstring)."""

    if TYPE_CHECKING:  # the consumer's, which these methods use
        config: ConsumerConfig
        _state: AssignmentState
        _group: GroupMember | None
        _subscribed: bool

        def _require_started(self) -> None: ...
        def _require_group(self) -> Committer: ...
        def _require_assigned(self, tp: TopicPartition) -> None: ...
        async def _any_connection(self) -> NodeConnection: ...

    async def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """Commit ``offsets`` (default: the position of every assigned partition) for
        ``group_id`` with OffsetCommit v8+: as a simple group (generation -1, no member id)
        with ``assign``, as the group's member (generation and member id) after ``subscribe``.
        A committed offset means every record below it is processed, so a partition
        assigned key ranges is refused: its position says nothing about the other ranges.

        With ``allow_individual_commit`` and no ``offsets``, commits what ``mark_processed``
        marked instead (see ``commit_processed``)."""
        self._require_started()
        committer = self._require_group()
        if offsets is None and self._state.tracking:
            await self.commit_processed()
            return
        if offsets is None:
            positions = {tp: self._state.position(tp) for tp in self._state.partitions()}
            offsets = {tp: position for tp, position in positions.items() if position is not None}
        offsets = dict(offsets)
        for tp, offset in offsets.items():
            self._require_assigned(tp)
            if self._state.ranges[tp]:
                raise IllegalStateError(
                    f"{tp[0]}-{tp[1]} is assigned key ranges: a plain committed offset covers every key of the "
                    f"partition, so a range member cannot commit its own position")
            if tp in self._state.cooperative:
                raise IllegalStateError(
                    f"{tp[0]}-{tp[1]} is fetched cooperatively: a plain committed offset would cover the chunks "
                    f"other members are processing (mark_processed, then commit() without offsets)")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise ValueError(f"{tp[0]}-{tp[1]}: offset must be a non-negative int, got {offset!r}")
        if offsets:
            with self._generation_races():
                await committer.commit_offsets(offsets)

    def mark_processed(self, *records: ConsumerRecord) -> None:
        """Mark records processed, in any order; the next ``commit`` carries them. Needs
        ``allow_individual_commit``."""
        self._require_started()
        if not self._state.tracking:
            raise IllegalStateError("mark_processed needs allow_individual_commit=True (and a group_id)")
        # Records of one partition mostly come together: its checks are made once per run.
        group = self._group if self._subscribed else None  # only a member tracks what it handed out
        tp = progress = None
        for record in records:
            if tp is None or record.partition != tp.partition or record.topic != tp.topic:
                tp = TopicPartition(record.topic, record.partition)
                self._require_assigned(tp)
                progress = self._state.progress.get(tp)
            if progress is None:
                raise IllegalStateError(f"{tp.topic}-{tp.partition} offset {record.offset} was not handed out by "
                                        f"this consumer's poll")
            progress.mark(record.offset)
            if group is not None:
                group.marked(tp, record.offset)

    def pending_commit(self, tp: TopicPartition) -> list[OffsetRange]:
        """Offset ranges of ``tp`` marked processed (or amended gaps) that no acknowledged
        commit has carried yet."""
        self._require_assigned(tp)
        progress = self._state.progress.get(tp)
        return list(progress.pending) if progress else []

    async def commit_processed(self) -> None:
        """Send every range marked so far with OffsetCommit v8+ (``individual.commit``), as
        many requests as ``individual_commit_max_ranges`` needs (ranges marked while they
        are out go with the next call); a range leaves the pending set only once
        acknowledged, so a failed commit loses nothing and may simply be retried.
        Without the feature, whole partitions fall back to a plain commit of the contiguous
        processed prefix; a partition assigned key ranges cannot and raises."""
        self._require_started()
        committer = self._require_group()
        if not self._state.tracking:
            raise IllegalStateError("commit_processed needs allow_individual_commit=True")
        with self._generation_races():
            await committer.commit_processed((await self._any_connection()).commits_ranges)

    @contextmanager
    def _generation_races(self) -> Iterator[None]:
        """A group member's commit that races a rebalance (the coordinator moved to the next
        generation before this member heard of it) fails with ILLEGAL_GENERATION: raised as
        the retriable ``RebalanceInProgressError``, since nothing was lost (the marks stay
        pending). A member really fenced learns it from its heartbeat and drops them.
        A member that left for want of a poll gets ``CommitFailedError`` (as Java does)."""
        if self._group is not None and self._subscribed and self._group.poll_expired:
            raise CommitFailedError(
                f"the member left group {self.config.group_id!r}: no poll within max_poll_interval_ms="
                f"{self.config.max_poll_interval_ms}; its partitions may be processed by others now, so nothing "
                f"is committed (the next poll rejoins)")
        try:
            yield
        except (IllegalGenerationError, UnknownMemberIdError) as exc:
            if self._group is None or not self._subscribed:
                raise
            raise RebalanceInProgressError(f"commit raced a rebalance ({exc})") from exc

    async def committed(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The group's committed offset of each partition (None where nothing is committed),
        read with OffsetFetch v8+."""
        return {tp: stable for tp, (stable, _) in (await self.committed_ranges(partitions)).items()}

    async def committed_ranges(self, partitions: Sequence[TopicPartition]
                               ) -> dict[TopicPartition, tuple[int | None, list[OffsetRange]]]:
        """The group's state of each partition: (S, R), the committed (stable) offset (None
        where nothing is committed) and the ranges processed above it (empty unless the
        proxy holds individual commits), read with OffsetFetch v8+."""
        self._require_started()
        committer = self._require_group()
        return await committer.committed_ranges([TopicPartition(*tp) for tp in partitions])
