"""The whole-blob split in C (``_ckernels.split_blob``) against the Python loop of ``split_records``.

``split_records`` hands a blob to ``split_blob`` first when the accelerator is built; the
result must be the Python loop's to the byte and to the stat, and anything the C code does
not take (compressed or magic 0/1 entries, malformed input) must come back as None so the
loop runs and raises its own error. Blobs are generated from seeds, so a failure names its
seed. The CRC32C the C code checks and writes is compared with the ``crc32c`` package, and
the point of it all, that the call runs without the GIL, is checked by racing it against a
Python loop.
"""

from __future__ import annotations

import os
import random
import struct
import sys
import threading
import time
from array import array
from bisect import bisect_left, bisect_right

import crc32c
import pytest

from harness.batches import Rec, control_batch, fix_crcs, kafka_python_batch, legacy_batch
from proxy.protocol.errors import ProtocolError
from proxy.ranges import HASH_MAX, KeyRange, equal_shares
from proxy.records import kernels
from proxy.records.batch import (
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    LegacyBatch,
    RecordBatch,
    iter_batches,
)
from proxy.records.builder import build_batch, encode_record
from proxy.records.compression import Codec
from proxy.records.plan import RangePlan
from proxy.records.split import split_records

pytestmark = pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")

SEEDS = range(int(os.environ.get("KEYRANGE_FUZZ_SCALE", "1")) * 250)


# ---------------------------------------------------------------- generated blobs

def _key(rnd: random.Random) -> bytes | None:
    return rnd.choice([
        None, b"", b"hot", rnd.randbytes(rnd.randint(1, 20)),
        rnd.randbytes(rnd.randint(60, 200)),  # beyond the one-byte key length fast path
    ])


def _value(rnd: random.Random) -> bytes | None:
    size = rnd.choice([0, rnd.randint(1, 100), rnd.randint(100, 3000)])
    if rnd.random() < 0.03:
        size = rnd.randint(8200, 12000)  # a three-byte record length
    return None if rnd.random() < 0.1 else rnd.randbytes(size)


def _record(rnd: random.Random, delta: int) -> bytes:
    return encode_record(
        offset_delta=delta,
        timestamp_delta=rnd.choice([0, rnd.randint(-5, 5), rnd.randint(-(10**9), 10**9)]),
        key=_key(rnd),
        value=_value(rnd),
        headers=[("trace", rnd.randbytes(4))] if rnd.random() < 0.3 else [],
    )


def _data_batch(rnd: random.Random, offset: int) -> tuple[bytes, int]:
    """An uncompressed batch at ``offset``, empty or not, plain or transactional; its next offset."""
    n = rnd.choice([0, 1, rnd.randint(1, 10), rnd.randint(10, 80)])
    deltas, delta = [], 0
    for i in range(n):
        delta += rnd.choice([1, 1, 1, 2, 5]) if i else 0  # gaps as compaction leaves
        deltas.append(delta)
    if n and rnd.random() < 0.25:  # another encoder's bytes
        recs = [Rec(d, _key(rnd), _value(rnd), 1_700_000_000_000 + rnd.randint(0, 10**6)) for d in deltas]
        transactional = rnd.random() < 0.5
        blob = kafka_python_batch(recs, base_offset=offset, transactional=transactional,
                                  partition_leader_epoch=rnd.randint(0, 40))
        return blob, offset + deltas[-1] + 1
    last_delta = (deltas[-1] if n else 0) + rnd.choice([0, 0, 3])
    transactional = rnd.random() < 0.4
    base_ts = rnd.choice([-1, 1_700_000_000_000 + rnd.randint(0, 10**6)])
    blob = build_batch(
        base_offset=offset,
        last_offset_delta=last_delta,
        records=[_record(rnd, d) for d in deltas],
        record_count=n,
        base_timestamp=base_ts,
        max_timestamp=base_ts + rnd.randint(0, 10**4),
        attributes=(TRANSACTIONAL_BIT if transactional else 0) | rnd.choice([0, TIMESTAMP_TYPE_BIT]),
        partition_leader_epoch=rnd.randint(-1, 40),
        producer_id=rnd.randint(0, 10**12) if transactional else -1,
        producer_epoch=rnd.randint(0, 30_000) if transactional else -1,
        base_sequence=rnd.randint(0, 10**6) if transactional else -1,
    )
    return blob, offset + last_delta + 1


