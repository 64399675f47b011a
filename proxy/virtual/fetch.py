"""Fetch of virtual partitions by standard clients, without I/O: the proxy's own fetch
sessions, one broker read per real partition, and answers every client accepts.

Why the proxy keeps its own fetch sessions: several virtual partitions of one connection
are shares of the same real partition, at different positions; a broker session cannot
hold one partition twice. So a Fetch naming virtual topics is answered by the proxy: it
reads each real partition once (sessionless, at the lowest position any of its shares
asked), splits the records by share, and answers the client's session itself (full and
incremental, KIP-227). A client that adds a virtual topic to a session the broker holds is
told FETCH_SESSION_ID_NOT_FOUND and opens a new one, which is then the proxy's.

The no-stall rule (docs/wire-contract.md#9-virtual-range-topics): a standard client must
never get a partition made only of record-less batches (librdkafka doubles its fetch size
on each such answer and fails after 14), yet its position must move past every record of
other shares, up to the high watermark at the log end. ``compose`` therefore drops the
batches filtering left empty and, where the read went past the share's last record, adds
one control batch (a transaction COMMIT marker without a producer id) whose offsets span
the rest of the read. Every client skips control records and moves its position past the
batch's last offset; none counts it as an empty answer.
"""

from __future__ import annotations

import random
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from proxy.protocol.constants import ErrorCode
from proxy.protocol.message_types import FetchRequest, FetchResponse
from proxy.protocol.message_versions import FETCH_FIRST_TOPIC_ID
from proxy.ranges import KeyRange
from proxy.records.batch import CONTROL_BIT, TRANSACTIONAL_BIT, LegacyBatch, PartialBatch, iter_batches
from proxy.records.builder import build_batch, encode_record
from proxy.records.stripes import Stripe
from proxy.virtual.names import VirtualTopic, share_ranges

RangeSet = tuple[KeyRange, ...]

NO_SESSION = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
MAX_SESSIONS = 64  # per connection; the oldest goes first

_CONTROL_KEY = struct.Struct(">hh").pack(0, 1)  # version 0, type COMMIT
_CONTROL_VALUE = struct.Struct(">hi").pack(0, 0)  # version 0, coordinator epoch 0

TopicKey = str | uuid.UUID  # the topic's name (Fetch v12 and older) or its id (v13+), as the client sent it


@dataclass(slots=True)
class FetchPart:
    """One partition a client fetches, as the proxy serves it."""

    topic: TopicKey
    index: int  # the partition as the client numbers it
    real: str
    real_id: uuid.UUID | None
    real_partition: int
    share: RangeSet | Stripe | None  # None: a real partition, whole
    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1
    shares: int = 0  # K of the virtual topic (0: a real partition)

    @property
    def key(self) -> tuple[TopicKey, int]:
        return self.topic, self.index


@dataclass(slots=True)
class Session:
    id: int
    epoch: int  # the epoch the next request must carry
    parts: dict[tuple[TopicKey, int], FetchPart] = field(default_factory=dict)
    sent: dict[tuple[TopicKey, int], tuple[int, int, int]] = field(default_factory=dict)  # hw, lso, log start


@dataclass(slots=True)
class Resolved:
    """What one Fetch request asks: the partitions to answer, and how."""

    parts: list[FetchPart]
    session: Session | None  # None: sessionless
    incremental: bool
    error: int = ErrorCode.NONE


# (topic name or id, as the client sent it) -> (virtual topic or None, real name, real id); None: unknown topic
Describe = Callable[[TopicKey], "tuple[VirtualTopic | None, str, uuid.UUID | None] | None"]


