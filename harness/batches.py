"""Record batches for tests, built independently of ``proxy.records`` where possible.

Data batches come from kafka-python's own encoders (``DefaultRecordBatchBuilder`` for v2,
``LegacyRecordBatchBuilder`` for magic 0/1), so our decoder is checked against another
implementation rather than against itself. Control batches, which no client library
writes, are assembled from the documented layout with ``proxy.records.builder``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from proxy.records.batch import CONTROL_BIT, TRANSACTIONAL_BIT, compute_crc
from proxy.records.builder import build_batch, encode_record


@dataclass
class Rec:
    """One record to encode: ``offset_delta`` relative to the batch's base offset."""

    offset_delta: int
    key: bytes | None
    value: bytes | None
    timestamp: int = 1_700_000_000_000
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)


def kafka_python_batch(
    records: Sequence[Rec],
    *,
    codec: int = 0,
    base_offset: int = 0,
    partition_leader_epoch: int = 0,
    transactional: bool = False,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """A v2 batch encoded by kafka-python.

    kafka-python always writes base offset 0 and leader epoch 0; both lie outside the CRC,
    so they are patched in afterwards as a broker does. Note kafka-python falls back to no
    compression when compressing does not make the batch smaller.
    """
    if transactional and producer_id < 0:
        producer_id, producer_epoch, base_sequence = 1000, 0, 0
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=1 << 30,
    )
    for r in records:
        meta = builder.append(r.offset_delta, r.timestamp, r.key, r.value, list(r.headers))
        assert meta is not None, "kafka-python refused the record"
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base_offset)
    struct.pack_into(">i", data, 12, partition_leader_epoch)
    return bytes(data)


def legacy_batch(
    records: Sequence[Rec], *, magic: int = 1, codec: int = 0, base_offset: int = 0
) -> bytes:
    """A magic 0/1 message set encoded by kafka-python, offsets from ``base_offset``."""
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=codec, batch_size=1 << 30)
    for r in records:
        builder.append(base_offset + r.offset_delta, r.timestamp, r.key, r.value)
    return bytes(builder.build())


def control_batch(
    *,
    base_offset: int,
    commit: bool,
    producer_id: int = 1000,
    producer_epoch: int = 0,
    coordinator_epoch: int = 0,
    timestamp: int = 1_700_000_000_000,
) -> bytes:
    """A transaction marker batch: one control record, key (version 0, type), value
    (version 0, coordinator epoch), as the broker writes for EndTxn."""
    record = encode_record(
        offset_delta=0,
        key=struct.pack(">hh", 0, 1 if commit else 0),
        value=struct.pack(">hi", 0, coordinator_epoch),
    )
    return build_batch(
        base_offset=base_offset,
        last_offset_delta=0,
        records=record,
        record_count=1,
        base_timestamp=timestamp,
        max_timestamp=timestamp,
        attributes=CONTROL_BIT | TRANSACTIONAL_BIT,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=-1,
    )


def fix_crcs(data: bytearray) -> bytes:
    """``data`` with the CRC of every complete v2 batch recomputed, so that bytes a test
    changed reach the parsers behind the CRC check."""
    pos = 0
    while pos + 61 <= len(data):
        size = struct.unpack_from(">i", data, pos + 8)[0] + 12
        if size < 61 or pos + size > len(data) or data[pos + 16] != 2:
            break
        struct.pack_into(">I", data, pos + 17, compute_crc(data[pos:pos + size]))
        pos += size
    return bytes(data)
