"""The order check of the SIGKILL group test catches what it must (and only that)."""

from harness.group_member import Event, order_violations


def ev(kind, member, offset, key, t, partition=0):
    return Event(kind, member, partition, offset, key, t)


def test_clean_hand_off_passes():
    events = [ev("H", "a", 0, "k", 1.0), ev("F", "a", 0, "k", 1.5), ev("H", "b", 1, "k", 2.0), ev("F", "b", 1, "k", 2.1)]
    assert order_violations(events, {0: 2}, set()) == []


def test_hand_out_before_an_earlier_record_of_the_key_finished_is_caught():
    events = [ev("H", "a", 0, "k", 1.0), ev("H", "b", 1, "k", 1.2), ev("F", "a", 0, "k", 1.5), ev("F", "b", 1, "k", 1.3)]
    assert len(order_violations(events, {0: 2}, set())) == 1


def test_same_member_in_order_passes_and_out_of_order_is_caught():
    ok = [ev("H", "a", 0, "k", 1.0), ev("H", "a", 1, "k", 1.0), ev("F", "a", 0, "k", 1.1), ev("F", "a", 1, "k", 1.2)]
    assert order_violations(ok, {0: 2}, set()) == []
    bad = [ev("H", "a", 0, "k", 1.0), ev("H", "a", 1, "k", 1.0), ev("F", "a", 1, "k", 1.1), ev("F", "a", 0, "k", 1.2)]
    assert len(order_violations(bad, {0: 2}, set())) == 1


def test_lost_records_and_unexplained_redelivery_are_caught():
    assert "never finished" in order_violations([ev("H", "a", 0, "k", 1.0)], {0: 1}, set())[0]
    twice = [ev("H", "a", 0, "k", 1.0), ev("F", "a", 0, "k", 1.1), ev("H", "b", 0, "k", 2.0), ev("F", "b", 0, "k", 2.1)]
    assert "handed out again" in order_violations(twice, {0: 1}, set())[0]
    assert order_violations(twice, {0: 1}, {"a"}) == []


def test_redelivery_after_a_kill_is_exempt():
    # a was killed with offset 0 unfinished; b gets 0 again and 1 in the same poll
    events = [ev("H", "a", 0, "k", 1.0), ev("H", "b", 0, "k", 5.0), ev("H", "b", 1, "k", 5.0),
              ev("F", "b", 0, "k", 5.1), ev("F", "b", 1, "k", 5.2)]
    assert order_violations(events, {0: 2}, {"a"}) == []
    # but a later record handed to b while killed a's record is still owed to another member is caught
    events = [ev("H", "a", 0, "k", 1.0), ev("H", "b", 1, "k", 5.0), ev("F", "b", 1, "k", 5.2),
              ev("H", "c", 0, "k", 6.0), ev("F", "c", 0, "k", 6.1)]
    assert len(order_violations(events, {0: 2}, {"a"})) == 1
