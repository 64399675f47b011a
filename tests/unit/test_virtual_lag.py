"""Lag that tells the truth on virtual partitions (docs/virtual-topics.md#lag): a share's
committed offset is lifted over the offsets the proxy proved hold none of its records
(proxy.commits.gaps, proxy.commits.state.lift_marks, proxy.virtual.lag), and never past a
record of the share."""

from __future__ import annotations

import uuid

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.batches import Rec, kafka_python_batch
from proxy.commits.gaps import add_gap, lift
from proxy.commits.state import CommitState, MarkEdit, apply_marks, join, lift_marks, rebase_commit
from proxy.keyrange.engine import KeyRangeEngine, SharedReads
from proxy.pipeline.cluster import ClusterView
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.records.batch import RecordBatch, iter_batches
from proxy.records.stripes import STRIPED_MARKS, stripe_of
from proxy.server.config import build_config
from proxy.virtual import fetch, lag
from proxy.virtual.fetch_feature import VirtualFetchFeature
from proxy.virtual.resolver import VirtualResolver
from tests.unit.test_virtual_fetch import Answer, World, key_of

TOPIC_ID = uuid.UUID(int=0x1234)


# -- gaps and lift: the pure rule -------------------------------------------------------------


def test_lift_moves_an_offset_inside_a_gap_to_its_end_and_nothing_else():
    gaps = ((10, 20), (30, 35))
    assert [lift(o, gaps) for o in (9, 10, 15, 19, 20, 29, 30, 34, 35)] == [9, 20, 20, 20, 20, 29, 35, 35, 35]
    assert lift(-1, ((0, 5),)) == -1  # no commit is not an offset
    assert lift(7, ()) == 7


def test_gaps_merge_where_they_touch_and_keep_the_highest():
    gaps = add_gap((), 10, 20, keep=8)
    gaps = add_gap(gaps, 20, 25, keep=8)  # a read that started where the last control batch ended
    assert gaps == ((10, 25),)
    gaps = add_gap(gaps, 30, 40, keep=8)
    gaps = add_gap(gaps, 5, 12, keep=8)
    assert gaps == ((5, 25), (30, 40))
    assert add_gap(gaps, 50, 60, keep=2) == ((30, 40), (50, 60))
    assert add_gap(gaps, 7, 7, keep=8) == gaps  # empty: nothing
    assert add_gap(gaps, -3, 2, keep=8) == gaps


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(1, 30)), max_size=20), st.integers(-1, 260))
def test_lift_never_passes_an_offset_outside_every_gap(intervals, offset):
    """Against a model: the offsets known to hold no record of the share are the union of
    what was added; a lift moves only across them, and as far as they reach."""
    gaps: tuple = ()
    empty: set[int] = set()
    for start, length in intervals:
        gaps = add_gap(gaps, start, start + length, keep=1000)
        empty |= set(range(start, start + length))
    lifted = lift(offset, gaps)
    assert lifted >= offset
    assert all(o in empty for o in range(max(offset, 0), lifted))  # passed only empty offsets
    assert offset < 0 or lifted not in empty  # and stopped at the first offset not known empty
    assert all(a[1] < b[0] for a, b in zip(gaps, gaps[1:]))  # sorted, disjoint, never touching


# -- the property that matters: a lift never skips a record of the share -----------------------


@st.composite
def _logs(draw):
    """A partition of records in shares of K, read by each share's consumer in steps as
    Fetch reads: (K, share of each offset, batch size, the reads' sizes)."""
    shares = draw(st.sampled_from([2, 4]))
    owners = draw(st.lists(st.integers(0, shares - 1), min_size=1, max_size=60))
    batch = draw(st.integers(1, 7))
    steps = draw(st.lists(st.integers(1, 25), min_size=1, max_size=12))
    return shares, owners, batch, steps