class VirtualSessions:
    """The virtual-fetch state of one client connection."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self.sessions: dict[int, Session] = {}
        self.served: set[tuple[str, int]] = set()  # real partitions the broker served this connection
        self.out_of_range = OutOfRange()
        self._rng = rng or random.SystemRandom()

    def owns(self, session_id: int) -> bool:
        return session_id in self.sessions

    def resolve(self, body: FetchRequest, describe: Describe) -> Resolved:
        """The partitions of a Fetch request the proxy answers, its session updated."""
        session_id, epoch = body.session_id, body.session_epoch
        if session_id == NO_SESSION:
            parts = _parts(body, describe)
            if epoch == FINAL_EPOCH:
                return Resolved(parts, None, False)
            fresh = self._new_session()
            for part in parts:
                fresh.parts[part.key] = part
            return Resolved(parts, fresh, False)
        session = self.sessions.get(session_id)
        if session is None:
            return Resolved([], None, False, ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
        if epoch == FINAL_EPOCH:
            del self.sessions[session_id]
            return Resolved(_parts(body, describe), None, False)
        if epoch != session.epoch:
            return Resolved([], None, False, ErrorCode.INVALID_FETCH_SESSION_EPOCH)
        session.epoch = _next_epoch(epoch)
        for part in _parts(body, describe):
            session.parts[part.key] = part
        for forgotten in body.forgotten_topics_data or ():
            key = topic_key(forgotten)
            for index in forgotten.partitions:
                session.parts.pop((key, index), None)
                session.sent.pop((key, index), None)
        return Resolved(list(session.parts.values()), session, True)

    def advance(self, part: FetchPart, next_offset: int) -> None:
        """A session partition's position after an answer (its next incremental request
        names it again only if the client's position differs)."""
        part.fetch_offset = max(part.fetch_offset, next_offset)

    def _new_session(self) -> Session:
        while len(self.sessions) >= MAX_SESSIONS:
            del self.sessions[next(iter(self.sessions))]
        while True:
            session_id = self._rng.randrange(1, 1 << 31)
            if session_id not in self.sessions:
                break
        session = self.sessions[session_id] = Session(session_id, 1)
        return session


_NO_ID = uuid.UUID(int=0)


def _next_epoch(epoch: int) -> int:
    return 1 if epoch >= (1 << 31) - 1 else epoch + 1


def topic_key(topic: FetchRequest.FetchTopic | FetchRequest.ForgottenTopic) -> TopicKey:
    """A requested topic's name, or its id when it has one (Fetch v13+; zero before)."""
    topic_id = topic.topic_id
    return topic_id if topic_id != _NO_ID else topic.topic


def _parts(body: FetchRequest, describe: Describe) -> list[FetchPart]:
    parts = []
    for topic in body.topics:
        key = topic_key(topic)
        described = describe(key)
        for partition in topic.partitions:
            if described is None:
                vt, real, real_id = None, "", None
            else:
                vt, real, real_id = described
            parts.append(FetchPart(
                topic=key, index=partition.partition, real=real, real_id=real_id,
                real_partition=vt.real_partition(partition.partition) if vt else partition.partition,
                share=vt.share_of(partition.partition) if vt else None,
                fetch_offset=partition.fetch_offset, max_bytes=partition.partition_max_bytes,
                current_leader_epoch=partition.current_leader_epoch,
                last_fetched_epoch=partition.last_fetched_epoch, shares=vt.shares if vt else 0))
    return parts


# -- the answer of one partition ----------------------------------------------------------------


@dataclass(slots=True)
class Composed:
    records: bytes
    next_offset: int  # where the client's position is after this answer
    records_kept: int  # data records in the answer
    control_added: bool
    # [start, end) the added control batch spans: offsets the read proved hold no record
    # of the share (every record of it in the read is in ``records``); None: none added
    skipped: tuple[int, int] | None = None


def control_batch(first: int, last: int, timestamp_ms: int) -> bytes:
    """A control batch spanning offsets [first, last], holding one COMMIT marker at
    ``last``, without a producer id (so no client relates it to a transaction)."""
    delta = last - first
    record = encode_record(offset_delta=delta, key=_CONTROL_KEY, value=_CONTROL_VALUE)
    return build_batch(base_offset=first, last_offset_delta=delta, records=record, record_count=1,
                       base_timestamp=timestamp_ms, max_timestamp=timestamp_ms,
                       attributes=CONTROL_BIT | TRANSACTIONAL_BIT)


def compose(records: bytes | bytearray | memoryview, position: int, read_end: int | None,
            timestamp_ms: int) -> Composed:
    """A share's answer from its filtered records: the batches holding a record at or
    after ``position`` (control batches and legacy entries included), then, when the read
    went past the last such record (``read_end``: the offset after its last complete
    batch), one control batch from there to ``read_end - 1``.

    Clients differ in what moves a position: Java moves to the last batch's end, librdkafka
    only past a delivered record or a control record. Ending every answer that went
    further than its last record with a control record at ``read_end - 1`` moves both.
    """
    candidates: list[Any] = []
    for entry in iter_batches(records) if records else ():
        if isinstance(entry, PartialBatch):
            break
        if isinstance(entry, LegacyBatch):
            candidates.append(entry)
            continue
        header = entry.header
        if header.last_offset >= position and (header.record_count or header.is_control):
            candidates.append(entry)
    # Only the first batch can hold records behind the position, and only the last one's
    # final record decides where the answer ends: parse those two, not the rest.
    if candidates and not isinstance(candidates[0], LegacyBatch) and candidates[0].header.base_offset < position:
        if _last_record(candidates[0]) < position:
            candidates.pop(0)
    kept = [entry.data for entry in candidates]
    count = sum(1 if isinstance(entry, LegacyBatch) else 0 if entry.header.is_control else entry.header.record_count
                for entry in candidates)
    end = position  # the offset after the last record kept
    if candidates:
        last = candidates[-1]
        end = last.base_offset + 1 if isinstance(last, LegacyBatch) else max(position, _last_record(last) + 1)
    skipped = None
    if read_end is not None and read_end > end:
        kept.append(control_batch(end, read_end - 1, timestamp_ms))
        skipped = (end, read_end)
        end = read_end
    return Composed(b"".join(bytes(part) for part in kept), end, count, skipped is not None, skipped)


