"""The chaos checker's counts, on hand-made histories."""

from __future__ import annotations

from chaos.verdict import Acked, Handed, judge, pair_events


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
