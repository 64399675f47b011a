"""The chaos checker's counts, on hand-made histories."""

from __future__ import annotations

from chaos.verdict import Acked, Handed, judge, longest_gap, merge_windows, pair_events, pauses


def _acks(n: int, key=lambda o: b"k%d" % (o % 3)) -> list[Acked]:
    return [Acked(0, o, key(o), float(o)) for o in range(n)]


def test_every_record_once_in_order_is_clean():
    handed = [Handed("a", 0, o, b"k%d" % (o % 3), 10.0 + o, 10.5 + o) for o in range(6)]
    verdict = judge(_acks(6), handed, committed={0: 6}, log_end={0: 6})
    assert verdict.ok and verdict.delivered == 6 and not verdict.redelivered


def test_a_record_never_handed_out_is_lost_and_a_foreign_one_a_stray():
    handed = [Handed("a", 0, o, b"x", 10.0 + o, 10.5 + o) for o in (0, 1, 3, 9)]
    verdict = judge(_acks(4), handed)
    assert verdict.lost == [(0, 2)] and verdict.strays == [(0, 9)] and not verdict.ok


def test_redelivery_is_counted_by_the_first_holders_fate():
    handed = [Handed("a", 0, 0, b"k", 1.0, 1.1), Handed("b", 0, 0, b"k", 5.0, 5.1),
              Handed("c", 0, 1, b"j", 1.0, 1.1), Handed("d", 0, 1, b"j", 5.0, 5.1),
              Handed("e", 0, 2, b"i", 1.0, 1.1), Handed("f", 0, 2, b"i", 5.0, 5.1)]
    verdict = judge(_acks(3), handed, killed={"a": 2.0}, lost_members={"c": 2.0})
    assert dict(verdict.redelivered) == {"member_killed": 1, "member_lost": 1, "other": 1}
    assert verdict.ok  # at-least-once: re-delivery alone is no failure


def test_a_key_handed_to_another_member_before_its_earlier_record_finished_breaks_order():
    same = b"k"
    handed = [Handed("a", 0, 0, same, 1.0, 3.0), Handed("b", 0, 1, same, 2.0, 2.5)]
    verdict = judge(_acks(2, key=lambda o: same), handed)
    assert len(verdict.order_violations) == 1 and not verdict.ok


def test_one_member_finishing_a_batch_in_order_keeps_order():
    same = b"k"
    handed = [Handed("a", 0, 0, same, 1.0, 1.2), Handed("a", 0, 1, same, 1.0, 1.4)]
    assert judge(_acks(2, key=lambda o: same), handed).ok


def test_order_broken_by_a_killed_members_records_is_counted_apart():
    same = b"k"
    handed = [Handed("a", 0, 0, same, 1.0, None), Handed("b", 0, 1, same, 2.0, 2.5)]
    verdict = judge(_acks(2, key=lambda o: same), handed, killed={"a": 1.5})
    assert not verdict.order_violations and verdict.order_after_redelivery == 1 and verdict.ok


def test_committed_behind_the_log_end_fails():
    handed = [Handed("a", 0, o, None, 1.0, 1.0) for o in range(3)]
    verdict = judge(_acks(3), handed, committed={0: 2}, log_end={0: 3})
    assert verdict.committed_behind == {0: (2, 3)} and not verdict.ok


def test_recovery_is_the_time_until_everything_acknowledged_before_the_heal_was_handed_out():
    acks = [Acked(0, 0, None, 1.0), Acked(0, 1, None, 4.0), Acked(0, 2, None, 9.0)]
    handed = [Handed("a", 0, 0, None, 1.5), Handed("a", 0, 1, None, 7.5), Handed("a", 0, 2, None, 9.1)]
    assert judge(acks, handed, heals=[5.0, 0.5]).recovery == [2.5, 0.0]


def test_pair_events_closes_each_hand_out_with_its_members_next_finish():
    events = [("H", "a", 0, 0, b"k", 1.0), ("F", "a", 0, 0, b"k", 2.0), ("H", "b", 0, 0, b"k", 3.0),
              ("F", "b", 0, 0, b"k", 4.0), ("H", "a", 0, 1, None, 5.0)]
    handed = pair_events(events)
    assert [(h.member, h.offset, h.finished) for h in handed] == [("a", 0, 2.0), ("b", 0, 4.0), ("a", 1, None)]


def test_fault_windows_close_together_are_one():
    assert merge_windows([(10.0, 14.0), (0.0, 3.0), (3.2, 6.0)]) == [(0.0, 6.0), (10.0, 14.0)]


def test_the_longest_gap_is_clipped_to_the_window():
    # hand-outs at 1, 4, 5 in the window (2, 8): gaps 2 (2-4), 1, 3 (5-8); 1 is before it
    assert longest_gap([1.0, 4.0, 5.0, 9.0], [(2.0, 8.0)]) == 3.0
    assert longest_gap([], [(2.0, 8.0)]) == 6.0


def test_pauses_per_member_against_the_producers_own_gaps():
    acked = [Acked(0, o, b"k", float(t)) for o, t in enumerate(range(0, 20))]  # one a second
    handed = ([Handed("a", 0, o, b"k", o + 0.1) for o in range(20) if not 10 <= o < 15]  # 5 s without
              + [Handed("b", 0, o, b"k", o + 0.2) for o in range(20)]
              + [Handed("late", 0, o, b"k", o + 0.3) for o in range(12, 20)]  # joined during the fault
              + [Handed("dead", 0, o, b"k", o + 0.4) for o in range(8)])
    pause = pauses(handed, acked, [(8.0, 11.0), (11.5, 16.0)], exclude={"dead"})
    assert pause is not None
    assert pause["members"] == {"a": 6.0, "b": 1.0}
    assert pause["max_s"] == 6.0 and pause["median_s"] == 3.5
    assert pause["producer_gap_s"] == 1.0 and pause["window_s"] == 8.0


def test_no_fault_no_pause():
    assert pauses([Handed("a", 0, 0, b"k", 1.0)], [], []) is None
