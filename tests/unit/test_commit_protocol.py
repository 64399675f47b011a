"""The range-commit write protocol (proxy.commits.range_commit) without a broker: what it
asks for at each step, and what it makes of each answer, including the races between
proxy instances that share the log."""

from __future__ import annotations

import pytest

from proxy.commits.codec import decode_value
from proxy.commits.packed import pack
from proxy.commits.range_commit import (
    Answer,
    Correct,
    FetchCommitted,
    Forward,
    ProtocolViolation,
    RangeCommit,
    ReadLogEnd,
    ReadWindow,
    Write,
)
from proxy.commits.state import CommitState, Floor, apply_edit, apply_ranges
from proxy.protocol.constants import ErrorCode

K = ("orders", 0)
L = ("orders", 1)
UNAVAILABLE = ErrorCode.COORDINATOR_NOT_AVAILABLE


def commit_of(*ranges) -> list[bytes]:
    return [pack(sorted(ranges))]


def planned(commits, records, *, position=10, end_read=True, plain=None, rounds=8) -> tuple[RangeCommit, Forward]:
    machine = RangeCommit(commits, plain, rounds=rounds)
    step = machine.begin(position, records, end_read=end_read)
    assert isinstance(step, Forward)
    return machine, step


def test_one_instance_no_race_forwards_s_then_writes_once_and_answers_it():
    records = {K: (7, CommitState(40, ((43, 45),)))}
    machine, forward = planned({K: commit_of((40, 42), (47, 47))}, records)
    assert forward.offsets == {K: 46}
    assert machine.needs_prepare
    machine.prepare()
    assert not machine.needs_prepare
    assert machine.on_response([(K, ErrorCode.NONE)]) == ReadLogEnd()
    write = machine.on_log_end(10, records)  # nothing new at the end
    assert isinstance(write, Write)
    assert write.states == {K: CommitState(46, ((47, 47),))}
    state, value = write.encoded[K]
    assert state is write.states[K] and decode_value(value) == state  # encoded while the broker worked
    assert machine.on_written(10) == Answer({}, {K: 46})
    assert machine.foreign_writes == 0


def test_a_key_without_state_starts_at_the_coordinators_offset():
    machine = RangeCommit({K: commit_of((40, 41)), L: commit_of((5, 5))})
    step = machine.begin(0, {}, end_read=False)
    assert step == FetchCommitted((K, L))
    forward = machine.on_committed({K: 40, L: -1}, {})
    assert forward.offsets == {K: 42, L: 0}
    # First use (the log was read before): no end read to wait for.
    write = machine.on_response([(K, ErrorCode.NONE), (L, ErrorCode.NONE)])
    assert write.states == {K: CommitState(42), L: CommitState(0, ((5, 5),))}
    assert machine.on_written(0) == Answer({}, {K: 42, L: 0})


def test_a_partition_the_broker_rejects_is_neither_written_nor_answered_by_the_proxy():
    records = {K: (3, CommitState(0)), L: (4, CommitState(0))}
    machine, _ = planned({K: commit_of((0, 4)), L: commit_of((0, 9))}, records)
    assert machine.on_response([(K, ErrorCode.ILLEGAL_GENERATION), (L, ErrorCode.NONE)]) == ReadLogEnd()
    write = machine.on_log_end(10, records)
    assert set(write.states) == {L}
    assert machine.on_written(10) == Answer({}, {L: 10})  # K keeps the broker's own error


def test_every_partition_rejected_means_no_log_read_wait_and_no_write():
    machine, _ = planned({K: commit_of((0, 4))}, {K: (3, CommitState(0))})
    assert machine.on_response([(K, ErrorCode.REBALANCE_IN_PROGRESS)]) == Answer({}, {})


def test_another_instance_wrote_between_our_read_and_our_write_is_merged_before_writing():
    ours = CommitState(40, ((50, 50),))
    machine, forward = planned({K: commit_of((45, 45))}, {K: (7, ours)})
    assert forward.offsets == {K: 40}
    machine.on_response([(K, ErrorCode.NONE)])
    # The end read found a newer record of the key, same epoch: it processed 40-44.
    theirs = CommitState(45, ((60, 60),))
    step = machine.on_log_end(12, {K: (11, theirs)})
    assert step == Correct({K: 46})  # S moved past what the broker got: correct it
    write = machine.on_corrected({K: ErrorCode.NONE})
    assert write.states == {K: CommitState(46, ((50, 50), (60, 60)))}  # the union, plus the commit
    assert write.states[K] is not write.encoded.get(K, (None,))[0]  # the old encoding is not reused
    assert machine.on_written(12) == Answer({}, {K: 46})
    assert machine.foreign_writes == 1


