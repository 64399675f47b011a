"""Key hash vectors (docs/wire-contract.md#2-key-hash-and-ranges) and key-range helpers."""

from __future__ import annotations

import struct

import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from proxy.ranges import (
    FULL_RANGE,
    HASH_MAX,
    KeyRange,
    contains,
    covers,
    effective_ranges,
    equal_share,
    equal_shares,
    normalize,
    subtract,
    validate_ranges,
)
from proxy.records.keyhash import key_hash, null_key_hash

# Computed with the xxhash package as the spec states: xxh3_64(seed=0) >> 1; null keys hash
# the absolute offset as 8-byte big-endian signed.
KEY_VECTORS = [
    (b"", 1622210670741801569),
    (b"a", 8314517215945369359),
    (b"hello", 5380381168995757694),
    (bytes(range(16)), 4731860249110886509),
    (b"x" * 100, 7243127955456026401),
]
OFFSET_VECTORS = [
    (0, 7187073606193763948),
    (1, 8770097325205603833),
    (-1, 2920834987923874313),
    (2**63 - 1, 8942317137017434824),
    (1234567890123, 4411479103263507912),
]


@pytest.mark.parametrize("key, expected", KEY_VECTORS)
def test_key_vectors(key: bytes, expected: int) -> None:
    assert key_hash(key, offset=999) == expected
    assert key_hash(memoryview(key), offset=0) == expected
    assert expected == xxhash.xxh3_64_intdigest(key, seed=0) >> 1


@pytest.mark.parametrize("offset, expected", OFFSET_VECTORS)
def test_null_key_vectors(offset: int, expected: int) -> None:
    assert key_hash(None, offset) == expected == null_key_hash(offset)
    assert expected == xxhash.xxh3_64_intdigest(struct.pack(">q", offset)) >> 1


@given(st.binary(max_size=64))
def test_hash_in_range(key: bytes) -> None:
    assert 0 <= key_hash(key, 0) <= HASH_MAX


def test_equal_shares_formula_and_coverage() -> None:
    for n in (1, 2, 3, 7, 16, 1000):
        shares = equal_shares(n)
        assert shares[0].start == 0 and shares[-1].end == HASH_MAX
        assert validate_ranges(shares) is None
        assert all(a.end + 1 == b.start for a, b in zip(shares, shares[1:]))
        assert shares[n // 2] == KeyRange((n // 2) * 2**63 // n, (n // 2 + 1) * 2**63 // n - 1)
        assert equal_share(n - 1, n) == shares[-1]
    assert equal_shares(1) == [FULL_RANGE]
    with pytest.raises(ValueError):
        equal_shares(0)


@pytest.mark.parametrize(
    "ranges, reason",
    [
        ([], None),
        ([KeyRange(0, HASH_MAX)], None),
        ([KeyRange(0, 5), KeyRange(6, 9)], None),
        ([KeyRange(6, 9), KeyRange(0, 5)], "unsorted"),
        ([KeyRange(0, 6), KeyRange(6, 9)], "overlaps"),
        ([KeyRange(-1, 5)], "outside"),
        ([KeyRange(0, 2**63)], "outside"),
        ([KeyRange(5, 4)], "start"),
    ],
)
def test_validate_ranges(ranges, reason) -> None:
    got = validate_ranges(ranges)
    if reason is None:
        assert got is None
    else:
        assert got is not None and reason in got


def test_contains_and_normalize() -> None:
    rs = [KeyRange(10, 20), KeyRange(30, 40)]
    assert contains(rs, 10) and contains(rs, 40) and not contains(rs, 25)
    assert contains([], 123) and contains(None, HASH_MAX)
    assert 15 in rs[0] and 21 not in rs[0]
    assert normalize([KeyRange(30, 40), KeyRange(0, 5), KeyRange(6, 8), KeyRange(35, 50)]) == [
        KeyRange(0, 8),
        KeyRange(30, 50),
    ]
    assert effective_ranges(None) == [FULL_RANGE]


_PAIRS = st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 1000)), max_size=8)


@given(_PAIRS, _PAIRS, st.integers(0, 1000))
def test_subtract_keeps_exactly_the_hashes_not_taken(pairs, taken, point) -> None:
    ranges = [KeyRange(min(a, b), max(a, b)) for a, b in pairs]
    minus = [KeyRange(min(a, b), max(a, b)) for a, b in taken]
    left = subtract(ranges, minus)
    assert validate_ranges(left) is None and left == normalize(left)
    assert any(point in r for r in left) == (any(point in r for r in ranges) and not any(point in r for r in minus))
    assert covers(ranges, left) and covers(ranges + minus, ranges)
    assert covers(ranges, minus) == (not subtract(minus, ranges))


def test_subtract_from_the_whole_space() -> None:
    quarters = equal_shares(4)
    assert subtract([FULL_RANGE], quarters[:2]) == [KeyRange(quarters[2].start, HASH_MAX)]
    assert subtract([FULL_RANGE], quarters) == []
    assert covers([FULL_RANGE], quarters) and not covers(quarters[:1], quarters[:2])


@given(_PAIRS, st.integers(0, 1000))
def test_normalize_preserves_union(pairs, point) -> None:
    ranges = [KeyRange(min(a, b), max(a, b)) for a, b in pairs]
    merged = normalize(ranges)
    assert validate_ranges(merged) is None
    assert all(a.end + 1 < b.start for a, b in zip(merged, merged[1:]))
    assert any(point in r for r in ranges) == any(point in r for r in merged)