def _last_record(batch: Any) -> int:
    """The offset of a batch's last record (-1 if none); compaction and filtering leave
    it below the batch's last offset."""
    last = -1
    for record in batch.records():
        last = record.offset
    return last


# -- the upstream read and the response ---------------------------------------------------------


@dataclass(slots=True)
class Read:
    """One real partition read for the request: from the lowest position of its parts."""

    real: str
    real_id: uuid.UUID | None
    partition: int
    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int
    parts: list[FetchPart] = field(default_factory=list)
    # A probe: the connection's parts are already in the result cache, but the broker has
    # not served this connection that partition yet. The probe asks the broker at the high
    # watermark (normally no records): its success is the broker's leave to serve the cache.
    probe: bool = False
    # Parts left out of the read because their position is below the partition's floor
    # (``OutOfRange``): read from there, the broker would refuse the read of every part.
    below_floor: list[FetchPart] = field(default_factory=list)


ProbeAt = Callable[[FetchPart], "int | None"]
FloorOf = Callable[[tuple[str, int]], "int | None"]


def plan_reads(parts: list[FetchPart], skip: set[tuple[TopicKey, int]],
               probe_at: ProbeAt | None = None, floor_of: FloorOf | None = None) -> list[Read]:
    """The broker reads for ``parts`` (leaving out those in ``skip``, served otherwise).

    ``probe_at(part)``: the offset to probe at when the cache can answer ``part`` once the
    broker has served this connection its partition, else None. A partition becomes a probe
    only when every one of its parts can (a real read answers them all anyway).

    ``floor_of(partition)``: the position below which the broker last refused this
    connection the partition (``OutOfRange.floor``). Parts below it go to the read's
    ``below_floor`` when another part is at or above it, so that the read starts at the
    lowest position the broker can serve; when none is, the read starts at the lowest
    position as usual and the broker decides again."""
    grouped: dict[tuple[str, int], list[FetchPart]] = {}
    for part in parts:
        if part.key in skip or not part.real:
            continue
        grouped.setdefault((part.real, part.real_partition), []).append(part)
    reads = []
    for partition, members in grouped.items():
        below: list[FetchPart] = []
        floor = floor_of(partition) if floor_of is not None else None
        if floor is not None and any(part.fetch_offset >= floor for part in members):
            below = [part for part in members if part.fetch_offset < floor]
            members = [part for part in members if part.fetch_offset >= floor]
        first = members[0]
        reads.append(Read(first.real, first.real_id, first.real_partition,
                          min(part.fetch_offset for part in members), max(part.max_bytes for part in members),
                          first.current_leader_epoch, members, below_floor=below))
    if probe_at is not None:
        for read in reads:
            offsets = [probe_at(part) for part in read.parts]
            if all(offset is not None for offset in offsets) and all(part.share for part in read.parts):
                read.probe = True
                read.fetch_offset = max(offset for offset in offsets if offset is not None)
    return reads


