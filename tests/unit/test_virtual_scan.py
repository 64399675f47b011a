"""What a read of a real partition proves about each share (proxy.virtual.scan)."""

from __future__ import annotations

from proxy.ranges import equal_share
from proxy.records.builder import build_batch, encode_record
from proxy.records.keyhash import key_hash
from proxy.records.stripes import STRIPED_MARKS, stripe_of
from proxy.virtual.scan import read_gaps


def _batch(base: int, keys: list[bytes], *, control: bool = False) -> bytes:
    records = [encode_record(offset_delta=i, key=key, value=b"v") for i, key in enumerate(keys)]
    return build_batch(base_offset=base, last_offset_delta=len(keys) - 1, records=records, record_count=len(keys),
                       base_timestamp=0, max_timestamp=0, attributes=0x20 if control else 0)


def _key_of(share: int, k: int, n: int = 0) -> bytes:
    """A key hashing into ``share`` of ``k`` (the ``n``-th found)."""
    found = 0
    for i in range(100_000):
        key = f"key-{i}".encode()
        r = equal_share(share, k)
        if r.start <= key_hash(key, 0) <= r.end:
            if found == n:
                return key
            found += 1
    raise AssertionError("no key found")


def test_each_share_gets_the_stretches_between_its_records() -> None:
    a, b = _key_of(0, 2), _key_of(1, 2)
    blob = _batch(10, [a, b, b]) + _batch(13, [b, a])
    gaps, end = read_gaps(blob, 10, 2, keep=4)
    assert end == 15
    assert gaps[0] == ((11, 14),)  # a at 10 and 14
    assert gaps[1] == ((10, 11), (14, 15))  # b at 11, 12, 13


def test_a_share_without_records_in_the_read_is_lifted_to_its_end() -> None:
    b = _key_of(1, 2)
    gaps, end = read_gaps(_batch(0, [b, b]), 0, 2, keep=4)
    assert end == 2
    assert gaps[0] == ((0, 2),)
    assert 1 not in gaps


def test_records_below_the_read_start_prove_nothing_below_it() -> None:
    a, b = _key_of(0, 2), _key_of(1, 2)
    gaps, end = read_gaps(_batch(5, [a, b, b]), 7, 2, keep=4)
    assert end == 8
    assert gaps[0] == ((7, 8),)
    assert gaps.get(1, ()) == ()


def test_control_batches_hold_no_share_s_record() -> None:
    a = _key_of(0, 2)
    blob = _batch(0, [a]) + _batch(1, [b"\x00\x00\x00\x00"], control=True)
    gaps, end = read_gaps(blob, 0, 2, keep=4)
    assert end == 2
    assert gaps[0] == ((1, 2),)
    assert gaps[1] == ((0, 2),)


def test_a_read_cut_short_proves_nothing_past_its_last_whole_batch() -> None:
    a = _key_of(0, 2)
    whole = _batch(0, [a])
    cut = _batch(1, [a, a])[:-5]
    gaps, end = read_gaps(whole + cut, 0, 2, keep=4)
    assert end == 1
    assert gaps[1] == ((0, 1),)
    assert read_gaps(cut, 1, 2, keep=4) == ({}, None)


def test_only_the_highest_stretches_are_kept() -> None:
    a, b = _key_of(0, 2), _key_of(1, 2)
    blob = _batch(0, [a, b, a, b, a, b, a, b])
    gaps, _ = read_gaps(blob, 0, 2, keep=2)
    assert gaps[0] == ((5, 6), (7, 8))


def test_a_stripe_takes_whole_batches() -> None:
    k = 3
    blob = _batch(0, [b"x", b"y"]) + _batch(2, [b"z"]) + _batch(3, [b"w", b"w", b"w"])
    gaps, end = read_gaps(blob, 0, STRIPED_MARKS + k, keep=8)
    assert end == 6
    owner = {0: stripe_of(0, k), 2: stripe_of(2, k), 3: stripe_of(3, k)}
    spans = {0: (0, 2), 2: (2, 3), 3: (3, 6)}
    for stripe in range(k):
        covered = set()
        for low, high in gaps.get(stripe, ()):
            covered |= set(range(low, high))
        mine = {o for base, (low, high) in spans.items() if owner[base] == stripe for o in range(low, high)}
        assert covered == set(range(6)) - mine
