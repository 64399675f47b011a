"""Building v2 batches, in particular filtered copies that keep a source batch's identity.

A filtered batch must look to a consumer like the source batch after log compaction: same
base offset and last offset delta (so the consumer's position moves past the whole source
batch even if nothing is left), same producer id/epoch/base sequence, partition leader
epoch, timestamps, timestamp type and transactional flag. Kept records are copied
verbatim: their offset and timestamp deltas are relative to the base offset and base
timestamp, which do not change, so they stay valid. Only the record count, the length and
the CRC are recomputed, and the compression may change.

A batch left with no records is written uncompressed, as compaction writes one (Java's
``DefaultRecordBatch.writeEmptyHeader``); readers skip the records section of a zero-count
batch entirely. Unlike compaction, it keeps the source's first timestamp (docs/wire-contract.md
section 3 lists FirstTimestamp among the kept fields).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import crc32c

from proxy.records.batch import (
    COMPRESSION_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    BatchHeader,
)
from proxy.records.compression import Codec, compress
from proxy.records.varint import encode_varint

# The header splits at the CRC: what precedes it is outside the checksum, what follows in.
_BEFORE_CRC = struct.Struct(">qiib")
_CRC = struct.Struct(">I")
_AFTER_CRC = struct.Struct(">Hiqqqhii")
_TAIL_NO_COUNT = struct.Struct(">Hiqqqhi")
_COUNT = struct.Struct(">i")
_BATCH_LENGTH_BASE = HEADER_SIZE - LOG_OVERHEAD  # 49: header bytes the length field counts

RawRecords = bytes | bytearray | memoryview | Sequence[bytes | bytearray | memoryview]


def build_batch(
    *,
    base_offset: int,
    last_offset_delta: int,
    records: RawRecords,
    record_count: int,
    base_timestamp: int,
    max_timestamp: int,
    attributes: int = 0,
    codec: Codec | int = Codec.NONE,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
) -> bytes:
    """Assemble a v2 batch from already-encoded records.

    ``records`` is either the records' concatenated bytes or a sequence of single raw
    records; ``record_count`` is how many records that is. ``attributes`` supplies every
    bit except the codec, which comes from ``codec`` (and is forced to none when there are
    no records).
    """
    if not isinstance(records, (bytes, bytearray, memoryview)):
        records = b"".join(records)
    section: bytes | bytearray | memoryview
    if record_count == 0:
        codec = Codec.NONE
        section = b""
    else:
        section = compress(codec, records) if codec else records
    attrs = (attributes & ~COMPRESSION_MASK & 0xFFFF) | int(codec)
    tail = _AFTER_CRC.pack(
        attrs,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        record_count,
    )
    crc = crc32c.crc32c(section, crc32c.crc32c(tail))
    head = _BEFORE_CRC.pack(
        base_offset, _BATCH_LENGTH_BASE + len(section), partition_leader_epoch, 2
    )
    return b"".join((head, _CRC.pack(crc), tail, section))


def rebuild_batch(
    source: BatchHeader,
    records: RawRecords,
    record_count: int,
    *,
    codec: Codec | int | None = None,
) -> bytes:
    """A batch with ``source``'s identity holding some (possibly none) of its records.

    ``codec`` None keeps the source's codec; ``Codec.NONE`` writes the result uncompressed.
    """
    if not isinstance(records, (bytes, bytearray, memoryview)):
        records = b"".join(records)
    return Rebuilder(source, codec)(records, record_count)


class Rebuilder:
    """Rebuilds filtered copies of one source batch, sharing the work common to all copies.

    Splitting a batch into n sets builds n batches that differ only in their records,
    count, length and CRC; the fixed header fields are packed once here.
    """

    __slots__ = ("_base_offset", "_leader_epoch", "_tail", "_empty_tail", "_codec")

    def __init__(self, source: BatchHeader, codec: Codec | int | None = None) -> None:
        codec = (source.attributes & COMPRESSION_MASK) if codec is None else int(codec)
        self._codec = Codec(codec)
        self._base_offset = source.base_offset
        self._leader_epoch = source.partition_leader_epoch
        fixed = (
            source.last_offset_delta,
            source.base_timestamp,
            source.max_timestamp,
            source.producer_id,
            source.producer_epoch,
            source.base_sequence,
        )
        plain = source.attributes & ~COMPRESSION_MASK & 0xFFFF
        self._tail = _TAIL_NO_COUNT.pack(plain | codec, *fixed)
        self._empty_tail = _TAIL_NO_COUNT.pack(plain, *fixed) + _COUNT.pack(0)

    def __call__(self, records: bytes | bytearray | memoryview, record_count: int) -> bytes:
        """The batch holding ``records`` (concatenated raw records, ``record_count`` of them)."""
        if record_count == 0:
            tail = self._empty_tail
            section: bytes | bytearray | memoryview = b""
        else:
            tail = self._tail + _COUNT.pack(record_count)
            section = compress(self._codec, records) if self._codec else records
        crc = crc32c.crc32c(section, crc32c.crc32c(tail))
        head = _BEFORE_CRC.pack(
            self._base_offset, _BATCH_LENGTH_BASE + len(section), self._leader_epoch, 2
        )
        return b"".join((head, _CRC.pack(crc), tail, section))


def encode_record(
    *,
    offset_delta: int,
    timestamp_delta: int = 0,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[bytes | str, bytes | None]] = (),
    attributes: int = 0,
) -> bytes:
    """Encode one v2 record (length prefix included)."""
    parts = [
        bytes((attributes & 0xFF,)),
        encode_varint(timestamp_delta),
        encode_varint(offset_delta),
        _encode_field(key),
        _encode_field(value),
        encode_varint(len(headers)),
    ]
    for hkey, hvalue in headers:
        parts.append(_encode_field(hkey.encode() if isinstance(hkey, str) else hkey))
        parts.append(_encode_field(hvalue))
    body = b"".join(parts)
    return encode_varint(len(body)) + body


def _encode_field(data: bytes | None) -> bytes:
    if data is None:
        return encode_varint(-1)
    return encode_varint(len(data)) + bytes(data)