def _world() -> tuple[World, VirtualFetchFeature]:
    world = World()
    cluster = ClusterView()
    meta = messages.body_class(ApiKey.METADATA, "response")
    cluster.learn_metadata(messages.new_body(ApiKey.METADATA, 12, "response", brokers=[], topics=[
        meta.MetadataResponseTopic(error_code=0, name="t", topic_id=TOPIC_ID, partitions=[
            meta.MetadataResponsePartition(error_code=0, partition_index=0, leader_id=0)])]))
    config = build_config({"bootstrap.servers": "127.0.0.1:9092", "virtual.topics.enabled": "true"})
    engine = KeyRangeEngine(cache_bytes=1 << 30, topic_settings=config.keyrange.topics.of, topic_name=lambda key: None)
    world.feature = VirtualFetchFeature(VirtualResolver(config.virtual, cluster), None, SharedReads(engine))
    return world, world.feature


def _broker(shares: int, owners: list[int], batch: int, limit: list[int]):
    """The partition ``owners`` (offset -> share) in batches of ``batch``; a read returns
    up to ``limit[0]`` records from its offset (a client's max bytes)."""
    end = len(owners)

    def answer(offset: int, isolation: int) -> Answer:
        first = offset - offset % batch
        stop = min(end, offset + limit[0])
        blob = b"".join(kafka_python_batch([Rec(o - base, key_of(shares, owners[o], o % 3), b"v")
                                            for o in range(base, min(base + batch, end))], base_offset=base)
                        for base in range(first, stop, batch))
        return Answer(blob, end, end, 0)
    return answer


@settings(max_examples=60, deadline=None)
@given(_logs(), st.booleans())
def test_a_lift_never_passes_a_record_of_the_share(log, striped):
    """Each share's consumer fetches through the feature, from its position, reads of the
    drawn sizes; whatever the proxy learnt, lifting any committed offset of a share passes
    no record of that share. And once a consumer's position is the log end, the offset
    after its last record lifts to the log end: lag 0. For key shares (``t.krK``: a
    record's share is its key's) and stripes (``t.coopK``: a record's stripe is its
    batch's)."""
    shares, owners, batch, steps = log
    world, feature = _world()
    limit = [1]
    broker = _broker(shares, owners, batch, limit)
    end = len(owners)
    topic, mark_k = (f"t.coop{shares}", STRIPED_MARKS + shares) if striped else (f"t.kr{shares}", shares)
    if striped:
        owners = [stripe_of(o - o % batch, shares) for o in range(end)]

    async def main():
        positions = {share: 0 for share in range(shares)}
        for step in steps:
            limit[0] = step
            for share in range(shares):
                if positions[share] >= end:
                    continue
                answer = (await world.fetch(world.connection(), topic, {share: positions[share]}, broker))[share]
                tops = [b.header.last_offset + 1 for b in iter_batches(answer.records or b"") if isinstance(b, RecordBatch)]
                positions[share] = max([positions[share], *tops])
        return positions

    positions = trio.run(main)
    for share in range(shares):
        gaps = feature.gaps.of("t", TOPIC_ID, 0, mark_k).get(share, ())
        mine = [o for o, owner in enumerate(owners) if owner == share]
        for offset in range(end + 1):
            lifted = lift(offset, gaps)
            assert not [o for o in mine if offset <= o < lifted], (share, offset, lifted, gaps)
        if positions[share] >= end:
            last = mine[-1] + 1 if mine else None
            if last is not None:
                assert lift(last, gaps) == end, (share, gaps)


def test_gaps_are_not_taken_for_a_topic_created_again():
    gaps = lag.ShareGaps()
    old, new = uuid.UUID(int=1), uuid.UUID(int=2)
    assert gaps.learn("t", old, 0, 4, 1, 10, 20)
    assert gaps.of("t", old, 0, 4) == {1: ((10, 20),)}
    assert gaps.of("t", new, 0, 4) == {}  # the new topic's offsets start again
    assert gaps.of("t", None, 0, 4) == {}
    assert not gaps.learn("t", None, 0, 4, 1, 30, 40)  # an unknown id is not learnt
    version = gaps.version("t", 0)
    assert gaps.learn("t", new, 0, 4, 1, 30, 40)
    assert gaps.of("t", new, 0, 4) == {1: ((30, 40),)}  # what was known of the old one is gone
    assert gaps.version("t", 0) > version
    version = gaps.version("t", 0)
    assert not gaps.learn("t", new, 0, 4, 1, 32, 38)  # nothing new: the version stays
    assert gaps.version("t", 0) == version


