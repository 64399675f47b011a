"""The consumer's flat record decoder and its batch-wide range check give exactly what the
strict record parser gives (records, ranges dropped and counted), and a batch the decoder
cannot take goes to the strict parser, whose errors stay the same."""

from __future__ import annotations

import random

import pytest

from harness.batches import Rec, kafka_python_batch
from proxy.client import TopicPartition, equal_shares
from proxy.client.records import ParsedPartition, _keep, parse_partition
from proxy.protocol.errors import ProtocolError
from proxy.records.batch import RecordBatch, iter_batches
from proxy.records.builder import build_batch, encode_record

TP = TopicPartition("t", 3)


def _strict(blob, fetch_offset: int, ranges=None) -> ParsedPartition:
    """The reference: every record through the strict parser and the per-record hash check."""
    out = ParsedPartition([], fetch_offset)
    for entry in iter_batches(blob):
        assert isinstance(entry, RecordBatch)
        for record in entry.records():
            _keep(out, TP, record, fetch_offset, ranges)
    return out


def _records(seed: int, count: int) -> list[Rec]:
    rng = random.Random(seed)
    out = []
    delta = 0
    for _ in range(count):
        delta += rng.choice((1, 1, 1, 70, 9000))  # one-, two- and three-byte offset deltas
        key = None if rng.random() < 0.1 else rng.randbytes(rng.choice((0, 5, 80, 200)))
        value = None if rng.random() < 0.05 else rng.randbytes(rng.choice((0, 10, 100, 20_000)))
        headers = [("h", b"x"), ("\u00e9", None)] if rng.random() < 0.2 else []
        out.append(Rec(delta, key, value, timestamp=1_700_000_000_000 + rng.choice((0, 5, 300, 10**7)),
                       headers=headers))
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("codec", [0, 1])
def test_the_decoder_matches_the_strict_parser(seed, codec):
    blob = kafka_python_batch(_records(seed, 300), base_offset=1000, codec=codec)
    blob += kafka_python_batch(_records(seed + 100, 50), base_offset=10_000_000, codec=codec)
    for ranges in (None, [equal_shares(3)[seed % 3]], [equal_shares(16)[5], equal_shares(16)[9]]):
        for fetch_offset in (0, 1000 + 70 * 20):
            got = parse_partition(TP, blob, fetch_offset, ranges=ranges, amend_gaps=False)
            want = _strict(blob, fetch_offset, ranges)
            assert got.records == want.records
            assert got.outside_ranges == want.outside_ranges
            if ranges:
                assert 0 < len(got.records) and want.outside_ranges > 0


def test_log_append_time_batches_take_the_batch_timestamp():
    records = encode_record(offset_delta=0, timestamp_delta=5, key=b"k", value=b"v")
    blob = build_batch(base_offset=7, last_offset_delta=0, records=records, record_count=1,
                       base_timestamp=100, max_timestamp=555, attributes=0x08)
    [record] = parse_partition(TP, blob, 0).records
    assert (record.offset, record.timestamp, record.key, record.value) == (7, 555, b"k", b"v")
    assert isinstance(record.key, bytes) and isinstance(record.value, bytes)


def _one_record_batch(record: bytes, count: int = 1) -> bytes:
    return build_batch(base_offset=0, last_offset_delta=0, records=record, record_count=count,
                       base_timestamp=0, max_timestamp=0)


@pytest.mark.parametrize("mangle, reason", [
    (lambda r: r[:-1] + b"\x82", "runs past the end"),  # a header count varint cut by the record's end
    (lambda r: r + b"\x00", "does not fit"),  # section longer than its records
])
def test_a_malformed_record_raises_the_strict_parsers_error(mangle, reason):
    record = encode_record(offset_delta=0, key=b"k", value=b"v")
    with pytest.raises(ProtocolError) as strict:
        _strict(_one_record_batch(mangle(record)), 0)
    with pytest.raises(ProtocolError) as fast:
        parse_partition(TP, _one_record_batch(mangle(record)), 0)
    assert str(fast.value) == str(strict.value)
    assert reason in str(fast.value)
    for ranges in ([equal_shares(2)[0]], [equal_shares(2)[1]]):
        with pytest.raises(ProtocolError) as ranged:
            parse_partition(TP, _one_record_batch(mangle(record)), 0, ranges=ranges)
        assert str(ranged.value) == str(strict.value)


def test_a_wrong_record_count_raises_as_before():
    record = encode_record(offset_delta=0, key=b"k", value=b"v")
    with pytest.raises(ProtocolError, match="1 records where 2 were declared"):
        parse_partition(TP, _one_record_batch(record, count=2), 0, ranges=[equal_shares(2)[0]])
