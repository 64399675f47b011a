"""The I/O edge of replicated cooperative grants (``proxy.coop.grants``): the compacted topic
``__cooperative_fetch_grants``, a reader per log partition this instance serves keys of,
and proposals appended with acks=all by the idempotent producer of the individual-commit
log (``proxy.commits.producer``; the topic is found or created by ``proxy.commits.cluster``'s
``LogTopic``, with the partition count and replication factor of ``__consumer_offsets``).

A key (group, topic, partition) lives in the log partition of its group, as Kafka maps
groups to ``__consumer_offsets``. The first time this instance serves a key of a log
partition it reads that partition from its start to its end, then keeps following it
(long-polling Fetch; other instances' records gathered for a tenth of a second, this
instance's own read back at once): every record of every key of the partition is read in
log order, so the state of the keys it serves is never older than what it has read.
This instance's own asks are placed as they come (a fetch waits for their chunks); the
other instances' are noted, and the state is rebuilt from the newest of them when a fetch
of this instance reads it (``KeyGrants.note``): an instance's work on the log follows its
own fetches, not every instance's.

An ask is appended, then the proposer waits until its reader has applied it and takes
the chunk the state machine assigned it (or none). Proposals of one log partition that meet travel in one
batch. A log that cannot be written or read within ``timeout`` raises ``CommitLogError``:
the caller hands out no chunk.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from dataclasses import dataclass, field

import trio

from proxy.commits.cluster import ClusterClient, CommitLogError, LogTopic
from proxy.commits.producer import IdempotentProducer
from proxy.coop.grants import (
    Decision,
    Grant,
    GrantFormatError,
    GroupPartitionKey,
    KeyGrants,
    decode_grant,
    decode_key,
    encode_grant,
    encode_key,
    peek_instance,
)
from proxy.net.broker_connection import BrokerConnectionError
from proxy.pipeline.background import Background
from proxy.protocol.errors import ProtocolError
from proxy.protocol.groups import group_partition

log = logging.getLogger("proxy.coop.grants")

GRANTS_TOPIC = "__cooperative_fetch_grants"
SEGMENT_BYTES = 16 << 20
MIN_COMPACTION_LAG_MS = 3_600_000  # compaction keeps every record younger (at least twice the lease)

_FOLLOW_WAIT_MS = 500  # a reader's long poll
_GATHER_S = 0.1  # after a read, while no record of this instance is awaited: the wait before the next read
_RETRY_PAUSE = 0.1
_ERRORS = (CommitLogError, BrokerConnectionError, OSError, trio.TooSlowError, ProtocolError)


@dataclass
class _Waiting:
    """An ask, between its append and its chunk."""

    done: trio.Event = field(default_factory=trio.Event)
    decision: Decision | None = None


@dataclass
class _Pending:
    """Proposals waiting to travel in their log partition's next batch."""

    records: list[tuple[bytes, bytes | None]]
    done: bool = False
    error: BaseException | None = None


@dataclass
class Proposal:
    """An ask queued for its log partition's next write (``GrantLog.submit``)."""

    number: int  # the ask's proposal number
    part: _Partition
    pending: _Pending
    waiting: _Waiting
    submitted: float  # when it joined the queue (trio clock)


@dataclass
class _Partition:
    """This instance's reader of one log partition."""

    index: int
    position: int = 0  # every record below it is applied
    applied: tuple[int, int] = (-1, -1)  # the offset and log-append time of the newest record applied
    loaded: trio.Event = field(default_factory=trio.Event)  # read to its end once
    healthy: bool = False  # the last read succeeded
    write_lock: trio.Lock = field(default_factory=trio.Lock)
    pending: list[_Pending] = field(default_factory=list)
    unread: int = 0  # records this instance appended and has not applied yet
    written: trio.Event = field(default_factory=trio.Event)  # set by an append of this instance