def test_a_foreign_write_that_leaves_s_alone_needs_no_correction():
    machine, _ = planned({K: commit_of((50, 50))}, {K: (7, CommitState(40))})
    machine.on_response([(K, ErrorCode.NONE)])
    write = machine.on_log_end(10, {K: (8, CommitState(40, ((60, 61),)))})
    assert isinstance(write, Write)
    assert write.states == {K: CommitState(40, ((50, 50), (60, 61)))}
    assert machine.on_written(10) == Answer({}, {K: 40})


def test_our_write_not_landing_at_the_read_end_reads_the_window_and_writes_the_merge():
    machine, _ = planned({K: commit_of((41, 41)), L: commit_of((0, 0))},
                         {K: (7, CommitState(40)), L: (8, CommitState(0))})
    machine.on_response([(K, ErrorCode.NONE), (L, ErrorCode.NONE)])
    machine.on_log_end(10, {K: (7, CommitState(40)), L: (8, CommitState(0))})
    # Another instance wrote offsets 10-12 after our end read: ours landed at 13.
    window = machine.on_written(13)
    assert window == ReadWindow(10, 13, frozenset({K, L}))
    write = machine.on_window({K: (11, CommitState(40, ((43, 43),)))}, 13)
    assert write.states == {K: CommitState(40, ((41, 41), (43, 43)))}  # only the key that changed
    # The rewrite landed right after our first write (13 + 2 records): nothing else came in.
    assert machine.on_written(15) == Answer({}, {K: 40, L: 1})
    assert machine.foreign_writes == 1


def test_a_window_holding_only_other_keys_or_records_already_merged_changes_nothing():
    theirs = CommitState(40, ((60, 60),))
    machine, _ = planned({K: commit_of((41, 41))}, {K: (7, CommitState(40))})
    machine.on_response([(K, ErrorCode.NONE)])
    # The end read stopped at 10, but memory already holds their record at 11 (another
    # commit through this instance read further meanwhile): the state is merged with it...
    write = machine.on_log_end(10, {K: (11, theirs)})
    assert write.states == {K: CommitState(40, ((41, 41), (60, 60)))}
    # ...so when our write lands late, the window showing that record again adds nothing,
    # and neither do records of keys this commit does not hold.
    assert machine.on_written(14) == ReadWindow(10, 14, frozenset({K}))
    assert machine.on_window({K: (11, theirs)}, 14) == Answer({}, {K: 40})
    assert machine.foreign_writes == 1


def test_an_unknown_write_position_reads_to_the_end_and_continues_from_there():
    machine, _ = planned({K: commit_of((41, 41))}, {K: (7, CommitState(40))}, end_read=False)
    machine.on_response([(K, ErrorCode.NONE)])
    assert machine.on_written(-1) == ReadWindow(10, None, frozenset({K}))  # an earlier attempt landed
    write = machine.on_window({K: (12, CommitState(40, ((45, 45),)))}, 20)
    assert isinstance(write, Write)
    assert machine.on_written(20) == Answer({}, {K: 40})  # landed where the window read ended


def test_the_log_end_cannot_be_read_nothing_is_written_and_the_client_retries():
    machine, _ = planned({K: commit_of((41, 41))}, {K: (7, CommitState(40))})
    machine.on_response([(K, ErrorCode.NONE)])
    assert machine.on_log_end_failed() == Answer({K: UNAVAILABLE}, {})


def test_a_failed_write_answers_every_accepted_key_retriable():
    machine, _ = planned({K: commit_of((41, 41)), L: commit_of((0, 0))},
                         {K: (7, CommitState(40)), L: (8, CommitState(0))}, end_read=False)
    machine.on_response([(K, ErrorCode.NONE), (L, ErrorCode.NONE)])
    assert machine.on_write_failed() == Answer({K: UNAVAILABLE, L: UNAVAILABLE}, {})


