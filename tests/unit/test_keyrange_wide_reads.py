"""Wide read-ahead, shares served within their consumer's limit, and probes.

A partition N range sets share is read ahead about N consumer limits at a time, so that each
consumer's next answer holds about a limit of its own records; a share above the limit of
the consumer fetching it is served in parts; and a connection's first Fetch of a partition
whose share is cached or on its way asks the broker for one batch only."""

from __future__ import annotations

import dataclasses

from harness.batches import Rec, kafka_python_batch, legacy_batch
from proxy.keyrange.engine import (
    PROBE_BYTES,
    SETTLE_SECONDS,
    SHARE_FILL,
    ConnectionRanges,
    KeyRangeEngine,
    expected_sets,
    read_ahead_bytes,
)
from proxy.keyrange.settings import KeyRangeTopicSettings
from proxy.protocol import messages
from proxy.protocol.messages import ApiKey
from proxy.ranges import KeyRange, contains, equal_shares
from proxy.records.batch import RecordBatch, cut_after, iter_batches, next_offset_after
from proxy.records.keyhash import key_hash

R = messages.body_class(ApiKey.FETCH, "request")
P = messages.body_class(ApiKey.FETCH, "response")
SHARES = equal_shares(4)
LIMIT = 1 << 20
T0 = 100.0  # when the sets join
LATER = T0 + 2 * SETTLE_SECONDS  # settled


def _engine(cache_bytes: int = 1 << 30) -> KeyRangeEngine:
    return KeyRangeEngine(cache_bytes=cache_bytes, topic_settings=lambda name: KeyRangeTopicSettings(),
                          topic_name=lambda key: key)


def _request(share: int | tuple, offset: int, limit: int = LIMIT):
    """A sessionless range fetch of partition 0 for ``SHARES[share]`` (a tuple: those shares)."""
    ranges = [SHARES[i] for i in share] if isinstance(share, tuple) else [SHARES[share]]
    topics = [R.FetchTopic(topic="t", partitions=[R.FetchPartition(
        partition=0, fetch_offset=offset, partition_max_bytes=limit,
        key_ranges=[R.KeyRange(start=r.start, end=r.end) for r in ranges])])]
    return messages.new_body(ApiKey.FETCH, 12, "request", session_id=0, session_epoch=-1, topics=topics,
                             max_bytes=50 << 20)


