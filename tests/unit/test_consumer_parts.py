"""The key-range consumer's pure parts: config validation, fair rotation, lag, record
parsing with aborted transactions and key ranges, partition-response handling."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from harness.batches import Rec, control_batch, kafka_python_batch
from proxy.client import (
    ConfigError,
    Consumer,
    ConsumerRecord,
    KafkaError,
    OffsetOutOfRangeError,
    TopicPartition,
    equal_shares,
)
from proxy.client.assignment import EARLIEST_TIMESTAMP, AssignmentState, PendingReset
from proxy.client.errors import CorruptRecordError, NotLeaderOrFollowerError, RetriableError
from proxy.client.fetch_protocol import apply_fetch_response, apply_partition
from proxy.client.records import FairBuffers, lag, parse_partition
from proxy.ranges import KeyRange, contains
from proxy.records.builder import build_batch
from proxy.records.keyhash import key_hash

TP = TopicPartition("t", 0)


# -- config -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "settings, message",
    [
        ({"auto_offset_reset": "smallest"}, "auto_offset_reset must be one of earliest, latest, none; got 'smallest'"),
        ({"isolation_level": "committed"}, "isolation_level must be one of read_uncommitted, read_committed"),
        ({"max_poll_records": 0}, "max_poll_records must be between 1 and 2147483647, got 0"),
        ({"fetch_max_wait_ms": -1}, "fetch_max_wait_ms must be between 0 and 2147483647, got -1"),
        ({"fetch_max_bytes": "1MB"}, "fetch_max_bytes must be an int, got str '1MB'"),
        ({"request_timeout_ms": True}, "request_timeout_ms must be an int, got bool True"),
        ({"retry_backoff_ms": 1 << 31}, "retry_backoff_ms must be between 0 and 2147483647"),
        ({"group_id": ""}, "group_id must be a non-empty string or None, got ''"),
        ({"client_id": 7}, "client_id must be a string, got int"),
    ],
)
def test_config_errors_name_the_setting(settings, message):
    with pytest.raises(ConfigError) as caught:
        Consumer("127.0.0.1:9092", **settings)
    assert message in str(caught.value)


@pytest.mark.parametrize("servers", ["", "localhost", "host:0", "host:70000", "host:port", ["a:1", 5]])
def test_config_rejects_bad_bootstrap_servers(servers):
    with pytest.raises(ConfigError, match="bootstrap_servers"):
        Consumer(servers)


def test_config_accepts_lists_and_defaults():
    consumer = Consumer(["127.0.0.1:1", "[::1]:2"], isolation_level="read_committed")
    assert consumer.config.bootstrap_addresses == [("127.0.0.1", 1), ("::1", 2)]
    assert consumer.config.isolation_code == 1
    assert consumer.config.auto_offset_reset == "latest"
    with pytest.raises(TypeError):
        Consumer("127.0.0.1:1", no_such_setting=1)


# -- fair rotation ------------------------------------------------------------------------
def _records(partition: int, start: int, count: int) -> list[ConsumerRecord]:
    return [ConsumerRecord("t", partition, offset, 0, None, b"") for offset in range(start, start + count)]


def test_rotation_starts_after_the_last_partition_served():
    buffers = FairBuffers()
    tps = [TopicPartition("t", p) for p in range(4)]
    buffers.set_partitions(tps)
    buffers.add(tps[0], _records(0, 0, 100), 100)
    for p in (1, 2, 3):
        buffers.add(tps[p], _records(p, 0, 3), 3)
    served = []
    for _ in range(4):
        out, _positions = buffers.drain(5)
        served.append({tp.partition: len(records) for tp, records in out.items()})
    # the poll cut short in partition 2 is followed by one starting at partition 3
    assert served == [{0: 5}, {1: 3, 2: 2}, {3: 3, 0: 2}, {2: 1, 0: 4}]
    assert [list(s) for s in served][2:] == [[3, 0], [2, 0]]


def test_no_partition_starves_under_a_small_max_poll_records():
    buffers = FairBuffers()
    tps = [TopicPartition("t", p) for p in range(5)]
    buffers.set_partitions(tps)
    for p, tp in enumerate(tps):
        buffers.add(tp, _records(p, 0, 50), 50)
    first_seen = {}
    for poll in range(5):
        out, _ = buffers.drain(7)
        for tp in out:
            first_seen.setdefault(tp.partition, poll)
    assert sorted(first_seen) == [0, 1, 2, 3, 4]
    assert max(first_seen.values()) <= 4


def test_drain_positions_follow_the_records_then_the_next_fetch_offset():
    buffers = FairBuffers()
    buffers.set_partitions([TP])
    buffers.add(TP, [ConsumerRecord("t", 0, o, 0, None, b"") for o in (3, 7, 9)], 15)
    out, positions = buffers.drain(2)
    assert [r.offset for r in out[TP]] == [3, 7] and positions[TP] == 8
    out, positions = buffers.drain(2)
    assert [r.offset for r in out[TP]] == [9] and positions[TP] == 15  # past filtered tail
    assert not buffers.has_buffered(TP)


def test_reassignment_drops_buffers_of_removed_partitions():
    buffers = FairBuffers()
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    buffers.set_partitions([a, b])
    buffers.add(a, _records(0, 0, 2), 2)
    buffers.add(b, _records(1, 0, 2), 2)
    buffers.set_partitions([b])
    out, _ = buffers.drain(10)
    assert list(out) == [b]


# -- lag ----------------------------------------------------------------------------------
@pytest.mark.parametrize("end, position, expected", [(None, 5, None), (10, None, None), (10, 4, 6),
                                                     (10, 10, 0), (10, 12, 0), (-1, 3, None)])
def test_lag(end, position, expected):
    assert lag(end, position) == expected


# -- parsing: aborted transactions, control batches, ranges -------------------------------
def _txn_log():
    """offsets 0-1 committed txn of producer 1, 2 its COMMIT marker; 3-4 txn of producer 2
    aborted by the marker at 7; 5-6 plain records; 8 producer 2's next, committed txn with
    its marker at 9."""
    recs = lambda n, tag: [Rec(i, f"{tag}{i}".encode(), f"{tag}{i}".encode()) for i in range(n)]  # noqa: E731
    return b"".join([
        kafka_python_batch(recs(2, "a"), base_offset=0, transactional=True, producer_id=1, producer_epoch=0,
                           base_sequence=0),
        control_batch(base_offset=2, commit=True, producer_id=1),
        kafka_python_batch(recs(2, "b"), base_offset=3, transactional=True, producer_id=2, producer_epoch=0,
                           base_sequence=0),
        kafka_python_batch(recs(2, "c"), base_offset=5),
        control_batch(base_offset=7, commit=False, producer_id=2),
        kafka_python_batch(recs(1, "d"), base_offset=8, transactional=True, producer_id=2, producer_epoch=0,
                           base_sequence=2),
        control_batch(base_offset=9, commit=True, producer_id=2),
    ])


def test_read_committed_drops_aborted_transactions_and_control_batches():
    parsed = parse_partition(TP, _txn_log(), 0, aborted_transactions=[(2, 3)], read_committed=True)
    assert [r.offset for r in parsed.records] == [0, 1, 5, 6, 8]
    assert parsed.aborted == 2
    assert parsed.next_offset == 10


def test_read_uncommitted_keeps_aborted_records_but_never_control_records():
    parsed = parse_partition(TP, _txn_log(), 0, aborted_transactions=[(2, 3)], read_committed=False)
    assert [r.offset for r in parsed.records] == [0, 1, 3, 4, 5, 6, 8]
    assert parsed.aborted == 0


def test_aborted_transaction_that_began_before_the_fetch_offset():
    parsed = parse_partition(TP, _txn_log(), 4, aborted_transactions=[(2, 3)], read_committed=True)
    assert [r.offset for r in parsed.records] == [5, 6, 8]


def test_records_outside_the_ranges_are_dropped_and_counted():
    blob = kafka_python_batch([Rec(i, f"k{i}".encode() if i % 5 else None, b"v") for i in range(200)],
                              base_offset=100)
    share = equal_shares(3)[1]
    parsed = parse_partition(TP, blob, 150, ranges=[share])
    expected = [o for o in range(150, 300)
                if contains([share], key_hash(None if (o - 100) % 5 == 0 else f"k{o - 100}".encode(), o))]
    assert [r.offset for r in parsed.records] == expected
    assert parsed.outside_ranges == 150 - len(expected)
    assert parsed.next_offset == 300


def test_a_truncated_tail_does_not_move_the_next_offset_past_it():
    whole = kafka_python_batch([Rec(0, b"a", b"1")], base_offset=0)
    second = kafka_python_batch([Rec(0, b"b", b"2")], base_offset=1)
    parsed = parse_partition(TP, whole + second[:20], 0)
    assert [r.offset for r in parsed.records] == [0]
    assert parsed.next_offset == 1 and parsed.truncated


# -- partition responses ------------------------------------------------------------------
def _consumer(**settings) -> Consumer:
    consumer = Consumer("127.0.0.1:1", **settings)
    consumer._started = True  # no network: responses are fed in directly
    consumer._connections.bootstrap = SimpleNamespace(filters_ranges=True, commits_ranges=False)
    return consumer


def _state(ranges=(), *, read_committed=False) -> AssignmentState:
    state = AssignmentState(read_committed=read_committed, tracking=False)
    state.assign({TP: list(ranges)})
    return state


def _part(blob=b"", *, code=0, applied=None, hw=10, lso=10):
    return SimpleNamespace(error_code=code, records=blob, high_watermark=hw, last_stable_offset=lso,
                           log_start_offset=0, aborted_transactions=[], key_ranges_applied=applied)


def _apply(state, part, offset, *, metrics=None, received=None, policy="latest") -> bool:
    return apply_partition(state, TP, part, offset, received_time=1.0,
                           received=set() if received is None else received, auto_offset_reset=policy,
                           metrics=Counter() if metrics is None else metrics)


def test_a_ranged_partition_answered_without_key_ranges_applied_is_filtered_locally():
    share = equal_shares(2)[0]
    state = _state([share])
    blob = kafka_python_batch([Rec(i, f"k{i}".encode(), b"v") for i in range(10)], base_offset=0)
    received: set = set()
    metrics: Counter = Counter()
    state.seek(TP, 0)
    _apply(state, _part(blob), 0, metrics=metrics, received=received)
    inside = [o for o in range(10) if contains([share], key_hash(f"k{o}".encode(), o))]
    records = state.drain(500, received)
    assert [r.offset for r in records] == inside
    assert metrics["unfiltered_range_responses"] == 1
    assert metrics["records_outside_ranges"] == 10 - len(inside)
    assert state.position(TP) == 10 and state.lag(TP) == 0
    meta = records.metadata()[TP]
    assert (meta.received_time, meta.position, meta.lag, meta.end_offset) == (1.0, 10, 0, 10)


def test_key_ranges_applied_matching_the_assignment_counts_nothing():
    share = equal_shares(2)[1]
    state = _state([share])
    state.seek(TP, 0)
    metrics: Counter = Counter()
    applied = [SimpleNamespace(start=share.start, end=share.end)]
    _apply(state, _part(b"", applied=applied, hw=0, lso=0), 0, metrics=metrics)
    assert metrics["unfiltered_range_responses"] == 0


def _applied(*ranges: KeyRange) -> list:
    return [SimpleNamespace(start=r.start, end=r.end) for r in ranges]


def _emptied(base_offset: int, count: int) -> bytes:
    """A batch of ``count`` offsets whose records a filter removed, all of them."""
    return build_batch(base_offset=base_offset, last_offset_delta=count - 1, records=b"", record_count=0,
                       base_timestamp=0, max_timestamp=0)


def test_a_batch_emptied_for_other_ranges_moves_nothing():
    halves = equal_shares(2)
    state = _state([halves[0]])
    state.seek(TP, 0)
    metrics: Counter = Counter()
    received: set = set()
    discarded: list[str] = []
    part = _part(_emptied(0, 10), applied=_applied(halves[1]))
    assert apply_partition(state, TP, part, 0, received_time=1.0, received=received, auto_offset_reset="latest",
                           metrics=metrics, discarded=discarded) is False
    assert state.position(TP) == 0, "records of this consumer's half may lie in the emptied batch"
    assert not state.buffers.has_buffered(TP) and not received and TP not in state.ends
    assert metrics["range_responses_discarded"] == 1 and metrics["unfiltered_range_responses"] == 1
    (reason,) = discarded
    assert "t-0 at offset 0" in reason and f"[{halves[1].start}, {halves[1].end}]" in reason
    assert "position stays at 0" in reason


def test_an_answer_filtered_for_narrower_ranges_hands_out_none_of_its_records():
    share = equal_shares(2)[0]
    narrower = KeyRange(share.start, share.start + share.size // 2)
    blob = kafka_python_batch([Rec(i, f"k{i}".encode(), b"v") for i in range(50)], base_offset=0)
    assert any(contains([narrower], key_hash(f"k{o}".encode(), o)) for o in range(50))
    state = _state([share])
    state.seek(TP, 0)
    metrics: Counter = Counter()
    _apply(state, _part(blob, applied=_applied(narrower), hw=50, lso=50), 0, metrics=metrics)
    assert not state.drain(500, ()) and state.position(TP) == 0
    assert metrics["range_responses_discarded"] == 1 and metrics["records_outside_ranges"] == 0


def test_key_ranges_applied_wider_than_the_ranges_held_are_taken():
    # the fetch asked for both halves; the assignment narrowed to one while it was out
    halves = equal_shares(2)
    state = _state([halves[1]])
    state.seek(TP, 0)
    metrics: Counter = Counter()
    blob = kafka_python_batch([Rec(i, f"k{i}".encode(), b"v") for i in range(20)], base_offset=0) + _emptied(20, 5)
    _apply(state, _part(blob, applied=_applied(*halves), hw=25, lso=25), 0, metrics=metrics)
    inside = [o for o in range(20) if contains([halves[1]], key_hash(f"k{o}".encode(), o))]
    assert [r.offset for r in state.drain(500, ())] == inside and state.position(TP) == 25
    assert metrics["range_responses_discarded"] == 0


def test_a_whole_partition_answered_filtered_is_discarded():
    state = _state()
    state.seek(TP, 0)
    metrics: Counter = Counter()
    _apply(state, _part(_emptied(0, 10), applied=_applied(equal_shares(2)[0])), 0, metrics=metrics)
    assert state.position(TP) == 0 and metrics["range_responses_discarded"] == 1
    assert metrics["unfiltered_range_responses"] == 0
    _apply(state, _part(_emptied(0, 10), applied=[]), 0, metrics=metrics)  # [] is the whole partition
    assert state.position(TP) == 10 and metrics["range_responses_discarded"] == 1


def test_a_discarded_partition_is_raised_after_the_rest_of_the_answer_is_taken():
    halves = equal_shares(2)
    other = TopicPartition("t", 1)
    state = AssignmentState(read_committed=False, tracking=False)
    state.assign({TP: [halves[0]], other: [halves[0]]})
    state.seek(TP, 0)
    state.seek(other, 0)
    good = SimpleNamespace(partition_index=1, **vars(_part(_emptied(0, 7), applied=_applied(halves[0]))))
    bad = SimpleNamespace(partition_index=0, **vars(_part(_emptied(0, 10), applied=_applied(halves[1]))))
    response = SimpleNamespace(error_code=0, responses=[SimpleNamespace(topic="t", partitions=[bad, good])])
    metrics: Counter = Counter()
    with pytest.raises(CorruptRecordError, match="Fetch from node 2: t-0 at offset 0 was filtered") as caught:
        apply_fetch_response(state, response, version=12, node_id=2, offsets={TP: 0, other: 0}, topic_names={},
                             received_time=1.0, received=set(), auto_offset_reset="latest", metrics=metrics)
    assert not caught.value.retriable and caught.value.name == "CORRUPT_MESSAGE"
    assert state.position(TP) == 0 and state.position(other) == 7
    assert metrics["range_responses_discarded"] == 1


def test_partition_errors():
    state = _state()
    state.seek(TP, 5)
    with pytest.raises(OffsetOutOfRangeError) as caught:
        _apply(state, _part(code=1), 5, policy="none")
    assert caught.value.name == "OFFSET_OUT_OF_RANGE"
    metrics: Counter = Counter()
    assert _apply(state, _part(code=6), 5, metrics=metrics) is True  # retry after refresh
    assert metrics["retriable_errors"] == 1
    with pytest.raises(KafkaError) as caught:
        _apply(state, _part(code=29), 5)
    assert (caught.value.code, caught.value.name) == (29, "TOPIC_AUTHORIZATION_FAILED")

    assert _apply(state, _part(code=1), 5, policy="earliest") is False
    assert state.position(TP) is None  # resolved by ListOffsets on the next poll
    assert state.positions[TP] == PendingReset(EARLIEST_TIMESTAMP)


def test_error_table():
    assert isinstance(KafkaError.for_code(6), NotLeaderOrFollowerError)
    assert isinstance(KafkaError.for_code(74), RetriableError)
    unknown = KafkaError.for_code(9999)
    assert (unknown.code, unknown.name) == (9999, "UNKNOWN_ERROR_CODE_9999")


def test_assign_validates_ranges():
    consumer = _consumer()
    with pytest.raises(ValueError, match="unsorted or overlaps"):
        consumer.assign({TP: [KeyRange(10, 20), KeyRange(15, 30)]})
    with pytest.raises(ValueError, match="outside"):
        consumer.assign({TP: [KeyRange(0, 1 << 63)]})
    consumer.assign({TP: equal_shares(4)[1:3]})
    assert consumer.assignment() == {TP: equal_shares(4)[1:3]}


async def test_commit_needs_a_group_and_refuses_ranged_partitions():
    from proxy.client import IllegalStateError

    consumer = _consumer()
    consumer.assign([TP])
    with pytest.raises(IllegalStateError, match="group_id"):
        await consumer.commit({TP: 1})
    grouped = _consumer(group_id="g")
    grouped.assign({TP: [equal_shares(2)[0]]})
    with pytest.raises(IllegalStateError, match="key ranges"):
        await grouped.commit({TP: 1})
    assert KafkaError.for_code(88).name == "UNSTABLE_OFFSET_COMMIT"
