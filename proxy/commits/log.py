"""The individual-commit log (docs/wire-contract.md#4-individual-commit-log): ``__individual_commit_offsets``.

One compacted record per (group, topic, partition) holds that key's whole state (S, R);
the newest record wins and a tombstone deletes. The record partition is the group's
partition of ``__consumer_offsets`` (``abs(java_string_hash(group)) % partitions``, with
Kafka's ``Utils.abs``), so a group's individual commits live next to its offsets.

Writes go through an idempotent producer (InitProducerId, then Produce with sequence
numbers and acks=-1) to the partition leader; concurrent writes to one log partition are
combined into one batch. Reads rebuild the state from the log: before any state of a
group is served, the instance reads that group's log partition up to its current end
(ListOffsets latest), so it never serves state older than the log.
"""

from __future__ import annotations

import logging
import struct
import time
from dataclasses import dataclass, field
from typing import Callable

import trio

from proxy.commits.packed import RANGE_SIZE, from_deltas, to_deltas
from proxy.commits.state import CommitState, join
from proxy.net.broker_connection import BrokerConnection, BrokerConnectionError
from proxy.protocol import messages
from proxy.protocol.errors import ProtocolError
from proxy.protocol.primitives import read_uvarint, uvarint_bytes
from proxy.protocol.messages import ApiKey
from proxy.records.batch import RecordBatch, iter_batches
from proxy.records.builder import build_batch, encode_record
from proxy.records.varint import encode_varint

log = logging.getLogger("proxy.commits.log")

LOG_TOPIC = "__individual_commit_offsets"
OFFSETS_TOPIC = "__consumer_offsets"

PRODUCE_VERSION = 9
FETCH_VERSION = 12
LIST_OFFSETS_VERSION = 7
METADATA_VERSION = 12
CREATE_TOPICS_VERSION = 5
INIT_PRODUCER_ID_VERSION = 4
FIND_COORDINATOR_VERSION = 4
OFFSET_FETCH_VERSION = 8
OFFSET_COMMIT_VERSION = 9

# Errors after which the same batch is sent again (same sequence: the broker dedups).
_RETRY_SAME = {3, 5, 6, 7, 13, 14, 15, 16, 19, 20, 56, 74, 75}
_DUPLICATE_SEQUENCE = 46
# Errors after which the producer id is renewed before sending again.
_RENEW_PRODUCER = {45, 47, 59, 90}
_TOPIC_ALREADY_EXISTS = 36
_LATEST = -1
_UNREACHABLE_BACKOFF = 30.0


