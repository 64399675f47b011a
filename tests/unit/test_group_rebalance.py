"""A group member's assignment changing under it: what it keeps goes on being handed out."""

from __future__ import annotations

from proxy.client import TopicPartition, equal_shares
from proxy.client.assignment import AssignmentState, narrows
from proxy.client.records import ConsumerRecord
from proxy.ranges import KeyRange, contains
from proxy.records.keyhash import key_hash

TP = TopicPartition("t", 0)


def _records(start: int, count: int) -> list[ConsumerRecord]:
    return [ConsumerRecord("t", 0, o, 0, b"key-%d" % o, b"") for o in range(start, start + count)]


def test_narrows():
    halves = equal_shares(2)
    assert narrows([], halves[:1]) and narrows(halves, halves[1:]) and narrows(halves, [KeyRange(5, 9)])
    assert not narrows(halves[:1], []) and not narrows(halves[:1], halves[1:])
    assert narrows(halves, [KeyRange(halves[0].end - 5, halves[1].start + 5)]), "adjacent ranges hold as one"
    assert not narrows([KeyRange(0, 10), KeyRange(20, 30)], [KeyRange(5, 25)])


def test_a_narrowed_range_keeps_its_buffered_records_in_order():
    state = AssignmentState(read_committed=False, tracking=True)
    state.assign({TP: []})
    state.seek(TP, 100)
    records = _records(100, 40)
    state.buffers.add(TP, records, 140)
    quarter = equal_shares(4)[1]
    state.assign({TP: [quarter]})
    kept = [r.offset for r in records if contains([quarter], key_hash(r.key, r.offset))]
    assert kept and len(kept) < 40
    drained = state.drain(1000, ())
    assert [r.offset for r in drained] == kept
    assert state.position(TP) == 140


def test_a_buffer_narrowed_to_nothing_moves_the_position_past_the_fetch():
    state = AssignmentState(read_committed=False, tracking=True)
    state.assign({TP: []})
    state.seek(TP, 100)
    records = _records(100, 3)
    state.buffers.add(TP, records, 103)
    hashes = sorted(key_hash(r.key, r.offset) for r in records)
    state.assign({TP: [KeyRange(hashes[0] + 1, hashes[0] + 1)]})
    assert not state.buffers.has_buffered(TP) and state.position(TP) == 103
    assert state.fetchable(lambda tp: True) == [TP]


def test_grown_ranges_drop_the_buffer():
    state = AssignmentState(read_committed=False, tracking=True)
    halves = equal_shares(2)
    state.assign({TP: halves[:1]})
    state.seek(TP, 100)
    state.buffers.add(TP, _records(100, 3), 103)
    state.assign({TP: []})
    assert not state.buffers.has_buffered(TP) and state.position(TP) == 100