def _entries(rnd: random.Random, offset: int, count: int) -> tuple[list[bytes], int]:
    entries = []
    for _ in range(count):
        if rnd.random() < 0.2:
            entries.append(control_batch(base_offset=offset, commit=rnd.random() < 0.5,
                                         producer_id=rnd.randint(0, 10**9)))
            offset += 1
        else:
            blob, offset = _data_batch(rnd, offset)
            entries.append(blob)
    return entries, offset


def _blob(rnd: random.Random) -> bytes:
    """Uncompressed and control batches, maybe cut short; sometimes nothing at all."""
    offset = rnd.choice([0, rnd.randint(0, 2**40)])
    entries, offset = _entries(rnd, offset, rnd.choice([0, 1, rnd.randint(1, 12)]))
    blob = b"".join(entries)
    if rnd.random() < 0.4:
        tail, _ = _data_batch(rnd, offset)
        blob += tail[: rnd.randint(1, len(tail) - 1)]
    return blob


def _plan(rnd: random.Random) -> RangePlan:
    """1-16 sets: equal shares, whole-space sets, random (often overlapping) ranges, or a mix."""
    kind = rnd.randrange(4)
    n = rnd.randint(1, 16)
    if kind == 0:
        return RangePlan([[r] for r in equal_shares(n)])
    if kind == 1:
        return RangePlan([rnd.choice([None, [], [KeyRange(0, HASH_MAX)]]) for _ in range(n)])
    sets: list[list[KeyRange] | None] = []
    for _ in range(n):
        cuts = sorted({rnd.randint(0, HASH_MAX) for _ in range(2 * rnd.randint(1, 4))})
        sets.append([KeyRange(a, b) for a, b in zip(cuts[::2], cuts[1::2])] or None)
    if kind == 3:
        sets[rnd.randrange(n)] = None
        sets[rnd.randrange(n)] = [equal_shares(2)[rnd.randrange(2)]]
    return RangePlan(sets)


# ---------------------------------------------------------------- helpers

def _outcome(blob: bytes, plan: RangePlan, impl: str, **options):
    """What split_records gives or raises (message, offset) with ``impl``: "c" (the default,
    whole blob first), "c-per-batch" (the C record kernel in the per-batch loop) or "python"."""
    try:
        if impl == "c":
            return split_records(blob, plan, **options)
        with kernels.using(impl.removesuffix("-per-batch"), whole_blob=False):
            return split_records(blob, plan, **options)
    except ProtocolError as exc:
        return ("error", str(exc), exc.offset)


def _same_outcome(blob: bytes, plan: RangePlan, **options):
    """The accelerated split_records gives what the per-batch loop gives, exceptions to the
    letter; and what the Python kernels give, their errors at the same offset (the two
    record kernels word a few reasons differently). Returns that outcome."""
    got = _outcome(blob, plan, "c", **options)
    assert got == _outcome(blob, plan, "c-per-batch", **options)
    python = _outcome(blob, plan, "python", **options)
    if isinstance(got, tuple):
        assert isinstance(python, tuple) and python[2] == got[2]
    else:
        assert got == python
    return got


def _whole(blob: bytes, plan: RangePlan, verify_crc: bool = True):
    assert kernels.split_blob is not None
    all_full = len(plan.full_sets) == len(plan)
    return kernels.split_blob(blob, plan.bounds, plan.members, len(plan), all_full, verify_crc)


def _batch_positions(blob: bytes) -> list[int]:
    return [e.position for e in iter_batches(blob) if isinstance(e, RecordBatch)]


# ---------------------------------------------------------------- same results

@pytest.mark.parametrize("seed", SEEDS)
def test_whole_blob_split_equals_the_python_loop(seed) -> None:
    rnd = random.Random(seed)
    blob, plan = _blob(rnd), _plan(rnd)
    for verify in (True, False):
        assert _whole(blob, plan, verify) is not None  # the C path, not a fallback
        for codec in (None, Codec.NONE):
            want = _outcome(blob, plan, "python", codec=codec, verify_crc=verify)
            got = _outcome(blob, plan, "c", codec=codec, verify_crc=verify)
            assert isinstance(want, type(got))
            assert got == want


