"""Record batch v2 (magic 2): header, batch iteration over a Fetch ``Records`` blob, records.

A Fetch partition's ``Records`` field is a plain concatenation of log entries. Each starts
with ``baseOffset int64, batchLength int32`` and has its magic byte at offset 16, whatever
its format, so entries can be walked without understanding them. The broker cuts the blob
at its size limit, so the last entry may be incomplete: that is normal and is reported as a
``PartialBatch``, not as an error.

v2 batch layout (big-endian; 61-byte header, then records)::

     0 baseOffset int64          27 baseTimestamp int64
     8 batchLength int32         35 maxTimestamp int64
    12 partitionLeaderEpoch      43 producerId int64
    16 magic int8                51 producerEpoch int16
    17 crc uint32                53 baseSequence int32
    21 attributes int16          57 recordCount int32
    23 lastOffsetDelta int32     61 records...

The CRC is CRC32C over bytes 21..end. Records are parsed lazily and their key, value and
header fields are ``memoryview`` slices of the batch (or of its decompressed section), so
nothing is copied until a caller asks for bytes.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import crc32c

from proxy.protocol.constants import MAX_ARRAY_ELEMENTS
from proxy.protocol.errors import ProtocolError
from proxy.records.compression import DEFAULT_MAX_DECOMPRESSED_BYTES, Codec, codec_of, decompress
from proxy.records.varint import read_varint, read_varlong

HEADER = struct.Struct(">qiibIHiqqqhii")  # attributes read unsigned
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: the part of an entry its length does not count
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
RECORDS_OFFSET = HEADER_SIZE
# The smallest legal entry of any format: a v0 message with null key and value.
MIN_ENTRY_LENGTH = 14
_ENTRY_PREFIX = struct.Struct(">qi")

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08  # 0 CreateTime, 1 LogAppendTime
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
DELETE_HORIZON_BIT = 0x40

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The 61-byte header of a v2 batch, field for field."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies in a Records blob."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def codec(self) -> Codec:
        return codec_of(self.attributes)

    @property
    def timestamp_type(self) -> int:
        """0 CreateTime, 1 LogAppendTime."""
        return (self.attributes & TIMESTAMP_TYPE_BIT) >> 3

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_BIT)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        """Where a consumer resumes after this batch, whatever records it still holds."""
        return self.last_offset + 1


def parse_header(buf, pos: int = 0) -> BatchHeader:
    """Parse and sanity-check a v2 header at ``pos``; the batch body need not be present."""
    if len(buf) - pos < HEADER_SIZE:
        raise ProtocolError(f"batch header truncated: {len(buf) - pos} bytes", offset=pos)
    header = BatchHeader(*HEADER.unpack_from(buf, pos))
    if header.magic != 2:
        raise ProtocolError(f"not a v2 batch: magic {header.magic}", offset=pos + MAGIC_OFFSET)
    if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise ProtocolError(f"batch length {header.batch_length} below header size", offset=pos + 8)
    if header.record_count < 0:
        raise ProtocolError(f"negative record count {header.record_count}", offset=pos + 57)
    if header.last_offset_delta < 0:
        raise ProtocolError(
            f"negative last offset delta {header.last_offset_delta}", offset=pos + 23
        )
    codec_of(header.attributes, offset=pos + ATTRIBUTES_OFFSET)
    return header


def compute_crc(batch) -> int:
    """CRC32C of a whole v2 batch's bytes from attributes to the end."""
    return crc32c.crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:])


class Header(NamedTuple):
    """One record header. Kafka declares the key a UTF-8 string; it is not validated here."""

    key: memoryview
    value: memoryview | None


@dataclass(frozen=True, slots=True)
class Record:
    """One record, its variable-size fields as zero-copy views.

    ``timestamp`` follows Java: the batch's max timestamp for LogAppendTime batches,
    base timestamp plus delta otherwise. ``raw`` is the whole record including its length
    prefix, exactly as it can be copied into another batch with the same base.
    """

    offset: int
    offset_delta: int
    timestamp: int
    timestamp_delta: int
    attributes: int
    key: memoryview | None
    value: memoryview | None
    headers: tuple[Header, ...]
    raw: memoryview


class ControlType(enum.IntEnum):
    """Control record types a data partition carries (EndTxnMarker)."""

    ABORT = 0
    COMMIT = 1


@dataclass(frozen=True, slots=True)
class ControlRecord:
    """A control record's key (version, type); ``type`` is an int when not a known kind."""

    version: int
    type: ControlType | int
    record: Record