def test_what_lies_above_a_high_watermark_seen_is_forgotten():
    """A high watermark below what was learnt: the log was truncated (an unclean leader
    election), and the offsets above it will hold other records."""
    gaps = lag.ShareGaps()
    gaps.learn("t", TOPIC_ID, 0, 4, 1, 10, 20)
    gaps.learn("t", TOPIC_ID, 0, 4, 1, 30, 40)
    gaps.learn("t", TOPIC_ID, 0, 4, 2, 35, 40)
    gaps.high_watermark("t", 0, 40)  # the log end it reached: nothing changes
    assert gaps.of("t", TOPIC_ID, 0, 4) == {1: ((10, 20), (30, 40)), 2: ((35, 40),)}
    gaps.high_watermark("t", 0, 33)
    assert gaps.of("t", TOPIC_ID, 0, 4) == {1: ((10, 20), (30, 33))}
    assert lift(30, gaps.of("t", TOPIC_ID, 0, 4)[1]) == 33


def test_gaps_are_bounded_and_kept_per_k():
    gaps = lag.ShareGaps(per_share=2, max_gaps=5)
    for start in range(0, 100, 10):
        gaps.learn("t", TOPIC_ID, 0, 4, 0, start, start + 5)
    gaps.learn("t", TOPIC_ID, 0, 1004, 0, 0, 100)  # the stripes of t.coop4: apart from t.kr4's shares
    assert gaps.of("t", TOPIC_ID, 0, 4) == {0: ((80, 85), (90, 95))}
    assert gaps.of("t", TOPIC_ID, 0, 1004) == {0: ((0, 100),)}
    assert gaps.held == 3
    for partition in range(1, 4):
        gaps.learn("t", TOPIC_ID, partition, 4, 0, 0, 5)
    assert gaps.of("t", TOPIC_ID, 0, 4) == {}  # the least recently learnt partition went first
    assert gaps.version("t", 0) == 0
    assert gaps.of("t", TOPIC_ID, 3, 4) == {0: ((0, 5),)}
    assert gaps.held == 3
    gaps.learn("t", uuid.UUID(int=9), 3, 4, 0, 0, 5)  # the topic created again: its old stretches go
    gaps.high_watermark("t", 2, 3)
    assert gaps.held == 3 and gaps.of("t", TOPIC_ID, 2, 4) == {0: ((0, 3),)}


def test_compose_reports_the_stretch_its_control_batch_passes():
    records = kafka_python_batch([Rec(0, b"k", b"v"), Rec(2, b"k", b"v")], base_offset=10)
    composed = fetch.compose(records, 10, 20, 0)
    assert composed.control_added and composed.skipped == (13, 20) and composed.next_offset == 20
    assert fetch.compose(b"", 15, 20, 0).skipped == (15, 20)  # nothing of the share: from the position
    assert fetch.compose(records, 10, 13, 0).skipped is None  # the read ended at the share's record


# -- the commit layer: watermarks lifted in the state a commit meets ---------------------------


def test_a_commit_lifts_every_share_in_a_gap_and_s_follows():
    state = apply_marks(CommitState(0), MarkEdit(4, {0: 90, 1: 95, 2: 97, 3: 100}))
    assert state.stable == 90
    gaps = {0: ((90, 100),), 1: ((96, 100),), 2: ((97, 100),)}
    after = apply_marks(state, MarkEdit(4, {1: 96}, gaps=gaps))  # share 1 commits its last record + 1
    assert {(share, w) for _k, share, w, _s in after.marks} == {(0, 100), (1, 100), (2, 100), (3, 100)}
    assert after.stable == 100  # the real partition's committed offset is its log end


