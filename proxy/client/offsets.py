"""Where each partition starts: the group's committed offset (OffsetFetch on start), else
a reset with ListOffsets per ``auto_offset_reset``, ``seek_to_beginning`` or
``seek_to_end``, or after OFFSET_OUT_OF_RANGE.

``list_offsets_request`` and ``apply_list_offsets`` are sans I/O; ``OffsetResolver``
sends the requests, to each partition's leader.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from proxy.client.assignment import EARLIEST_TIMESTAMP, AssignmentState, PendingReset, reset_timestamp
from proxy.client.committer import Committer
from proxy.client.connection import Connections
from proxy.client.errors import METADATA_REFRESH_CODES, KafkaError
from proxy.client.metadata import ClusterMetadata
from proxy.client.progress import PartitionProgress
from proxy.client.records import TopicPartition
from proxy.protocol.constants import ErrorCode
from proxy.protocol.message_types import ListOffsetsRequest, ListOffsetsResponse
from proxy.protocol.messages import ApiKey

CONSUMER_REPLICA_ID = -1


@dataclass(frozen=True)
class OffsetQuery:
    """One partition of a ListOffsets request."""

    tp: TopicPartition
    leader_epoch: int
    timestamp: int


def list_offsets_request(version: int, queries: Sequence[OffsetQuery], *, isolation_level: int,
                         timeout_ms: int) -> ListOffsetsRequest:
    cls = ListOffsetsRequest
    topics: dict[str, list[ListOffsetsRequest.ListOffsetsPartition]] = {}
    for q in queries:
        topics.setdefault(q.tp.topic, []).append(cls.ListOffsetsPartition(
            partition_index=q.tp.partition, current_leader_epoch=q.leader_epoch, timestamp=q.timestamp))
    return cls(
        replica_id=CONSUMER_REPLICA_ID, isolation_level=isolation_level,
        timeout_ms=timeout_ms,
        topics=[cls.ListOffsetsTopic(name=name, partitions=parts) for name, parts in topics.items()])


def apply_list_offsets(state: AssignmentState, response: ListOffsetsResponse, metrics: Counter[str],
                       log_starts: Mapping[TopicPartition, int] | None = None) -> bool:
    """Resolve the pending resets a ListOffsets response answers (``log_starts``: the log
    start offsets of the partitions ``AssignmentState.needs_log_start`` names). True when
    one hit a leader change (refresh metadata and retry); raises other partition errors."""
    refresh = False
    for tp, offset in _answers(response, metrics):
        if tp not in state or isinstance(state.positions.get(tp), int):
            continue  # unassigned or sought meanwhile
        if offset is None:
            refresh = True
        else:
            state.reset_to(tp, offset, (log_starts or {}).get(tp))
            metrics["offset_resets"] += 1
    return refresh


def _answers(response: ListOffsetsResponse, metrics: Counter[str]) -> Iterator[tuple[TopicPartition, int | None]]:
    """Each partition's offset from a ListOffsets response; None for a leader change."""
    for topic in response.topics:
        for part in topic.partitions:
            tp = TopicPartition(topic.name, part.partition_index)
            if part.error_code in METADATA_REFRESH_CODES:
                metrics["retriable_errors"] += 1
                yield tp, None
            elif part.error_code != ErrorCode.NONE:
                raise KafkaError.for_code(part.error_code, f"ListOffsets {tp.topic}-{tp.partition}")
            else:
                yield tp, part.offset


class OffsetResolver:
    """Gives every assigned partition a position before it is fetched."""

    def __init__(self, state: AssignmentState, metadata: ClusterMetadata, connections: Connections,
                 committer: Committer | None, *, auto_offset_reset: str, isolation_level: int,
                 timeout_ms: int, metrics: Counter[str]) -> None:
        self._state = state
        self._metadata = metadata
        self._connections = connections
        self._committer = committer
        self._policy = auto_offset_reset
        self._isolation_level = isolation_level
        self._timeout_ms = timeout_ms
        self._metrics = metrics

    def reset_timestamp(self, tp: TopicPartition) -> int:
        """The timestamp a partition's reset asks for: its pending reset's, else the
        policy's (raises under "none")."""
        pending = self._state.positions.get(tp)
        if isinstance(pending, PendingReset):
            return pending.timestamp
        return reset_timestamp(self._policy, tp)

    async def resolve(self) -> bool:
        """Start partitions from the group's state (with a group), then resolve resets.
        True when something is still missing (the caller backs off)."""
        state = self._state
        committer = self._committer
        wanted = state.wants_group_offsets()
        if wanted and committer is not None:
            for tp, (offset, ranges) in (await committer.committed_ranges(wanted)).items():
                if state.positions.get(tp) is None:
                    state.positions[tp] = (offset if offset is not None
                                           else PendingReset(reset_timestamp(self._policy, tp)))
                if state.tracking and tp not in state.progress:
                    state.progress[tp] = PartitionProgress(offset, ranges)
        pending = state.pending_resets()
        if not pending:
            return False
        return await self._reset(pending)

    async def _reset(self, pending: list[TopicPartition]) -> bool:
        # A key-range member resetting past the log start needs the log start too
        # (AssignmentState.reset_to): asked first, in a request of its own, since one
        # ListOffsets request cannot name a partition twice.
        timestamps = {tp: self.reset_timestamp(tp) for tp in pending}  # raises first under "none"
        starts_wanted = [tp for tp in pending
                         if self._state.needs_log_start(tp) and timestamps[tp] != EARLIEST_TIMESTAMP]
        log_starts: dict[TopicPartition, int] = {}
        retry = False
        if starts_wanted:
            retry, responses = await self._list_offsets({tp: EARLIEST_TIMESTAMP for tp in starts_wanted})
            for response in responses:
                for tp, offset in _answers(response, self._metrics):
                    if offset is not None:
                        log_starts[tp] = offset
            timestamps = {tp: ts for tp, ts in timestamps.items() if tp not in starts_wanted or tp in log_starts}
        again, responses = await self._list_offsets(timestamps)
        for response in responses:
            for tp, offset in _answers(response, Counter()):  # an earliest reset's answer is its log start
                if offset is not None and timestamps.get(tp) == EARLIEST_TIMESTAMP and self._state.needs_log_start(tp):
                    log_starts[tp] = offset
            if apply_list_offsets(self._state, response, self._metrics, log_starts):
                self._metadata.stale = again = True
        return retry or again

    async def _list_offsets(self, timestamps: Mapping[TopicPartition, int]
                            ) -> tuple[bool, list[ListOffsetsResponse]]:
        """One ListOffsets request per leader: (no partition had a leader, the responses).
        Partitions without a leader stay pending for a later poll."""
        by_leader: dict[int, list[OffsetQuery]] = {}
        for tp, timestamp in timestamps.items():
            leader = self._metadata.leader(tp)
            if leader is None:
                continue
            by_leader.setdefault(leader.leader, []).append(OffsetQuery(tp, leader.leader_epoch, timestamp))
        responses: list[ListOffsetsResponse] = []
        for node_id, queries in by_leader.items():
            connection = await self._connections.node(node_id, self._metadata.nodes[node_id])
            version = connection.versions[ApiKey.LIST_OFFSETS]
            body = list_offsets_request(version, queries, isolation_level=self._isolation_level,
                                        timeout_ms=self._timeout_ms)
            responses.append(await self._connections.request(connection, ApiKey.LIST_OFFSETS, version, body))
        return not by_leader, responses