class CommitLogError(Exception):
    """The log could not be read or written before the deadline."""


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: over UTF-16 code units, 32-bit signed arithmetic."""
    value = 0
    data = text.encode("utf-16-be")
    for index in range(0, len(data), 2):
        value = (31 * value + ((data[index] << 8) | data[index + 1])) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def group_partition(group: str, partitions: int) -> int:
    """``Utils.abs(group.hashCode()) % partitions``; Utils.abs(Integer.MIN_VALUE) is 0."""
    value = java_string_hash(group)
    value = 0 if value == -(1 << 31) else abs(value)
    return value % partitions


def encode_key_generic(group: str, topic: str, partition: int) -> bytes:
    """IndividualCommitKey through the schema codec (the reference for ``encode_key``)."""
    return messages.encode_data(
        "IndividualCommitKey", messages.new_data("IndividualCommitKey", group=group, topic=topic, partition=partition)
    )


_KEY_STRING = struct.Struct(">h")
_KEY_TAIL = struct.Struct(">i")


def encode_key(group: str, topic: str, partition: int) -> bytes:
    """IndividualCommitKey v0 (int16 version, then non-flexible strings and the partition),
    byte for byte what the schema codec writes (a unit test checks it)."""
    group_bytes = group.encode()
    topic_bytes = topic.encode()
    if len(group_bytes) > 0x7FFF or len(topic_bytes) > 0x7FFF:
        return encode_key_generic(group, topic, partition)  # let the codec refuse it
    return b"".join((b"\x00\x00", _KEY_STRING.pack(len(group_bytes)), group_bytes, _KEY_STRING.pack(len(topic_bytes)),
                     topic_bytes, _KEY_TAIL.pack(partition)))


# Zigzag varints of small non-negative numbers, the lengths and offset deltas of log records.
_SMALL_VARINTS = [encode_varint(number) for number in range(1 << 13)]
_NULL_VARINT = b"\x01"  # zigzag(-1)


def encode_records(records: list[tuple[bytes, bytes | None]]) -> list[bytes]:
    """v2 records (attributes 0, timestamp delta 0, offset delta = position, no headers),
    byte for byte what ``encode_record`` writes (a unit test checks it), for the small keys
    and values of this log; anything larger goes through ``encode_record``."""
    small = _SMALL_VARINTS
    limit = len(small)
    out = []
    for delta, (key, value) in enumerate(records):
        value_size = -1 if value is None else len(value)
        if delta >= limit or len(key) >= limit or value_size >= limit:
            out.append(encode_record(offset_delta=delta, key=key, value=value))
            continue
        body = b"".join((b"\x00\x00", small[delta], small[len(key)], key,
                         _NULL_VARINT if value is None else small[value_size], value or b"", b"\x00"))
        size = len(body)
        out.append((small[size] if size < limit else encode_varint(size)) + body)
    return out


def encode_value_generic(state: CommitState, version: int | None = None) -> bytes:
    """IndividualCommitValue through the schema codec (the reference for ``encode_value``)."""
    value_class = messages.data_class("IndividualCommitValue")
    if version == 0:
        value = value_class(stable_offset=state.stable,
                            ranges=[value_class.OffsetRange(start=start, end=end) for start, end in state.ranges])
    else:
        value = value_class(stable_offset=state.stable, range_deltas=to_deltas(state.stable, state.packed),
                            reset_epoch=state.epoch)
    return messages.encode_data("IndividualCommitValue", value, version)


_VALUE_HEAD = struct.Struct(">hq")
_EPOCH = struct.Struct(">q")


def encode_value(state: CommitState) -> bytes:
    """IndividualCommitValue v1, byte for byte what the schema codec writes (a unit test
    checks it), without building message objects: commits write one per partition."""
    deltas = to_deltas(state.stable, state.packed)
    return b"".join((_VALUE_HEAD.pack(1, state.stable), uvarint_bytes(len(deltas) + 1), deltas,
                     _EPOCH.pack(state.epoch), b"\x00"))


def decode_key(data) -> tuple[str, str, int]:
    key = messages.decode_data("IndividualCommitKey", bytes(data))
    return key.group, key.topic, key.partition


def decode_value(data) -> CommitState:
    """A value as this proxy writes it (version 1, or 0 of earlier releases) is read from
    slices; anything else (tagged fields a newer writer added) through the schema codec."""
    data = bytes(data)
    if len(data) >= 12 and data[-1] == 0:
        version, stable = _VALUE_HEAD.unpack_from(data, 0)
        try:
            length, pos = read_uvarint(data, 10, len(data))
        except ProtocolError:
            length, pos = 0, 0
        if version == 1 and length and pos + length + 8 == len(data):
            (epoch,) = _EPOCH.unpack_from(data, pos + length - 1)
            return CommitState.from_packed(stable, from_deltas(stable, data[pos:pos + length - 1]), epoch)
        if version == 0 and length and pos + (length - 1) * RANGE_SIZE + 1 == len(data):
            ranges = data[pos:-1]
            if ranges[16::RANGE_SIZE].count(0) == length - 1:
                return CommitState.from_packed(stable, ranges)
    value = messages.decode_data("IndividualCommitValue", data)
    if messages.data_version(data) >= 1:
        return CommitState.from_packed(value.stable_offset, from_deltas(value.stable_offset, value.range_deltas or b""),
                                       value.reset_epoch)
    return CommitState(value.stable_offset, tuple((r.start, r.end) for r in value.ranges))


Address = tuple[str, int]


class Cluster:
    """The proxy's own view of the cluster: node addresses, leaders, and a small pool of
    connections per broker (each carries one request at a time)."""

    def __init__(self, bootstrap: list[Address], *, ssl_context=None, timeout: float = 10.0) -> None:
        self.bootstrap = list(bootstrap)
        self.ssl_context = ssl_context
        self.timeout = timeout
        self.nodes: dict[int, Address] = {}
        self._idle: dict[Address, list[BrokerConnection]] = {}

    async def request(self, address: Address, api_key: int, version: int, body, *, timeout: float | None = None):
        idle = self._idle.setdefault(address, [])
        connection = idle.pop() if idle else None
        if connection is None or connection.closed:
            connection = await BrokerConnection.open(address[0], address[1], client_id="keyrange-proxy-commits",
                                                     timeout=self.timeout, ssl_context=self.ssl_context)
        try:
            response = await connection.request(api_key, version, body, timeout=timeout or self.timeout)
        except BaseException:
            with trio.CancelScope(shield=True):
                await connection.aclose()
            raise
        if len(idle) < 16:
            idle.append(connection)
        else:
            await connection.aclose()
        return response

    def addresses(self) -> list[Address]:
        return [*self.nodes.values(), *[a for a in self.bootstrap if a not in self.nodes.values()]]

    async def request_any(self, api_key: int, version: int, body, *, timeout: float | None = None):
        failures = []
        for address in self.addresses():
            try:
                return await self.request(address, api_key, version, body, timeout=timeout)
            except (BrokerConnectionError, OSError, trio.TooSlowError, ProtocolError) as exc:
                failures.append(f"{address[0]}:{address[1]} ({exc})")
        raise CommitLogError("no broker answered: " + "; ".join(failures))

    async def metadata(self, topics: list[str]):
        cls = messages.body_class(ApiKey.METADATA, "request")
        body = messages.new_body(ApiKey.METADATA, METADATA_VERSION, "request",
                                 topics=[cls.MetadataRequestTopic(name=t) for t in topics],
                                 allow_auto_topic_creation=False)
        response = await self.request_any(ApiKey.METADATA, METADATA_VERSION, body)
        for broker in response.brokers:
            self.nodes[broker.node_id] = (broker.host, broker.port)
        return response

    async def find_coordinator(self, group: str) -> Address:
        body = messages.new_body(ApiKey.FIND_COORDINATOR, FIND_COORDINATOR_VERSION, "request", key_type=0,
                                 coordinator_keys=[group])
        response = await self.request_any(ApiKey.FIND_COORDINATOR, FIND_COORDINATOR_VERSION, body)
        (entry,) = response.coordinators
        if entry.error_code:
            raise CommitLogError(f"FindCoordinator({group}) error {entry.error_code}")
        return entry.host, entry.port

    async def committed_offsets(self, group: str, keys: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The real coordinator's committed offsets (-1 for none)."""
        if not keys:
            return {}
        cls = messages.body_class(ApiKey.OFFSET_FETCH, "request")
        by_topic: dict[str, list[int]] = {}
        for topic, partition in keys:
            by_topic.setdefault(topic, []).append(partition)
        body = messages.new_body(
            ApiKey.OFFSET_FETCH, OFFSET_FETCH_VERSION, "request",
            groups=[cls.OffsetFetchRequestGroup(group_id=group, topics=[
                cls.OffsetFetchRequestTopics(name=topic, partition_indexes=parts) for topic, parts in by_topic.items()
            ])],
        )
        deadline = trio.current_time() + 30
        while True:
            try:
                address = await self.find_coordinator(group)
                response = await self.request(address, ApiKey.OFFSET_FETCH, OFFSET_FETCH_VERSION, body)
                (entry,) = response.groups
                if entry.error_code:
                    raise CommitLogError(f"OffsetFetch({group}) error {entry.error_code}")
                out = {}
                for topic in entry.topics:
                    for part in topic.partitions:
                        out[(topic.name, part.partition_index)] = part.committed_offset if not part.error_code else -1
                return out
            except (CommitLogError, BrokerConnectionError, OSError, trio.TooSlowError) as exc:
                if trio.current_time() > deadline:
                    raise CommitLogError(f"cannot read the committed offsets of {group}: {exc}") from exc
                await trio.sleep(0.1)


    async def commit_offsets(self, group: str, generation: int, member: str, instance_id: str | None,
                             offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """A standard OffsetCommit from the proxy's own connection to the coordinator, with
        the generation and member of the client's commit (the broker checks them as for the
        client); the error code per key. Raises CommitLogError when no coordinator answers."""
        cls = messages.body_class(ApiKey.OFFSET_COMMIT, "request")
        by_topic: dict[str, list] = {}
        for (topic, partition), offset in offsets.items():
            by_topic.setdefault(topic, []).append(
                cls.OffsetCommitRequestPartition(partition_index=partition, committed_offset=offset))
        body = messages.new_body(ApiKey.OFFSET_COMMIT, OFFSET_COMMIT_VERSION, "request", group_id=group,
                                 generation_id_or_member_epoch=generation, member_id=member,
                                 group_instance_id=instance_id,
                                 topics=[cls.OffsetCommitRequestTopic(name=topic, partitions=parts)
                                         for topic, parts in by_topic.items()])
        try:
            address = await self.find_coordinator(group)
            response = await self.request(address, ApiKey.OFFSET_COMMIT, OFFSET_COMMIT_VERSION, body)
        except (BrokerConnectionError, OSError, trio.TooSlowError, ProtocolError) as exc:
            raise CommitLogError(f"OffsetCommit({group}) from the proxy failed: {exc}") from exc
        return {(topic.name, part.partition_index): part.error_code
                for topic in response.topics for part in topic.partitions}

@dataclass
class _Pending:
    records: list[tuple[bytes, bytes | None]]
    updates: list[tuple[str, tuple[str, int], CommitState | None]]
    done: bool = False
    error: BaseException | None = None
    offset: int = -1


@dataclass
class _Partition:
    """What this instance has read of one log partition."""

    position: int = 0
    read_lock: trio.Lock = field(default_factory=trio.Lock)
    write_lock: trio.Lock = field(default_factory=trio.Lock)
    pending: list[_Pending] = field(default_factory=list)
    sequence: int = 0
    leader: int | None = None
    loaded: bool = False


class CommitLog:
    def __init__(
        self,
        cluster: Cluster,
        *,
        segment_bytes: int,
        timeout: float = 30.0,
        on_rebuild: Callable[[], None] | None = None,
        on_write: Callable[[float], None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.segment_bytes = segment_bytes
        self.timeout = timeout
        self.partitions: int | None = None  # of the log topic, once it exists
        self._parts: dict[int, _Partition] = {}
        # group -> (topic, partition) -> (log offset of the record, state)
        self.groups: dict[str, dict[tuple[str, int], tuple[int, CommitState]]] = {}
        self.held = 0  # ranges above S over every state held
        self._producer: tuple[int, int] | None = None
        self._producer_lock = trio.Lock()
        self._topic_lock = trio.Lock()
        self._unreachable_until = -1.0
        self._on_rebuild = on_rebuild or (lambda: None)
        self._on_write = on_write or (lambda seconds: None)

    # -- topic ------------------------------------------------------------------------------
    async def _topic_partitions(self, create: bool) -> int | None:
        if self.partitions is not None:
            return self.partitions
        if trio.current_time() < self._unreachable_until:
            raise CommitLogError("the brokers refused the proxy's own requests a moment ago")
        try:
            return await self._find_topic(create)
        except CommitLogError:
            # E.g. a SASL listener refuses the proxy's unauthenticated requests: do not
            # try again on every request.
            self._unreachable_until = trio.current_time() + _UNREACHABLE_BACKOFF
            raise

    async def _find_topic(self, create: bool) -> int | None:
        async with self._topic_lock:
            deadline = trio.current_time() + self.timeout
            while self.partitions is None:
                response = await self.cluster.metadata([LOG_TOPIC, OFFSETS_TOPIC])
                topics = {t.name: t for t in response.topics}
                ours = topics.get(LOG_TOPIC)
                if ours is not None and not ours.error_code and ours.partitions and \
                        all(p.leader_id >= 0 for p in ours.partitions):
                    self.partitions = len(ours.partitions)
                    for p in ours.partitions:
                        self._part(p.partition_index).leader = p.leader_id
                    break
                if ours is not None and ours.error_code == 3 and not create:
                    return None
                offsets = topics.get(OFFSETS_TOPIC)
                if offsets is None or offsets.error_code or not offsets.partitions:
                    # __consumer_offsets is created with the first FindCoordinator.
                    try:
                        await self.cluster.find_coordinator("keyrange-proxy")
                    except CommitLogError:
                        pass
                elif ours is None or ours.error_code == 3:
                    await self._create(len(offsets.partitions), len(offsets.partitions[0].replica_nodes))
                if trio.current_time() > deadline:
                    raise CommitLogError(f"{LOG_TOPIC} has no leaders yet")
                await trio.sleep(0.1)
            return self.partitions

    async def _create(self, partitions: int, replication: int) -> None:
        cls = messages.body_class(ApiKey.CREATE_TOPICS, "request")
        body = messages.new_body(
            ApiKey.CREATE_TOPICS, CREATE_TOPICS_VERSION, "request", timeout_ms=30000,
            topics=[cls.CreatableTopic(name=LOG_TOPIC, num_partitions=partitions, replication_factor=replication,
                                       configs=[cls.CreatableTopicConfig(name="cleanup.policy", value="compact"),
                                                cls.CreatableTopicConfig(name="segment.bytes",
                                                                         value=str(self.segment_bytes))])],
        )
        response = await self.cluster.request_any(ApiKey.CREATE_TOPICS, CREATE_TOPICS_VERSION, body, timeout=40)
        (result,) = response.topics
        if result.error_code not in (0, _TOPIC_ALREADY_EXISTS):
            raise CommitLogError(f"CreateTopics {LOG_TOPIC}: error {result.error_code} {result.error_message}")
        log.info("individual-commit log topic=%s partitions=%s replication=%s result=%s", LOG_TOPIC, partitions,
                 replication, result.error_code)

    def _part(self, index: int) -> _Partition:
        part = self._parts.get(index)
        if part is None:
            part = self._parts[index] = _Partition()
        return part

    async def _leader(self, index: int, refresh: bool = False) -> tuple[str, int]:
        part = self._part(index)
        if refresh or part.leader is None or part.leader not in self.cluster.nodes:
            response = await self.cluster.metadata([LOG_TOPIC])
            for topic in response.topics:
                if topic.name == LOG_TOPIC:
                    for p in topic.partitions:
                        self._part(p.partition_index).leader = p.leader_id
        if part.leader is None or part.leader not in self.cluster.nodes:
            raise CommitLogError(f"{LOG_TOPIC}-{index} has no leader")
        return self.cluster.nodes[part.leader]

    # -- reading ---------------------------------------------------------------------------------
    async def states(self, group: str) -> dict[tuple[str, int], CommitState]:
        """The group's current state, read up to the log's end first."""
        await self.catch_up(group)
        return {key: state for key, (_, state) in self.groups.get(group, {}).items()}

    def current(self, group: str) -> bool:
        """Whether this instance has read the group's log partition at least once (its
        memory then holds every record up to the position it read; newer ones may exist)."""
        if self.partitions is None:
            return False
        part = self._parts.get(group_partition(group, self.partitions))
        return part is not None and part.loaded

    def position(self, group: str) -> int:
        """How far this instance has read the group's log partition (after ``catch_up``):
        every record below it is in memory. 0 while the log topic does not exist."""
        if self.partitions is None:
            return 0
        return self._part(group_partition(group, self.partitions)).position

    def records(self, group: str) -> dict[tuple[str, int], tuple[int, CommitState]]:
        """What this instance holds of the group: key -> (log offset of the record, state)."""
        return self.groups.get(group, {})

    async def catch_up(self, group: str) -> None:
        partitions = await self._topic_partitions(create=False)
        if partitions is None:
            return
        index = group_partition(group, partitions)
        part = self._part(index)
        async with part.read_lock:
            await self._retrying(lambda refresh: self._read_to_end(index, part, refresh))

    async def _retrying(self, attempt):
        deadline = trio.current_time() + self.timeout
        refresh = False
        while True:
            try:
                return await attempt(refresh)
            except (CommitLogError, BrokerConnectionError, OSError, trio.TooSlowError, ProtocolError) as exc:
                if trio.current_time() > deadline:
                    raise CommitLogError(str(exc)) from exc
                log.debug("retrying log operation reason=%r", str(exc))
                refresh = True
                await trio.sleep(0.05)

    async def _read_to_end(self, index: int, part: _Partition, refresh: bool) -> None:
        address = await self._leader(index, refresh)
        end = await self._end_offset(address, index)
        if part.position >= end:
            part.loaded = True  # every record below the end is in memory
            return
        if not part.loaded:
            self._on_rebuild()
        while part.position < end:
            records, after, high_watermark, log_start = await self._fetch(address, index, part.position)
            if log_start is not None:  # compaction/retention moved the start
                part.position = max(part.position, log_start)
                continue
            for offset, key, value in records:
                self._apply(offset, key, value)
            if after is None:
                # Nothing readable at this position yet (e.g. an open transaction's
                # boundary): the end we were asked for is the high watermark; stop here.
                if high_watermark <= part.position:
                    break
                raise CommitLogError(f"no progress reading {LOG_TOPIC}-{index} at {part.position}")
            part.position = after
        part.loaded = True

    async def window(self, group: str, start: int, stop: int | None,
                     keys) -> tuple[dict[tuple[str, int], tuple[int, CommitState | None]], int]:
        """The newest record of each of ``keys`` (of ``group``) at an offset in [start, stop)
        (``stop`` None: up to the log's end), read from the log itself: memory keeps only the
        newest record of a key, so one shadowed by a later write is seen only there. Returns
        them with the offset read up to (at least ``stop``). Everything read is applied to
        memory as well."""
        index = group_partition(group, self.partitions)
        part = self._part(index)
        found: dict[tuple[str, int], tuple[int, CommitState | None]] = {}

        async def attempt(refresh: bool) -> int:
            found.clear()
            address = await self._leader(index, refresh)
            position = start
            while True:
                records, after, high_watermark, log_start = await self._fetch(address, index, position)
                if log_start is not None:  # compacted away: nothing newest there
                    position = max(position, log_start)
                    continue
                for offset, key, value in records:
                    applied = self._apply(offset, key, value)
                    if applied is not None and applied[0] == group and applied[1] in keys and \
                            (stop is None or offset < stop):
                        found[applied[1]] = (offset, applied[2])
                if after is None:
                    if high_watermark <= position and (stop is None or position >= stop):
                        return position
                    raise CommitLogError(f"no progress reading {LOG_TOPIC}-{index} at {position}")
                if position <= part.position:  # memory now holds every record below ``after``
                    part.position = max(part.position, after)
                position = after
                if position >= high_watermark and (stop is None or position >= stop):
                    return position

        async with part.read_lock:
            end = await self._retrying(attempt)
        return found, end

    async def _fetch(self, address, index: int, offset: int):
        """One Fetch of log partition ``index`` from ``offset``: (records [(offset, key, value)]
        at or above it, the position after the last batch read or None when none was,
        the high watermark, the log start offset when ``offset`` is below it, else None)."""
        fetch_class = messages.body_class(ApiKey.FETCH, "request")
        body = messages.new_body(
            ApiKey.FETCH, FETCH_VERSION, "request", max_wait_ms=0, min_bytes=0, max_bytes=8 << 20,
            isolation_level=0, session_id=0, session_epoch=-1,
            topics=[fetch_class.FetchTopic(topic=LOG_TOPIC, partitions=[
                fetch_class.FetchPartition(partition=index, fetch_offset=offset, partition_max_bytes=8 << 20)])],
        )
        response = await self.cluster.request(address, ApiKey.FETCH, FETCH_VERSION, body)
        data = response.responses[0].partitions[0]
        if data.error_code == 1:  # OFFSET_OUT_OF_RANGE
            if data.log_start_offset <= offset:
                raise CommitLogError(f"Fetch {LOG_TOPIC}-{index} at {offset}: out of range")
            return [], None, data.high_watermark, data.log_start_offset
        if data.error_code:
            raise CommitLogError(f"Fetch {LOG_TOPIC}-{index} error {data.error_code}")
        records = []
        after = None
        for entry in iter_batches(data.records or b""):
            if not isinstance(entry, RecordBatch) or entry.header.next_offset <= offset:
                continue
            if not entry.header.is_control:
                records.extend((record.offset, record.key, record.value) for record in entry.records()
                               if record.offset >= offset and record.key is not None)
            after = entry.header.next_offset
        return records, after, data.high_watermark, None

    async def _end_offset(self, address, index: int) -> int:
        cls = messages.body_class(ApiKey.LIST_OFFSETS, "request")
        body = messages.new_body(
            ApiKey.LIST_OFFSETS, LIST_OFFSETS_VERSION, "request", replica_id=-1, isolation_level=0,
            topics=[cls.ListOffsetsTopic(name=LOG_TOPIC, partitions=[
                cls.ListOffsetsPartition(partition_index=index, timestamp=_LATEST)])],
        )
        response = await self.cluster.request(address, ApiKey.LIST_OFFSETS, LIST_OFFSETS_VERSION, body)
        entry = response.topics[0].partitions[0]
        if entry.error_code:
            raise CommitLogError(f"ListOffsets {LOG_TOPIC}-{index} error {entry.error_code}")
        return entry.offset

    def _apply(self, offset: int, key, value) -> tuple[str, tuple[str, int], CommitState | None] | None:
        """A record read from the log into memory: (group, key, state), or None if unreadable."""
        try:
            group, topic, partition = decode_key(key)
            state = None if value is None else decode_value(value)
        except (ProtocolError, ValueError) as exc:
            log.warning("skipping unreadable individual-commit record offset=%s reason=%r", offset, str(exc))
            return None
        self._set(group, (topic, partition), offset, state)
        return group, (topic, partition), state

    def _set(self, group: str, key: tuple[str, int], offset: int, state: CommitState | None) -> None:
        entries = self.groups.get(group)
        current = entries.get(key) if entries else None
        if state is not None and current is not None:
            # Records of a key join, in whatever order they are read: one written from an
            # older read (another instance's, concurrent with this one's) adds what it
            # holds and drops nothing; a reset (a higher epoch) replaces what came before.
            state = join(current[1], state)
            offset = max(offset, current[0])
        elif current is not None and current[0] > offset:
            return  # a tombstone older than the record held
        self.held += (state.held() if state is not None else 0) - (current[1].held() if current is not None else 0)
        if state is None:
            if entries is not None:
                entries.pop(key, None)
                if not entries:
                    del self.groups[group]
            return
        self.groups.setdefault(group, {})[key] = (offset, state)

    # -- writing ---------------------------------------------------------------------------------
    async def write(self, group: str, updates: dict[tuple[str, int], CommitState | None],
                    encoded: dict[tuple[str, int], tuple[CommitState, bytes]] | None = None) -> int:
        """Write the new states (None: a tombstone) with acks=all; returns once they are in the
        log, with the log offset of the first of them (-1: unknown, the broker had them from an
        earlier attempt). ``encoded``: values already encoded, used for a key whose state is
        the very one given."""
        if not updates:
            return -1
        partitions = await self._topic_partitions(create=True)
        index = group_partition(group, partitions)
        part = self._part(index)
        keys = list(updates)
        encoded = encoded or {}
        values = []
        for key in keys:
            state = updates[key]
            ready = encoded.get(key)
            values.append(None if state is None else ready[1] if ready is not None and ready[0] is state
                          else encode_value(state))
        pending = _Pending([(encode_key(group, topic, partition), value)
                            for (topic, partition), value in zip(keys, values)],
                           [(group, key, updates[key]) for key in keys])
        part.pending.append(pending)
        started = time.perf_counter()
        async with part.write_lock:
            if not pending.done:
                batch, part.pending = part.pending, []
                with trio.CancelScope(shield=True):
                    try:
                        base = await self._retrying(lambda refresh: self._produce(index, part, batch, refresh))
                    except BaseException as exc:  # noqa: BLE001 - handed to every waiter
                        for item in batch:
                            item.done, item.error = True, exc
                    else:
                        offset = base
                        for item in batch:
                            # base -1: the broker had the batch already (a retry); where
                            # it lies is unknown.
                            item.done, item.offset = True, offset if base >= 0 else -1
                            offset += len(item.records)
                        if base >= 0 and part.loaded:
                            # The written states are in memory at once (a reader that gets
                            # there first keeps the newer record: offsets decide).
                            for item in batch:
                                for number, (owner, key, state) in enumerate(item.updates):
                                    self._set(owner, key, item.offset + number, state)
                            if part.position == base:
                                # Nobody else wrote in between: the log is read up to here.
                                part.position = base + sum(len(item.records) for item in batch)
        self._on_write(time.perf_counter() - started)
        if pending.error is not None:
            raise CommitLogError(f"write to {LOG_TOPIC}-{index} failed: {pending.error}") from pending.error
        return pending.offset

    async def _producer_id(self, renew: bool = False) -> tuple[int, int]:
        async with self._producer_lock:
            if self._producer is None or renew:
                body = messages.new_body(ApiKey.INIT_PRODUCER_ID, INIT_PRODUCER_ID_VERSION, "request",
                                         transactional_id=None, transaction_timeout_ms=2147483647)
                response = await self.cluster.request_any(ApiKey.INIT_PRODUCER_ID, INIT_PRODUCER_ID_VERSION, body)
                if response.error_code:
                    raise CommitLogError(f"InitProducerId error {response.error_code}")
                self._producer = (response.producer_id, response.producer_epoch)
                for part in self._parts.values():
                    part.sequence = 0
            return self._producer

    async def _produce(self, index: int, part: _Partition, batch: list[_Pending], refresh: bool) -> int:
        producer_id, epoch = await self._producer_id()
        address = await self._leader(index, refresh)
        records = [record for item in batch for record in item.records]
        now = int(time.time() * 1000)
        raw = encode_records(records)
        blob = build_batch(base_offset=0, last_offset_delta=len(raw) - 1, records=raw, record_count=len(raw),
                           base_timestamp=now, max_timestamp=now, producer_id=producer_id, producer_epoch=epoch,
                           base_sequence=part.sequence)
        cls = messages.body_class(ApiKey.PRODUCE, "request")
        body = messages.new_body(
            ApiKey.PRODUCE, PRODUCE_VERSION, "request", transactional_id=None, acks=-1, timeout_ms=15000,
            topic_data=[cls.TopicProduceData(name=LOG_TOPIC, partition_data=[
                cls.PartitionProduceData(index=index, records=blob)])],
        )
        response = await self.cluster.request(address, ApiKey.PRODUCE, PRODUCE_VERSION, body, timeout=20)
        result = response.responses[0].partition_responses[0]
        if result.error_code in (0, _DUPLICATE_SEQUENCE):
            part.sequence = (part.sequence + len(raw)) & 0x7FFFFFFF
            return result.base_offset if result.error_code == 0 else -1
        if result.error_code in _RENEW_PRODUCER:
            await self._producer_id(renew=True)
            raise CommitLogError(f"Produce {LOG_TOPIC}-{index} error {result.error_code}; new producer id")
        if result.error_code in _RETRY_SAME:
            raise CommitLogError(f"Produce {LOG_TOPIC}-{index} error {result.error_code}")
        raise CommitLogError(f"Produce {LOG_TOPIC}-{index} failed with error {result.error_code}")

    def ranges_held(self) -> int:
        return self.held
