"""Packed offset ranges: the C kernels give exactly the pure-Python reference's results,
and the reference follows the merge rule and validation of docs/wire-contract.md#33-offsetcommit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.commits import _packed_py as reference
from proxy.commits import packed
from proxy.commits.state import CommitState, apply_packed, apply_ranges, check, check_packed, normalise

MAX = reference.MAX_OFFSET

try:
    from proxy.commits import _cpacked
except ImportError:  # pragma: no cover - the accelerator is optional
    _cpacked = None

needs_c = pytest.mark.skipif(_cpacked is None, reason="proxy.commits._cpacked is not built")

_offsets = st.one_of(st.integers(-3, 70), st.sampled_from([MAX - 2, MAX - 1, MAX]))
_any_ranges = st.lists(st.tuples(_offsets, _offsets), max_size=10)
_ranges = st.lists(st.tuples(st.integers(0, 70), st.integers(0, 9)).map(lambda r: (r[0], r[0] + r[1])),
                   max_size=10)


def _held(stable: int, ranges) -> tuple[int, bytes]:
    """A reachable (S, R): the merge of ``ranges`` into S."""
    return reference.merge(stable, b"", reference.pack(ranges))


def test_pack_unpack_and_layout():
    data = packed.pack([(1, 2), (MAX - 1, MAX - 1)])
    assert len(data) == 2 * packed.RANGE_SIZE
    assert data[:17] == (1).to_bytes(8, "big") + (2).to_bytes(8, "big") + b"\x00"
    assert packed.unpack(data) == [(1, 2), (MAX - 1, MAX - 1)]
    with pytest.raises(ValueError, match="multiple of 17"):
        packed.unpack(data[:-1])


@needs_c
@settings(max_examples=2000, deadline=None)
@given(_any_ranges)
def test_sort_checked_matches_the_reference(ranges):
    data = reference.pack(ranges)
    assert _cpacked.sort_checked(data) == reference.sort_checked(data)
    assert _cpacked.sort_checked(bytearray(data)) == reference.sort_checked(data)


@needs_c
@settings(max_examples=2000, deadline=None)
@given(st.integers(0, 40), _ranges, _ranges)
def test_merge_and_stable_after_match_the_reference(stable, held, commit):
    stable, held_packed = _held(stable, held)
    commit_packed = reference.pack(commit)  # any order, overlaps allowed
    expected = reference.merge(stable, held_packed, commit_packed)
    assert _cpacked.merge(stable, held_packed, commit_packed) == expected
    assert _cpacked.merge(stable, memoryview(held_packed), bytearray(commit_packed)) == expected
    assert _cpacked.stable_after(stable, held_packed, commit_packed) == expected[0]
    assert reference.stable_after(stable, held_packed, commit_packed) == expected[0]


@pytest.mark.parametrize("impl", [reference, pytest.param(_cpacked, marks=needs_c)],
                         ids=["python", "c"])
def test_bad_input_is_refused_alike(impl):
    with pytest.raises(ValueError, match="multiple of 17"):
        impl.merge(0, b"\x00" * 16, b"")
    with pytest.raises(ValueError, match="multiple of 17"):
        impl.sort_checked(b"\x00" * 18)
    with pytest.raises(OverflowError):
        impl.merge(0, b"", reference.pack([(0, MAX)]))
    with pytest.raises(OverflowError):
        impl.stable_after(0, b"", reference.pack([(0, MAX)]))
    assert impl.sort_checked(b"") == ("no ranges", b"")


@settings(max_examples=1000, deadline=None)
@given(_any_ranges, st.integers(1, 12))
def test_check_packed_agrees_with_the_tuple_check(ranges, max_ranges):
    reason, ordered = check(-1, ranges, max_ranges)
    packed_reason, packed_ordered = check_packed(-1, reference.pack(ranges), max_ranges)
    assert packed_reason == reason
    if reason is None:
        assert reference.unpack(packed_ordered) == ordered
    assert check_packed(5, reference.pack(ranges), max_ranges)[0] == check(5, ranges, max_ranges)[0]


def test_sorted_input_is_returned_as_it_is():
    data = reference.pack([(1, 2), (4, 9)])
    reason, ordered = check_packed(-1, data, 10)
    assert reason is None and ordered == data
    assert check_packed(-1, reference.pack([(4, 9), (1, 2)]), 10) == (None, data)


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 30), _ranges, st.lists(_ranges, max_size=5))
def test_the_merge_keeps_the_state_well_formed(stable, held, commits):
    state = CommitState.from_packed(*_held(stable, held))
    for commit in commits:
        state = apply_packed(state, reference.pack(commit))
    assert state.ranges == tuple(normalise(state.ranges))
    assert all(start > state.stable for start, _ in state.ranges)
    assert state == apply_ranges(CommitState(stable), [*held, *(r for c in commits for r in c)])


@pytest.mark.parametrize("impl", [reference, pytest.param(_cpacked, marks=needs_c)], ids=["python", "c"])
def test_deltas_layout_and_bad_input(impl):
    data = reference.pack([(43, 45), (48, 49), (300, 300)])
    deltas = impl.to_deltas(40, data)
    assert deltas == bytes([3, 2, 2, 1]) + bytes([250, 1, 0])  # 43-40, 45-43, 48-46, 49-48, 300-50 (varint), 0
    assert impl.from_deltas(40, deltas) == data
    assert impl.to_deltas(40, b"") == b"" and impl.from_deltas(40, b"") == b""
    for not_a_state in ([(40, 41)], [(43, 45), (46, 47)], [(43, 42)], [(50, 51), (43, 45)]):
        with pytest.raises(ValueError):
            impl.to_deltas(40, reference.pack(not_a_state))
    for garbage in (b"\x00\x01", b"\x01", b"\x81", b"\xff" * 10 + b"\x01\x00", b"\x01" + b"\xff" * 8 + b"\x7f"):
        with pytest.raises(ValueError):
            impl.from_deltas(40, garbage)
    with pytest.raises(ValueError):
        impl.from_deltas(-1, b"\x01\x00")


@needs_c
@settings(max_examples=2000, deadline=None)
@given(st.integers(0, MAX - 1), st.lists(st.tuples(st.integers(1, 1 << 62), st.integers(0, 1 << 62)), max_size=12),
       st.binary(max_size=24))
def test_deltas_match_the_reference(stable, steps, garbage):
    ranges, cursor = [], stable
    for gap, length in steps:
        start = cursor + gap
        if start + length >= MAX:
            break
        ranges.append((start, start + length))
        cursor = start + length + 1
    data = reference.pack(ranges)
    deltas = reference.to_deltas(stable, data)
    assert _cpacked.to_deltas(stable, data) == deltas
    assert _cpacked.from_deltas(stable, deltas) == reference.from_deltas(stable, deltas) == data

    def outcome(impl):
        try:
            return impl.from_deltas(stable, garbage)
        except ValueError:
            return ValueError

    assert outcome(_cpacked) == outcome(reference)
