"""Keeping this instance's memory in step with ``__individual_commit_offsets`` (docs/wire-contract.md
section 4): reading a group's log partition to its end, reading what landed between two
offsets, and writing states.

Before any state of a group is served, the instance reads that group's log partition up
to its current end (ListOffsets latest), so it never serves state older than the log.
Writes from concurrent commits to one log partition are combined into one batch of the
idempotent producer, and what is written is applied to memory at once. The record format
is ``proxy.commits.codec``, the memory ``proxy.commits.table``, the producer
``proxy.commits.producer``, the topic and the brokers ``proxy.commits.cluster``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import trio

from proxy.commits.cluster import LOG_TOPIC, ClusterClient, CommitLogError, LogTopic
from proxy.commits.codec import encode_key, encode_value
from proxy.commits.producer import IdempotentProducer
from proxy.commits.state import CommitState
from proxy.commits.table import AppliedState, StateTable, TopicPartitionKey
from proxy.net.broker_connection import BrokerConnectionError
from proxy.protocol.errors import ProtocolError
from proxy.protocol.groups import group_partition

log = logging.getLogger("proxy.commits.log")

_RETRY_PAUSE = 0.05


@dataclass
class _Pending:
    """One caller's states, waiting to travel in the partition's next batch."""

    records: list[tuple[bytes, bytes | None]]
    updates: list[tuple[str, TopicPartitionKey, CommitState | None]]
    done: bool = False
    error: BaseException | None = None
    offset: int = -1


@dataclass
class _Partition:
    """What this instance has read of one log partition."""

    position: int = 0  # every record below it is in memory
    loaded: bool = False  # read to its end at least once
    read_lock: trio.Lock = field(default_factory=trio.Lock)
    write_lock: trio.Lock = field(default_factory=trio.Lock)
    pending: list[_Pending] = field(default_factory=list)


class CommitLog:
    def __init__(
        self,
        cluster: ClusterClient,
        *,
        segment_bytes: int,
        timeout: float = 30.0,
        on_rebuild: Callable[[], None] | None = None,
        on_write: Callable[[float], None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.timeout = timeout
        self.topic = LogTopic(cluster, segment_bytes=segment_bytes, timeout=timeout)
        self.producer = IdempotentProducer(self.topic)
        self.table = StateTable()
        self._parts: dict[int, _Partition] = {}
        self._on_rebuild = on_rebuild or (lambda: None)
        self._on_write = on_write or (lambda seconds: None)

    @property
    def partitions(self) -> int | None:
        """The log topic's partition count, once this instance has seen it."""
        return self.topic.partitions

    def _part(self, index: int) -> _Partition:
        part = self._parts.get(index)
        if part is None:
            part = self._parts[index] = _Partition()
        return part

    def ranges_held(self) -> int:
        return self.table.held

    # -- reading ---------------------------------------------------------------------------------
    async def states(self, group: str) -> dict[TopicPartitionKey, CommitState]:
        """The group's current state, read up to the log's end first."""
        await self.catch_up(group)
        return self.table.states(group)

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

    def records(self, group: str) -> dict[TopicPartitionKey, AppliedState]:
        """What this instance holds of the group: key -> (log offset of the record, state)."""
        return self.table.records(group)

    async def catch_up(self, group: str) -> None:
        """Read the group's log partition up to its current end (nothing if the log topic
        does not exist yet)."""
        partitions = await self.topic.partition_count(create=False)
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
                await trio.sleep(_RETRY_PAUSE)  # a leader moving or a broker restarting

    async def _read_to_end(self, index: int, part: _Partition, refresh: bool) -> None:
        """Read from where memory ends to the high watermark the first Fetch reports (the
        end as of the call, or later): one round trip when nothing or little is new, where
        asking the end first (ListOffsets) would take two before every commit that reads
        the log first."""
        address = await self.topic.leader(index, refresh)
        end: int | None = None
        while end is None or part.position < end:
            read = await self.topic.read(address, index, part.position)
            if end is None:
                end = read.high_watermark
                if part.position >= end:
                    break  # every record below the end is in memory
                if not part.loaded:
                    self._on_rebuild()
            if read.log_start is not None:  # compaction/retention moved the start
                part.position = max(part.position, read.log_start)
                continue
            for offset, _timestamp, key, value in read.records:
                self.table.apply(offset, key, value)
            if read.after is None:
                # Nothing readable at this position yet (e.g. an open transaction's
                # boundary): the end we were asked for is the high watermark; stop here.
                if read.high_watermark <= part.position:
                    break
                raise CommitLogError(f"no progress reading {LOG_TOPIC}-{index} at {part.position}")
            part.position = read.after
        part.loaded = True

    async def window(self, group: str, start: int, stop: int | None,
                     keys) -> tuple[dict[TopicPartitionKey, tuple[int, CommitState | None]], int]:
        """The newest record of each of ``keys`` (of ``group``) at an offset in [start, stop)
        (``stop`` None: up to the log's end), read from the log itself: memory keeps only the
        newest record of a key, so one shadowed by a later write is seen only there. Returns
        them with the offset read up to (at least ``stop``). Everything read is applied to
        memory as well."""
        partitions = self.partitions
        if partitions is None:
            raise CommitLogError(f"{LOG_TOPIC} has not been read yet")
        index = group_partition(group, partitions)
        part = self._part(index)
        found: dict[TopicPartitionKey, tuple[int, CommitState | None]] = {}

        async def attempt(refresh: bool) -> int:
            found.clear()
            address = await self.topic.leader(index, refresh)
            position = start
            while True:
                read = await self.topic.read(address, index, position)
                if read.log_start is not None:  # compacted away: nothing newest there
                    position = max(position, read.log_start)
                    continue
                for offset, _timestamp, key, value in read.records:
                    applied = self.table.apply(offset, key, value)
                    if applied is not None and applied[0] == group and applied[1] in keys and \
                            (stop is None or offset < stop):
                        found[applied[1]] = (offset, applied[2])
                if read.after is None:
                    if read.high_watermark <= position and (stop is None or position >= stop):
                        return position
                    raise CommitLogError(f"no progress reading {LOG_TOPIC}-{index} at {position}")
                if position <= part.position:  # memory now holds every record below ``after``
                    part.position = max(part.position, read.after)
                position = read.after
                if position >= read.high_watermark and (stop is None or position >= stop):
                    return position

        async with part.read_lock:
            end = await self._retrying(attempt)
        return found, end

    # -- writing ---------------------------------------------------------------------------------
    async def write(self, group: str, updates: Mapping[TopicPartitionKey, CommitState | None],
                    encoded: dict[TopicPartitionKey, tuple[CommitState, bytes]] | None = None) -> int:
        """Write the new states (None: a tombstone) with acks=all; returns once they are in the
        log, with the log offset of the first of them (-1: unknown, the broker had them from an
        earlier attempt). ``encoded``: values already encoded, used for a key whose state is
        the very one given."""
        if not updates:
            return -1
        partitions = await self.topic.partition_count(create=True)
        assert partitions is not None  # created if it was missing
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
                    await self._send(index, part, batch)
        self._on_write(time.perf_counter() - started)
        if pending.error is not None:
            raise CommitLogError(f"write to {LOG_TOPIC}-{index} failed: {pending.error}") from pending.error
        return pending.offset

    async def _send(self, index: int, part: _Partition, batch: list[_Pending]) -> None:
        """Send the waiting writes of one partition as one batch, and tell each its outcome."""
        records = [record for item in batch for record in item.records]
        try:
            base = await self._retrying(lambda refresh: self.producer.send(index, records, refresh))
        except BaseException as exc:  # noqa: BLE001 - handed to every waiter
            for item in batch:
                item.done, item.error = True, exc
            return
        offset = base
        for item in batch:
            # base -1: the broker had the batch already (a retry); where it lies is unknown.
            item.done, item.offset = True, offset if base >= 0 else -1
            offset += len(item.records)
        if base >= 0 and part.loaded:
            # The written states are in memory at once (a reader that gets there first
            # keeps the newer record: offsets decide).
            for item in batch:
                for number, (owner, key, state) in enumerate(item.updates):
                    self.table.set(owner, key, item.offset + number, state)
            if part.position == base:
                # Nobody else wrote in between: the log is read up to here.
                part.position = base + len(records)