def test_a_lift_keeps_the_sequence_so_a_newer_commit_elsewhere_still_wins():
    base = apply_marks(CommitState(0), MarkEdit(2, {0: 50, 1: 60}))
    sequence = {share: s for _k, share, _w, s in base.marks}
    lifted = apply_marks(base, MarkEdit(2, {}, gaps={0: ((50, 70),)}))
    assert (2, 0, 70, sequence[0]) in lifted.marks
    # Meanwhile another instance wrote a commit of share 0 that sought back to 20.
    elsewhere = apply_marks(base, MarkEdit(2, {0: 20}))
    merged = join(lifted, elsewhere)
    assert (2, 0, 20) in {mark[:3] for mark in merged.marks}
    # The lift applied again on top of that record (the merge after a write) lifts what it meets.
    redone = rebase_commit(lifted, elsewhere, [MarkEdit(2, {}, gaps={0: ((50, 70),)})])
    assert (2, 0, 20) in {mark[:3] for mark in redone.marks}


def test_a_share_without_a_watermark_is_lifted_from_s_and_no_commit_is_never_lifted():
    assert lift_marks((), -1, 2, {0: ((0, 10),)}) == ()
    marks = lift_marks(((2, 1, 40, 3),), 30, 2, {0: ((30, 40),)})
    assert marks == ((2, 0, 40, 0), (2, 1, 40, 3))  # sequence 0: any commit of share 0 outranks it
    untouched = ((2, 0, 35, 1), (3, 0, 35, 1))
    assert lift_marks(untouched, 30, 2, {0: ((40, 50),)}) is untouched


# -- what the features do with it ----------------------------------------------------------------


def test_an_offset_fetch_answer_shows_each_share_lifted():
    gaps = {4: {0: ((90, 100),), 2: ((30, 100),)}}
    stable, per_k = lag.lift_answer(30, {4: [90, 95, -1, 100]}, lambda mark_k: gaps.get(mark_k, {}))
    assert (stable, per_k) == (30, {4: [100, 95, 100, 100]})


def test_a_transactional_commit_is_lifted_before_its_shadow_holds_it():
    gaps = {(("t", 0), 4): {1: ((96, 100),)}}
    lifted = lag.lift_edits({("t", 0): {4: {1: 96, 2: 50}}}, lambda key, mark_k: gaps.get((key, mark_k), {}))
    assert lifted == {("t", 0): {4: {1: 100, 2: 50}}}


def test_the_proxy_lifts_a_partition_once_its_commits_are_quiet_then_whenever_something_is_new():
    watch = lag.LiftWatch(quiet=1.0, retry=5.0)
    versions = {("t", 0): 3}
    me = lag.Identity(7, "member-1")
    assert not watch
    watch.committed("g", {("t", 0): {4}}, me, 100.0, lambda key: versions.get(key, 0))
    assert watch.due("g", 100.5, lambda key: versions.get(key, 0)) is None  # not quiet yet
    assert watch.due("g", 102.0, lambda key: versions.get(key, 0)) == (me, {("t", 0): {4}})  # committed since
    watch.done("g", [], 102.0)
    assert watch.due("g", 102.5, lambda key: versions.get(key, 0)) is None  # nothing new since
    versions[("t", 0)] = 4
    heartbeat = lag.Identity(8, "member-2")
    watch.heard("g", heartbeat)
    assert watch.due("g", 103.0, lambda key: versions.get(key, 0)) == (heartbeat, {("t", 0): {4}})
    versions[("t", 0)] = 5
    assert watch.due("g", 103.0, lambda key: versions.get(key, 0)) is None  # one lift of a group at a time
    watch.done("g", [("t", 0)], 103.0)  # refused: tried again after the retry time
    assert watch.due("g", 104.0, lambda key: versions.get(key, 0)) is None
    assert watch.due("g", 108.5, lambda key: versions.get(key, 0)) == (heartbeat, {("t", 0): {4}})
    watch.done("g", [], 108.5)
    assert watch.due("g", 200.0, lambda key: versions.get(key, 0)) is None  # lifted: nothing new
    assert watch.groups() == ["g"]
    watch.heard("other", me)
    assert not watch.watches("other")