def _records(offset: int, count: int, per_batch: int = 50, key=lambda n: f"key-{n}".encode()) -> bytes:
    return b"".join(kafka_python_batch([Rec(i, key(offset + b * per_batch + i), b"v" * 40)
                                        for i in range(per_batch)], base_offset=offset + b * per_batch)
                    for b in range(count // per_batch))


def _response(offset: int, records: bytes, high_watermark: int = 100_000):
    return messages.new_body(ApiKey.FETCH, 12, "response", responses=[P.FetchableTopicResponse(
        topic="t", partitions=[P.PartitionData(partition_index=0, high_watermark=high_watermark,
                                               last_stable_offset=high_watermark, records=records)])])


def _served(engine, conn, share, offset, records, now, limit=LIMIT):
    """A consumer's read at ``offset`` answered by the broker with ``records``; its plan."""
    plan = engine.plan(conn, 12, _request(share, offset, limit), now=now)
    engine.finish(plan)
    assert plan.upstream_body is not None
    engine.complete(conn, plan, _response(offset, records), now=now)
    return plan


def _all_active(engine, now=T0):
    """Every set reads the first 400 records once (each is then served on its connection)."""
    conns = [ConnectionRanges() for _ in SHARES]
    plans = [_served(engine, conn, share, 0, _records(0, 400), now) for share, conn in enumerate(conns)]
    return conns, plans


def _offsets(records) -> list[int]:
    return [r.offset for b in iter_batches(records) if isinstance(b, RecordBatch) for r in b.records()]


# -- the width of a read ahead --------------------------------------------------------------------

def test_a_read_ahead_asks_a_limit_per_set_within_the_cap_and_the_room():
    assert read_ahead_bytes(LIMIT, 16, 16 << 20, 1 << 30) == int(LIMIT * 16 * SHARE_FILL)
    assert read_ahead_bytes(LIMIT, 64, 16 << 20, 1 << 30) == 16 << 20, "the cap"
    assert read_ahead_bytes(LIMIT, 16, 16 << 20, 3 << 20) == 3 << 20, "what the cache has room for"
    assert read_ahead_bytes(LIMIT, 16, 0, 1 << 30) == LIMIT, "never less than the consumer's own read"
    assert read_ahead_bytes(LIMIT, 16, 16 << 20, -5) == LIMIT


def test_a_settled_partition_is_read_ahead_wide_from_its_frontier():
    engine = _engine()
    _, plans = _all_active(engine)
    ahead = engine.prefetch(plans[0], lambda key: False, now=LATER, max_read_bytes=16 << 20, room=1 << 30)
    assert ahead is not None and ahead.positions == {("t", 0): 400}
    wide = int(LIMIT * 4 * SHARE_FILL)
    assert ahead.body.topics[0].partitions[0].partition_max_bytes == wide
    assert ahead.read_bytes == wide and ahead.body.max_bytes >= wide
    assert plans[0].request.topics[0].partitions[0].partition_max_bytes == LIMIT, "the consumer's request alone"


def test_a_read_ahead_stays_narrow_behind_the_frontier():
    engine = _engine()
    conns, _ = _all_active(engine)
    _served(engine, conns[1], 1, 400, _records(400, 400), LATER)  # split for every set: the frontier is 800
    for share in (0, 2, 3):  # the others take their shares of it
        plan = engine.plan(conns[share], 12, _request(share, 400), now=LATER)
        assert plan.hits
        engine.finish(plan)
        engine.complete(conns[share], plan, None, now=LATER)
    # a consumer of two shares joins, at 200: no read was split for its set
    behind = _served(engine, ConnectionRanges(), (0, 1), 200, _records(200, 100), LATER)
    ahead = engine.prefetch(behind, lambda key: False, now=LATER + 1, max_read_bytes=16 << 20, room=1 << 30)
    assert ahead is not None and ahead.positions == {("t", 0): 300}
    assert ahead.body.topics[0].partitions[0].partition_max_bytes == LIMIT, \
        "catching up through reads made for others: a wide read would read most of them again"


def test_while_sets_join_a_read_ahead_is_wide_for_the_sets_their_size_implies():
    engine = _engine()
    conns = [ConnectionRanges() for _ in range(2)]
    plans = [_served(engine, conn, share, 0, _records(0, 400), T0) for share, conn in enumerate(conns)]
    assert expected_sets([(SHARES[0],), (SHARES[1],)]) == 4, "two quarters of the hash space: four sets to come"
    ahead = engine.prefetch(plans[0], lambda key: False, now=T0, max_read_bytes=16 << 20, room=1 << 30)
    assert ahead is not None
    assert ahead.body.topics[0].partitions[0].partition_max_bytes == int(LIMIT * 4 * SHARE_FILL), \
        "sized for the four sets a group of quarter ranges has, not the two that joined so far"
    assert expected_sets([(SHARES[0],), (SHARES[0], SHARES[1])]) == 3
    assert expected_sets([()]) == 1, "no ranges: the whole partition"


def test_a_set_joining_after_a_read_takes_its_share_from_the_rest_kept_while_sets_join():
    engine = _engine()
    early = [ConnectionRanges() for _ in range(2)]
    for share, conn in enumerate(early):  # sets 0 and 1 read [0, 400) while the group joins
        _served(engine, conn, share, 0, _records(0, 400), T0)
    rest = [s for s in engine.cache.shares() if s.ranges == (KeyRange(SHARES[2].start, SHARES[3].end),)]
    assert rest and rest[0].start_offset == 0, "the hash space no set holds yet, kept as one share"
    late = ConnectionRanges()  # set 2 joins: its first read is its own (the partition is not served to it yet)
    _served(engine, late, 2, 0, _records(0, 50), T0 + 0.01)
    plan = engine.plan(late, 12, _request(2, 50), now=T0 + 0.01)
    assert plan.hits, "its records of [50, 400) come out of the rest, not from the broker"
    engine.finish(plan)
    assert plan.upstream_body is None
    part = engine.complete(late, plan, None, now=T0 + 0.01).responses[0].partitions[0]
    assert engine.stats.wider_splits == 1
    expected = [o for o in range(50, 400) if contains([SHARES[2]], key_hash(f"key-{o}".encode(), o))]
    assert [o for o in _offsets(part.records) if o >= 50] == expected
    assert plan.reached[("t", 0)][0] == 400
    assert engine.cache.holds(("t", 0), (SHARES[3],), 0, 0), "the set still to join keeps its part"

    engine = _engine()
    for share in range(2):
        _served(engine, ConnectionRanges(), share, 0, _records(0, 400), LATER)
    engine2_later = LATER + 2 * SETTLE_SECONDS
    _served(engine, ConnectionRanges(), 0, 400, _records(400, 400), engine2_later)
    assert not [s for s in engine.cache.shares() if s.start_offset == 400 and s.ranges != (SHARES[1],)], \
        "once no set has joined for SETTLE_SECONDS no rest is kept"


# -- a share above the consumer's limit -----------------------------------------------------------

def test_cut_after_cuts_at_entry_boundaries_keeping_at_least_one():
    blob = _records(0, 200)  # four batches of 50
    sizes = [b.header.size for b in iter_batches(blob)]
    assert cut_after(blob, len(blob)) is None, "it fits"
    assert cut_after(blob, sizes[0] + sizes[1] + 10) == (sizes[0] + sizes[1], 100)
    assert cut_after(blob, 1) == (sizes[0], 50), "the first entry even when it alone is above the limit"
    assert cut_after(blob[: sizes[0]], 1) is None, "one entry: nothing to cut"
    assert cut_after(blob + blob[:30], len(blob)) is None, "what is whole fits; the cut-short tail is left as it is"
    legacy = legacy_batch([Rec(0, b"k", b"v")], base_offset=7)
    assert cut_after(legacy + blob, len(legacy) + 1) == (len(legacy), 8)


def test_a_share_above_the_limit_is_served_in_parts_in_offset_order():
    engine = _engine()
    conns, _ = _all_active(engine)
    _served(engine, conns[1], 1, 400, _records(400, 1000, per_batch=10), T0)  # caches set 0's share of it
    [share] = [s for s in engine.cache.shares() if s.ranges == (SHARES[0],) and s.start_offset == 400]
    entries = list(iter_batches(share.records))
    limit = sum(b.header.size for b in entries[:30]) + 5  # thirty batches and a bit
    got: list[int] = []
    position, answers = 400, 0
    while position < 1400:
        plan = engine.plan(conns[0], 12, _request(0, position, limit), now=T0)
        assert plan.hits, "served from the cache, part after part"
        engine.finish(plan)
        part = engine.complete(conns[0], plan, None, now=T0).responses[0].partitions[0]
        assert len(part.records) <= limit
        got.extend(_offsets(part.records))
        position = plan.reached[("t", 0)][0]
        answers += 1
    assert answers == 4  # 100 batches, 30 a part
    assert got == _offsets(share.records), "every record of the share once, in order"
    assert not [s for s in engine.cache.shares() if s.ranges == (SHARES[0],)], "nothing left behind"


# -- probes ---------------------------------------------------------------------------------------

def test_a_first_fetch_whose_share_is_cached_asks_the_broker_for_one_batch():
    engine = _engine()
    conns, _ = _all_active(engine)
    _served(engine, conns[1], 1, 400, _records(400, 400), T0)  # set 0's share of [400, 800) cached
    [share] = [s for s in engine.cache.shares() if s.ranges == (SHARES[0],) and s.start_offset == 400]
    expected = _offsets(share.records)
    fresh = ConnectionRanges()  # set 0's consumer again, on a new connection
    plan = engine.plan(fresh, 12, _request(0, 400), now=T0)
    engine.probe_reads(fresh, plan, lambda key: False)
    assert engine.upstream_reads(plan) == [], "not a read others wait for"
    engine.finish(plan)
    assert plan.upstream_body.topics[0].partitions[0].partition_max_bytes == PROBE_BYTES
    before = sorted((s.ranges, s.start_offset, s.next_offset) for s in engine.cache.shares())
    part = engine.complete(fresh, plan, _response(400, _records(400, 50)), now=T0).responses[0].partitions[0]
    assert sorted((s.ranges, s.start_offset, s.next_offset) for s in engine.cache.shares()) == before, \
        "a probe's batch caches nothing: its shares would replace the larger ones at the same offset"
    assert plan.reached == {}, "no read ahead from a probe"
    mine = _offsets(part.records)
    plan = engine.plan(fresh, 12, _request(0, 450), now=T0)
    assert plan.hits, "served now: the rest of its share comes from the cache"
    engine.finish(plan)
    rest = engine.complete(fresh, plan, None, now=T0).responses[0].partitions[0]
    assert mine + [o for o in _offsets(rest.records) if o >= 450] == expected


def test_a_first_fetch_probes_only_where_a_share_is_cached_or_on_its_way():
    engine = _engine()
    _all_active(engine)
    fresh = ConnectionRanges()
    plan = engine.plan(fresh, 12, _request(0, 400), now=T0)
    engine.probe_reads(fresh, plan, lambda key: False)
    assert not plan.probes, "nothing cached or on its way: its own read, whole"
    plan = engine.plan(fresh, 12, _request(0, 400), now=T0)
    engine.probe_reads(fresh, plan, lambda key: key == ("t", 0, 400, 0))
    assert plan.probes == {("t", 0)}, "a read of its position is on its way"
    engine.finish(plan)
    assert plan.upstream_body.topics[0].partitions[0].partition_max_bytes == PROBE_BYTES


def test_a_served_connection_never_probes():
    engine = _engine()
    conns, _ = _all_active(engine)
    plan = engine.plan(conns[0], 12, _request(0, 400), now=T0)
    engine.probe_reads(conns[0], plan, lambda key: True)
    assert not plan.probes


# -- the next read sent as the last one arrives ---------------------------------------------------

def _wide_ahead(engine, plans):
    ahead = engine.prefetch(plans[0], lambda key: False, now=LATER, max_read_bytes=16 << 20, room=1 << 30)
    assert ahead is not None and ahead.wide
    return ahead


def test_a_wide_read_chains_the_next_when_its_answer_arrives():
    engine = _engine()
    _, plans = _all_active(engine)
    ahead = _wide_ahead(engine, plans)
    following = engine.chain(ahead, _response(400, _records(400, 400)), lambda key: False, LATER, room=1 << 30)
    assert following is not None, "sent before the answer is split: the broker's next answer is on its way meanwhile"
    assert following.positions == {("t", 0): 800}, "from where the answer ends"
    width = ahead.body.topics[0].partitions[0].partition_max_bytes
    assert following.body.topics[0].partitions[0].partition_max_bytes == width
    assert following.read_bytes == width and following.limits == ahead.limits


def test_a_read_is_not_chained_beyond_what_the_consumers_and_the_log_allow():
    engine = _engine()
    _, plans = _all_active(engine)
    ahead = _wide_ahead(engine, plans)
    records = _records(400, 400)

    def chained(**change):
        response = _response(400, change.pop("records", records), high_watermark=change.pop("high_watermark", 100_000))
        args = {"in_flight": lambda key: False, "room": 1 << 30, "ahead": ahead, **change}
        return engine.chain(args["ahead"], response, args["in_flight"], LATER, room=args["room"])

    assert chained() is not None
    assert chained(high_watermark=800) is None, "the answer reaches the log end: nothing to read yet"
    assert chained(room=1 << 20) is None, "the cache has no room for another read on its way"
    assert chained(in_flight=lambda key: key == ("t", 0, 800, 0)) is None, "its next position is being read"
    narrow = dataclasses.replace(ahead, limits={("t", 0): ahead.body.topics[0].partitions[0].partition_max_bytes})
    assert chained(ahead=narrow) is None, "narrow reads (sets joining, catching up) wait for their consumers"
    ahead_of_all = dataclasses.replace(ahead, positions={("t", 0): 800})
    assert chained(ahead=ahead_of_all, records=_records(800, 400)) is None, \
        "no consumer reached where the read began: two reads ahead of the foremost at most"


def test_next_offset_after_is_where_the_last_whole_entry_leaves_the_reader():
    blob = _records(0, 200)
    assert next_offset_after(blob) == 200
    assert next_offset_after(blob + blob[:70]) == 200, "a cut-short tail is not read"
    assert next_offset_after(b"") is None and next_offset_after(blob[:40]) is None
    assert next_offset_after(blob + legacy_batch([Rec(0, b"k", b"v")], base_offset=250)) == 251
