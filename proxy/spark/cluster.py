"""The few Kafka requests the ``keyrange`` source makes, over trio (the source's IO edge).

The driver asks for metadata, offsets and commits; each task fetches its share. Both run
inside ``trio.run`` of their own: Spark calls the source from plain threads and processes.
Requests go to the proxy (``kafka.bootstrap.servers``) over ``BrokerConnection``, one
connection per node, versions chosen from ApiVersions. Errors a leader move or a restart
causes are retried after a metadata refresh until the request timeout; everything else
raises ``SourceReadError`` with Kafka's error name.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import trio

from proxy.net.broker_connection import BrokerConnection, BrokerConnectionError
from proxy.protocol import messages
from proxy.protocol.constants import INDIVIDUAL_COMMIT_FEATURE, KEY_RANGE_FETCH_FEATURE, ErrorCode
from proxy.protocol.errors import ProtocolError
from proxy.protocol.message_types import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FetchRequest,
    FetchResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    MetadataRequest,
    MetadataResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
)
from proxy.protocol.message_versions import (
    API_VERSIONS_FIRST_SUPPORTED_FEATURES,
    FETCH_FIRST_FLEXIBLE,
    FETCH_FIRST_TOPIC_ID,
)
from proxy.protocol.messages import ApiKey
from proxy.ranges import KeyRange
from proxy.spark.options import KeyRangeSourceError, parse_bootstrap

R = TypeVar("R")
RANGE_FETCH_FEATURE = KEY_RANGE_FETCH_FEATURE
FETCH_VERSION = FETCH_FIRST_FLEXIBLE  # the first with tagged fields (tag 10000 key ranges); it still names topics
assert FETCH_VERSION < FETCH_FIRST_TOPIC_ID
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
# (lowest we speak, highest we ask for)
_VERSIONS = {
    ApiKey.METADATA: (4, 12),
    ApiKey.LIST_OFFSETS: (2, 9),
    ApiKey.FETCH: (FETCH_VERSION, FETCH_VERSION),
    ApiKey.FIND_COORDINATOR: (4, 4),
    ApiKey.OFFSET_COMMIT: (8, 9),
}
RETRIABLE = frozenset({
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.REQUEST_TIMED_OUT, ErrorCode.REPLICA_NOT_AVAILABLE, ErrorCode.NETWORK_EXCEPTION,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.OFFSET_NOT_AVAILABLE, ErrorCode.UNKNOWN_TOPIC_ID,
})
NETWORK_ERRORS = (BrokerConnectionError, OSError, trio.TooSlowError, ProtocolError)


class SourceReadError(RuntimeError):
    """Kafka (through the proxy) refused or failed a request of the ``keyrange`` source."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message if code is None else f"{message}: {ErrorCode.name_of(code)} ({code})")
        self.code = code


class Retry(Exception):
    """A retriable failure; the caller refreshes metadata and tries again."""


_CONNECT_BACKOFF_MIN = 0.05  # seconds between rounds over the bootstrap servers, doubling
_CONNECT_BACKOFF_MAX = 1.0


@dataclass
class Node:
    conn: BrokerConnection
    versions: dict[int, int]
    features: frozenset[str]


