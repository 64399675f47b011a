"""Where each partition starts: the group's committed offset (OffsetFetch on start), else
a reset with ListOffsets per ``auto_offset_reset``, ``seek_to_beginning`` or
``seek_to_end``, or after OFFSET_OUT_OF_RANGE.

``list_offsets_request`` and ``apply_list_offsets`` are sans I/O; ``OffsetResolver``
sends the requests, to each partition's leader.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.client.assignment import AssignmentState, PendingReset, reset_timestamp
from proxy.client.committer import Committer
from proxy.client.connection import Connections
from proxy.client.errors import METADATA_REFRESH_CODES, KafkaError
from proxy.client.metadata import ClusterMetadata
from proxy.client.progress import PartitionProgress
from proxy.client.records import TopicPartition
from proxy.protocol import messages
from proxy.protocol.constants import ErrorCode
from proxy.protocol.messages import ApiKey

CONSUMER_REPLICA_ID = -1


@dataclass(frozen=True)
class OffsetQuery:
    """One partition of a ListOffsets request."""

    tp: TopicPartition
    leader_epoch: int
    timestamp: int


def list_offsets_request(version: int, queries: Sequence[OffsetQuery], *, isolation_level: int,
                         timeout_ms: int) -> Any:
    cls: Any = messages.body_class(ApiKey.LIST_OFFSETS, "request")
    topics: dict[str, list[Any]] = {}
    for q in queries:
        topics.setdefault(q.tp.topic, []).append(cls.ListOffsetsPartition(
            partition_index=q.tp.partition, current_leader_epoch=q.leader_epoch, timestamp=q.timestamp))
    return messages.new_body(
        ApiKey.LIST_OFFSETS, version, "request", replica_id=CONSUMER_REPLICA_ID, isolation_level=isolation_level,
        timeout_ms=timeout_ms,
        topics=[cls.ListOffsetsTopic(name=name, partitions=parts) for name, parts in topics.items()])


def apply_list_offsets(state: AssignmentState, response: Any, metrics: Counter[str]) -> bool:
    """Resolve the pending resets a ListOffsets response answers. True when one hit a
    leader change (refresh metadata and retry); raises other partition errors."""
    refresh = False
    for topic in response.topics:
        for part in topic.partitions:
            tp = TopicPartition(topic.name, part.partition_index)
            if tp not in state or isinstance(state.positions.get(tp), int):
                continue  # unassigned or sought meanwhile
            if part.error_code in METADATA_REFRESH_CODES:
                metrics["retriable_errors"] += 1
                refresh = True
            elif part.error_code != ErrorCode.NONE:
                raise KafkaError.for_code(part.error_code, f"ListOffsets {tp.topic}-{tp.partition}")
            else:
                state.reset_to(tp, part.offset)
                metrics["offset_resets"] += 1
    return refresh


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
        by_leader: dict[int, list[OffsetQuery]] = {}
        for tp in pending:
            timestamp = self.reset_timestamp(tp)  # raises first under "none"
            leader = self._metadata.leader(tp)
            if leader is None:
                continue
            by_leader.setdefault(leader.leader, []).append(OffsetQuery(tp, leader.leader_epoch, timestamp))
        retry = not by_leader
        for node_id, queries in by_leader.items():
            connection = await self._connections.node(node_id, self._metadata.nodes[node_id])
            version = connection.versions[ApiKey.LIST_OFFSETS]
            body = list_offsets_request(version, queries, isolation_level=self._isolation_level,
                                        timeout_ms=self._timeout_ms)
            response = await self._connections.request(connection, ApiKey.LIST_OFFSETS, version, body)
            if apply_list_offsets(self._state, response, self._metrics):
                self._metadata.stale = retry = True
        return retry