class RecordBatch:
    """A complete v2 batch inside a Records blob.

    ``data`` is a view of exactly the batch's bytes and ``position`` its byte offset in the
    blob, which error offsets refer to.
    """

    __slots__ = ("header", "data", "position")

    magic = 2

    def __init__(self, header: BatchHeader, data: memoryview, position: int) -> None:
        self.header = header
        self.data = data
        self.position = position

    def __repr__(self) -> str:
        h = self.header
        return (
            f"RecordBatch(offsets={h.base_offset}..{h.last_offset}, records={h.record_count}, "
            f"codec={h.codec.name}, control={h.is_control}, at={self.position})"
        )

    def crc_ok(self) -> bool:
        return compute_crc(self.data) == self.header.crc

    def verify_crc(self) -> None:
        """Raise ``ProtocolError`` when the stored CRC does not match the bytes."""
        if not self.crc_ok():
            raise ProtocolError("record batch CRC mismatch", offset=self.position + CRC_OFFSET)

    def records_section(self) -> memoryview:
        """The bytes after the header, still compressed if the batch is."""
        return self.data[RECORDS_OFFSET:]

    def records_payload(self, *, max_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES):
        """The records section, decompressed (a zero-copy view when uncompressed)."""
        return decompress(
            self.header.codec,
            self.records_section(),
            max_bytes=max_bytes,
            offset=self.position + RECORDS_OFFSET,
        )

    def records(self, *, max_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES) -> Iterator[Record]:
        """Lazily parse the records; errors carry the blob offset of the fault.

        In a compressed batch a fault's offset is the batch's own position; the reason then
        names the byte within the decompressed records.
        """
        h = self.header
        payload = memoryview(self.records_payload(max_bytes=max_bytes))
        compressed = h.codec is not Codec.NONE
        try:
            yield from iter_records(
                payload,
                base_offset=h.base_offset,
                base_timestamp=h.base_timestamp,
                max_timestamp=h.max_timestamp,
                log_append_time=bool(h.attributes & TIMESTAMP_TYPE_BIT),
                record_count=h.record_count,
            )
        except ProtocolError as exc:
            if compressed:
                raise ProtocolError(
                    f"{exc.reason} (byte {exc.offset} of decompressed records)",
                    offset=self.position,
                ) from None
            raise ProtocolError(exc.reason, offset=self.position + RECORDS_OFFSET + (exc.offset or 0)) from None

    def control_records(self) -> Iterator[ControlRecord]:
        """The control records of a control batch (commit/abort markers)."""
        if not self.header.is_control:
            raise ProtocolError("not a control batch", offset=self.position + ATTRIBUTES_OFFSET)
        for record in self.records():
            yield parse_control_record(record)


@dataclass(frozen=True, slots=True)
class LegacyBatch:
    """A magic 0 or 1 entry (message set), kept opaque: the proxy forwards it unchanged."""

    base_offset: int
    magic: int
    data: memoryview
    position: int


@dataclass(frozen=True, slots=True)
class PartialBatch:
    """The trailing bytes of an entry the broker cut short at its fetch size limit."""

    data: memoryview
    position: int


Entry = RecordBatch | LegacyBatch | PartialBatch


def as_byte_view(buf) -> memoryview:
    """A flat unsigned-byte view of any bytes-like object."""
    view = memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def iter_batches(blob, *, max_batch_bytes: int | None = None) -> Iterator[Entry]:
    """Walk the entries of a Records blob in order.

    Yields ``RecordBatch`` for v2 batches, ``LegacyBatch`` for magic 0/1 entries and, at most
    once and last, ``PartialBatch`` for a truncated tail. Malformed entries (length below any
    format's minimum, unknown magic, ``max_batch_bytes`` exceeded, bad v2 header) raise
    ``ProtocolError``. CRCs are not checked here; see ``RecordBatch.verify_crc``.
    """
    view = as_byte_view(blob)
    n = len(view)
    pos = 0
    while pos < n:
        remaining = n - pos
        if remaining < LOG_OVERHEAD:
            yield PartialBatch(view[pos:], pos)
            return
        base_offset, length = _ENTRY_PREFIX.unpack_from(view, pos)
        if length < MIN_ENTRY_LENGTH:
            raise ProtocolError(f"entry length {length} below minimum", offset=pos + 8)
        size = LOG_OVERHEAD + length
        if max_batch_bytes is not None and size > max_batch_bytes:
            raise ProtocolError(
                f"entry of {size} bytes exceeds limit {max_batch_bytes}", offset=pos + 8
            )
        if remaining <= MAGIC_OFFSET:
            yield PartialBatch(view[pos:], pos)
            return
        magic = view[pos + MAGIC_OFFSET]
        if magic > 2:
            raise ProtocolError(f"unknown magic {magic}", offset=pos + MAGIC_OFFSET)
        if magic == 2 and length < HEADER_SIZE - LOG_OVERHEAD:
            raise ProtocolError(f"batch length {length} below header size", offset=pos + 8)
        if size > remaining:
            yield PartialBatch(view[pos:], pos)
            return
        data = view[pos : pos + size]
        if magic == 2:
            yield RecordBatch(_header_at(data, pos), data, pos)
        else:
            yield LegacyBatch(base_offset, magic, data, pos)
        pos += size


def _header_at(data: memoryview, position: int) -> BatchHeader:
    """Parse a complete batch's header, reporting faults at their blob offset."""
    try:
        return parse_header(data, 0)
    except ProtocolError as exc:
        raise ProtocolError(exc.reason, offset=position + (exc.offset or 0)) from None


