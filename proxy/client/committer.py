"""Committing offsets for the consumer's group, and reading them back.

Three ways to commit, one lock so that they never interleave:

* plain: an offset per whole partition (every record below it is processed);
* range (``individual.commit`` advertised): the offsets marked processed, as OffsetRanges,
  at most ``individual_commit_max_ranges`` per partition and request;
* contiguous (no ``individual.commit``): the processed prefix of each whole partition, as
  a plain commit (never for a partition with key ranges or fetched cooperatively: its
  members' offsets interleave).

A partition's pending offsets leave its ``PartitionProgress`` only once a commit carrying
them is acknowledged, so a failed commit loses nothing and may be retried.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import trio

from proxy.client.assignment import AssignmentState
from proxy.client.commit_protocol import (
    SIMPLE_GROUP,
    CommitEntry,
    GroupMember,
    Range,
    accepted_partitions,
    committed_state,
    first_commit_error,
    offset_commit_request,
    offset_fetch_request,
)
from proxy.client.connection import INDIVIDUAL_COMMIT_FEATURE
from proxy.client.coordinator import Coordinator
from proxy.client.errors import IllegalStateError, KafkaError
from proxy.client.metadata import ClusterMetadata
from proxy.client.records import TopicPartition
from proxy.protocol.messages import ApiKey


class Committer:
    def __init__(self, coordinator: Coordinator, state: AssignmentState, metadata: ClusterMetadata, *,
                 max_ranges: int, metrics: Counter[str]) -> None:
        self._coordinator = coordinator
        self._state = state
        self._metadata = metadata
        self._max_ranges = max_ranges
        self._metrics = metrics
        self._lock = trio.Lock()
        # who commits: a simple group until group membership sets its generation and id
        self.member: GroupMember = SIMPLE_GROUP

    @property
    def group(self) -> str:
        return self._coordinator.group

    async def commit_offsets(self, offsets: Mapping[TopicPartition, int]) -> None:
        """A plain commit of checked ``offsets``; a tracked partition's S follows."""
        async with self._lock:
            accepted, failed = await self._send(offsets)
            for tp in accepted:
                progress = self._state.progress.get(tp)
                if progress is not None:
                    progress.acknowledged_plain(offsets[tp])
        if failed is not None:
            raise failed

    async def commit_processed(self, ranges_supported: bool) -> None:
        """Commit what was marked processed: as ranges where the proxy advertises
        ``individual.commit``, else as the contiguous prefix."""
        async with self._lock:
            if ranges_supported:
                await self._commit_ranges()
            else:
                await self._commit_contiguous()

    async def _commit_ranges(self) -> None:
        state = self._state
        limit = self._max_ranges
        # each round sends the lowest `limit` pending ranges of every partition; bounded by
        # the largest pending set (an acknowledged round always removes what it sent)
        rounds = max((len(p.pending) for p in state.progress.values()), default=0) // limit + 1
        for _ in range(rounds):
            sent: dict[TopicPartition, list[Range]] = {
                tp: progress.to_commit(limit) for tp, progress in state.progress.items()
                if tp in state and progress.pending}
            if not sent:
                return
            accepted, failed = await self._send(sent)
            for tp, part in accepted.items():
                progress = state.progress.get(tp)
                if progress is not None:
                    progress.acknowledged(sent[tp], part.stable_offset)
                    self._metrics["range_commits"] += 1
            if failed is not None:
                raise failed

    async def _commit_contiguous(self) -> None:
        state = self._state
        ranged = [tp for tp, progress in state.progress.items() if state.ranges.get(tp) and progress.pending]
        if ranged:
            raise IllegalStateError(
                f"the cluster does not advertise {INDIVIDUAL_COMMIT_FEATURE}, and "
                f"{', '.join(f'{tp.topic}-{tp.partition}' for tp in ranged)} is assigned key ranges: a plain "
                f"committed offset would cover the other ranges' records too")
        shared = [tp for tp, progress in state.progress.items() if tp in state.cooperative and progress.pending]
        if shared:
            raise IllegalStateError(
                f"the cluster does not advertise {INDIVIDUAL_COMMIT_FEATURE}, and "
                f"{', '.join(f'{tp.topic}-{tp.partition}' for tp in shared)} is fetched cooperatively: a plain "
                f"committed offset would cover the chunks other members are processing too")
        offsets: dict[TopicPartition, int] = {}
        for tp, progress in state.progress.items():
            offset = progress.contiguous() if tp in state else None
            if offset is not None:
                offsets[tp] = offset
        if not offsets:
            return
        accepted, failed = await self._send(offsets)
        for tp in accepted:
            state.progress[tp].acknowledged_plain(offsets[tp])
            self._metrics["plain_commits"] += 1
        if failed is not None:
            raise failed

    async def _send(self, entries: Mapping[TopicPartition, CommitEntry]
                    ) -> tuple[dict[TopicPartition, Any], KafkaError | None]:
        """One OffsetCommit; the accepted partitions' responses and the first error."""
        epochs = {}
        for tp in entries:
            leader = self._metadata.leader(tp)
            if leader is not None:
                epochs[tp] = leader.leader_epoch
        member = self.member
        response = await self._coordinator.request(
            ApiKey.OFFSET_COMMIT, lambda version: offset_commit_request(version, self.group, entries, epochs, member))
        return accepted_partitions(response, entries), first_commit_error(response, self.group)

    async def committed_ranges(self, partitions: Sequence[TopicPartition]
                               ) -> dict[TopicPartition, tuple[int | None, list[Range]]]:
        """The group's (S, R) of each partition, read with OffsetFetch."""
        if not partitions:
            return {}
        response = await self._coordinator.request(
            ApiKey.OFFSET_FETCH, lambda version: offset_fetch_request(version, self.group, partitions))
        return committed_state(response, partitions, self.group)
