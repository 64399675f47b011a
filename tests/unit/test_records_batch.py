"""Decoding v2 batches written by an independent encoder (kafka-python)."""

from __future__ import annotations

import struct

import pytest

from harness.batches import Rec, control_batch, kafka_python_batch, legacy_batch
from proxy.protocol.errors import ProtocolError
from proxy.records.batch import (
    HEADER_SIZE,
    ControlType,
    LegacyBatch,
    PartialBatch,
    RecordBatch,
    iter_batches,
    iter_records,
    parse_header,
)
from proxy.records.compression import Codec

RECORDS = [
    Rec(0, b"key-0", b"value-0" * 20, 1_700_000_000_000, [("h1", b"v1"), ("h2", None)]),
    Rec(1, None, b"null-key" * 20, 1_700_000_000_005),
    Rec(2, b"key-2", None, 1_700_000_000_003),
    Rec(5, b"", b"empty-key" * 20, 1_700_000_000_009),  # a gap, as after compaction
    Rec(6, b"k" * 300, b"long-key" * 20, 1_700_000_000_010),
]


@pytest.mark.parametrize("codec", list(Codec))
def test_decodes_kafka_python_batch(codec: Codec) -> None:
    blob = kafka_python_batch(
        RECORDS, codec=codec, base_offset=1234, partition_leader_epoch=7,
        producer_id=42, producer_epoch=3, base_sequence=99,
    )
    (batch,) = list(iter_batches(blob))
    assert isinstance(batch, RecordBatch)
    h = batch.header
    assert h.codec is codec  # the payload compresses, so kafka-python keeps the codec
    assert (h.base_offset, h.partition_leader_epoch, h.last_offset_delta) == (1234, 7, 6)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (42, 3, 99)
    assert (h.base_timestamp, h.max_timestamp) == (1_700_000_000_000, 1_700_000_000_010)
    assert h.record_count == 5 and h.size == len(blob) and h.next_offset == 1241
    assert not h.is_control and not h.is_transactional and h.timestamp_type == 0
    batch.verify_crc()
    got = list(batch.records())
    assert [r.offset for r in got] == [1234 + r.offset_delta for r in RECORDS]
    assert [r.timestamp for r in got] == [r.timestamp for r in RECORDS]
    assert [None if r.key is None else bytes(r.key) for r in got] == [r.key for r in RECORDS]
    assert [None if r.value is None else bytes(r.value) for r in got] == [r.value for r in RECORDS]
    assert [(bytes(k), v if v is None else bytes(v)) for k, v in got[0].headers] == [
        (b"h1", b"v1"),
        (b"h2", None),
    ]


def test_records_are_zero_copy_views_of_uncompressed_batch() -> None:
    blob = kafka_python_batch(RECORDS)
    batch = next(iter_batches(blob))
    record = next(batch.records())
    assert isinstance(record.key, memoryview) and isinstance(record.raw, memoryview)
    assert record.raw.obj is blob and record.key.obj is blob


def test_transactional_and_log_append_time() -> None:
    blob = bytearray(kafka_python_batch(RECORDS, transactional=True))
    struct.pack_into(">h", blob, 21, struct.unpack_from(">h", blob, 21)[0] | 0x08)
    from proxy.records.batch import compute_crc

    struct.pack_into(">I", blob, 17, compute_crc(blob))
    batch = next(iter_batches(bytes(blob)))
    batch.verify_crc()
    assert batch.header.is_transactional and batch.header.timestamp_type == 1
    # LogAppendTime: every record carries the batch's max timestamp, as in Java.
    assert {r.timestamp for r in batch.records()} == {batch.header.max_timestamp}


def test_control_records() -> None:
    blob = control_batch(base_offset=10, commit=True) + control_batch(base_offset=11, commit=False)
    batches = list(iter_batches(blob))
    kinds = [cr.type for b in batches for cr in b.control_records()]
    assert kinds == [ControlType.COMMIT, ControlType.ABORT]
    assert all(b.header.is_control and b.header.is_transactional for b in batches)
    with pytest.raises(ProtocolError):
        list(next(iter_batches(kafka_python_batch(RECORDS))).control_records())