def iter_records(
    payload,
    *,
    base_offset: int,
    base_timestamp: int,
    max_timestamp: int = -1,
    log_append_time: bool = False,
    record_count: int | None = None,
) -> Iterator[Record]:
    """Parse a (decompressed) records section record by record.

    Every field must lie inside its record's declared length, the records must fill the
    section exactly, and their number must equal ``record_count`` when given. Error
    offsets are relative to ``payload``.
    """
    view = as_byte_view(payload)
    end = len(view)
    pos = 0
    count = 0
    while pos < end:
        start = pos
        length, pos = read_varint(view, pos, end)
        if length < 1 or length > end - pos:
            raise ProtocolError(f"record length {length} does not fit", offset=start)
        rec_end = pos + length
        attributes = view[pos]
        pos += 1
        ts_delta, pos = read_varlong(view, pos, rec_end)
        off_delta, pos = read_varint(view, pos, rec_end)
        key, pos = _read_bytes(view, pos, rec_end)
        value, pos = _read_bytes(view, pos, rec_end)
        header_count, pos = read_varint(view, pos, rec_end)
        if header_count < 0:
            raise ProtocolError(f"negative header count {header_count}", offset=pos)
        if header_count > MAX_ARRAY_ELEMENTS:
            raise ProtocolError(
                f"record header array of {header_count} elements exceeds the limit of {MAX_ARRAY_ELEMENTS}",
                offset=pos,
            )
        headers = []
        for _ in range(header_count):
            hkey, pos = _read_bytes(view, pos, rec_end)
            if hkey is None:
                raise ProtocolError("null header key", offset=pos)
            hvalue, pos = _read_bytes(view, pos, rec_end)
            headers.append(Header(hkey, hvalue))
        if pos != rec_end:
            raise ProtocolError(f"record has {rec_end - pos} stray bytes", offset=pos)
        count += 1
        if record_count is not None and count > record_count:
            raise ProtocolError(f"more records than the declared {record_count}", offset=start)
        timestamp = max_timestamp if log_append_time else base_timestamp + ts_delta
        yield Record(
            offset=base_offset + off_delta,
            offset_delta=off_delta,
            timestamp=timestamp,
            timestamp_delta=ts_delta,
            attributes=attributes,
            key=key,
            value=value,
            headers=tuple(headers),
            raw=view[start:rec_end],
        )
    if record_count is not None and count != record_count:
        raise ProtocolError(f"{count} records where {record_count} were declared", offset=end)


def _read_bytes(view: memoryview, pos: int, end: int) -> tuple[memoryview | None, int]:
    """A varint-length-prefixed byte field; length -1 means null."""
    n, pos = read_varint(view, pos, end)
    if n == -1:
        return None, pos
    if n < 0 or n > end - pos:
        raise ProtocolError(f"field length {n} does not fit its record", offset=pos)
    return view[pos : pos + n], pos + n


_CONTROL_KEY = struct.Struct(">hh")


def parse_control_record(record: Record) -> ControlRecord:
    """Decode a control record's key: version int16, type int16 (0 abort, 1 commit)."""
    key = record.key
    if key is None or len(key) < _CONTROL_KEY.size:
        raise ProtocolError("control record key shorter than 4 bytes")
    version, ctype = _CONTROL_KEY.unpack_from(key, 0)
    try:
        kind: ControlType | int = ControlType(ctype)
    except ValueError:
        kind = ctype
    return ControlRecord(version, kind, record)



def next_offset_after(blob) -> int | None:
    """The offset after the last whole entry of a record set (None: it holds none): where
    the read that returned it leaves its reader. A malformed entry ends the walk."""
    next_offset: int | None = None
    try:
        for entry in iter_batches(blob):
            if isinstance(entry, PartialBatch):
                break
            next_offset = _next_offset(entry)
    except ProtocolError:
        pass
    return next_offset


def _next_offset(entry: RecordBatch | LegacyBatch) -> int:
    """The offset after a whole entry: a legacy entry holds one message, or a wrapper
    carrying its last inner offset."""
    return entry.header.next_offset if isinstance(entry, RecordBatch) else entry.base_offset + 1


def cut_after(blob, max_bytes: int) -> tuple[int, int] | None:
    """Where to cut a record set so that its head holds at most ``max_bytes`` (at least its
    first entry): (the head's length in bytes, the offset after the head's last entry), or
    None when every whole entry fits (a cut-short one may follow) or there is only one.

    Why: a cached key-range share can be larger than what the consumer fetching it asked
    for (a wide read-ahead split into uneven shares); the head is served, the rest waits
    in the cache at the offset the head leaves the consumer at."""
    if len(blob) <= max_bytes:
        return None
    cut: tuple[int, int] | None = None
    for entry in iter_batches(blob):
        if isinstance(entry, PartialBatch):
            break
        end = entry.position + len(entry.data)
        if cut is not None and end > max_bytes:
            return cut
        cut = (end, _next_offset(entry))
    return None  # every whole entry fits
