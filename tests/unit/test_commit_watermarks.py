"""Share watermarks of virtual topics in the individual-commit state: the log value v2,
the merge rule of two writers, S settling, and the coordinator's copy (no I/O)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.commits.codec import decode_value, encode_key, encode_value, encode_value_generic
from proxy.commits.packed import MAX_OFFSET
from proxy.commits.range_commit import Forward, RangeCommit, Write
from proxy.commits.state import (
    MAX_SHARES,
    CommitState,
    MarkEdit,
    apply_marks,
    apply_plain,
    apply_ranges,
    join,
    rebase_commit,
    settle,
    watermark_floor,
)
from proxy.commits.table import StateTable
from proxy.commits.watermarks import combine, decode_metadata, encode_metadata, per_share

K = ("t", 0)


def test_value_v2_round_trips_watermarks_and_v1_is_still_written_without_them():
    state = apply_marks(apply_ranges(CommitState(5, epoch=3), [(9, 9)]), MarkEdit(4, {0: 12, 2: 30}))
    value = encode_value(state)
    assert value[:2] == b"\x00\x02"
    assert decode_value(value) == state and decode_value(value).marks == ((4, 0, 12, 1), (4, 2, 30, 1))
    assert encode_value(CommitState(5, ((9, 9),)))[:2] == b"\x00\x01"  # no watermarks: v1, as before
    assert encode_value_generic(CommitState(5, ((9, 9),)), 2)[:2] == b"\x00\x02"
    assert decode_value(encode_value_generic(CommitState(5, ((9, 9),)), 2)) == CommitState(5, ((9, 9),))
    for version in (0, 1):  # older versions still decode (no watermarks)
        assert decode_value(encode_value_generic(CommitState(5, ((9, 9),)), version)) == CommitState(5, ((9, 9),))


def test_s_settles_to_the_lowest_watermark_once_every_share_has_one_and_never_moves_back():
    state = CommitState(-1)
    state = apply_marks(state, MarkEdit(3, {0: 10}))
    assert state.stable == -1
    state = apply_marks(state, MarkEdit(3, {1: 7, 2: 12}))
    assert state.stable == 7 and watermark_floor(state.marks) == 7
    rewound = apply_marks(state, MarkEdit(3, {1: 3}))  # a share sought back: its W moves, S does not
    assert rewound.stable == 7 and per_share(rewound.marks) == {3: [10, 3, 12]}
    moved = apply_marks(state, MarkEdit(3, {1: 11}))
    assert moved.stable == 10


def test_ranges_above_fold_into_s_when_the_watermarks_reach_them():
    state = apply_ranges(CommitState(0), [(20, 24)])
    state = apply_marks(state, MarkEdit(2, {0: 20, 1: 25}))
    assert state.stable == 25 and state.ranges == ()


def test_two_writers_of_different_shares_join_to_both():
    base = apply_marks(CommitState(0), MarkEdit(2, {0: 5, 1: 5}))
    a = apply_marks(base, MarkEdit(2, {0: 40}))
    b = apply_marks(base, MarkEdit(2, {1: 30}))
    assert join(a, b) == join(b, a)
    assert per_share(join(a, b).marks) == {2: [40, 30]} and join(a, b).stable == 30


def test_the_newer_commit_of_one_share_wins_even_when_lower():
    first = apply_marks(CommitState(0), MarkEdit(2, {0: 50}))
    later = apply_marks(first, MarkEdit(2, {0: 20}))  # sought back and committed lower
    assert per_share(join(first, later).marks) == {2: [20, -1]}
    assert join(first, later) == join(later, first)


def test_a_plain_commit_resets_the_watermarks_with_the_epoch():
    marked = apply_marks(CommitState(0), MarkEdit(2, {0: 50, 1: 60}))
    reset = apply_plain(10, marked)
    assert reset.marks == () and reset.epoch == marked.epoch + 1
    assert join(marked, reset) == reset  # a record from before the reset adds nothing
    # A watermark commit computed before the reset, brought up to it, applies on top of it.
    redone = rebase_commit(apply_marks(marked, MarkEdit(2, {0: 70})), reset, [MarkEdit(2, {0: 70})])
    assert redone.epoch == reset.epoch and per_share(redone.marks) == {2: [70, -1]} and redone.stable == 10


edits = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 100)), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(edits, edits, st.randoms(use_true_random=False))
def test_join_is_a_merge_whatever_the_order(first, second, rng):
    """Records of one epoch from two writers: any order of joining gives the same
    watermarks, joining again changes nothing, and neither writer's newest watermark of a
    share is lost to an older one. S never moves back: a reader that joined records whose
    floor a later, lower commit of a share undid (a rewind) keeps that floor. So S is at
    least the final watermarks' floor, and never above what every share reported
    processed at some time (the lowest over the shares of each one's highest watermark):
    nothing unprocessed reads as processed."""
    def run(state, steps):
        out = [state]
        for share, offset in steps:
            state = apply_marks(state, MarkEdit(3, {share: offset}))
            out.append(state)
        return out
    a = run(CommitState(0), first)
    b = run(CommitState(0), second)
    records = a[1:] + b[1:]
    rng.shuffle(records)
    merged = records[0]
    for record in records[1:]:
        merged = join(merged, record)
    expected = join(a[-1], b[-1])
    assert merged.marks == expected.marks and join(merged, expected).marks == expected.marks
    assert join(merged, merged) == merged
    highest: dict[int, int] = {}
    for share, offset in first + second:
        highest[share] = max(highest.get(share, 0), offset)
    bound = min(highest.values()) if len(highest) == 3 else 0
    assert expected.stable <= merged.stable <= max(bound, 0)
    assert merged.stable >= max(a[-1].stable, b[-1].stable)


def test_metadata_carries_epoch_and_sequences_and_reads_the_old_form():
    state = apply_marks(CommitState(0, epoch=2), MarkEdit(2, {0: 5, 1: 9}))
    assert decode_metadata(encode_metadata(state)) == (2, state.marks)
    assert decode_metadata("keyrange.watermarks/1:3:10,-1,12") == (None, ((3, 0, 10, 0), (3, 2, 12, 0)))
    assert decode_metadata("a client's own metadata") is None
    assert decode_metadata("keyrange.watermarks/2:x:") is None
    assert decode_metadata("keyrange.watermarks/2:0:2/5=1@1") is None  # share out of range


def test_s_does_not_move_while_a_share_is_missing_even_with_another_listed_twice():
    # Share 1 of 2 has processed nothing; share 0 is listed twice.
    twice = ((2, 0, 50, 1), (2, 0, 60, 2))
    assert watermark_floor(twice) == -1
    assert settle(CommitState(10, (), 0, twice)).stable == 10
    assert watermark_floor(((2, 0, 50, 1), (2, 5, 60, 1))) == -1  # a share that does not exist counts for none
    # Every share present, one twice: complete, at the lower of its two watermarks.
    assert watermark_floor(((2, 0, 50, 1), (2, 0, 60, 2), (2, 1, 70, 1))) == 50
    # Neither copy of the watermarks can hold a share twice: the coordinator's is read as
    # none (S stays the committed offset), the log's is skipped as unreadable.
    metadata = "keyrange.watermarks/2:0:2/0=50@1,2/0=60@2"
    assert decode_metadata(metadata) is None
    assert combine(None, 10, metadata) == CommitState(10)
    logged = apply_marks(CommitState(10), MarkEdit(2, {0: 40}))
    assert combine(logged, 10, metadata) == logged
    with pytest.raises(ValueError, match="twice"):
        decode_value(encode_value_generic(CommitState(10, (), 0, twice), 2))
    table = StateTable()
    assert table.apply(3, encode_key("g", "t", 0), encode_value_generic(CommitState(10, (), 0, twice), 2)) is None
    assert table.groups == {}


def test_a_share_count_beyond_max_shares_is_read_from_neither_copy():
    at_most = ((MAX_SHARES, MAX_SHARES - 1, 7, 1),)
    assert decode_value(encode_value_generic(CommitState(0, (), 0, at_most), 2)).marks == at_most
    assert decode_metadata(f"keyrange.watermarks/2:0:{MAX_SHARES}/{MAX_SHARES - 1}=7@1") == (0, at_most)
    beyond = MAX_SHARES + 1
    # The log: anyone who can produce to it could claim any K; the record is skipped.
    with pytest.raises(ValueError, match=f"{beyond} shares"):
        decode_value(encode_value_generic(CommitState(0, (), 0, ((beyond, 0, 7, 1),)), 2))
    with pytest.raises(ValueError, match="shares"):
        decode_value(encode_value_generic(CommitState(0, (), 0, ((1 << 30, 1, 7, 1),)), 2))
    # The coordinator's copy: any group member sets it; OffsetFetch reads the log's alone.
    assert decode_metadata(f"keyrange.watermarks/2:0:{beyond}/0=7@1") is None
    assert decode_metadata(f"keyrange.watermarks/1:{beyond}:" + ",".join(["-1"] * beyond)) is None
    assert decode_metadata(f"keyrange.watermarks/1:{beyond}:" + ",".join(["7"] * beyond)) is None
    logged = apply_marks(CommitState(0), MarkEdit(2, {0: 5}))
    assert combine(logged, 0, f"keyrange.watermarks/2:1:{1 << 30}/0=7@9") == logged
    # Nothing read holds such a K; a state built otherwise is not listed at its length.
    assert per_share(((1 << 30, 0, 7, 1), (2, 1, 3, 1))) == {2: [-1, 3]}


def test_metadata_numbers_are_read_only_within_the_logs_ranges():
    # An int64 kernel never sees a number the log's int64 fields could not hold.
    assert decode_metadata("keyrange.watermarks/1:1:" + str(1 << 64)) is None
    assert combine(None, 5, "keyrange.watermarks/1:1:" + str(1 << 64)) == CommitState(5)
    for item in (f"2/0={1 << 63}@1", f"2/0=1@{1 << 63}", "2/0=-2@1", "2/0=1@-1", "2/-1=1@1", "0/0=1@1"):
        assert decode_metadata(f"keyrange.watermarks/2:0:{item}") is None, item
    assert decode_metadata(f"keyrange.watermarks/2:{1 << 63}:2/0=1@1") is None
    assert decode_metadata("keyrange.watermarks/2:-1:2/0=1@1") is None
    highest = f"keyrange.watermarks/2:0:2/0={MAX_OFFSET}@{MAX_OFFSET},2/1={MAX_OFFSET}@1"
    assert decode_metadata(highest) == (0, ((2, 0, MAX_OFFSET, MAX_OFFSET), (2, 1, MAX_OFFSET, 1)))
    assert combine(None, 5, highest).stable == MAX_OFFSET
    assert decode_metadata("keyrange.watermarks/2:0:2/0=-1@1") == (0, ((2, 0, -1, 1),))


def test_a_negative_commit_of_a_share_is_held_and_read_back_as_none():
    state = apply_marks(CommitState(0, epoch=1), MarkEdit(2, {0: -5, 1: 8}))
    assert per_share(state.marks) == {2: [-1, 8]} and state.stable == 0
    assert decode_metadata(encode_metadata(state)) == (1, state.marks)
    # Earlier releases kept the negative W as committed: the log's value reads it as none.
    kept = CommitState(0, (), 1, ((1, 0, -5, 1), (2, 0, -5, 1), (2, 1, 8, 1)))
    read = decode_value(encode_value_generic(kept, 2))
    assert read.marks == ((1, 0, -1, 1), (2, 0, -1, 1), (2, 1, 8, 1)) and watermark_floor(read.marks) == -1


def test_the_coordinators_copy_wins_where_newer_and_a_reset_drops_it():
    logged = apply_marks(CommitState(0), MarkEdit(2, {0: 10, 1: 10}))
    # The proxy died after the coordinator took a newer commit and before the log write.
    newer = apply_marks(logged, MarkEdit(2, {1: 20}))
    seen = combine(logged, newer.stable, encode_metadata(newer))
    assert per_share(seen.marks) == {2: [10, 20]}
    # A stale coordinator copy (an older sequence) changes nothing.
    older = apply_marks(CommitState(0), MarkEdit(2, {0: 3}))
    assert per_share(combine(newer, 10, encode_metadata(older)).marks) == {2: [10, 20]}
    # After a reset the log is of a later epoch: the older copy is dropped, S is the larger.
    reset = apply_plain(4, newer)
    assert combine(reset, 10, encode_metadata(newer)) == CommitState(10, (), reset.epoch)
    # A plain client metadata, or nothing in the log: the coordinator's offset alone.
    assert combine(None, -1, None) == CommitState(-1)
    assert combine(None, 7, "keyrange.watermarks/1:2:9,8").stable == 8


def test_a_watermark_commit_runs_the_write_protocol_like_a_range_commit():
    records = {K: (7, apply_marks(CommitState(0), MarkEdit(2, {0: 10})))}
    machine = RangeCommit({K: [MarkEdit(2, {1: 15})]})
    step = machine.begin(8, records, end_read=False)
    assert isinstance(step, Forward) and step.offsets == {K: 10}
    planned = machine.planned(K)
    assert planned is not None and per_share(planned.marks) == {2: [10, 15]}
    write = machine.on_response([(K, 0)])
    assert isinstance(write, Write) and write.states == {K: planned}
    answer = machine.on_written(8)
    assert answer.errors == {} and answer.stable == {K: 10}