class OutOfRange:
    """Which positions of a real partition the broker refused this connection with
    OFFSET_OUT_OF_RANGE, so that one share's position does not cost the others theirs.

    One read serves every share a connection holds of a partition, from the lowest
    position. When that position is out of range (retention moved the log start past a
    lagging share) the broker refuses the whole read, but the error belongs only to the
    shares whose own position is out of range: a share told so at a valid position resets
    (to the log end, with the clients' default auto.offset.reset=latest) and loses its
    records up to there. So the error goes only to the parts known to be out of range: at
    the refused position, or below the log start when the broker reports it (Kafka does
    not: it answers -1 with that error). The others get an answer without records or
    error, and the client asks again; the next read starts at the lowest position at or
    above the partition's ``floor`` (above the refused position, and at least the log
    start), the parts below the floor waiting. A successful read tells the log start,
    which only grows: the parts that waited below it get the error, the others are read.

    No loop: each refusal raises the floor above the refused position and never above a
    valid position, so a valid part is read within as many round trips as its connection
    has parts of the partition at distinct lower positions. When every part is below the
    floor the read starts at the lowest again and the broker decides. A floor is kept only
    while some part waits below it. A wrong error would lose records; a wrong empty answer
    costs a round trip, hence the error only where it is known."""

    def __init__(self) -> None:
        self._floors: dict[tuple[str, int], int] = {}

    def floor(self, partition: tuple[str, int]) -> int | None:
        return self._floors.get(partition)

    def refused(self, read: Read, log_start: int) -> list[FetchPart]:
        """The broker answered OFFSET_OUT_OF_RANGE to ``read``: the parts the error belongs
        to (the others get no records and no error). ``log_start``: as the broker reported
        it, -1 when it did not."""
        self._floors[(read.real, read.partition)] = max(read.fetch_offset + 1, log_start)
        return [part for part in read.parts + read.below_floor
                if part.fetch_offset == read.fetch_offset or part.fetch_offset < log_start]

    def served(self, read: Read, log_start: int) -> list[FetchPart]:
        """``read`` succeeded: the parts it left out that are below ``log_start`` (out of
        range; -1: not reported, none is known to be)."""
        partition = (read.real, read.partition)
        refused = [part for part in read.below_floor if 0 <= log_start and part.fetch_offset < log_start]
        if refused:
            self._floors[partition] = log_start
        else:
            self._floors.pop(partition, None)
        return refused


def every_share(parts: list[FetchPart]) -> list[RangeSet]:
    """Every share of the virtual topics ``parts`` read: a read of a real partition is
    split into all of them, so that the members of a group that start after the first one
    (at the same position, as a group starts) find their shares in the cache."""
    counts = sorted({part.shares for part in parts if part.shares and not isinstance(part.share, Stripe)})
    return [(share,) for count in counts for share in share_ranges(count)]


def every_stripe_count(parts: list[FetchPart]) -> list[int]:
    """The K of every striped topic ``parts`` read: a read is cut into all K stripes."""
    return sorted({part.share.count for part in parts if isinstance(part.share, Stripe)})


class RecentReads:
    """The stretches of each real partition recently read from the broker for virtual
    partitions, and the last high watermark seen: a position inside such a stretch may
    have its share in the result cache (the other shares of a read are cached), so a
    connection the broker has not served yet probes instead of reading it all again.
    A stretch counts only for consumers of the isolation level it was read at, the only
    ones its cached shares serve.
    Bounded: ``per_partition`` stretches per partition, ``max_partitions`` partitions."""

    def __init__(self, per_partition: int = 8, max_partitions: int = 10_000) -> None:
        self.per_partition = per_partition
        self.max_partitions = max_partitions
        self._reads: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
        self._high_watermark: dict[tuple[str, int], int] = {}

    def add(self, partition: tuple[str, int], start: int, end: int | None, high_watermark: int,
            isolation_level: int) -> None:
        """A successful read of ``partition`` from ``start`` up to ``end`` (exclusive;
        None: it held no complete batch) at ``isolation_level``."""
        if high_watermark >= 0:
            self._high_watermark[partition] = high_watermark
        if end is None or end <= start:
            return
        stretches = self._reads.pop(partition, None)
        if stretches is None:
            stretches = []
            while len(self._reads) >= self.max_partitions:
                oldest = next(iter(self._reads))
                del self._reads[oldest]
                self._high_watermark.pop(oldest, None)
        stretches.append((start, end, isolation_level))
        del stretches[:-self.per_partition]
        self._reads[partition] = stretches  # most recently read partitions last

    def at_log_end(self, partition: tuple[str, int], position: int) -> bool:
        """Whether ``position`` is at (or past) the last high watermark seen: a read there
        is a long poll that brings nothing to wait for. Unknown before the first read, so
        consumers that start together wait for the first one's read."""
        high_watermark = self._high_watermark.get(partition)
        return high_watermark is not None and position >= high_watermark

    def probe_offset(self, partition: tuple[str, int], position: int, isolation_level: int) -> int | None:
        """Where to probe ``partition`` for a consumer at ``position``: the last high
        watermark seen, when a recent read at ``isolation_level`` covered ``position``;
        else None."""
        high_watermark = self._high_watermark.get(partition)
        if high_watermark is None or high_watermark < position:
            return None
        for start, end, level in self._reads.get(partition, ()):
            if start <= position < end and level == isolation_level:
                return high_watermark
        return None

    def forget(self, partition: tuple[str, int]) -> None:
        """The broker refused a probe at the last high watermark seen (it went back): no
        more probes there, or the connection would probe the same offset forever."""
        self._reads.pop(partition, None)
        self._high_watermark.pop(partition, None)