def test_a_failed_window_read_or_rewrite_answers_retriable():
    machine, _ = planned({K: commit_of((41, 41))}, {K: (7, CommitState(40))}, end_read=False)
    machine.on_response([(K, ErrorCode.NONE)])
    machine.on_written(12)
    assert machine.on_write_failed() == Answer({K: UNAVAILABLE}, {})


def test_a_key_deleted_by_another_instance_meanwhile_gets_the_commit_in_a_new_epoch():
    machine, forward = planned({K: commit_of((0, 4))}, {K: (7, CommitState(0, ((2, 9),), epoch=3))})
    assert forward.offsets == {K: 10}
    machine.on_response([(K, ErrorCode.NONE)])
    step = machine.on_log_end(12, {})  # the tombstone removed the key from memory
    assert step == Correct({K: 5})  # the coordinator holds 10, from the deleted state
    write = machine.on_corrected({K: ErrorCode.NONE})
    assert write.states == {K: CommitState(5, (), epoch=4)}
    assert machine.on_written(12) == Answer({}, {K: 5})


def test_a_reset_by_another_instance_replaces_and_the_commit_applies_again():
    machine, forward = planned({K: commit_of((100, 104))}, {K: (7, CommitState(100, ((106, 110),), epoch=1))})
    assert forward.offsets == {K: 105}
    machine.on_response([(K, ErrorCode.NONE)])
    # A plain commit to 20 through another instance: epoch 2, ranges gone.
    step = machine.on_log_end(10, {K: (8, CommitState(20, (), epoch=2))})
    assert step == Correct({K: 20})  # S' went too far: lowered again
    write = machine.on_corrected({K: ErrorCode.NONE})
    assert write.states == {K: CommitState(20, ((100, 104),), epoch=2)}
    assert machine.on_written(10) == Answer({}, {K: 20})


def test_a_record_of_an_older_epoch_adds_nothing():
    ours = CommitState(50, ((52, 52),), epoch=2)
    machine, _ = planned({K: commit_of((54, 54))}, {K: (7, ours)}, end_read=False)
    machine.on_response([(K, ErrorCode.NONE)])
    assert machine.on_written(11) == ReadWindow(10, 11, frozenset({K}))
    # Written before the reset this instance saw: its ranges are not processed any more.
    assert machine.on_window({K: (10, CommitState(0, ((60, 70),), epoch=1))}, 11) == Answer({}, {K: 50})


def test_a_correction_the_coordinator_refuses_before_the_write_leaves_the_key_alone():
    machine, _ = planned({K: commit_of((45, 45)), L: commit_of((0, 0))},
                         {K: (7, CommitState(40)), L: (8, CommitState(0))})
    machine.on_response([(K, ErrorCode.NONE), (L, ErrorCode.NONE)])
    step = machine.on_log_end(12, {K: (11, CommitState(45)), L: (8, CommitState(0))})
    assert step == Correct({K: 46})
    write = machine.on_corrected({K: ErrorCode.ILLEGAL_GENERATION})
    assert set(write.states) == {L}  # K is not written: a retry merges again
    assert machine.on_written(12) == Answer({K: ErrorCode.ILLEGAL_GENERATION}, {L: 1})


def test_a_correction_nobody_answers_counts_as_coordinator_not_available():
    machine, _ = planned({K: commit_of((45, 45))}, {K: (7, CommitState(40))})
    machine.on_response([(K, ErrorCode.NONE)])
    assert machine.on_log_end(12, {K: (11, CommitState(45))}) == Correct({K: 46})
    assert machine.on_correction_failed() == Answer({K: UNAVAILABLE}, {})


def test_a_correction_refused_after_the_write_still_writes_the_merge_but_answers_the_error():
    machine, _ = planned({K: commit_of((45, 45))}, {K: (7, CommitState(40))}, end_read=False)
    machine.on_response([(K, ErrorCode.NONE)])
    machine.on_written(12)
    assert machine.on_window({K: (11, CommitState(45))}, 12) == Correct({K: 46})
    write = machine.on_corrected({K: ErrorCode.UNKNOWN_MEMBER_ID})
    assert write.states == {K: CommitState(46)}  # the log's newest record must hold both
    assert machine.on_written(13) == Answer({K: ErrorCode.UNKNOWN_MEMBER_ID}, {})