@dataclass
class ProxyNodes:
    """Connections to the proxy's nodes. Use ``async with await ProxyNodes.connect(...)``."""

    bootstrap: str
    timeout: float
    client_id: str
    seed: Node
    nodes: dict[int, tuple[str, int]] = field(default_factory=dict)
    leaders: dict[tuple[str, int], int] = field(default_factory=dict)
    partitions: dict[str, list[int]] = field(default_factory=dict)
    _open: dict[int | tuple[str, str], Node] = field(default_factory=dict)  # node id, or ('coordinator', group)

    @classmethod
    async def connect(cls, bootstrap: str, *, timeout: float = 30.0, client_id: str = "keyrange-spark") -> ProxyNodes:
        """The first bootstrap server that answers. Every server is tried in turn, again and
        again with a growing pause between rounds, until ``timeout``: a proxy restarting or
        a link refusing for a moment must not fail a task or end a stream, as it does not
        stop a Kafka client (which reconnects with a backoff)."""
        servers = parse_bootstrap(bootstrap)
        deadline = trio.current_time() + timeout
        backoff = _CONNECT_BACKOFF_MIN
        errors: list[str] = []
        while True:
            errors = []
            for host, port in servers:
                left = deadline - trio.current_time()
                if left <= 0:
                    break
                try:
                    seed = await _open_node(host, port, left, client_id)
                    return cls(bootstrap, timeout, client_id, seed)
                except (*NETWORK_ERRORS, SourceReadError) as exc:
                    errors.append(f"{host}:{port}: {exc or type(exc).__name__}")
            if trio.current_time() + backoff >= deadline:
                break
            await trio.sleep(backoff)
            backoff = min(backoff * 2, _CONNECT_BACKOFF_MAX)
        raise KeyRangeSourceError(f"kafka.bootstrap.servers: no server answered within {timeout:g} s (last tries: "
                                  f"{'; '.join(errors) or 'none'})")

    @property
    def features(self) -> frozenset[str]:
        return self.seed.features

    async def aclose(self) -> None:
        for node in [self.seed, *self._open.values()]:
            with trio.CancelScope(shield=True):
                await node.conn.aclose()
        self._open.clear()

    async def __aenter__(self) -> ProxyNodes:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()

    # -- metadata -------------------------------------------------------------------------
    async def refresh(self, topics: Iterable[str]) -> dict[str, int]:
        """Learn the partitions, leaders and node addresses of ``topics``; returns the
        topics that came back with an error, and their code."""
        version = self.seed.versions[ApiKey.METADATA]
        cls = MetadataRequest
        body = cls(allow_auto_topic_creation=False,
                   topics=[cls.MetadataRequestTopic(name=name) for name in sorted(set(topics))])
        response: MetadataResponse = await self._seed_request(ApiKey.METADATA, version, body)
        self.nodes = {b.node_id: (b.host, b.port) for b in response.brokers}
        errors: dict[str, int] = {}
        for topic in response.topics:
            name = topic.name
            if name is None:
                continue  # null only for a topic asked by id, which the source never does
            if topic.error_code:
                errors[name] = topic.error_code
                continue
            self.partitions[name] = sorted(p.partition_index for p in topic.partitions)
            for p in topic.partitions:
                self.leaders[(name, p.partition_index)] = p.leader_id if p.error_code == ErrorCode.NONE else -1
        return errors

    async def _seed_request(self, api_key: int, version: int, body: object) -> Any:
        """The response to ``body`` (a request of ``api_key``), typed by the caller."""
        if self.seed.conn.closed:
            await self._reconnect_seed()
        return await _request(self.seed, api_key, version, body, self.timeout)

    async def node(self, node_id: int) -> Node:
        node = self._open.get(node_id)
        if node is not None and not node.conn.closed:
            return node
        if node_id not in self.nodes:
            raise Retry(f"node {node_id} is not in the metadata")
        host, port = self.nodes[node_id]
        node = await _open_node(host, port, self.timeout, self.client_id)
        self._open[node_id] = node
        return node

    async def leader(self, tp: tuple[str, int]) -> Node:
        leader = self.leaders.get(tp, -1)
        if leader < 0:
            raise Retry(f"{tp[0]}-{tp[1]} has no leader")
        return await self.node(leader)

    # -- offsets --------------------------------------------------------------------------
    async def list_offsets(self, partitions: Iterable[tuple[str, int]], timestamp: int,
                           isolation_level: int) -> dict[tuple[str, int], int]:
        """Earliest (-2) or latest (-1) offset of each partition; latest under
        read_committed is the last stable offset."""
        wanted = sorted(set(partitions))
        out: dict[tuple[str, int], int] = {}

        async def attempt() -> None:
            by_leader: dict[int, list[tuple[str, int]]] = {}
            for tp in wanted:
                if tp not in out:
                    by_leader.setdefault(self.leaders.get(tp, -1), []).append(tp)
            if -1 in by_leader:
                raise Retry(f"no leader for {by_leader[-1]}")
            for leader, tps in by_leader.items():
                node = await self.node(leader)
                version = node.versions[ApiKey.LIST_OFFSETS]
                cls = ListOffsetsRequest
                topics: dict[str, list[ListOffsetsRequest.ListOffsetsPartition]] = {}
                for topic, partition in tps:
                    topics.setdefault(topic, []).append(cls.ListOffsetsPartition(
                        partition_index=partition, current_leader_epoch=-1, timestamp=timestamp))
                body = cls(
                    replica_id=-1, isolation_level=isolation_level,
                    timeout_ms=int(self.timeout * 1000),
                    topics=[cls.ListOffsetsTopic(name=name, partitions=parts) for name, parts in topics.items()])
                response: ListOffsetsResponse = await _request(node, ApiKey.LIST_OFFSETS, version, body, self.timeout)
                retry = False
                for answered in response.topics:
                    for part in answered.partitions:
                        if part.error_code in RETRIABLE:
                            retry = True
                        elif part.error_code:
                            raise SourceReadError(f"ListOffsets {answered.name}-{part.partition_index}",
                                                  part.error_code)
                        else:
                            out[(answered.name, part.partition_index)] = part.offset
                if retry:
                    raise Retry("ListOffsets")

        await self.retrying(attempt, wanted)
        return out

    async def retrying(self, attempt: Callable[[], Awaitable[R]],
                       topics_of: Iterable[tuple[str, int]] | Iterable[str]) -> R:
        """Run ``attempt()`` until it succeeds; on ``Retry`` or a network failure refresh
        metadata, back off, and go again, until the request timeout has passed."""
        topics = {t if isinstance(t, str) else t[0] for t in topics_of}
        deadline = trio.current_time() + self.timeout
        delay = 0.05
        while True:
            try:
                return await attempt()
            except (Retry, *NETWORK_ERRORS) as exc:
                if trio.current_time() + delay > deadline:
                    raise SourceReadError(f"gave up after {self.timeout:.0f} s of retries: {exc!r}") from exc
            await trio.sleep(delay)
            delay = min(delay * 2, 1.0)
            try:
                await self.refresh(topics)
            except NETWORK_ERRORS:
                await self._reconnect_seed()

    async def _reconnect_seed(self) -> None:
        try:
            fresh = await ProxyNodes.connect(self.bootstrap, timeout=self.timeout, client_id=self.client_id)
        except KeyRangeSourceError:
            return
        with trio.CancelScope(shield=True):
            await self.seed.conn.aclose()
        self.seed = fresh.seed

    # -- fetch ----------------------------------------------------------------------------
    async def fetch(self, tp: tuple[str, int], offset: int, share: KeyRange | None, *, isolation_level: int,
                    max_bytes: int, wait_ms: int) -> FetchResponse.PartitionData:
        """One sessionless Fetch of one partition from its leader, with the share as the
        partition's key ranges (none for a whole partition). Returns the partition's
        answer; retriable errors raise ``Retry``."""
        node = await self.leader(tp)
        cls = FetchRequest
        ranges = None if share is None else [cls.KeyRange(start=share.start, end=share.end)]
        body = cls(
            replica_id=-1, max_wait_ms=wait_ms, min_bytes=1,
            max_bytes=max_bytes, isolation_level=isolation_level, session_id=0, session_epoch=-1,
            topics=[cls.FetchTopic(topic=tp[0], partitions=[cls.FetchPartition(
                partition=tp[1], current_leader_epoch=-1, fetch_offset=offset, log_start_offset=-1,
                partition_max_bytes=max_bytes, key_ranges=ranges)])])
        response: FetchResponse = await _request(node, ApiKey.FETCH, FETCH_VERSION, body,
                                                 self.timeout + wait_ms / 1000)
        if response.error_code in RETRIABLE:
            raise Retry(f"Fetch: {ErrorCode.name_of(response.error_code)}")
        if response.error_code:
            raise SourceReadError(f"Fetch {tp[0]}-{tp[1]}", response.error_code)
        for topic in response.responses:
            for part in topic.partitions:
                if part.partition_index == tp[1]:
                    if part.error_code in RETRIABLE:
                        raise Retry(f"Fetch {tp[0]}-{tp[1]}: {ErrorCode.name_of(part.error_code)}")
                    return part
        raise Retry(f"Fetch answer without {tp[0]}-{tp[1]}")

    # -- commits --------------------------------------------------------------------------
    async def commit(self, group: str, offsets: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """Record, for ``group``, that every offset below ``offsets[tp]`` is processed.

        Through a proxy with ``individual.commit`` this is a range commit of
        ``[0, offset - 1]`` (docs/wire-contract.md#33-offsetcommit): it merges into the group's state and can
        never move the stable offset back, so a replayed micro-batch's commit is harmless.
        Elsewhere it is a plain OffsetCommit. Returns each partition's stable offset."""
        wanted = {tp: o for tp, o in offsets.items() if o > 0}
        if not wanted:
            return {}
        individual = INDIVIDUAL_COMMIT_FEATURE in self.features
        result: dict[tuple[str, int], int] = {}

        async def attempt() -> None:
            coordinator = await self._coordinator(group)
            version = coordinator.versions.get(ApiKey.OFFSET_COMMIT)
            if version is None:
                raise SourceReadError(f"commit.group.id: the coordinator of {group!r} does not serve "
                                      "OffsetCommit v8+")
            cls = OffsetCommitRequest
            topics: dict[str, list[OffsetCommitRequest.OffsetCommitRequestPartition]] = {}
            for (topic, partition), offset in sorted(wanted.items()):
                if individual:
                    part = cls.OffsetCommitRequestPartition(partition_index=partition, committed_offset=-1,
                                                            offset_ranges=[cls.OffsetRange(start=0, end=offset - 1)])
                else:
                    part = cls.OffsetCommitRequestPartition(partition_index=partition, committed_offset=offset)
                topics.setdefault(topic, []).append(part)
            body = cls(group_id=group, generation_id_or_member_epoch=-1, member_id="",
                       topics=[cls.OffsetCommitRequestTopic(name=name, partitions=parts) for name, parts in topics.items()])
            response: OffsetCommitResponse = await _request(coordinator, ApiKey.OFFSET_COMMIT, version, body,
                                                            self.timeout)
            for answered in response.topics:
                for entry in answered.partitions:
                    if entry.error_code in RETRIABLE:
                        await coordinator.conn.aclose()
                        self._open.pop(("coordinator", group), None)
                        raise Retry(f"OffsetCommit: {ErrorCode.name_of(entry.error_code)}")
                    if entry.error_code:
                        raise SourceReadError(f"OffsetCommit {answered.name}-{entry.partition_index} for group "
                                              f"{group!r}", entry.error_code)
                    stable = entry.stable_offset
                    result[(answered.name, entry.partition_index)] = (
                        stable if individual and stable >= 0 else wanted[(answered.name, entry.partition_index)])

        await self.retrying(attempt, wanted)
        return result

    async def _coordinator(self, group: str) -> Node:
        key = ("coordinator", group)
        node = self._open.get(key)
        if node is not None and not node.conn.closed:
            return node
        version = self.seed.versions.get(ApiKey.FIND_COORDINATOR)
        if version is None:
            raise SourceReadError("commit.group.id: the cluster does not serve FindCoordinator v4")
        body = FindCoordinatorRequest(key_type=0, coordinator_keys=[group])
        response: FindCoordinatorResponse = await self._seed_request(ApiKey.FIND_COORDINATOR, version, body)
        (entry,) = response.coordinators
        if entry.error_code in RETRIABLE:
            raise Retry(f"FindCoordinator: {ErrorCode.name_of(entry.error_code)}")
        if entry.error_code:
            raise SourceReadError(f"FindCoordinator for group {group!r}", entry.error_code)
        node = await _open_node(entry.host, entry.port, self.timeout, self.client_id)
        self._open[key] = node
        return node


async def _request(node: Node, api_key: int, version: int, body: object, timeout: float) -> Any:
    """A request that failed or was cancelled midway closes its connection, so a late
    answer can never be read as the next request's. The response body is that of
    ``api_key``: the caller types it."""
    try:
        return await node.conn.request(api_key, version, body, timeout=timeout)
    except BaseException:
        with trio.CancelScope(shield=True):
            await node.conn.aclose()
        raise


async def _open_node(host: str, port: int, timeout: float, client_id: str) -> Node:
    conn = await BrokerConnection.open(host, port, client_id=client_id, timeout=timeout)
    try:
        body = ApiVersionsRequest(client_software_name="keyrange-spark", client_software_version="1")
        response: ApiVersionsResponse = await conn.request(ApiKey.API_VERSIONS, API_VERSIONS_FIRST_SUPPORTED_FEATURES,
                                                           body, timeout=timeout)
        if response.error_code:
            raise SourceReadError(f"ApiVersions from {host}:{port}", response.error_code)
        theirs = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
        versions: dict[int, int] = {}
        for api_key, (floor, ceiling) in _VERSIONS.items():
            ours_low, ours_high = messages.supported_versions(api_key) or (0, -1)
            low, high = theirs.get(api_key, (0, -1))
            version = min(ceiling, ours_high, high)
            if version >= max(floor, low, ours_low):
                versions[api_key] = version
        for api_key in (ApiKey.METADATA, ApiKey.LIST_OFFSETS, ApiKey.FETCH):
            if api_key not in versions:
                raise SourceReadError(f"{host}:{port} does not serve {ApiKey(api_key).name} in the versions the "
                                      f"keyrange source speaks ({_VERSIONS[api_key][0]}+)")
        features = frozenset(f.name for f in response.supported_features or ())
    except BaseException:
        with trio.CancelScope(shield=True):
            await conn.aclose()
        raise
    return Node(conn, versions, features)
