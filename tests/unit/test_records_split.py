"""One-pass split: every record reaches exactly the sets whose ranges hold its hash.

Batches come from kafka-python's encoder; expectations are computed from the generated
keys and offsets with ``key_hash`` alone, never from the code under test. Each test runs
with both kernel implementations (pure Python and, when built, the C accelerator).
"""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch

from harness.batches import Rec, control_batch, fix_crcs, kafka_python_batch, legacy_batch
from proxy.protocol.errors import ProtocolError
from proxy.ranges import HASH_MAX, KeyRange, contains, equal_shares
from proxy.records import _kernels_py, kernels
from proxy.records.batch import LegacyBatch, PartialBatch, RecordBatch, compute_crc, iter_batches
from proxy.records.compression import Codec
from proxy.records.keyhash import key_hash
from proxy.records.plan import RangePlan
from proxy.records.split import filter_by_offsets, match_offsets, split_records

# KEYRANGE_FUZZ_SCALE=20 runs twenty times the examples, for a deeper local run.
SCALE = int(os.environ.get("KEYRANGE_FUZZ_SCALE", "1"))
IMPLS = ["python"] + (["c"] if kernels.ACCELERATED else [])


# ---------------------------------------------------------------- generated logs

HOT_KEYS = [b"hot-1", b"hot-2", b"\x00"]
keys = st.one_of(
    st.none(),
    st.sampled_from(HOT_KEYS),
    st.binary(min_size=0, max_size=20),
    st.binary(min_size=60, max_size=90),  # beyond the one-byte key length fast path
)
values = st.one_of(st.none(), st.binary(max_size=120))
headers = st.lists(st.tuples(st.sampled_from(["a", "trace"]), st.one_of(st.none(), st.binary(max_size=8))), max_size=2)


@st.composite
def logs(draw):
    """(blob, expected entries): data batches, control batches, maybe a legacy entry and a
    truncated tail. Expected entries are ('data', batch_bytes, [(offset, key, raw?)...]),
    ('pass', bytes) or ('partial', bytes)."""
    offset = draw(st.integers(0, 2**40))
    entries = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["data", "data", "data", "control", "legacy"]))
        if kind == "control":
            blob = control_batch(base_offset=offset, commit=draw(st.booleans()))
            entries.append(("pass", blob))
            offset += 1
            continue
        n = draw(st.integers(0 if kind == "data" else 1, 30))
        recs, delta = [], 0
        for i in range(n):
            delta += draw(st.integers(1, 3)) if i else 0  # gaps as compaction leaves
            ts = 1_700_000_000_000 + draw(st.integers(0, 100_000))
            recs.append(Rec(delta, draw(keys), draw(values), ts, draw(headers)))
        if kind == "legacy":
            blob = legacy_batch([Rec(r.offset_delta, r.key, r.value or b"") for r in recs],
                                magic=draw(st.sampled_from([0, 1])), base_offset=offset)
            entries.append(("pass", blob))
            offset += delta + 1
            continue
        if n == 0:  # a zero-record batch, as compaction leaves
            from proxy.records.builder import build_batch

            blob = build_batch(base_offset=offset, last_offset_delta=draw(st.integers(0, 5)),
                               records=b"", record_count=0, base_timestamp=1, max_timestamp=2)
            entries.append(("data", blob, []))
            offset += 10
            continue
        codec = draw(st.sampled_from(list(Codec)))
        blob = kafka_python_batch(recs, codec=codec, base_offset=offset,
                                  transactional=draw(st.booleans()))
        entries.append(("data", blob, [(offset + r.offset_delta, r.key) for r in recs]))
        offset += delta + 1
    whole = b"".join(e[1] for e in entries)
    if draw(st.booleans()):
        tail = kafka_python_batch([Rec(0, b"t", b"tail" * 30)], base_offset=offset)
        whole += tail[: draw(st.integers(1, len(tail) - 1))]
    return whole, entries


