"""The consumer's pure parts: what poll returns, turning a fetched partition into records
(aborted transactions, control batches, key ranges), per-partition buffers with fair
rotation (KIP-387), and lag from cached fetch metadata (KIP-695)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from proxy.client.errors import KafkaError
from proxy.protocol.constants import MAX_ARRAY_ELEMENTS, ErrorCode
from proxy.protocol.errors import ProtocolError
from proxy.ranges import KeyRange, contains
from proxy.records import kernels
from proxy.records.batch import TIMESTAMP_TYPE_BIT, LegacyBatch, PartialBatch, Record, RecordBatch, iter_batches
from proxy.records.keyhash import key_hash
from proxy.records.plan import RangePlan
from proxy.records.transactions import TransactionFilter, Verdict
from proxy.records.varint import VARINT_MAX_BYTES, VARLONG_MAX_BYTES, read_varint

# The Records field of a fetched partition, as the response decoder hands it over.
RecordsBlob = bytes | bytearray | memoryview


class TopicPartition(NamedTuple):
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class ConsumerRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class FetchMetadata:
    """What the latest fetch response said about a partition (KIP-695), with the position
    after the records this poll returned. ``end_offset`` is the high watermark under
    read_uncommitted and the last stable offset under read_committed."""

    received_time: float  # time.time() when the response arrived
    position: int
    lag: int
    log_start_offset: int
    end_offset: int


@dataclass
class ConsumerRecords:
    """What one ``poll`` returns: records in the order served, grouped per partition, and
    fetch metadata for every partition that returned records or got a fetch response."""

    by_partition: dict[TopicPartition, list[ConsumerRecord]] = field(default_factory=dict)
    fetch_metadata: dict[TopicPartition, FetchMetadata] = field(default_factory=dict)

    def __iter__(self) -> Iterator[ConsumerRecord]:
        for records in self.by_partition.values():
            yield from records

    def __len__(self) -> int:
        return sum(len(records) for records in self.by_partition.values())

    def __bool__(self) -> bool:
        return len(self) > 0

    def partitions(self) -> list[TopicPartition]:
        return list(self.by_partition)

    def records(self, tp: TopicPartition) -> list[ConsumerRecord]:
        return self.by_partition.get(tp, [])

    def metadata(self) -> dict[TopicPartition, FetchMetadata]:
        return dict(self.fetch_metadata)


@dataclass
class ParsedPartition:
    records: list[ConsumerRecord]
    # Where the next fetch starts: past every batch read, those a proxy's filter emptied
    # too, so it may be taken only when that filter kept every record of the consumer's
    # ranges (fetch_protocol.apply_partition checks KeyRangesApplied first).
    next_offset: int
    outside_ranges: int = 0  # records dropped because their key hash is not assigned
    aborted: int = 0  # records dropped as part of aborted transactions
    truncated: bool = False  # the blob ended with an incomplete entry
    # Offsets at or above the fetch offset that nobody will ever process (gap amending):
    # control batches, aborted transactions, and for a whole partition every offset
    # between the records returned (removed by compaction, say).
    gaps: list[tuple[int, int]] = field(default_factory=list)


def parse_partition(
    tp: TopicPartition,
    blob: RecordsBlob | None,
    fetch_offset: int,
    *,
    aborted_transactions: Iterable[tuple[int, int]] = (),
    read_committed: bool = False,
    ranges: Sequence[KeyRange] | None = None,
    amend_gaps: bool = True,
) -> ParsedPartition:
    """The records of one fetched partition the application may see.

    Records below ``fetch_offset`` (a compressed batch may start before it) are skipped.
    Control batches are never returned. Under read_committed a transactional batch of a
    producer with an open aborted transaction (``(producer_id, first_offset)`` from the
    response, active from its first offset until that producer's ABORT marker) is dropped,
    as Kafka consumers do. With ``ranges``, a record whose key hash is outside them is
    dropped and counted. With ``amend_gaps``, ``gaps`` lists the offsets no consumer will
    process (only individual commit needs them).
    """
    out = ParsedPartition([], fetch_offset)
    if not blob:
        return out
    # A ranged partition's gaps are its control and aborted batches, seen while reading; a
    # whole partition's are every offset the fetch passed over without a record.
    _read_batches(out, tp, blob, fetch_offset, aborted_transactions, read_committed, ranges,
                  batch_gaps=amend_gaps and bool(ranges))
    if amend_gaps and not ranges:
        cursor = fetch_offset
        for record in out.records:
            if record.offset > cursor:
                out.gaps.append((cursor, record.offset - 1))
            cursor = record.offset + 1
        if out.next_offset > cursor:
            out.gaps.append((cursor, out.next_offset - 1))
    return out


def _read_batches(out: ParsedPartition, tp: TopicPartition, blob: RecordsBlob, fetch_offset: int,
                  aborted_transactions: Iterable[tuple[int, int]], read_committed: bool,
                  ranges: Sequence[KeyRange] | None, batch_gaps: bool) -> None:
    transactions = TransactionFilter(aborted_transactions, read_committed)
    for entry in iter_batches(blob):
        if isinstance(entry, PartialBatch):
            out.truncated = True
            break
        if isinstance(entry, LegacyBatch):
            raise KafkaError(f"{tp.topic}-{tp.partition} holds a magic v{entry.magic} message set at offset "
                             f"{entry.base_offset}; this consumer reads record batches (magic 2) only",
                             code=ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT,
                             name="UNSUPPORTED_FOR_MESSAGE_FORMAT")
        header = entry.header
        if header.next_offset <= fetch_offset:
            continue
        out.next_offset = max(out.next_offset, header.next_offset)
        verdict = transactions.verdict(entry)
        if verdict is not Verdict.DELIVER:
            if verdict is Verdict.ABORTED:
                out.aborted += header.record_count
            if batch_gaps:  # nobody processes these offsets: they are committed as gaps
                out.gaps.append((max(header.base_offset, fetch_offset), header.last_offset))
            continue
        _read_records(out, tp, entry, fetch_offset, ranges)


def _read_records(out: ParsedPartition, tp: TopicPartition, entry: RecordBatch, fetch_offset: int,
                  ranges: Sequence[KeyRange] | None) -> None:
    """The kept records of one data batch. The ranges are checked for the whole batch at
    once by the record kernels (C when built: no key hashed in Python), and the records are
    decoded by a flat loop; a batch that loop cannot take (malformed, say) goes through the
    strict record parser, which raises the precise error."""
    header = entry.header
    payload = entry.records_payload()
    inside: set[int] | None = None
    try:
        if ranges:
            plan = _plan(ranges)
            matched, total = kernels.match(payload, 0, len(payload), header.base_offset, plan.bounds,
                                           plan.members, 1)
            if total != header.record_count:
                raise _Irregular
            if len(matched[0]) != total:
                inside = set(matched[0])
        decoded = _decode(bytes(payload), header.base_offset, header.base_timestamp,
                          header.max_timestamp if header.attributes & TIMESTAMP_TYPE_BIT else None,
                          header.record_count, fetch_offset, tp)
    except (_Irregular, ProtocolError):
        for record in entry.records():
            _keep(out, tp, record, fetch_offset, ranges)
        return
    if inside is None:
        out.records += decoded
        return
    for kept in decoded:
        if kept.offset in inside:
            out.records.append(kept)
        else:
            out.outside_ranges += 1


class _Irregular(Exception):
    """A batch the flat decoder leaves to the strict parser."""


def _varint(buf: bytes, pos: int, end: int, max_bytes: int = VARINT_MAX_BYTES) -> tuple[int, int]:
    try:
        return read_varint(buf, pos, end, max_bytes)
    except ProtocolError:
        raise _Irregular from None


def _decode(buf: bytes, base_offset: int, base_timestamp: int, log_append_time: int | None, record_count: int,
            fetch_offset: int, tp: TopicPartition) -> list[ConsumerRecord]:
    """The records at or above ``fetch_offset`` of an uncompressed records section, for
    the application: the common cases (varints of one or two bytes) inline, framing still
    checked (every field inside its record, the section filled exactly, the declared
    count); anything else raises ``_Irregular``. A hot loop, kept whole on purpose: it runs
    once per record the consumer receives, and a call per field would double its cost."""
    topic, partition = tp
    out: list[ConsumerRecord] = []
    append = out.append
    end = len(buf)
    pos = 0
    count = 0
    try:
        while pos < end:
            u = buf[pos]
            if u < 0x80:
                pos += 1
                length = (u >> 1) ^ -(u & 1)
            elif buf[pos + 1] < 0x80:
                u = (u & 0x7F) | (buf[pos + 1] << 7)
                pos += 2
                length = (u >> 1) ^ -(u & 1)
            else:
                length, pos = _varint(buf, pos, end)
            rec_end = pos + length
            if length < 1 or rec_end > end:
                raise _Irregular
            pos += 1  # attributes
            u = buf[pos]
            if u < 0x80:
                pos += 1
                ts_delta = (u >> 1) ^ -(u & 1)
            else:
                ts_delta, pos = _varint(buf, pos, rec_end, VARLONG_MAX_BYTES)
            u = buf[pos]
            if u < 0x80:
                pos += 1
                off_delta = (u >> 1) ^ -(u & 1)
            elif buf[pos + 1] < 0x80:
                u = (u & 0x7F) | (buf[pos + 1] << 7)
                pos += 2
                off_delta = (u >> 1) ^ -(u & 1)
            else:
                off_delta, pos = _varint(buf, pos, rec_end)
            u = buf[pos]
            if u < 0x80:
                pos += 1
                n = (u >> 1) ^ -(u & 1)
            else:
                n, pos = _varint(buf, pos, rec_end)
            if n < 0:
                if n != -1:
                    raise _Irregular
                key = None
            else:
                if pos + n > rec_end:
                    raise _Irregular
                key = buf[pos:pos + n]
                pos += n
            u = buf[pos]
            if u < 0x80:
                pos += 1
                n = (u >> 1) ^ -(u & 1)
            elif buf[pos + 1] < 0x80:
                u = (u & 0x7F) | (buf[pos + 1] << 7)
                pos += 2
                n = (u >> 1) ^ -(u & 1)
            else:
                n, pos = _varint(buf, pos, rec_end)
            if n < 0:
                if n != -1:
                    raise _Irregular
                value = None
            else:
                if pos + n > rec_end:
                    raise _Irregular
                value = buf[pos:pos + n]
                pos += n
            if pos >= rec_end:
                raise _Irregular
            headers: tuple[tuple[str, bytes | None], ...] = ()
            if buf[pos] == 0:
                pos += 1
            else:
                headers, pos = _headers(buf, pos, rec_end)
            if pos != rec_end:
                raise _Irregular
            count += 1
            offset = base_offset + off_delta
            if offset >= fetch_offset:
                append(ConsumerRecord(topic, partition, offset,
                                      base_timestamp + ts_delta if log_append_time is None else log_append_time,
                                      key, value, headers))
    except IndexError:
        raise _Irregular from None
    if count != record_count:
        raise _Irregular
    return out


def _headers(buf: bytes, pos: int, end: int) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    count, pos = _varint(buf, pos, end)
    if count < 0 or count > MAX_ARRAY_ELEMENTS:  # the strict parser names the fault
        raise _Irregular
    headers = []
    for _ in range(count):
        n, pos = _varint(buf, pos, end)
        if n < 0 or pos + n > end:
            raise _Irregular
        name = buf[pos:pos + n].decode("utf-8", "replace")
        pos += n
        n, pos = _varint(buf, pos, end)
        if n < -1 or pos + n > end:
            raise _Irregular
        value = None if n == -1 else buf[pos:pos + n]
        pos += max(n, 0)
        headers.append((name, value))
    return tuple(headers), pos


_PLANS: dict[tuple[KeyRange, ...], RangePlan] = {}


def _plan(ranges: Sequence[KeyRange]) -> RangePlan:
    """The kernels' lookup for one assignment's ranges (a handful per process; bounded)."""
    key = tuple(ranges)
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= 64:
            _PLANS.clear()
        plan = _PLANS[key] = RangePlan([key])
    return plan


def _keep(out: ParsedPartition, tp: TopicPartition, record: Record, fetch_offset: int,
          ranges: Sequence[KeyRange] | None) -> None:
    if record.offset < fetch_offset:
        return
    if ranges and not contains(ranges, key_hash(record.key, record.offset)):
        out.outside_ranges += 1
        return
    out.records.append(ConsumerRecord(
        tp.topic, tp.partition, record.offset, record.timestamp,
        None if record.key is None else bytes(record.key),
        None if record.value is None else bytes(record.value),
        tuple((bytes(h.key).decode("utf-8", "replace"), None if h.value is None else bytes(h.value))
              for h in record.headers),
    ))


class PartitionBuffer:
    """Fetched records not yet returned, and where the partition's next fetch starts."""

    __slots__ = ("records", "next_fetch_offset")

    def __init__(self, records: Iterable[ConsumerRecord], next_fetch_offset: int) -> None:
        self.records = deque(records)
        self.next_fetch_offset = next_fetch_offset


class FairBuffers:
    """Per-partition buffers drained in a rotation over the assigned partitions (KIP-387).

    A drain serves partitions in assignment order starting at ``start``; each partition
    gives what it has until ``max_records`` is reached. The next drain starts with the
    partition after the last one served, so a partition with a deep buffer cannot keep
    every poll to itself.
    """

    def __init__(self) -> None:
        self.order: list[TopicPartition] = []
        self.buffers: dict[TopicPartition, PartitionBuffer] = {}
        self.start = 0

    def set_partitions(self, partitions: Sequence[TopicPartition]) -> None:
        previous = self.order[self.start] if self.order and self.start < len(self.order) else None
        self.order = list(partitions)
        for tp in list(self.buffers):
            if tp not in self.order:
                del self.buffers[tp]
        self.start = self.order.index(previous) if previous in self.order else 0

    def add(self, tp: TopicPartition, records: Iterable[ConsumerRecord], next_fetch_offset: int) -> None:
        self.buffers[tp] = PartitionBuffer(records, next_fetch_offset)

    def clear(self, tp: TopicPartition) -> None:
        self.buffers.pop(tp, None)

    def has_buffered(self, tp: TopicPartition) -> bool:
        buffer = self.buffers.get(tp)
        return buffer is not None and bool(buffer.records)

    def drain(self, max_records: int) -> tuple[dict[TopicPartition, list[ConsumerRecord]], dict[TopicPartition, int]]:
        """Up to ``max_records`` records, per partition in rotation order, and the new
        position of every partition that gave any (or whose emptied buffer moved it)."""
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        positions: dict[TopicPartition, int] = {}
        n = len(self.order)
        remaining = max_records
        last_served = None
        for step in range(n):
            if remaining == 0:
                break
            index = (self.start + step) % n
            tp = self.order[index]
            buffer = self.buffers.get(tp)
            if buffer is None:
                continue
            taken = []
            while buffer.records and remaining:
                taken.append(buffer.records.popleft())
                remaining -= 1
            if taken:
                out[tp] = taken
                last_served = index
            if buffer.records:
                positions[tp] = taken[-1].offset + 1 if taken else buffer.records[0].offset
            else:
                positions[tp] = buffer.next_fetch_offset
                del self.buffers[tp]
        if last_served is not None:
            self.start = (last_served + 1) % n
        return out, positions


def lag(end_offset: int | None, position: int | None) -> int | None:
    """Offsets between the position and the partition's end; None when either is unknown."""
    if end_offset is None or position is None or end_offset < 0:
        return None
    return max(0, end_offset - position)
