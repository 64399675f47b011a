"""Share watermarks of virtual topics in the individual-commit state: the log value v2,
the merge rule of two writers, S settling, and the coordinator's copy (no I/O)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.commits.codec import decode_value, encode_value, encode_value_generic
from proxy.commits.range_commit import Forward, RangeCommit, Write
from proxy.commits.state import (
    CommitState,
    MarkEdit,
    apply_marks,
    apply_plain,
    apply_ranges,
    join,
    rebase_commit,
    watermark_floor,
)
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