@st.composite
def range_sets(draw):
    """Either n equal shares (one per set) or a few random, possibly overlapping sets."""
    if draw(st.booleans()):
        return [[r] for r in equal_shares(draw(st.integers(2, 16)))]
    sets = []
    for _ in range(draw(st.integers(1, 5))):
        cuts = sorted(draw(st.sets(st.integers(0, HASH_MAX), min_size=0, max_size=8)))
        ranges = [KeyRange(a, b) for a, b in zip(cuts[::2], cuts[1::2])]
        sets.append(ranges)  # an empty list means the whole space
    return sets


def _check_identity(src: RecordBatch, out: RecordBatch) -> None:
    a, b = src.header, out.header
    for name in ("base_offset", "last_offset_delta", "partition_leader_epoch", "producer_id",
                 "producer_epoch", "base_sequence", "base_timestamp", "max_timestamp",
                 "is_transactional", "timestamp_type", "is_control"):
        assert getattr(a, name) == getattr(b, name), name
    out.verify_crc()


@pytest.mark.parametrize("impl", IMPLS)
@settings(max_examples=120 * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log=logs(), sets=range_sets(), out_codec=st.sampled_from([None, None, Codec.NONE]))
def test_split_routes_every_record_to_exactly_its_sets(impl, log, sets, out_codec) -> None:
    blob, entries = log
    # an uncompressed magic 0/1 message set is one entry per message
    entries = [
        sub
        for e in entries
        for sub in ([("pass", bytes(x.data)) for x in iter_batches(e[1])] if e[0] == "pass" else [e])
    ]
    plan = RangePlan(sets)
    with kernels.using(impl):
        result = split_records(blob, plan, codec=out_codec)
        matched = match_offsets(blob, plan)
    assert len(result.outputs) == len(sets)
    complete = sum(len(e[1]) for e in entries)
    assert result.partial_bytes == len(blob) - complete
    for k, ranges in enumerate(sets):
        out_entries = list(iter_batches(result.outputs[k].records))
        assert not any(isinstance(e, PartialBatch) for e in out_entries)
        assert len(out_entries) == len(entries)
        kept = dropped = 0
        expected_offsets = []
        for expected, got in zip(entries, out_entries):
            if expected[0] == "pass":
                assert bytes(got.data) == expected[1]
                continue
            _, src_blob, recs = expected
            src = next(iter_batches(src_blob))
            assert isinstance(got, RecordBatch)
            _check_identity(src, got)
            want = [(off, key) for off, key in recs if contains(ranges, key_hash(key, off))]
            have = [(r.offset, None if r.key is None else bytes(r.key)) for r in got.records()]
            assert have == want  # exactly these records, in order
            raw = {r.offset: bytes(r.raw) for r in src.records()}
            assert all(bytes(r.raw) == raw[r.offset] for r in got.records())
            kept += len(want)
            dropped += len(recs) - len(want)
            expected_offsets += [off for off, _ in want]
            if out_codec is None and len(want) == len(recs):
                assert bytes(got.data) == src_blob  # untouched when everything is kept
        stats = result.outputs[k].stats
        assert (stats.records_kept, stats.records_dropped) == (kept, dropped)
        assert stats.bytes_out == len(result.outputs[k].records)
        assert matched.offsets[k] == expected_offsets
        with kernels.using(impl):
            again = filter_by_offsets(blob, matched.offsets[k], codec=out_codec)
        assert again.records == result.outputs[k].records


@pytest.mark.parametrize("impl", IMPLS)
@settings(max_examples=80 * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log=logs(), sets=range_sets(), data=st.data())
def test_offsets_matched_on_an_earlier_shorter_read_lose_nothing_of_a_longer_one(impl, log, sets, data) -> None:
    """The offsets-only cache matches a read that ended at some batch; a later read of the
    same offset may hold more batches (the log grew). Filtering the later read by those
    offsets must give exactly what hashing it would: no record beyond the earlier read's end
    may be dropped for being absent from the match."""
    blob, entries = log
    cut = data.draw(st.integers(1, len(entries)), label="batches in the earlier read")
    earlier = b"".join(e[1] for e in entries[:cut])
    plan = RangePlan(sets)
    with kernels.using(impl):
        matched = match_offsets(earlier, plan)
        if matched.next_offset is None:
            return
        for k, ranges in enumerate(sets):
            own = RangePlan([ranges])
            got = filter_by_offsets(blob, matched.offsets[k], known_below=matched.next_offset, plan=own)
            assert got.records == split_records(blob, own).outputs[0].records


