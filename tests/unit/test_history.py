"""The history checker and the live producer's schedule: pure, no broker."""

from __future__ import annotations

import pytest

from harness.history import History, check
from harness.live import schedule


def _acked(history: History, offsets, key=b"k", partition=0) -> None:
    for offset in offsets:
        history.ack("t", partition, offset, key, str(offset).encode())


def test_a_complete_in_order_history_is_ok():
    history = History()
    _acked(history, range(5))
    for offset in range(5):
        history.deliver("m1", "t", 0, offset, b"k")
    verdict = check(history, committed={("t", 0): 5}, log_end={("t", 0): 5})
    assert verdict.ok(), verdict.summary()
    assert (verdict.acknowledged, verdict.delivered) == (5, 5)


def test_lost_records_are_reported_by_offset_span():
    history = History()
    _acked(history, range(10))
    for offset in (0, 1, 2, 6, 9):
        history.deliver("m1", "t", 0, offset, b"k")
    verdict = check(history)
    assert [a.offset for a in verdict.lost] == [3, 4, 5, 7, 8]
    assert "t-0 offsets 3-5, 7-8" in verdict.summary()
    assert not verdict.ok()
    assert history.missing() == 5


def test_duplicates_fail_unless_allowed_and_are_counted():
    history = History()
    _acked(history, range(3))
    for offset in (0, 1, 1, 2, 1):
        history.deliver("m1", "t", 0, offset, b"k")
    verdict = check(history)
    assert verdict.duplicates == {("t", 0, 1): 3}
    assert verdict.redelivered == 2
    assert not verdict.ok()
    assert verdict.ok(allow_duplicates=True)


def test_a_later_record_of_a_key_handed_out_before_the_earlier_one_finished_is_an_order_violation():
    history = History()
    _acked(history, range(3))
    first = history.deliver("m1", "t", 0, 0, b"k", finished=False)
    history.deliver("m2", "t", 0, 1, b"k")  # the key moved while offset 0 was in process
    history.finish(first)
    history.deliver("m2", "t", 0, 2, b"k")
    verdict = check(history)
    assert len(verdict.order_violations) == 1
    key, earlier, later = verdict.order_violations[0]
    assert (key, earlier.offset, later.offset) == (b"k", 0, 1)
    assert "key b'k' offset 1 handed to m2" in verdict.summary()


def test_other_keys_and_null_keys_carry_no_order_between_them():
    history = History()
    history.ack("t", 0, 0, b"a", b"0")
    history.ack("t", 0, 1, b"b", b"1")
    history.ack("t", 0, 2, None, b"2")
    history.ack("t", 0, 3, None, b"3")
    for offset, key in ((3, None), (1, b"b"), (2, None), (0, b"a")):
        history.deliver("m", "t", 0, offset, key)
    assert check(history).ok()
    assert not check(history, keyed_order=False).order_violations


def test_strays_and_committed_offsets_behind_the_end():
    history = History()
    _acked(history, range(2))
    for offset in range(3):
        history.deliver("m", "t", 0, offset, b"k")
    verdict = check(history, committed={("t", 0): 1}, log_end={("t", 0): 3, ("t", 1): 4})
    assert verdict.strays == [("t", 0, 2)]
    assert verdict.committed_behind == {("t", 0): (1, 3), ("t", 1): (-1, 4)}
    assert not verdict.ok()


@pytest.mark.parametrize("seed", [1, 2, 3, 99])
def test_schedule_writes_every_record_in_small_bursts_with_idle_gaps(seed):
    bursts = schedule(seed, 3000, 10.0)
    assert sum(b.records for b in bursts) == 3000
    assert max(b.records for b in bursts) <= 40
    assert any(b.pause >= 0.8 for b in bursts)  # the log end is reached and left
    assert 5.0 < sum(b.pause for b in bursts) < 20.0
    assert schedule(seed, 3000, 10.0) == bursts  # reproducible from its seed