def test_concatenation_with_trailing_partial() -> None:
    one = kafka_python_batch(RECORDS, base_offset=0)
    two = kafka_python_batch(RECORDS, base_offset=7, codec=Codec.GZIP)
    for cut in (1, 11, 12, 16, 17, 40, HEADER_SIZE, len(two) - 1):
        entries = list(iter_batches(one + two + one[:cut]))
        assert [type(e) for e in entries] == [RecordBatch, RecordBatch, PartialBatch]
        assert entries[2].position == len(one) + len(two)
        assert len(entries[2].data) == cut


def test_legacy_entries_are_reported_opaque() -> None:
    v2 = kafka_python_batch(RECORDS, base_offset=100)
    v0 = legacy_batch(RECORDS[:2], magic=0, base_offset=0)
    v1 = legacy_batch(RECORDS[:2], magic=1, codec=Codec.GZIP, base_offset=50)
    entries = list(iter_batches(v0 + v1 + v2))
    assert [type(e) for e in entries[:-1]] == [LegacyBatch] * (len(entries) - 1)
    assert isinstance(entries[-1], RecordBatch)
    assert {e.magic for e in entries[:-1]} == {0, 1}
    assert b"".join(bytes(e.data) for e in entries) == v0 + v1 + v2


def test_empty_blob() -> None:
    assert list(iter_batches(b"")) == []


def _corrupt(blob: bytes, at: int, value: bytes) -> bytes:
    return blob[:at] + value + blob[at + len(value):]


@pytest.mark.parametrize(
    "at, value, where",
    [
        (8, struct.pack(">i", 3), 8),  # length below any format's minimum
        (16, b"\x07", 16),  # unknown magic
        (57, struct.pack(">i", -1), 57),  # negative record count
        (23, struct.pack(">i", -5), 23),  # negative last offset delta
        (21, struct.pack(">h", 7), 21),  # codec id 7
    ],
)
def test_malformed_headers_raise_with_offset(at: int, value: bytes, where: int) -> None:
    prefix = kafka_python_batch(RECORDS)
    blob = prefix + _corrupt(kafka_python_batch(RECORDS), at, value)
    with pytest.raises(ProtocolError) as info:
        list(iter_batches(blob))
    assert info.value.offset == len(prefix) + where


def test_crc_mismatch_is_detected() -> None:
    blob = bytearray(kafka_python_batch(RECORDS))
    blob[-1] ^= 0xFF
    batch = next(iter_batches(bytes(blob)))
    assert not batch.crc_ok()
    with pytest.raises(ProtocolError) as info:
        batch.verify_crc()
    assert info.value.offset == 17


def test_record_count_mismatch_and_truncated_record() -> None:
    blob = bytearray(kafka_python_batch(RECORDS))
    struct.pack_into(">i", blob, 57, 6)
    with pytest.raises(ProtocolError, match="declared"):
        list(next(iter_batches(bytes(blob))).records())
    with pytest.raises(ProtocolError) as info:
        list(iter_records(bytes(blob[HEADER_SIZE:-3]), base_offset=0, base_timestamp=0))
    assert info.value.offset is not None


def test_parse_header_requires_61_bytes_and_magic_2() -> None:
    blob = kafka_python_batch(RECORDS)
    assert parse_header(blob).record_count == 5
    with pytest.raises(ProtocolError):
        parse_header(blob[:60])
    with pytest.raises(ProtocolError):
        parse_header(_corrupt(blob, 16, b"\x01"))


def test_max_batch_bytes() -> None:
    blob = kafka_python_batch(RECORDS)
    with pytest.raises(ProtocolError, match="exceeds"):
        list(iter_batches(blob, max_batch_bytes=len(blob) - 1))
