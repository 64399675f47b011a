"""Committing offsets for the consumer's group, and reading them back.

Three ways to commit, one lock so that they never interleave:

* plain: an offset per whole partition (every record below it is processed);
* range (``individual.commit`` advertised): the offsets marked processed, as OffsetRanges,
  at most ``individual_commit_max_ranges`` per partition and request, lowest first;
* contiguous (no ``individual.commit``): the processed prefix of each whole partition, as
  a plain commit (never for a partition with key ranges or fetched cooperatively: its
  members' offsets interleave).

A partition's pending offsets leave its ``PartitionProgress`` only once a commit carrying
them is acknowledged, so a failed commit loses nothing and may be retried.

A range commit the proxy refuses with INVALID_COMMIT_OFFSET_SIZE would leave the group's
state of the partition holding more ranges than its ``max.individual.commit.ranges.held``:
the partition's other shares lag, and its gaps must close first. Like the per-request
limit, it is met by sending fewer ranges: the partition's next request in the same
``commit`` carries half as many of its lowest pending ranges, down to one (the lowest
close gaps or move S, and those always pass); once part is accepted, or even one range
is refused, the rest waits for a later ``commit``. It is not an error of this consumer:
``commit`` does not raise for it, the ranges stay pending (``Consumer.pending_commit``), and
``metrics()["range_commits_deferred"]`` counts the partitions left so.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence

import trio

from proxy.client.assignment import AssignmentState
from proxy.client.commit_protocol import (
    SIMPLE_GROUP,
    CommitEntry,
    MemberIdentity,
    OffsetRange,
    accepted_partitions,
    commit_errors,
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
from proxy.protocol.constants import ErrorCode
from proxy.protocol.message_types import OffsetCommitResponse, OffsetFetchResponse
from proxy.protocol.messages import ApiKey

log = logging.getLogger(__name__)

# The proxy's refusal of a range commit that would pass the state's bound (module docstring).
_STATE_FULL = frozenset({ErrorCode.INVALID_COMMIT_OFFSET_SIZE})


class Committer:
    def __init__(self, coordinator: Coordinator, state: AssignmentState, metadata: ClusterMetadata, *,
                 max_ranges: int, metrics: Counter[str]) -> None:
        self._coordinator = coordinator
        self._state = state
        self._metadata = metadata
        self._max_ranges = max_ranges
        self._metrics = metrics
        self._lock = trio.Lock()
        # partitions whose last range commit the state's bound deferred (logged once a spell)
        self._deferred: set[TopicPartition] = set()
        # who commits: a simple group until group membership sets its generation and id
        self.member: MemberIdentity = SIMPLE_GROUP

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
        # Each round sends the lowest `limit` pending ranges of every partition (fewer where
        # the state's bound refused it: `narrowed`); bounded by the largest pending set (an
        # acknowledged round always removes what it sent) and by the halvings. A partition
        # whose round carried all it had pending is done: offsets marked while the request
        # was out go with the next commit, not with more rounds of this one (a consumer that
        # keeps processing meanwhile would make each commit a stream of small ones).
        rounds = max((len(p.pending) for p in state.progress.values()), default=0) // limit + 2 + limit.bit_length()
        narrowed: dict[TopicPartition, int] = {}
        done: set[TopicPartition] = set()  # nothing more of these in this commit
        for _ in range(rounds):
            sent: dict[TopicPartition, list[OffsetRange]] = {
                tp: progress.to_commit(narrowed.get(tp, limit)) for tp, progress in state.progress.items()
                if tp in state and progress.pending and tp not in done}
            if not sent:
                break
            response = await self._request(sent)
            for tp, part in accepted_partitions(response, sent).items():
                progress = state.progress.get(tp)
                if progress is not None:
                    progress.acknowledged(sent[tp], part.stable_offset)
                    self._metrics["range_commits"] += 1
                if tp in narrowed or len(sent[tp]) < limit:
                    done.add(tp)  # what the bound lets through now, or all it had: the rest waits
            for tp, code in commit_errors(response).items():
                if code in _STATE_FULL and tp in sent:
                    if len(sent[tp]) > 1:
                        narrowed[tp] = len(sent[tp]) // 2
                    else:
                        narrowed[tp] = 1
                        done.add(tp)
            failed = first_commit_error(response, self.group, ignore=_STATE_FULL)
            if failed is not None:
                raise failed
        self._note_deferred({tp for tp in narrowed if tp in state.progress and state.progress[tp].pending})

    def _note_deferred(self, deferred: set[TopicPartition]) -> None:
        """Count the partitions whose ranges the state's bound left pending, and log when
        one starts being deferred and when it is not any more."""
        self._metrics["range_commits_deferred"] += len(deferred)
        for tp in sorted(deferred - self._deferred):
            pending = self._state.progress[tp].pending
            log.warning("consumer: %s-%s: the proxy refused part of the range commit with INVALID_COMMIT_OFFSET_SIZE "
                        "(the group's state of the partition is at max.individual.commit.ranges.held: other shares "
                        "lag); %d ranges stay pending and go with a later commit", tp.topic, tp.partition,
                        len(pending))
        for tp in sorted(self._deferred - deferred):
            log.info("consumer: %s-%s: range commits are accepted whole again", tp.topic, tp.partition)
        self._deferred = deferred

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
                    ) -> tuple[dict[TopicPartition, OffsetCommitResponse.OffsetCommitResponsePartition], KafkaError | None]:
        """One OffsetCommit; the accepted partitions' responses and the first error."""
        response = await self._request(entries)
        return accepted_partitions(response, entries), first_commit_error(response, self.group)

    async def _request(self, entries: Mapping[TopicPartition, CommitEntry]) -> OffsetCommitResponse:
        """One OffsetCommit of ``entries``; its response."""
        epochs = {}
        for tp in entries:
            leader = self._metadata.leader(tp)
            if leader is not None:
                epochs[tp] = leader.leader_epoch
        member = self.member
        return await self._coordinator.request(
            ApiKey.OFFSET_COMMIT, lambda version: offset_commit_request(version, self.group, entries, epochs, member))

    async def committed_ranges(self, partitions: Sequence[TopicPartition]
                               ) -> dict[TopicPartition, tuple[int | None, list[OffsetRange]]]:
        """The group's (S, R) of each partition, read with OffsetFetch."""
        if not partitions:
            return {}
        response: OffsetFetchResponse = await self._coordinator.request(
            ApiKey.OFFSET_FETCH, lambda version: offset_fetch_request(version, self.group, partitions))
        return committed_state(response, partitions, self.group)
