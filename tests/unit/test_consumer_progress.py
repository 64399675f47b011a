"""Individual commit in the consumer, without a broker: the offset set, the partition's
(S, R) view with pending marks, gap amending while parsing, and the seed proposal's
worked example."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.batches import Rec, kafka_python_batch
from proxy.client import ConfigError, Consumer, IllegalStateError, TopicPartition, equal_shares
from proxy.client.fetch_protocol import apply_partition
from proxy.client.progress import OffsetSet, PartitionProgress
from proxy.client.records import parse_partition
from proxy.commits.state import CommitState, apply_ranges
from proxy.ranges import contains
from proxy.records.batch import iter_batches
from proxy.records.builder import rebuild_batch
from proxy.records.keyhash import key_hash
from tests.unit.test_consumer_parts import _txn_log

TP = TopicPartition("t", 0)


# -- OffsetSet ----------------------------------------------------------------------------
def _as_set(ranges) -> set[int]:
    return {o for start, end in ranges for o in range(start, end + 1)}


def _canonical(ranges) -> bool:
    ranges = list(ranges)
    return all(s <= e for s, e in ranges) and all(a[1] + 1 < b[0] for a, b in zip(ranges, ranges[1:]))


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 60), st.integers(0, 6)), max_size=60))
def test_offset_set_matches_a_plain_set(operations):
    offsets = OffsetSet()
    model: set[int] = set()
    for adding, start, length in operations:
        end = start + length
        if adding:
            offsets.add(start, end)
            model |= set(range(start, end + 1))
        else:
            offsets.remove(start, end)
            model -= set(range(start, end + 1))
        assert _canonical(offsets)
        assert _as_set(offsets) == model
    for o in range(-1, 70):
        assert (o in offsets) == (o in model)
    offsets.discard_below(30)
    assert _as_set(offsets) == {o for o in model if o >= 30}


def test_ascending_marks_extend_one_range():
    offsets = OffsetSet()
    for o in range(1000):
        offsets.add(o)
    assert list(offsets) == [(0, 999)]
    offsets.add(1001)
    offsets.add(1000)
    assert list(offsets) == [(0, 1001)]
    with pytest.raises(ValueError, match="above its end"):
        offsets.add(5, 4)


# -- PartitionProgress ---------------------------------------------------------------------
def test_the_seed_example_commits_only_the_processed_offsets():
    """stable 40, IC [43-45], [48-49]; fetched [40-50]: records already committed are
    never handed out, and the commit carries only the ones processed now."""
    progress = PartitionProgress(40, [(43, 45), (48, 49)])
    handed_out = [o for o in range(40, 51) if not progress.already_committed(o)]
    assert handed_out == [40, 41, 42, 46, 47, 50]
    for o in (41, 42, 46, 47, 50):  # 40 is still being processed
        progress.mark(o)
    assert progress.to_commit(1000) == [(41, 42), (46, 47), (50, 50)]
    # what the proxy computes from that commit, and tells back as StableOffset
    group = apply_ranges(CommitState(40, ((43, 45), (48, 49))), progress.to_commit(1000))
    assert group == CommitState(40, ((41, 50),))
    progress.acknowledged(progress.to_commit(1000), group.stable)
    assert not progress.pending
    progress.mark(40)
    group = apply_ranges(group, progress.to_commit(1000))
    assert group == CommitState(51, ())
    progress.acknowledged([(40, 40)], group.stable)
    assert progress.stable == 51 and not progress.committed and not progress.pending


def test_a_failed_commit_keeps_everything_pending():
    progress = PartitionProgress(0)
    for o in (0, 1, 5):
        progress.mark(o)
    sent = progress.to_commit(1000)
    progress.mark(2)  # processed while the commit is in flight
    # the commit fails: acknowledged() is never called; the next one carries it all
    assert progress.to_commit(1000) == [(0, 2), (5, 5)]
    progress.acknowledged(sent, 2)  # only the first commit's ranges leave; S is now 2
    assert progress.to_commit(1000) == [(2, 2)]
    assert progress.stable == 2 and not progress.committed


def test_marks_below_stable_are_ignored_and_the_limit_takes_the_lowest():
    progress = PartitionProgress(100)
    progress.mark(5)
    progress.mark(90, 105)
    for o in range(110, 130, 2):
        progress.mark(o)
    assert progress.to_commit(3) == [(100, 105), (110, 110), (112, 112)]


def test_contiguous_prefix_for_plain_commits():
    progress = PartitionProgress(10, [(14, 15)])
    assert progress.contiguous() is None
    progress.mark(11)
    assert progress.contiguous() is None  # 10 is not processed
    progress.mark(10)
    progress.mark(12, 13)
    assert progress.contiguous() == 16  # through the committed range 14-15
    progress.acknowledged_plain(16)
    assert progress.stable == 16 and not progress.committed and not progress.pending
    assert PartitionProgress(None).contiguous() is None


@given(st.integers(0, 2**32), st.integers(2, 6))
def test_members_committing_their_shares_in_any_order_move_s_to_the_end(seed, members):
    """Each member marks its records in a random order and commits in random chunks; the
    merged group state reaches the end with no ranges left, and no member ever holds an
    offset twice in flight."""
    rnd = random.Random(seed)
    end = 200
    owner = {o: rnd.randrange(members) for o in range(end)}
    views = [PartitionProgress(0) for _ in range(members)]
    todo = [[o for o in range(end) if owner[o] == m] for m in range(members)]
    for queue in todo:
        rnd.shuffle(queue)
    group = CommitState(0, ())
    while any(todo) or any(v.pending for v in views):
        m = rnd.randrange(members)
        for _ in range(rnd.randint(0, 10)):
            if todo[m]:
                views[m].mark(todo[m].pop())
        sent = views[m].to_commit(rnd.randint(1, 5))
        if sent and rnd.random() < 0.8:  # some commits fail and are simply retried later
            group = apply_ranges(group, sent)
            views[m].acknowledged(sent, group.stable)
    assert group == CommitState(end, ())


# -- gap amending while parsing -----------------------------------------------------------
def test_control_batches_and_aborted_transactions_are_gaps():
    # the log of test_consumer_parts: markers at 2, 7 and 9; 3-4 aborted
    parsed = parse_partition(TP, _txn_log(), 0, aborted_transactions=[(2, 3)], read_committed=True)
    assert [r.offset for r in parsed.records] == [0, 1, 5, 6, 8]
    assert parsed.gaps == [(2, 4), (7, 7), (9, 9)]  # a whole partition: everything between its records
    ranged = parse_partition(TP, _txn_log(), 0, aborted_transactions=[(2, 3)], read_committed=True,
                             ranges=equal_shares(1))
    assert ranged.gaps == [(2, 2), (3, 4), (7, 7), (9, 9)]


def test_a_whole_partition_amends_every_offset_between_its_records():
    # a compacted log: offsets 10, 11, 15, 19 survive in a batch spanning 10-21
    source = next(iter_batches(kafka_python_batch([Rec(d, b"k%d" % d, b"v") for d in range(12)], base_offset=10)))
    kept = [r.raw for r in source.records() if r.offset - 10 in (0, 1, 5, 9)]
    batch = rebuild_batch(source.header, kept, len(kept))
    parsed = parse_partition(TP, batch, 11)
    assert [r.offset for r in parsed.records] == [11, 15, 19]
    assert parsed.gaps == [(12, 14), (16, 18), (20, 21)]
    assert parsed.next_offset == 22


def test_a_ranged_partition_never_amends_other_members_records():
    blob = kafka_python_batch([Rec(i, f"k{i}".encode(), b"v") for i in range(50)], base_offset=0)
    share = equal_shares(4)[2]
    parsed = parse_partition(TP, blob, 0, ranges=[share])
    assert parsed.gaps == []
    assert all(contains([share], key_hash(r.key, r.offset)) for r in parsed.records)


# -- the consumer's bookkeeping, fed responses directly ------------------------------------
def _consumer(**settings) -> Consumer:
    consumer = Consumer("127.0.0.1:1", group_id="g", allow_individual_commit=True, **settings)
    consumer._started = True
    consumer._connections.bootstrap = SimpleNamespace(filters_ranges=True, commits_ranges=False)
    return consumer


def _part(blob):
    return SimpleNamespace(error_code=0, records=blob, high_watermark=30, last_stable_offset=30,
                           log_start_offset=0, aborted_transactions=[], key_ranges_applied=None)


def test_records_the_group_already_committed_are_never_handed_out():
    consumer = _consumer()
    consumer.assign([TP])
    state = consumer._state
    state.seek(TP, 10)
    state.progress[TP] = PartitionProgress(10, [(12, 14), (20, 20)])
    blob = kafka_python_batch([Rec(i, b"k", b"v") for i in range(15)], base_offset=10)
    received: set = set()
    apply_partition(state, TP, _part(blob), 10, received_time=1.0, received=received, auto_offset_reset="latest",
                    metrics=consumer._metrics)
    records = list(state.drain(500, received))
    assert [r.offset for r in records] == [10, 11, 15, 16, 17, 18, 19, 21, 22, 23, 24]
    assert consumer.metrics()["records_already_committed"] == 4
    consumer.mark_processed(*records[::-1])
    assert consumer.pending_commit(TP) == [(10, 11), (15, 19), (21, 24)]


def test_individual_commit_settings_are_checked():
    with pytest.raises(ConfigError, match="allow_individual_commit=True needs a group_id"):
        Consumer("127.0.0.1:1", allow_individual_commit=True)
    with pytest.raises(ConfigError, match="allow_individual_commit must be a bool, got str 'yes'"):
        Consumer("127.0.0.1:1", group_id="g", allow_individual_commit="yes")
    with pytest.raises(ConfigError, match="individual_commit_max_ranges must be between 1"):
        Consumer("127.0.0.1:1", group_id="g", individual_commit_max_ranges=0)
    plain = Consumer("127.0.0.1:1", group_id="g")
    plain._started = True
    plain._connections.bootstrap = SimpleNamespace(filters_ranges=True, commits_ranges=False)
    plain.assign([TP])
    with pytest.raises(IllegalStateError, match="mark_processed needs allow_individual_commit"):
        plain.mark_processed()