def test_a_partition_s_tail_is_read_once_per_committed_state_and_not_too_often():
    watch = lag.LiftWatch(quiet=1.0, retry=5.0, scan_interval=5.0)
    watch.committed("g", {("t", 0): {4}}, lag.Identity(7, "m"), 100.0, lambda key: 0)
    assert watch.scan_wait("g", ("t", 0), "state-1", 101.0) == 0
    watch.scanned("g", ("t", 0), "state-1", 101.0)
    assert watch.scan_wait("g", ("t", 0), "state-1", 102.0) is None  # read for this state already
    assert watch.scan_wait("g", ("t", 0), "state-2", 102.0) == 4.0  # a new state, read at 106
    watch.done("g", [], 102.0)
    watch.later("g", ("t", 0), 106.0)
    assert watch.due("g", 105.0, lambda key: 0) is None
    assert watch.due("g", 106.0, lambda key: 0) is not None
    assert watch.scan_wait("g", ("u", 0), "state-1", 101.0) is None  # not watched


def test_the_watch_is_bounded():
    watch = lag.LiftWatch(max_groups=2)
    for group in ("a", "b", "c"):
        watch.committed(group, {("t", 0): {4}}, lag.Identity(1, "m"), 0.0, lambda key: 0)
    assert [watch.watches(group) for group in ("a", "b", "c")] == [False, True, True]


@pytest.mark.parametrize("keys", [[(("t", 0), 4)], [(("t", 0), 4), (("t", 1), 1004)]])
def test_a_commit_carries_the_gaps_of_every_share_it_names(keys):
    known = {(("t", 0), 4): {0: ((5, 9),), 3: ((7, 9),)}}
    assert lag.commit_gaps(keys, lambda key, mark_k: known.get((key, mark_k), {})) == \
        {("t", 0): {4: {0: ((5, 9),), 3: ((7, 9),)}}}


def test_lifts_anything_tells_whether_a_lift_would_move_a_watermark():
    marks = ((4, 0, 100, 1), (4, 1, 96, 2))
    assert lag.lifts_anything(marks, 90, {4: {1: ((96, 100),)}})
    assert not lag.lifts_anything(marks, 90, {4: {1: ((97, 100),)}})


def test_a_transactional_commit_has_its_partition_lifted_once_quiet():
    # Fetch learnt share 2's last stretch (version 4) before a transaction named only share 1:
    # nothing new is learnt afterwards, yet the partition is due once quiet, for share 2.
    watch = lag.LiftWatch(quiet=1.0, retry=5.0)
    member = lag.Identity(7, "member-1")
    marks = lag.txn_watch_marks({("t", 0): {4: {1: 100}}, ("t", 1): {4: {}}})
    assert marks == {("t", 0): {4}, ("t", 1): {4}}
    watch.committed("g", marks, member, 100.0, lambda key: 4)
    assert watch.due("g", 100.5, lambda key: 4) is None  # not quiet yet
    assert watch.due("g", 101.5, lambda key: 4) == (member, {("t", 0): {4}, ("t", 1): {4}})
    watch.done("g", [], 101.5)
    assert watch.due("g", 200.0, lambda key: 4) is None  # lifted: nothing new since


def test_partitions_idle_for_long_are_no_longer_watched():
    watch = lag.LiftWatch(quiet=1.0)
    versions = {("t", 0): 1, ("t", 1): 1}
    watch.committed("g", {("t", 0): {4}, ("t", 1): {4}}, lag.Identity(1, "m"), 0.0, lambda key: versions[key])
    assert watch.due("g", 2.0, lambda key: versions[key]) is not None
    watch.done("g", [], 2.0)
    watch.committed("g", {("t", 1): {4}}, lag.Identity(1, "m"), 200.0, lambda key: versions[key])
    assert watch.forget_idle(250.0, lambda key: versions[key], idle=300.0) == 0  # neither idle long enough
    versions[("t", 0)] = 2  # learnt since its last lift: kept until lifted
    assert watch.forget_idle(400.0, lambda key: versions[key], idle=300.0) == 0
    versions[("t", 0)] = 1
    assert watch.forget_idle(400.0, lambda key: versions[key], idle=300.0) == 1  # t-0; t-1 is pending still
    assert watch.watches("g")
    assert watch.due("g", 400.0, lambda key: versions[key]) == (lag.Identity(1, "m"), {("t", 1): {4}})
    watch.done("g", [], 400.0)
    assert watch.forget_idle(600.0, lambda key: versions[key], idle=300.0) == 1
    assert not watch.watches("g") and not watch
