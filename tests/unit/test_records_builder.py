"""Rebuilt batches keep the source identity and are read back by kafka-python."""

from __future__ import annotations

import pytest
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecords

from harness.batches import Rec, kafka_python_batch
from proxy.records.batch import HEADER_SIZE, iter_batches
from proxy.records.builder import build_batch, encode_record, rebuild_batch
from proxy.records.compression import Codec

RECORDS = [
    Rec(i, None if i % 5 == 0 else b"key-%d" % i, b"value-%d" % i * 10, 1_700_000_000_000 + i * 3,
        [("trace", b"t%d" % i)] if i % 2 else [])
    for i in range(0, 40, 2)  # offset deltas with gaps
]
IDENTITY = dict(
    base_offset=5_000_000_000, partition_leader_epoch=12, transactional=True,
    producer_id=77, producer_epoch=4, base_sequence=1_000,
)


def _source(codec: Codec) -> tuple[bytes, object]:
    blob = kafka_python_batch(RECORDS, codec=codec, **IDENTITY)
    return blob, next(iter_batches(blob))


def _identity(batch: DefaultRecordBatch) -> tuple:
    return (
        batch.base_offset, batch.last_offset_delta, batch.leader_epoch, batch.producer_id,
        batch.producer_epoch, batch.base_sequence, batch.first_timestamp, batch.max_timestamp,
        batch.is_transactional, batch.timestamp_type,
    )


def test_record_encoding_matches_kafka_python_byte_for_byte() -> None:
    expected = kafka_python_batch(RECORDS, **IDENTITY)
    src = next(iter_batches(expected)).header
    encoded = [
        encode_record(
            offset_delta=r.offset_delta,
            timestamp_delta=r.timestamp - RECORDS[0].timestamp,
            key=r.key,
            value=r.value,
            headers=r.headers,
        )
        for r in RECORDS
    ]
    assert rebuild_batch(src, encoded, len(encoded)) == expected
    assert build_batch(
        base_offset=src.base_offset, last_offset_delta=src.last_offset_delta, records=encoded,
        record_count=len(encoded), base_timestamp=src.base_timestamp,
        max_timestamp=src.max_timestamp, attributes=src.attributes,
        partition_leader_epoch=12, producer_id=77, producer_epoch=4, base_sequence=1_000,
    ) == expected


@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("out_codec", [None, Codec.NONE, Codec.LZ4])
@pytest.mark.parametrize("keep", ["all", "odd", "none"])
def test_rebuild_keeps_identity(codec: Codec, out_codec: Codec | None, keep: str) -> None:
    blob, batch = _source(codec)
    records = list(batch.records())
    kept = {"all": records, "odd": records[1::2], "none": []}[keep]
    rebuilt = rebuild_batch(batch.header, [r.raw for r in kept], len(kept), codec=out_codec)

    theirs = DefaultRecordBatch(bytearray(rebuilt))
    assert theirs.validate_crc()
    assert _identity(theirs) == _identity(DefaultRecordBatch(bytearray(blob)))
    got = list(theirs)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in got] == [
        (r.offset, r.timestamp, None if r.key is None else bytes(r.key), bytes(r.value),
         [(bytes(k).decode(), bytes(v)) for k, v in r.headers])
        for r in kept
    ]
    ours = next(iter_batches(rebuilt))
    ours.verify_crc()
    expected_codec = Codec.NONE if not kept else (codec if out_codec is None else out_codec)
    assert ours.header.codec is expected_codec
    assert ours.header.record_count == len(kept)


def test_zero_record_batch_is_a_bare_header_like_compaction_leaves() -> None:
    blob, batch = _source(Codec.ZSTD)
    empty = rebuild_batch(batch.header, b"", 0)
    assert len(empty) == HEADER_SIZE
    theirs = DefaultRecordBatch(bytearray(empty))
    assert theirs.validate_crc() and list(theirs) == []
    assert theirs.compression_type == 0
    assert theirs.next_offset == batch.header.next_offset  # the consumer still moves past it
    # a reader walking a Records blob moves past it to the next batch
    follower = kafka_python_batch(RECORDS, base_offset=batch.header.next_offset)
    records = MemoryRecords(empty + follower)
    first = records.next_batch()
    assert first.base_offset == batch.header.base_offset and list(first) == []
    second = records.next_batch()
    assert second.base_offset == batch.header.next_offset and len(list(second)) == len(RECORDS)