class GrantLog:
    def __init__(self, cluster: ClusterClient, background: Background, *, lease_ms: int, timeout: float = 5.0,
                 instance: str | None = None) -> None:
        self.cluster = cluster
        self.background = background
        self.timeout = timeout
        self.instance = instance or uuid.uuid4().hex[:16]
        lag = max(MIN_COMPACTION_LAG_MS, 2 * lease_ms)
        self.topic = LogTopic(cluster, name=GRANTS_TOPIC, segment_bytes=SEGMENT_BYTES, timeout=timeout, configs={
            "message.timestamp.type": "LogAppendTime", "min.compaction.lag.ms": str(lag)})
        self.producer = IdempotentProducer(self.topic)
        self.states: dict[GroupPartitionKey, KeyGrants] = {}
        self._parts: dict[int, _Partition] = {}
        self._key_parts: dict[GroupPartitionKey, _Partition] = {}
        self._waiting: dict[int, _Waiting] = {}
        self._proposals = itertools.count(1)

    def next_proposal(self) -> int:
        return next(self._proposals)

    # -- reading ---------------------------------------------------------------------------------
    async def state(self, key: GroupPartitionKey) -> KeyGrants:
        """The key's grants, its log partition read to its end at least once and followed
        from then on. Raises ``CommitLogError`` when the log cannot be read in time."""
        index = await self._index(key, create=True)
        part = self._parts.get(index)
        if part is None:
            part = self._parts[index] = _Partition(index)
            self.background.start_soon(self._follow, index, part)
        if not part.loaded.is_set():
            with trio.move_on_after(self.timeout):
                await part.loaded.wait()
            if not part.loaded.is_set():
                raise CommitLogError(f"{GRANTS_TOPIC}-{index} could not be read to its end")
        state = self.states.get(key)
        if state is None:
            state = self.states[key] = KeyGrants()
        self._key_parts[key] = part
        return state

    def view(self, key: GroupPartitionKey) -> tuple[int, int]:
        """The offset and log-append time of the newest record applied of ``key``'s log
        partition (any key's; (-1, -1): none): what an ask of ``key`` made now is based on."""
        part = self._key_parts.get(key)
        return (-1, -1) if part is None else part.applied

    async def _index(self, key: GroupPartitionKey, create: bool) -> int:
        try:
            partitions = await self.topic.partition_count(create=create)
        except _ERRORS as exc:
            raise CommitLogError(f"{GRANTS_TOPIC} unavailable: {exc}") from exc
        assert partitions is not None
        return group_partition(key[0], partitions)

    async def _follow(self, index: int, part: _Partition) -> None:
        """Read log partition ``index`` for as long as the proxy runs, applying each record.

        A read that leaves none of this instance's records awaited is followed by the next
        one after ``_GATHER_S`` at most, or as soon as this instance appends: each instance reads
        the others' asks in bunches (a few reads a second) instead of once per ask of any
        instance, and its own ask, which a fetch waits for, still at once."""
        refresh = False
        target: int | None = None  # the end to reach before the partition counts as loaded
        while True:
            try:
                address = await self.topic.leader(index, refresh)
                if target is None and not part.loaded.is_set():
                    target = await self.topic.end_offset(address, index, timeout=self.timeout)
                wait = 0 if not part.loaded.is_set() else _FOLLOW_WAIT_MS
                read = await self.topic.read(address, index, part.position, wait_ms=wait,
                                             timeout=self.timeout + wait / 1000)
                refresh = False
                part.healthy = True
            except _ERRORS as exc:
                if part.healthy:
                    log.warning("cooperative grants: cannot read %s-%d reason=%r", GRANTS_TOPIC, index, str(exc))
                part.healthy = False
                refresh = True
                await trio.sleep(_RETRY_PAUSE)
                continue
            if read.log_start is not None:
                part.position = max(part.position, read.log_start)  # compaction or retention moved the start
                continue
            for offset, ms, key, value in read.records:
                if self._apply(offset, ms, key, value):
                    part.unread = max(0, part.unread - 1)
                part.applied = (offset, ms)
            if read.after is not None:
                part.position = max(part.position, read.after)
            if target is not None and part.position >= target:
                part.loaded.set()
                target = None
            if read.records and part.loaded.is_set() and not part.unread:
                with trio.move_on_after(_GATHER_S):
                    await part.written.wait()
            if part.written.is_set():
                part.written = trio.Event()

    def _apply(self, offset: int, ms: int, raw_key: bytes | memoryview, value: bytes | memoryview | None) -> bool:
        """Apply one record; whether this instance appended it. Another instance's ask is
        only noted (``KeyGrants.note``): its snapshot is decoded if the key's state is next
        read from it."""
        try:
            key = decode_key(raw_key)
            if value is None:  # a tombstone: the key's grants are over
                self.states.pop(key, None)
                return False
            own = peek_instance(value) == self.instance
            grant = decode_grant(value, held=own)
            if not own and (grant.fixed or grant.reset):
                grant = decode_grant(value)
        except GrantFormatError as exc:
            log.warning("cooperative grants: record %d skipped reason=%r", offset, str(exc))
            return False
        state = self.states.get(key)
        if state is None:
            state = self.states[key] = KeyGrants()
        if offset <= state.offset:
            return False
        if not (own or grant.fixed or grant.reset):
            state.note(offset, ms, grant, bytes(value))
            return False
        decision = state.apply(offset, ms, grant)
        if grant.instance != self.instance:
            return False
        waiting = self._waiting.pop(grant.proposal, None)
        if waiting is not None:
            waiting.decision = decision
            waiting.done.set()
        return True

    # -- proposing -------------------------------------------------------------------------------
    def submit(self, key: GroupPartitionKey, grant: Grant) -> Proposal:
        """Queue ``grant`` for its log partition's next write now, so that this instance's
        asks reach the log in the order it decided them (an ask decided after another goes
        around the chunk that one expects: appended first, it would be placed below it).
        ``state(key)`` comes first; ``outcome`` writes it and waits for its chunk."""
        part = self._key_parts.get(key)
        if part is None:
            raise CommitLogError(f"the grants of {key} were never read")
        waiting = self._waiting[grant.proposal] = _Waiting()
        pending = _Pending([(encode_key(*key), encode_grant(grant))])
        part.pending.append(pending)
        return Proposal(grant.proposal, part, pending, waiting, trio.current_time())

    async def outcome(self, proposal: Proposal) -> Decision:
        """Write ``proposal`` (with whatever else is queued) and wait until this instance
        applied it. Raises ``CommitLogError`` past ``timeout``."""
        part, pending, waiting = proposal.part, proposal.pending, proposal.waiting
        try:
            with trio.move_on_after(self.timeout) as scope:
                await self._flush(part, pending)
                await waiting.done.wait()
            if scope.cancelled_caught:
                raise CommitLogError(f"grant {proposal.number} not read back from {GRANTS_TOPIC}-{part.index} "
                                     "in time")
            assert waiting.decision is not None
            return waiting.decision
        finally:
            self.withdraw(proposal)

    def withdraw(self, proposal: Proposal) -> None:
        """Stop waiting for ``proposal``, and take it out of the queue if it was never sent
        (its fetch ended first: nobody would be handed its chunk)."""
        self._waiting.pop(proposal.number, None)
        queue = proposal.part.pending
        if not proposal.pending.done and proposal.pending in queue:
            queue.remove(proposal.pending)

    async def _flush(self, part: _Partition, pending: _Pending) -> None:
        async with part.write_lock:
            if not pending.done:
                batch, part.pending = part.pending, []
                with trio.CancelScope(shield=True):  # the producer's sequence must not be left half-sent
                    with trio.move_on_after(self.timeout):
                        await self._send(part.index, batch)
                for item in batch:
                    if not item.done:
                        item.done, item.error = True, CommitLogError("write timed out")
                appended = sum(len(item.records) for item in batch if item.error is None)
                if appended:  # the reader reads them back at once
                    part.unread += appended
                    part.written.set()
        if pending.error is not None:
            raise CommitLogError(f"write to {GRANTS_TOPIC}-{part.index} failed: {pending.error}") from pending.error

    async def _send(self, index: int, batch: list[_Pending]) -> None:
        records = [record for item in batch for record in item.records]
        refresh = False
        while True:
            try:
                await self.producer.send(index, records, refresh)
            except _ERRORS as exc:
                log.debug("retrying a grants write reason=%r", str(exc))
                refresh = True
                await trio.sleep(_RETRY_PAUSE)
                continue
            for item in batch:
                item.done = True
            return
