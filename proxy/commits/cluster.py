"""The brokers as individual commit needs them: requests from the proxy's own connections,
the group coordinator, and where ``__individual_commit_offsets`` lives.

``ClusterClient`` is a thin adapter over the proxy's ``BrokerPool`` and ``ClusterView``. What the
rest of ``proxy.commits`` asks of it:

* ``nodes``: node id -> (host, port), from the shared view;
* ``metadata(topics)``: partition counts, leaders and replicas (used for the log topic and
  ``__consumer_offsets``), auto-creation off;
* ``request(address, ...)`` / ``request_any(...)``: one request to a node / to any node;
* ``committed_offsets`` and ``commit_offsets``: OffsetFetch and OffsetCommit at the group
  coordinator (``find_coordinator``).

``LogTopic`` finds or creates the log topic (the partition count and replication factor
of ``__consumer_offsets``), knows each partition's leader, and reads a partition (one Fetch,
its end offset): the one reader of both internal logs, ``__individual_commit_offsets``
(``proxy.commits.log``) and ``__cooperative_fetch_grants`` (``proxy.coop.grant_log``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import trio

from proxy.net.broker_connection import BrokerConnectionError
from proxy.net.pool import BrokerPool, NoBrokerAnswered
from proxy.pipeline.cluster import ClusterView
from proxy.protocol.constants import ErrorCode
from proxy.protocol.errors import ProtocolError
from proxy.protocol.message_types import (
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    FetchRequest,
    FetchResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    MetadataRequest,
    MetadataResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from proxy.protocol.message_versions import FETCH_FIRST_TOPIC_ID
from proxy.protocol.messages import ApiKey
from proxy.records.batch import RecordBatch, iter_batches

log = logging.getLogger("proxy.commits.cluster")

LOG_TOPIC = "__individual_commit_offsets"
OFFSETS_TOPIC = "__consumer_offsets"

METADATA_VERSION = 12
CREATE_TOPICS_VERSION = 5
FIND_COORDINATOR_VERSION = 4
OFFSET_FETCH_VERSION = 8
OFFSET_COMMIT_VERSION = 9
LIST_GROUPS_VERSION = 4
DELETE_GROUPS_VERSION = 2
OFFSET_DELETE_VERSION = 0
FETCH_VERSION = 12
assert FETCH_VERSION < FETCH_FIRST_TOPIC_ID  # it names the log topic
LIST_OFFSETS_VERSION = 7

_LATEST = -1
_FETCH_BYTES = 8 << 20

_UNREACHABLE_BACKOFF = 30.0
_COORDINATORS_KEPT = 10_000  # groups whose coordinator address is remembered
_MOVED = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})

Address = tuple[str, int]
TopicPartitionKey = tuple[str, int]


class CommitLogError(Exception):
    """The log (or the coordinator) could not be read or written before the deadline."""


class ClusterClient:
    """The cluster as individual commit asks it: through the proxy's shared connection
    pool and cluster view (the metadata it reads feeds the view every feature uses)."""

    def __init__(self, pool: BrokerPool, view: ClusterView) -> None:
        self.pool = pool
        self.view = view
        self._coordinators: OrderedDict[str, Address] = OrderedDict()

    @property
    def nodes(self) -> dict[int, Address]:
        return self.view.nodes

    async def request(self, address: Address, api_key: int, version: int, body: object, *,
                      timeout: float | None = None) -> Any:
        """The response to ``body`` (a request of ``api_key``): the caller, who knows which, types it."""
        return await self.pool.request(address, api_key, version, body, timeout=timeout)

    async def request_any(self, api_key: int, version: int, body: object, *, timeout: float | None = None) -> Any:
        try:
            return await self.pool.request_any(api_key, version, body, timeout=timeout)
        except NoBrokerAnswered as exc:
            raise CommitLogError(str(exc)) from exc

    async def metadata(self, topics: list[str]) -> MetadataResponse:
        cls = MetadataRequest
        body = cls(topics=[cls.MetadataRequestTopic(name=t) for t in topics], allow_auto_topic_creation=False)
        response: MetadataResponse = await self.request_any(ApiKey.METADATA, METADATA_VERSION, body)
        self.view.learn_metadata(response)
        return response

    async def find_coordinator(self, group: str, *, remembered: bool = True) -> Address:
        """The address of ``group``'s coordinator: the one found before while requests to it
        succeed (``remembered``), else FindCoordinator's answer. A commit corrected after
        another instance's write, a committed-offsets read, each would otherwise ask first."""
        if remembered and (address := self._coordinators.get(group)) is not None:
            self._coordinators.move_to_end(group)
            return address
        body = FindCoordinatorRequest(key_type=0, coordinator_keys=[group])
        response: FindCoordinatorResponse = await self.request_any(ApiKey.FIND_COORDINATOR, FIND_COORDINATOR_VERSION,
                                                                   body)
        (entry,) = response.coordinators
        if entry.error_code != ErrorCode.NONE:
            raise CommitLogError(f"FindCoordinator({group}) error {ErrorCode.name_of(entry.error_code)}")
        address = self._coordinators[group] = (entry.host, entry.port)
        while len(self._coordinators) > _COORDINATORS_KEPT:
            self._coordinators.popitem(last=False)
        return address

    def coordinator_moved(self, group: str, codes: Iterable[int] | None = None) -> None:
        """Forget ``group``'s coordinator when a request to it failed (``codes`` None), or
        answered one of ``codes`` that says it moved (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE)."""
        if codes is None or not _MOVED.isdisjoint(codes):
            self._coordinators.pop(group, None)

    async def _at_coordinator(self, group: str, api_key: int, version: int, body: object) -> Any:
        address = await self.find_coordinator(group)
        try:
            return await self.request(address, api_key, version, body)
        except BaseException:
            self.coordinator_moved(group)
            raise

    async def committed_offsets(self, group: str, keys: list[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """The real coordinator's committed offsets (-1 for none)."""
        return {key: offset for key, (offset, _) in (await self.committed(group, keys)).items()}

    async def committed(self, group: str, keys: list[TopicPartitionKey]) -> dict[TopicPartitionKey, tuple[int, str | None]]:
        """The real coordinator's committed offsets (-1 for none) and their metadata."""
        if not keys:
            return {}
        cls = OffsetFetchRequest
        by_topic: dict[str, list[int]] = {}
        for topic, partition in keys:
            by_topic.setdefault(topic, []).append(partition)
        body = cls(
            groups=[cls.OffsetFetchRequestGroup(group_id=group, topics=[
                cls.OffsetFetchRequestTopics(name=topic, partition_indexes=parts) for topic, parts in by_topic.items()
            ])],
        )
        deadline = trio.current_time() + 30
        while True:
            try:
                response: OffsetFetchResponse = await self._at_coordinator(group, ApiKey.OFFSET_FETCH,
                                                                           OFFSET_FETCH_VERSION, body)
                (entry,) = response.groups
                if entry.error_code != ErrorCode.NONE:
                    self.coordinator_moved(group, [entry.error_code])
                    raise CommitLogError(f"OffsetFetch({group}) error {ErrorCode.name_of(entry.error_code)}")
                out: dict[TopicPartitionKey, tuple[int, str | None]] = {}
                for answered in entry.topics:
                    for part in answered.partitions:
                        out[(answered.name, part.partition_index)] = \
                            (part.committed_offset, part.metadata) if part.error_code == ErrorCode.NONE else (-1, None)
                return out
            except (CommitLogError, BrokerConnectionError, OSError, trio.TooSlowError) as exc:
                if trio.current_time() > deadline:
                    raise CommitLogError(f"cannot read the committed offsets of {group}: {exc}") from exc
                await trio.sleep(0.1)  # the coordinator is loading or moving: ask again shortly

    async def committed_groups(self, coordinator_of: str, groups: dict[str, list[TopicPartitionKey]], *,
                               require_stable: bool) -> dict[str, dict[TopicPartitionKey, tuple[int, str | None, int]]]:
        """The committed offsets, metadata and error code of several groups that share
        ``coordinator_of``'s coordinator (shadow groups of a transactional commit), in one
        OffsetFetch; with ``require_stable`` a key a transaction holds pending answers
        UNSTABLE_OFFSET_COMMIT. Raises CommitLogError when no coordinator answers in time."""
        asked = {group: keys for group, keys in groups.items() if keys}
        if not asked:
            return {}
        cls = OffsetFetchRequest
        request_groups = []
        for group, keys in asked.items():
            by_topic: dict[str, list[int]] = {}
            for topic, partition in keys:
                by_topic.setdefault(topic, []).append(partition)
            request_groups.append(cls.OffsetFetchRequestGroup(group_id=group, topics=[
                cls.OffsetFetchRequestTopics(name=topic, partition_indexes=parts) for topic, parts in by_topic.items()]))
        body = cls(groups=request_groups, require_stable=require_stable)
        deadline = trio.current_time() + 30
        while True:
            try:
                answer: OffsetFetchResponse = await self._at_coordinator(coordinator_of, ApiKey.OFFSET_FETCH,
                                                                         OFFSET_FETCH_VERSION, body)
                out: dict[str, dict[TopicPartitionKey, tuple[int, str | None, int]]] = {}
                for entry in answer.groups:
                    if entry.error_code != ErrorCode.NONE:
                        self.coordinator_moved(coordinator_of, [entry.error_code])
                        raise CommitLogError(f"OffsetFetch({entry.group_id}) error {ErrorCode.name_of(entry.error_code)}")
                    out[entry.group_id] = {(topic.name, part.partition_index): (
                        part.committed_offset, part.metadata, part.error_code)
                        for topic in entry.topics for part in topic.partitions}
                return out
            except (CommitLogError, BrokerConnectionError, OSError, trio.TooSlowError) as exc:
                if trio.current_time() > deadline:
                    raise CommitLogError(f"cannot read the committed offsets of {sorted(asked)}: {exc}") from exc
                await trio.sleep(0.1)  # the coordinator is loading or moving: ask again shortly

    async def commit_offsets(self, group: str, generation: int, member: str, instance_id: str | None,
                             offsets: dict[TopicPartitionKey, int] | dict[TopicPartitionKey, tuple[int, str]]) -> dict[TopicPartitionKey, int]:
        """A standard OffsetCommit from the proxy's own connection to the coordinator, with
        the generation and member of the client's commit (the broker checks them as for the
        client); the error code per key. An offset may come with its metadata. Raises
        CommitLogError when no coordinator answers."""
        cls = OffsetCommitRequest
        by_topic: dict[str, list[OffsetCommitRequest.OffsetCommitRequestPartition]] = {}
        for (topic, partition), value in offsets.items():
            offset, metadata = value if isinstance(value, tuple) else (value, "")
            by_topic.setdefault(topic, []).append(
                cls.OffsetCommitRequestPartition(partition_index=partition, committed_offset=offset,
                                                 committed_metadata=metadata))
        body = cls(group_id=group, generation_id_or_member_epoch=generation, member_id=member,
                   group_instance_id=instance_id,
                   topics=[cls.OffsetCommitRequestTopic(name=topic, partitions=parts) for topic, parts in by_topic.items()])
        try:
            response: OffsetCommitResponse = await self._at_coordinator(group, ApiKey.OFFSET_COMMIT,
                                                                        OFFSET_COMMIT_VERSION, body)
        except (BrokerConnectionError, OSError, trio.TooSlowError, ProtocolError) as exc:
            raise CommitLogError(f"OffsetCommit({group}) from the proxy failed: {exc}") from exc
        errors = {(topic.name, part.partition_index): part.error_code
                  for topic in response.topics for part in topic.partitions}
        self.coordinator_moved(group, errors.values())
        return errors


    async def read_partition(self, topic: str, partition: int, offset: int, max_bytes: int, *,
                             timeout: float | None = None) -> tuple[bytes, int]:
        """One Fetch (read_uncommitted, no wait) of ``topic``/``partition`` from ``offset``
        at its leader: the Records bytes (up to ``max_bytes``, a batch the broker cut short
        at the end) and the high watermark. Raises CommitLogError on the partition's error
        or when no leader answers."""
        cls = FetchRequest
        body = cls(
            max_wait_ms=0, min_bytes=1, max_bytes=max_bytes, isolation_level=0, session_id=0, session_epoch=-1,
            topics=[cls.FetchTopic(topic=topic, partitions=[
                cls.FetchPartition(partition=partition, fetch_offset=offset, partition_max_bytes=max_bytes)])],
        )
        leader = self.view.leader(topic, partition)
        try:
            if leader is None or leader not in self.nodes:
                await self.metadata([topic])
                leader = self.view.leader(topic, partition)
            if leader is None or leader not in self.nodes:
                raise CommitLogError(f"{topic}-{partition} has no leader")
            response: FetchResponse = await self.request(self.nodes[leader], ApiKey.FETCH, FETCH_VERSION, body,
                                                         timeout=timeout)
        except (BrokerConnectionError, OSError, trio.TooSlowError, ProtocolError) as exc:
            raise CommitLogError(f"Fetch {topic}-{partition} from the proxy failed: {exc}") from exc
        data = response.responses[0].partitions[0]
        if data.error_code != ErrorCode.NONE:
            raise CommitLogError(f"Fetch {topic}-{partition} at {offset} error {ErrorCode.name_of(data.error_code)}")
        return bytes(data.records or b""), data.high_watermark

    async def groups_beside(self, group: str) -> list[str]:
        """Every group ``group``'s coordinator holds (ListGroups at that broker): groups on
        its ``__consumer_offsets`` partition are among them."""
        try:
            response: ListGroupsResponse = await self._at_coordinator(group, ApiKey.LIST_GROUPS, LIST_GROUPS_VERSION,
                                                                      ListGroupsRequest())
        except (BrokerConnectionError, OSError, trio.TooSlowError, ProtocolError) as exc:
            raise CommitLogError(f"ListGroups at the coordinator of {group} failed: {exc}") from exc
        if response.error_code != ErrorCode.NONE:
            self.coordinator_moved(group, [response.error_code])
            raise CommitLogError(f"ListGroups at the coordinator of {group}: {ErrorCode.name_of(response.error_code)}")
        return [entry.group_id for entry in response.groups]

    async def delete_groups(self, coordinator_of: str, groups: list[str]) -> dict[str, int]:
        """DeleteGroups of ``groups`` (all on ``coordinator_of``'s coordinator); error per group."""
        if not groups:
            return {}
        try:
            response: DeleteGroupsResponse = await self._at_coordinator(
                coordinator_of, ApiKey.DELETE_GROUPS, DELETE_GROUPS_VERSION, DeleteGroupsRequest(groups_names=groups))
        except (BrokerConnectionError, OSError, trio.TooSlowError, ProtocolError) as exc:
            raise CommitLogError(f"DeleteGroups {groups} failed: {exc}") from exc
        errors = {result.group_id: result.error_code for result in response.results}
        self.coordinator_moved(coordinator_of, errors.values())
        return errors

    async def delete_offsets(self, group: str, keys: list[TopicPartitionKey]) -> int:
        """OffsetDelete of ``keys`` in ``group``; the request's error code."""
        cls = OffsetDeleteRequest
        by_topic: dict[str, list[int]] = {}
        for topic, partition in keys:
            by_topic.setdefault(topic, []).append(partition)
        body = cls(group_id=group, topics=[
            cls.OffsetDeleteRequestTopic(name=topic, partitions=[
                cls.OffsetDeleteRequestPartition(partition_index=p) for p in parts])
            for topic, parts in by_topic.items()])
        try:
            response: OffsetDeleteResponse = await self._at_coordinator(group, ApiKey.OFFSET_DELETE,
                                                                        OFFSET_DELETE_VERSION, body)
        except (BrokerConnectionError, OSError, trio.TooSlowError, ProtocolError) as exc:
            raise CommitLogError(f"OffsetDelete({group}) failed: {exc}") from exc
        self.coordinator_moved(group, [response.error_code])
        return response.error_code


@dataclass(frozen=True)
class LogRead:
    """One Fetch of a log partition from an offset: ``records`` at or above it as (offset,
    timestamp, key, value), keyless ones and control batches left out; ``after``, the
    position after the last batch read (None: none was, e.g. at the end or at an open
    transaction's boundary); ``high_watermark``; ``log_start``, set (and nothing read) when
    the offset lies below the log's start (compaction or retention moved it)."""

    records: list[tuple[int, int, memoryview, memoryview | None]] = field(default_factory=list)
    after: int | None = None
    high_watermark: int = -1
    log_start: int | None = None


class LogTopic:
    """``__individual_commit_offsets``: found, or created by the first proxy that writes
    (compacted, with the partition count and replication factor of ``__consumer_offsets``),
    the leader of each of its partitions, and reads of them."""

    def __init__(self, cluster: ClusterClient, *, segment_bytes: int, timeout: float, name: str = LOG_TOPIC,
                 configs: dict[str, str] | None = None) -> None:
        self.cluster = cluster
        self.name = name  # another compacted internal topic made the same way (cooperative grants)
        self.configs = configs or {}
        self.segment_bytes = segment_bytes
        self.timeout = timeout
        self.partitions: int | None = None  # once the topic exists with leaders
        self._leaders: dict[int, int] = {}
        self._lock = trio.Lock()
        self._unreachable_until = -1.0

    async def partition_count(self, create: bool) -> int | None:
        """The log's partition count; None if it does not exist and ``create`` is false."""
        if self.partitions is not None:
            return self.partitions
        if trio.current_time() < self._unreachable_until:
            raise CommitLogError("the brokers refused the proxy's own requests a moment ago")
        try:
            return await self._find(create)
        except CommitLogError:
            # E.g. a SASL listener refuses the proxy's unauthenticated requests: do not
            # try again on every request.
            self._unreachable_until = trio.current_time() + _UNREACHABLE_BACKOFF
            raise

    async def _find(self, create: bool) -> int | None:
        async with self._lock:
            deadline = trio.current_time() + self.timeout
            while self.partitions is None:
                response = await self.cluster.metadata([self.name, OFFSETS_TOPIC])
                topics = {t.name: t for t in response.topics}
                ours = topics.get(self.name)
                if ours is not None and ours.error_code == ErrorCode.NONE and ours.partitions and \
                        all(p.leader_id >= 0 for p in ours.partitions):
                    self.partitions = len(ours.partitions)
                    self._learn_leaders(ours)
                    break
                missing = ours is None or ours.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                if ours is not None and missing and not create:
                    return None
                offsets = topics.get(OFFSETS_TOPIC)
                if offsets is None or offsets.error_code != ErrorCode.NONE or not offsets.partitions:
                    # __consumer_offsets is created with the first FindCoordinator.
                    try:
                        await self.cluster.find_coordinator("keyrange-proxy", remembered=False)
                    except CommitLogError:
                        pass
                elif missing:
                    await self._create(len(offsets.partitions), len(offsets.partitions[0].replica_nodes))
                if trio.current_time() > deadline:
                    raise CommitLogError(f"{self.name} has no leaders yet")
                await trio.sleep(0.1)  # the topic is being created: its leaders appear shortly
            return self.partitions

    async def _create(self, partitions: int, replication: int) -> None:
        cls = CreateTopicsRequest
        body = cls(
            timeout_ms=30000,
            topics=[cls.CreatableTopic(name=self.name, num_partitions=partitions, replication_factor=replication,
                                       configs=[cls.CreatableTopicConfig(name=key, value=value) for key, value in {
                                           "cleanup.policy": "compact", "segment.bytes": str(self.segment_bytes),
                                           **self.configs}.items()])],
        )
        response: CreateTopicsResponse = await self.cluster.request_any(ApiKey.CREATE_TOPICS, CREATE_TOPICS_VERSION,
                                                                        body, timeout=40)
        (result,) = response.topics
        if result.error_code not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
            raise CommitLogError(f"CreateTopics {self.name}: error {ErrorCode.name_of(result.error_code)} "
                                 f"{result.error_message}")
        log.info("internal log topic=%s partitions=%s replication=%s result=%s", self.name, partitions,
                 replication, ErrorCode.name_of(result.error_code))

    def _learn_leaders(self, topic: MetadataResponse.MetadataResponseTopic) -> None:
        for p in topic.partitions:
            self._leaders[p.partition_index] = p.leader_id

    async def leader(self, index: int, refresh: bool = False) -> Address:
        """The address of the leader of log partition ``index`` (``refresh``: ask again,
        after a request to the one known failed)."""
        leader = self._leaders.get(index)
        if refresh or leader is None or leader not in self.cluster.nodes:
            response = await self.cluster.metadata([self.name])
            for topic in response.topics:
                if topic.name == self.name:
                    self._learn_leaders(topic)
            leader = self._leaders.get(index)
        if leader is None or leader not in self.cluster.nodes:
            raise CommitLogError(f"{self.name}-{index} has no leader")
        return self.cluster.nodes[leader]

    # -- reading a partition ----------------------------------------------------------------------
    async def read(self, address: Address, index: int, offset: int, *, wait_ms: int = 0,
                   timeout: float | None = None) -> LogRead:
        """One Fetch of partition ``index`` from ``offset`` at its leader ``address``,
        waiting up to ``wait_ms`` for a record (a follower's long poll; 0: answer at once).
        Raises ``CommitLogError`` on the partition's error."""
        cls = FetchRequest
        body = cls(
            max_wait_ms=wait_ms, min_bytes=1, max_bytes=_FETCH_BYTES,
            isolation_level=0, session_id=0, session_epoch=-1,
            topics=[cls.FetchTopic(topic=self.name, partitions=[
                cls.FetchPartition(partition=index, fetch_offset=offset, partition_max_bytes=_FETCH_BYTES)])],
        )
        response: FetchResponse = await self.cluster.request(address, ApiKey.FETCH, FETCH_VERSION, body,
                                                             timeout=timeout)
        data = response.responses[0].partitions[0]
        if data.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
            if data.log_start_offset <= offset:
                raise CommitLogError(f"Fetch {self.name}-{index} at {offset}: out of range")
            return LogRead(high_watermark=data.high_watermark, log_start=data.log_start_offset)
        if data.error_code != ErrorCode.NONE:
            raise CommitLogError(f"Fetch {self.name}-{index} error {ErrorCode.name_of(data.error_code)}")
        records: list[tuple[int, int, memoryview, memoryview | None]] = []
        after = None
        for entry in iter_batches(data.records or b""):
            if not isinstance(entry, RecordBatch) or entry.header.next_offset <= offset:
                continue
            if not entry.header.is_control:
                records.extend((record.offset, record.timestamp, record.key, record.value)
                               for record in entry.records() if record.offset >= offset and record.key is not None)
            after = entry.header.next_offset
        return LogRead(records, after, data.high_watermark)

    async def end_offset(self, address: Address, index: int, *, timeout: float | None = None) -> int:
        """The end (the next offset to be written) of partition ``index`` at its leader."""
        cls = ListOffsetsRequest
        body = cls(
            replica_id=-1, isolation_level=0,
            topics=[cls.ListOffsetsTopic(name=self.name, partitions=[
                cls.ListOffsetsPartition(partition_index=index, timestamp=_LATEST)])],
        )
        response: ListOffsetsResponse = await self.cluster.request(address, ApiKey.LIST_OFFSETS, LIST_OFFSETS_VERSION,
                                                                   body, timeout=timeout)
        entry = response.topics[0].partitions[0]
        if entry.error_code != ErrorCode.NONE:
            raise CommitLogError(f"ListOffsets {self.name}-{index} error {ErrorCode.name_of(entry.error_code)}")
        return entry.offset