@pytest.mark.parametrize("seed", SEEDS[:20])
def test_a_view_of_a_frame_splits_as_its_bytes(seed) -> None:
    """The proxy splits ``records`` fields as views of the response frame (a bytearray),
    handed to the kernel without a copy first."""
    rnd = random.Random(seed)
    blob, plan = _blob(rnd), _plan(rnd)
    frame = bytearray(b"head" + blob + b"tail")
    view = memoryview(frame)[4:4 + len(blob)]
    assert split_records(view, plan) == split_records(blob, plan)


def test_every_field_of_a_known_split() -> None:
    plan = RangePlan([[KeyRange(0, HASH_MAX // 2)], [KeyRange(HASH_MAX // 2 + 1, HASH_MAX)], None])
    recs = [encode_record(offset_delta=i, key=b"k%d" % i, value=b"v" * i) for i in range(30)]
    data = build_batch(base_offset=100, last_offset_delta=29, records=recs, record_count=30,
                       base_timestamp=5, max_timestamp=9)
    empty = build_batch(base_offset=130, last_offset_delta=4, records=b"", record_count=0,
                        base_timestamp=5, max_timestamp=5)
    marker = control_batch(base_offset=135, commit=True)
    blob = data + empty + marker + data[:40]
    got = split_records(blob, plan)
    assert got == _outcome(blob, plan, "python")
    assert (got.bytes_in, got.partial_bytes, got.next_offset) == (len(blob), 40, 136)
    halves = [o.stats.records_kept for o in got.outputs[:2]]
    assert sum(halves) == 30 and 0 not in halves
    for out in got.outputs[:2]:
        s = out.stats
        assert (s.batches_out, s.passed_through, s.unfiltered, s.empty_batches) == (3, 1, 0, 0)
        assert s.records_dropped == 30 - s.records_kept and s.bytes_out == len(out.records)
        batches = list(iter_batches(out.records))
        assert [bytes(b.data) for b in batches[1:]] == [empty, marker]
        for b in batches:
            b.verify_crc()
    assert got.outputs[2].records == data + empty + marker  # the whole space: bytes unchanged


def test_empty_blobs_and_lone_partial_tails() -> None:
    plan = RangePlan([[r] for r in equal_shares(3)])
    for blob in (b"", b"\x00" * 5, kafka_python_batch([Rec(0, b"k", b"v")])[:30]):
        got = split_records(blob, plan)
        assert got == _outcome(blob, plan, "python")
        assert got.next_offset is None and got.partial_bytes == len(blob)
        assert _whole(blob, plan) is not None


# ---------------------------------------------------------------- fallbacks

def _with_foreign_entry(rnd: random.Random) -> bytes:
    """A blob of the generated kind holding one compressed batch or magic 0/1 entry."""
    entries, offset = _entries(rnd, rnd.randint(0, 2**30), rnd.randint(0, 5))
    recs = [Rec(i, _key(rnd), b"compressible " * 20) for i in range(rnd.randint(1, 20))]
    if rnd.random() < 0.5:
        foreign = kafka_python_batch(recs, base_offset=offset,
                                     codec=rnd.choice([Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD]))
    else:
        foreign = legacy_batch([Rec(r.offset_delta, r.key or b"k", r.value) for r in recs],
                               magic=rnd.choice([0, 1]), base_offset=offset)
    entries.insert(rnd.randint(0, len(entries)), foreign)
    return b"".join(entries)


@pytest.mark.parametrize("seed", range(60))
def test_compressed_and_legacy_entries_fall_back(seed) -> None:
    rnd = random.Random(seed)
    blob, plan = _with_foreign_entry(rnd), _plan(rnd)
    foreign = [e for e in iter_batches(blob)
               if isinstance(e, LegacyBatch) or (isinstance(e, RecordBatch) and e.header.codec != Codec.NONE)]
    assert foreign
    assert _whole(blob, plan) is None
    for codec in (None, Codec.NONE, Codec.LZ4):
        _same_outcome(blob, plan, codec=codec)


@pytest.mark.parametrize("seed", range(250))
def test_mutated_blobs_give_the_same_result_or_the_same_error(seed) -> None:
    rnd = random.Random(10_000 + seed)
    blob = bytearray(_blob(rnd) or _data_batch(rnd, 0)[0])
    for _ in range(rnd.randint(1, 4)):
        blob[rnd.randrange(len(blob))] = rnd.randrange(256)
    mutated = fix_crcs(blob) if rnd.random() < 0.7 else bytes(blob)
    plan = _plan(rnd)
    for verify in (True, False):
        if isinstance(_same_outcome(mutated, plan, verify_crc=verify), tuple):
            assert _whole(mutated, plan, verify) is None


def _patched(fmt: str, at: int, value: int, *, fix_crc: bool = True):
    def patch(batch: bytes) -> bytes:
        data = bytearray(batch)
        struct.pack_into(fmt, data, at, value)
        return fix_crcs(data) if fix_crc else bytes(data)
    return patch


FAULTS = {
    "bad CRC": lambda b: b[:-1] + bytes([b[-1] ^ 1]),
    "one record more than declared": _patched(">i", 57, 9),
    "one record fewer than declared": _patched(">i", 57, 11),
    "a record count its bytes cannot hold": _patched(">i", 57, 2**31 - 1),
    "a record count just past a fifth of its bytes": _patched(">i", 57, 320 // 5 + 1),
    "negative record count": _patched(">i", 57, -1),
    "negative last offset delta": _patched(">i", 23, -3),
    "unknown codec": _patched(">H", 21, 5),
    "magic 3": _patched(">b", 16, 3, fix_crc=False),
    "entry length below any format": _patched(">i", 8, 13, fix_crc=False),
    "v2 length below its header": _patched(">i", 8, 40, fix_crc=False),
    "negative base offset": _patched(">q", 0, -5, fix_crc=False),
    "base offset beyond int64 with the deltas": _patched(">q", 0, 2**63 - 5, fix_crc=False),
    "record length past the batch": _patched(">B", 61, 0x7F),
    "record length zero": _patched(">B", 61, 0),
    "key length past its record": _patched(">B", 65, 0x7E),
    "negative key length": _patched(">B", 65, 5),
}


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("sets", [[None], [None, []], [[KeyRange(0, HASH_MAX // 3)]], "shares"])
def test_faults_fall_back_to_the_python_error(fault, sets) -> None:
    plan = RangePlan([[r] for r in equal_shares(4)] if sets == "shares" else sets)
    recs = [encode_record(offset_delta=i, key=b"key-%d" % i, value=b"v" * 20) for i in range(10)]
    good = build_batch(base_offset=50, last_offset_delta=9, records=recs, record_count=10,
                       base_timestamp=1, max_timestamp=2)
    blob = good + control_batch(base_offset=60, commit=True) + FAULTS[fault](good)
    for verify in (True, False):
        if isinstance(_same_outcome(blob, plan, verify_crc=verify), tuple):
            assert _whole(blob, plan, verify) is None
    # A whole-space plan does not walk records: its faults there are nobody's to report.
    walked = len(plan.full_sets) != len(plan)
    if walked or fault in ("bad CRC", "magic 3", "negative record count", "unknown codec"):
        assert isinstance(_outcome(blob, plan, "python"), tuple), "the fault was not one"


def test_no_sets_falls_back() -> None:
    blob = kafka_python_batch([Rec(0, b"k", b"v")])
    assert _whole(blob, RangePlan([])) is None
    assert split_records(blob, RangePlan([])) == _outcome(blob, RangePlan([]), "python")


def test_python_kernels_turn_the_whole_blob_path_off() -> None:
    with kernels.using("python"):
        assert kernels.split_blob is None
    with kernels.using("c", whole_blob=False):
        assert kernels.split_blob is None
    assert kernels.split_blob is not None


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_a_late_fallback_frees_its_scratch() -> None:
    """A bad CRC in the last batch: every record was routed into scratch before the
    fault; a leak of it would be megabytes a call."""
    blob = _tiny_records_blob(batches=200)
    bad = bytearray(blob)
    bad[-1] ^= 1
    bad_blob = bytes(bad)
    plan = RangePlan([[r] for r in equal_shares(4)])
    for _ in range(3):
        assert _whole(bad_blob, plan) is None and _whole(blob, plan) is not None
    before = _rss_bytes()
    for _ in range(60):
        assert _whole(bad_blob, plan) is None
        assert _whole(blob, plan) is not None
    assert _rss_bytes() - before < 40 << 20


# ---------------------------------------------------------------- CRC32C

def test_crc32c_equals_the_crc32c_package() -> None:
    from proxy.records import _ckernels

    assert _ckernels.crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C
    rnd = random.Random(3)
    data = rnd.randbytes(200_000)
    view = memoryview(data)
    cases = [(start, n) for start in range(9) for n in range(71)]
    # around the chunks of the three interleaved lanes (3 x 128, 3 x 1024, 3 x 8192 bytes)
    cases += [(start, 3 * lane + d) for start in (0, 5) for lane in (128, 1024, 8192) for d in (-1, 0, 1, 8)]
    cases += [(rnd.randrange(64), rnd.randrange(1, 200_000 - 64)) for _ in range(200)]
    for start, n in cases:
        chunk = view[start:start + n]
        seed = rnd.choice([0, rnd.getrandbits(32)])
        want = crc32c.crc32c(chunk, seed)
        assert _ckernels.crc32c(chunk, seed) == want, (start, n)
        assert _ckernels.crc32c(chunk, seed, False) == want, (start, n)  # the table path


# ---------------------------------------------------------------- the GIL

def _tiny_records_blob(batches: int) -> bytes:
    """Many batches of 1,000 small records: routing work per byte is at its highest."""
    rnd = random.Random(5)
    recs = [encode_record(offset_delta=i, key=rnd.choice([None, rnd.randbytes(4)]), value=b"")
            for i in range(1000)]
    one = bytearray(build_batch(base_offset=0, last_offset_delta=999, records=recs,
                                record_count=1000, base_timestamp=1, max_timestamp=1))
    out = []
    for i in range(batches):  # the base offset lies outside the CRC
        struct.pack_into(">q", one, 0, i * 1000)
        out.append(bytes(one))
    return b"".join(out)


def _race(args: tuple, calls: int) -> tuple[list[tuple[float, float]], array]:
    """Run ``calls`` split_blob calls on a thread while this one ticks; when each call began
    and ended, and when each tick was."""
    windows: list[tuple[float, float]] = []

    def work() -> None:
        for _ in range(calls):
            began = time.perf_counter()
            assert kernels.split_blob is not None and kernels.split_blob(*args) is not None
            windows.append((began, time.perf_counter()))

    ticks = array("d")
    worker = threading.Thread(target=work)
    worker.start()
    while worker.is_alive() and len(ticks) < 20_000_000:  # bounded whatever happens
        ticks.append(time.perf_counter())
    worker.join()
    return windows, ticks


def test_split_blob_runs_without_the_gil() -> None:
    """While split_blob runs on a thread, this thread keeps executing Python.

    A call that held the GIL would let no tick land strictly inside it: the middle half of
    each call leaves room for the hand-over around its edges, which a short switch interval
    keeps well below it. Calls last tens of milliseconds (the blob grows until they do)."""
    plan = RangePlan([[r] for r in equal_shares(8)] + [[KeyRange(0, HASH_MAX // 3)], None])
    batches = 100
    while True:
        args = (_tiny_records_blob(batches), plan.bounds, plan.members, len(plan), False, True)
        began = time.perf_counter()
        kernels.split_blob(*args)
        if time.perf_counter() - began > 0.03 or batches >= 3200:
            break
        batches *= 2
    saved = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    try:
        for _ in range(5):  # a loaded machine may starve this thread through one race
            windows, ticks = _race(args, calls=4)
            inside = sum(
                bisect_left(ticks, b - (b - a) / 4) - bisect_right(ticks, a + (b - a) / 4)
                for a, b in windows
            )
            if inside:
                return
    finally:
        sys.setswitchinterval(saved)
    pytest.fail("no Python ran on the main thread while split_blob ran")