def test_offsets_known_below_an_offset_need_the_one_set_plan() -> None:
    with pytest.raises(ValueError, match="plan of the one wanted set"):
        filter_by_offsets(b"", [], known_below=10)


@pytest.mark.parametrize("impl", IMPLS)
def test_split_output_is_readable_by_kafka_python(impl) -> None:
    recs = [Rec(i, b"key-%d" % (i % 7), b"v" * 50) for i in range(100)]
    blob = (kafka_python_batch(recs, codec=Codec.LZ4, base_offset=1000)
            + control_batch(base_offset=1100, commit=True)
            + kafka_python_batch(recs, codec=Codec.NONE, base_offset=1101))
    with kernels.using(impl):
        result = split_records(blob, RangePlan([[r] for r in equal_shares(4)]))
    total = 0
    for out in result.outputs:
        data, pos = out.records, 0
        while pos < len(data):
            size = struct.unpack_from(">i", data, pos + 8)[0] + 12
            batch = DefaultRecordBatch(bytearray(data[pos:pos + size]))
            assert batch.validate_crc()
            if not batch.is_control_batch:
                total += len(list(batch))
            pos += size
    assert total == 200


@pytest.mark.parametrize("impl", IMPLS)
def test_full_range_set_gets_source_batches_unchanged(impl) -> None:
    blob = kafka_python_batch([Rec(i, b"k%d" % i, b"v") for i in range(10)], codec=Codec.GZIP)
    with kernels.using(impl):
        result = split_records(blob, RangePlan([None, [], [KeyRange(0, HASH_MAX)], [KeyRange(0, 10)]]))
    assert [o.records == blob for o in result.outputs] == [True, True, True, False]


def test_hot_key_goes_to_one_set_only() -> None:
    recs = [Rec(i, b"hot", b"v") for i in range(50)]
    result = split_records(kafka_python_batch(recs), RangePlan([[r] for r in equal_shares(16)]))
    kept = [o.stats.records_kept for o in result.outputs]
    assert sorted(kept) == [0] * 15 + [50]
    assert sum(o.stats.empty_batches for o in result.outputs) == 15


def test_plan_lookup() -> None:
    plan = RangePlan([[KeyRange(0, 9), KeyRange(20, 29)], [KeyRange(5, 24)], None])
    assert plan.sets_for(0) == (0, 2) and plan.sets_for(7) == (0, 1, 2)
    assert plan.sets_for(15) == (1, 2) and plan.sets_for(25) == (0, 2)
    assert plan.sets_for(30) == (2,) and plan.sets_for(HASH_MAX) == (2,)
    assert not plan.disjoint and plan.full_sets == {2}


# ---------------------------------------------------------------- bad input

def _valid_blob() -> bytes:
    recs = [Rec(i, [None, b"k%d" % i, b"x" * 70][i % 3], b"v" * 30) for i in range(20)]
    return (kafka_python_batch(recs, base_offset=10)
            + control_batch(base_offset=40, commit=False)
            + kafka_python_batch(recs, codec=Codec.SNAPPY, base_offset=50))


mutations = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6)


def _mutate(blob: bytes, muts, cut: int | None, fix_crc: bool) -> bytes:
    data = bytearray(blob)
    for pos, val in muts:
        data[pos % len(data)] = val
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    if fix_crc:  # make mutations reach the record parsers instead of the CRC check
        return fix_crcs(data)
    return bytes(data)


@pytest.mark.parametrize("impl", IMPLS)
@settings(max_examples=150 * SCALE, deadline=None)
@given(muts=mutations, cut=st.one_of(st.none(), st.integers(0, 10_000)), fix_crc=st.booleans())
def test_mutated_input_raises_only_protocol_error(impl, muts, cut, fix_crc) -> None:
    blob = _mutate(_valid_blob(), muts, cut, fix_crc)
    plan = RangePlan([[r] for r in equal_shares(3)])
    with kernels.using(impl):
        for run in (
            lambda: split_records(blob, plan, max_decompressed_bytes=1 << 20),
            lambda: split_records(blob, plan, verify_crc=False, max_decompressed_bytes=1 << 20),
            lambda: match_offsets(blob, plan, verify_crc=False),
            lambda: filter_by_offsets(blob, range(0, 100, 2), verify_crc=False),
            lambda: [list(e.records()) for e in iter_batches(blob) if isinstance(e, RecordBatch)],
        ):
            try:
                run()
            except ProtocolError as exc:
                assert exc.offset is None or 0 <= exc.offset <= len(blob)


@pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")
@settings(max_examples=300 * SCALE, deadline=None)
@given(muts=mutations, cut=st.one_of(st.none(), st.integers(0, 4000)),
       n=st.integers(1, 5), base=st.sampled_from([0, 7, 2**40]))
def test_c_and_python_kernels_agree(muts, cut, n, base) -> None:
    from proxy.records import _ckernels

    recs = [Rec(i * 2, [None, b"k%d" % i, b"", b"x" * 70][i % 4], b"v" * (i * 7 % 150),
                1_700_000_000_000 + i * 40, [("h", b"1")] if i % 3 else []) for i in range(25)]
    section = kafka_python_batch(recs)[61:]
    buf = b"junk" + _mutate(section, muts, cut, False) + b"\x80\x80"
    end = len(buf) - 2
    plan = RangePlan([[r] for r in equal_shares(n)] + [[KeyRange(0, HASH_MAX // 3)]])

    def outcome(fn, *args):
        try:
            return fn(*args)
        except ProtocolError as exc:
            return ("error", exc.offset)

    args = (buf, 4, end, base, plan.bounds, plan.members, len(plan))
    assert outcome(_ckernels.split, *args) == outcome(_kernels_py.split, *args)
    assert outcome(_ckernels.match, *args) == outcome(_kernels_py.match, *args)
    keep_args = (buf, 4, end, base, frozenset(range(base, base + 60, 3)))
    assert outcome(_ckernels.keep, *keep_args) == outcome(_kernels_py.keep, *keep_args)


@pytest.mark.parametrize("impl", IMPLS)
def test_errors_carry_blob_offsets(impl) -> None:
    good = kafka_python_batch([Rec(i, b"k%d" % i, b"v") for i in range(5)])
    bad = bytearray(good)
    bad[61] = 0x7F  # first record's length varint now claims more than the batch holds
    struct.pack_into(">I", bad, 17, compute_crc(bad))
    with kernels.using(impl), pytest.raises(ProtocolError) as info:
        split_records(good + bytes(bad), RangePlan([[KeyRange(0, 5)]]))
    assert info.value.offset == len(good) + 61


def test_crc_checked_by_default() -> None:
    bad = bytearray(kafka_python_batch([Rec(0, b"k", b"v")]))
    bad[-1] ^= 1
    with pytest.raises(ProtocolError, match="CRC"):
        split_records(bytes(bad), RangePlan([None]))
    split_records(bytes(bad), RangePlan([None]), verify_crc=False)


def test_decompression_bomb_in_batch() -> None:
    blob = kafka_python_batch([Rec(i, b"k", bytes(100_000)) for i in range(20)], codec=Codec.ZSTD)
    with pytest.raises(ProtocolError, match="beyond"):
        split_records(blob, RangePlan([[KeyRange(0, 5)]]), max_decompressed_bytes=1_000_000)


def test_legacy_and_partial_entries() -> None:
    old = legacy_batch([Rec(0, b"a", b"1"), Rec(1, b"b", b"2")], magic=1, base_offset=0)
    new = kafka_python_batch([Rec(0, b"c", b"3")], base_offset=2)
    result = split_records(old + new + new[:30], RangePlan([[KeyRange(0, 1)], None]))
    for out in result.outputs:
        entries = list(iter_batches(out.records))
        # an uncompressed v1 message set is one entry per message
        assert all(isinstance(e, LegacyBatch) for e in entries[:2])
        assert b"".join(bytes(e.data) for e in entries[:2]) == old
        assert out.stats.passed_through == 2
        assert out.stats.unfiltered == 2  # the caller must not claim it filtered them
    assert result.partial_bytes == 30 and result.next_offset == 3
    only_new = split_records(new, RangePlan([[KeyRange(0, 1)]]))
    assert only_new.outputs[0].stats.unfiltered == 0