def test_the_reconcile_rounds_are_bounded():
    machine, _ = planned({K: commit_of((41, 41))}, {K: (7, CommitState(40))}, end_read=False, rounds=3)
    machine.on_response([(K, ErrorCode.NONE)])
    at, windows, writes = 12, 0, 1
    step = machine.on_written(at)
    while isinstance(step, ReadWindow):
        windows += 1
        # Every time, another instance has written the key again just before our write.
        step = machine.on_window({K: (at - 1, CommitState(40, ((50 + windows, 50 + windows),)))}, at)
        assert isinstance(step, Write)
        writes += 1
        at += 2
        step = machine.on_written(at)
    assert (windows, writes) == (3, 4)
    assert step == Answer({K: UNAVAILABLE}, {})  # each record holds the commit; the client retries


def test_state_unavailable_refuses_the_range_commits():
    machine = RangeCommit({K: commit_of((41, 41))}, {L: 5})
    assert machine.unavailable() == {K: UNAVAILABLE}
    # The plain partition is still forwarded; its answer changes nothing here.
    assert machine.on_response([(L, ErrorCode.NONE)]) == Answer({}, {})


def test_a_plain_commit_of_a_key_with_state_resets_it_without_counting_as_foreign():
    records = {K: (7, CommitState(40, ((45, 45),), epoch=1)), L: (8, CommitState(0))}
    machine, forward = planned({L: commit_of((0, 0))}, records, plain={K: 30})
    assert forward.offsets == {L: 1}
    machine.on_response([(K, ErrorCode.NONE), (L, ErrorCode.NONE)])
    write = machine.on_log_end(10, records)
    assert write.states == {K: CommitState(30, (), epoch=2), L: CommitState(1)}
    assert machine.on_written(10) == Answer({}, {L: 1})  # no StableOffset for a plain commit
    assert machine.foreign_writes == 0


def test_a_request_with_nothing_needing_state_answers_at_once():
    machine = RangeCommit({}, {K: 5})
    assert machine.on_response([(K, ErrorCode.NONE)]) == Answer({}, {})


def test_events_out_of_order_are_refused():
    machine, _ = planned({K: commit_of((41, 41))}, {K: (7, CommitState(40))})
    with pytest.raises(ProtocolViolation):
        machine.on_written(10)
    machine.on_response([(K, ErrorCode.NONE)])
    with pytest.raises(ProtocolViolation):
        machine.on_response([(K, ErrorCode.NONE)])


# -- the bound on a key's state (max.individual.commit.ranges.held) --------------------------------
OVER_BOUND = ErrorCode.INVALID_COMMIT_OFFSET_SIZE


def test_a_commit_past_the_bound_is_refused_before_the_broker_and_the_others_go_on():
    held = CommitState(0, ((10, 10), (12, 12), (14, 14)))
    records = {K: (7, held), L: (8, held)}
    machine = RangeCommit({K: commit_of((20, 20), (22, 22)), L: commit_of((20, 20))}, max_held=4)
    forward = machine.begin(10, records, end_read=True)
    assert isinstance(forward, Forward)
    assert forward.refused == {K: OVER_BOUND} and forward.offsets == {L: 0}  # K is not forwarded
    assert "5 ranges" in machine.over_bound[K] and "at most 4" in machine.over_bound[K]
    assert machine.needs_prepare and machine.planned(L) is None  # 3 held + 1 sent cannot pass 4
    assert machine.on_response([(L, ErrorCode.NONE)]) == ReadLogEnd()
    write = machine.on_log_end(10, records)
    assert set(write.states) == {L}  # nothing of K is written
    assert machine.on_written(10) == Answer({}, {L: 0})


def test_below_the_bound_by_the_commits_size_r_still_waits_for_prepare():
    machine, forward = planned({K: commit_of((20, 20))}, {K: (7, CommitState(0, ((10, 10),)))})
    assert forward.refused == {} and machine.needs_prepare
    machine = RangeCommit({K: commit_of((20, 20), (22, 22))}, max_held=3)
    forward = machine.begin(10, {K: (7, CommitState(0, ((10, 10),)))}, end_read=True)
    assert forward.refused == {} and machine.needs_prepare  # 1 held + 2 sent cannot pass 3