def upstream_request(client: FetchRequest, version: int, reads: list[Read], *,
                     max_wait_ms: int | None = None) -> FetchRequest:
    """A sessionless Fetch of ``reads``, at the client's version, limits and isolation."""
    cls = FetchRequest
    by_topic: dict[str, FetchRequest.FetchTopic] = {}
    for read in reads:
        topic = by_topic.get(read.real)
        if topic is None:
            topic = by_topic[read.real] = cls.FetchTopic(topic=read.real, partitions=[])
            if version >= FETCH_FIRST_TOPIC_ID:
                topic.topic_id = read.real_id  # type: ignore[assignment]  # None if unknown: the encode refuses it
        # No last fetched epoch: with one, a broker whose log diverged answers no records
        # and a DivergingEpoch (or OFFSET_OUT_OF_RANGE for an epoch it lacks) for the whole
        # read, from the lowest share's position; neither belongs to the other shares, and
        # the client's answer has nowhere per share to carry it, so they would stall or reset.
        # Consumers send none either (Java and librdkafka leave it to followers): they detect
        # truncation with OffsetsForLeaderEpoch, answered per share (rewrite.py).
        topic.partitions.append(cls.FetchPartition(
            partition=read.partition, current_leader_epoch=read.current_leader_epoch, fetch_offset=read.fetch_offset,
            last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=read.max_bytes))
    body = cls()
    body.replica_id = client.replica_id
    body.max_wait_ms = client.max_wait_ms if max_wait_ms is None else max_wait_ms
    body.min_bytes = client.min_bytes
    body.max_bytes = client.max_bytes
    body.isolation_level = client.isolation_level
    body.session_id = NO_SESSION
    body.session_epoch = FINAL_EPOCH
    body.topics = list(by_topic.values())
    body.forgotten_topics_data = []
    body.rack_id = client.rack_id or ""
    return body


@dataclass(slots=True)
class PartAnswer:
    """What one partition of the client's request gets."""

    error_code: int = ErrorCode.NONE
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted_transactions: list = field(default_factory=list)
    records: bytes = b""


def client_response(version: int, resolved: Resolved, answers: dict[tuple[TopicKey, int], PartAnswer],
                    throttle_ms: int = 0) -> FetchResponse:
    """The client's Fetch response: every partition on a full request, on an incremental
    one only those with records, an error or new offsets (as a broker session does)."""
    cls = FetchResponse
    response = cls()
    response.throttle_time_ms = throttle_ms
    response.error_code = int(resolved.error)
    session = resolved.session
    response.session_id = session.id if session is not None else NO_SESSION
    response.responses = []
    if resolved.error != ErrorCode.NONE:
        return response
    topics: dict[TopicKey, FetchResponse.FetchableTopicResponse] = {}
    for part in resolved.parts:
        answer = answers.get(part.key) or PartAnswer(error_code=int(ErrorCode.UNKNOWN_SERVER_ERROR))
        offsets = (answer.high_watermark, answer.last_stable_offset, answer.log_start_offset)
        if session is not None:
            changed = session.sent.get(part.key) != offsets
            session.sent[part.key] = offsets
            if resolved.incremental and not changed and not answer.records and answer.error_code == ErrorCode.NONE:
                continue
        topic = topics.get(part.topic)
        if topic is None:
            if isinstance(part.topic, uuid.UUID):
                topic = cls.FetchableTopicResponse(topic_id=part.topic, partitions=[])
            else:
                topic = cls.FetchableTopicResponse(topic=part.topic, partitions=[])
            topics[part.topic] = topic
            response.responses.append(topic)
        topic.partitions.append(cls.PartitionData(
            partition_index=part.index, error_code=int(answer.error_code), high_watermark=answer.high_watermark,
            last_stable_offset=answer.last_stable_offset, log_start_offset=answer.log_start_offset,
            aborted_transactions=list(answer.aborted_transactions) if answer.aborted_transactions else [],
            preferred_read_replica=-1, records=answer.records))
    return response