def test_a_state_over_the_bound_still_takes_commits_that_close_its_gaps():
    over = CommitState(0, ((10, 10), (12, 12), (14, 14), (16, 16)))  # the bound was lowered to 2
    records = {K: (7, over)}
    machine = RangeCommit({K: commit_of((11, 11), (30, 30))}, max_held=2)
    forward = machine.begin(10, records, end_read=False)
    assert forward.refused == {}  # [10-12], [14], [16], [30]: 4 held, no more than before
    assert not machine.needs_prepare  # 4 held + 2 sent might have passed 2: merged up front
    assert machine.on_response([(K, ErrorCode.NONE)]).states == {K: apply_ranges(over, [(11, 11), (30, 30)])}
    machine = RangeCommit({K: commit_of((30, 30))}, max_held=2)
    assert machine.begin(10, records, end_read=False).refused == {K: OVER_BOUND}
    # A plain commit of the same partition in that request is not applied either.
    machine = RangeCommit({K: commit_of((30, 30))}, {K: 50}, max_held=2)
    assert machine.begin(10, records, end_read=False).refused == {K: OVER_BOUND}
    assert machine.planned(K) is None


# -- a lift of the log to the coordinator's committed offset (an OffsetFetch that serves it) --------
def lifted(records, floors, *, position=10) -> tuple[RangeCommit, Write]:
    machine = RangeCommit({key: [Floor(floor, records[key][1].epoch)] for key, floor in floors.items()},
                          coordinator=False)
    forward = machine.begin(position, records, end_read=False)
    assert isinstance(forward, Forward)  # what S' would be: nothing is forwarded
    write = machine.on_response([(key, ErrorCode.NONE) for key in forward.offsets])
    assert isinstance(write, Write)
    return machine, write


def test_a_floor_lifts_s_and_drops_the_ranges_below_it_in_its_epoch_only():
    state = CommitState(5, ((10, 14), (22, 24)), epoch=3)
    assert apply_edit(state, Floor(20, 3)) == CommitState(20, ((22, 24),), epoch=3)
    assert apply_edit(state, Floor(22, 3)) == CommitState(25, (), epoch=3)  # S moves on over a range at S
    assert apply_edit(state, Floor(4, 3)) == state  # the log holds more already
    assert apply_edit(state, Floor(20, 2)) == state  # reset since the coordinator's offset was read


def test_a_lift_writes_what_the_coordinator_holds_into_the_log():
    machine, write = lifted({K: (7, CommitState(5, ((10, 14), (22, 24))))}, {K: 20})
    assert write.states == {K: CommitState(20, ((22, 24),))}
    assert machine.on_written(10) == Answer({}, {K: 20})


def test_a_lift_merges_another_write_in_its_window_and_corrects_no_coordinator():
    machine, _ = lifted({K: (7, CommitState(5, ((10, 14),)))}, {K: 20})
    assert machine.on_written(12) == ReadWindow(10, 12, frozenset({K}))
    # Another instance's commit of [20, 24] landed before ours: S moves past the floor, and
    # the union is written again without a word to the coordinator (its commit said so).
    write = machine.on_window({K: (11, CommitState(5, ((10, 14), (20, 24))))}, 12)
    assert write == Write({K: CommitState(25)})
    assert machine.on_written(13) == Answer({}, {K: 25})


def test_a_lift_meeting_a_reset_writes_the_reset_again_and_lifts_nothing():
    machine, _ = lifted({K: (7, CommitState(5, ((10, 14),), epoch=1))}, {K: 20})
    assert machine.on_written(12) == ReadWindow(10, 12, frozenset({K}))
    # A plain commit to 3 landed before ours: ours (of the older epoch) must not stay newest.
    write = machine.on_window({K: (11, CommitState(3, (), epoch=2))}, 12)
    assert write == Write({K: CommitState(3, (), epoch=2)})
    assert machine.on_written(13) == Answer({}, {K: 3})


def test_a_lift_meeting_a_deletion_leaves_s_0_in_a_new_epoch_as_a_range_commit_would():
    machine, _ = lifted({K: (7, CommitState(5, (), epoch=1))}, {K: 20})
    assert machine.on_written(12) == ReadWindow(10, 12, frozenset({K}))
    write = machine.on_window({K: (11, None)}, 12)  # the tombstone came before our record
    assert write == Write({K: CommitState(0, (), epoch=2)})  # nothing of the deleted state comes back
    assert machine.on_written(13) == Answer({}, {K: 0})
