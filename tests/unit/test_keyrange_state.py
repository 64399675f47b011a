"""Key-range request resolution across fetch sessions, and the byte-capped share cache."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.keyrange.cache import SET_ENTRY_BYTES, ActiveRangeSets, CachedShare, ShareCache
from proxy.keyrange.requests import FetchRangeSessions
from proxy.keyrange.settings import KeyRangeTopicSettings
from proxy.protocol import messages
from proxy.protocol.messages import ApiKey
from proxy.ranges import KeyRange, equal_shares

RECORDS_CACHED = KeyRangeTopicSettings()  # the default: reserve.message.value.range.fetch=true
OFFSETS_ONLY = KeyRangeTopicSettings(cache_records=False)  # only the matching offsets are kept

R = messages.body_class(ApiKey.FETCH, "request")
A, B = equal_shares(2)
READ_UNCOMMITTED, READ_COMMITTED = 0, 1


def _wire(ranges):
    return None if ranges is None else [R.KeyRange(start=r.start, end=r.end) for r in ranges]


def _request(session_id, epoch, partitions, *, top=None, forgotten=(), fetch_offset=0,
             isolation_level=READ_UNCOMMITTED):
    topics = [R.FetchTopic(topic="t", partitions=[
        R.FetchPartition(partition=p, fetch_offset=fetch_offset, partition_max_bytes=1 << 20, key_ranges=_wire(r))
        for p, r in partitions
    ])]
    body = messages.new_body(ApiKey.FETCH, 12, "request", session_id=session_id, session_epoch=epoch, topics=topics,
                             key_ranges=_wire(top), isolation_level=isolation_level)
    if forgotten:
        body.forgotten_topics_data = [R.ForgottenTopic(topic="t", partitions=list(forgotten))]
    return body


def test_partition_ranges_override_top_level():
    sessions = FetchRangeSessions()
    out = sessions.resolve(_request(0, -1, [(0, [A]), (1, None)], top=[B]))
    assert out.filtered == {("t", 0): (A,), ("t", 1): (B,)}


def test_ranges_stay_in_force_in_incremental_session_until_changed_or_forgotten():
    sessions = FetchRangeSessions()
    first = sessions.resolve(_request(0, 0, [(0, [A]), (1, [B])]))
    sessions.bind_new_session(77, first)
    # incremental: partition 0 re-sent without ranges keeps them; partition 1 not sent keeps them
    out = sessions.resolve(_request(77, 1, [(0, None)]))
    assert out.filtered == {("t", 0): (A,), ("t", 1): (B,)}
    # re-sent with other ranges replaces; an explicit empty list means the whole partition
    out = sessions.resolve(_request(77, 2, [(0, [B]), (1, [])]))
    assert out.filtered == {("t", 0): (B,)}
    # forgotten partitions lose their ranges
    out = sessions.resolve(_request(77, 3, [], forgotten=[0]))
    assert out.filtered == {}
    # closing the session drops everything
    sessions.resolve(_request(77, -1, []))
    assert 77 not in sessions.sessions


def test_invalid_ranges_are_reported_per_partition():
    sessions = FetchRangeSessions()
    out = sessions.resolve(_request(0, -1, [(0, [KeyRange(5, 1)]), (1, [A])]))
    assert set(out.invalid) == {("t", 0)}
    assert out.filtered == {("t", 1): (A,)}


def test_sessionless_full_request_starts_from_nothing():
    sessions = FetchRangeSessions()
    sessions.bind_new_session(5, sessions.resolve(_request(0, 0, [(0, [A])])))
    out = sessions.resolve(_request(0, -1, [(0, None)]))
    assert out.filtered == {}
    assert not out.uses_ranges


def _share(offset, size, ranges=(A,), partition=("t", 0), isolation_level=READ_UNCOMMITTED):
    return CachedShare(partition, ranges, offset, offset + 10, isolation_level, records=b"x" * size)


def test_cache_serves_once_and_by_position():
    cache = ShareCache(10_000)
    assert cache.put(_share(100, 50))
    assert cache.take(("t", 0), (B,), 100, READ_UNCOMMITTED) is None
    assert cache.take(("t", 0), (A,), 99, READ_UNCOMMITTED) is None
    hit = cache.take(("t", 0), (A,), 105, READ_UNCOMMITTED)
    assert hit is not None and hit.start_offset == 100
    assert cache.take(("t", 0), (A,), 105, READ_UNCOMMITTED) is None, "a served share is evicted"
    assert cache.bytes_held == 0


def test_cache_serves_a_share_only_at_the_isolation_level_of_its_read():
    """A read_committed read stops at the last stable offset and lists aborted transactions;
    a read_uncommitted one does neither: neither kind may stand in for the other."""
    cache = ShareCache(10_000)
    assert cache.put(_share(100, 50, isolation_level=READ_UNCOMMITTED))
    assert cache.put(_share(100, 60, isolation_level=READ_COMMITTED))  # the same start: both kept
    assert len(cache) == 2
    committed = cache.take(("t", 0), (A,), 105, READ_COMMITTED)
    assert committed is not None and committed.isolation_level == READ_COMMITTED and len(committed.records) == 60
    assert cache.take(("t", 0), (A,), 105, READ_COMMITTED) is None
    uncommitted = cache.take(("t", 0), (A,), 105, READ_UNCOMMITTED)
    assert uncommitted is not None and uncommitted.isolation_level == READ_UNCOMMITTED
    assert cache.bytes_held == 0


def _charged(cache: ShareCache) -> int:
    """What the cache should be charging: its shares, and an index entry per range set."""
    sets = {(share.partition, share.ranges, share.isolation_level) for share in cache.shares()}
    return sum(share.size for share in cache.shares()) + SET_ENTRY_BYTES * len(sets)


def test_cache_evicts_least_recently_used_and_rejects_oversized():
    one = _share(0, 300).size
    cap = SET_ENTRY_BYTES + 2 * one + one // 2  # room for two of them
    cache = ShareCache(cap)
    cache.put(_share(0, 300))
    cache.put(_share(10, 300))
    cache.put(_share(20, 300))
    assert len(cache) == 2 and cache.bytes_held == _charged(cache) <= cap
    assert cache.take(("t", 0), (A,), 0, READ_UNCOMMITTED) is None, "the oldest share went first"
    assert not cache.put(_share(30, cap))
    assert cache.stats.rejected_too_large == 1


@settings(max_examples=150, deadline=None)
@given(st.integers(1500, 8000), st.lists(st.tuples(st.booleans(), st.integers(0, 30), st.integers(0, 2000),
                                                    st.sampled_from([READ_UNCOMMITTED, READ_COMMITTED])),
                                          max_size=120))
def test_cache_never_holds_more_than_its_cap(cap, operations):
    cache = ShareCache(cap)
    for is_put, offset_slot, size, level in operations:
        if is_put:
            cache.put(_share(offset_slot * 10, size, isolation_level=level))
        else:
            cache.take(("t", 0), (A,), offset_slot * 10 + 3, level)
        assert 0 <= cache.bytes_held <= cap
        assert cache.bytes_held == _charged(cache)


def test_active_range_sets_expire():
    active = ActiveRangeSets(ttl=10)
    active.touch(("t", 0), (A,), now=0)
    active.touch(("t", 0), (B,), now=5)
    assert active.active(("t", 0), now=9) == [(A,), (B,)]
    assert active.active(("t", 0), now=12) == [(B,)]


def _engine_response(records: bytes, error_code: int = 0):
    from proxy.keyrange.engine import ConnectionRanges, KeyRangeEngine

    engine = KeyRangeEngine(cache_bytes=1 << 20, topic_settings=lambda name: OFFSETS_ONLY,
                            topic_name=lambda key: key)
    conn = ConnectionRanges()
    request = _request(0, -1, [(0, [A])])
    plan = engine.plan(conn, 12, request, now=0.0)
    engine.upstream_reads(plan)
    engine.finish(plan)
    P = messages.body_class(ApiKey.FETCH, "response")
    response = messages.new_body(ApiKey.FETCH, 12, "response", responses=[P.FetchableTopicResponse(
        topic="t", partitions=[P.PartitionData(partition_index=0, error_code=error_code, high_watermark=10,
                                               records=records)])])
    return engine.complete(conn, plan, response, now=0.0).responses[0].partitions[0]


def test_key_ranges_applied_is_present_exactly_when_the_partition_was_filtered():
    from harness.batches import Rec, kafka_python_batch, legacy_batch

    current = _engine_response(kafka_python_batch([Rec(i, f"k{i}".encode(), b"v") for i in range(20)]))
    assert [KeyRange(r.start, r.end) for r in current.key_ranges_applied] == [A]
    legacy = _engine_response(legacy_batch([Rec(i, f"k{i}".encode(), b"v") for i in range(3)], magic=1))
    assert not legacy.key_ranges_applied  # passed unfiltered: the client filters it itself
    failed = _engine_response(b"", error_code=6)
    assert not failed.key_ranges_applied


def _fetch_through(engine, conn, ranges, records: bytes, now: float):
    """One sessionless range fetch at offset 0: plan, then complete with ``records``."""
    plan = engine.plan(conn, 12, _request(0, -1, [(0, [ranges])]), now=now)
    engine.finish(plan)
    P = messages.body_class(ApiKey.FETCH, "response")
    response = messages.new_body(ApiKey.FETCH, 12, "response", responses=[P.FetchableTopicResponse(
        topic="t", partitions=[P.PartitionData(partition_index=0, high_watermark=100, records=records)])])
    return plan, response


def _offsets_in(records: bytes) -> list[int]:
    from proxy.records.batch import RecordBatch, iter_batches

    return [r.offset for b in iter_batches(records) if isinstance(b, RecordBatch) for r in b.records()]


def test_a_read_that_reaches_past_the_cached_match_keeps_every_record_of_its_range():
    """Two consumers read offset 0 at different times while the log grows: A's read holds
    offsets 0-9 and caches which of them B wants; B's later read holds 0-29. B must get every
    record of its range in 0-29, not only those the cached match of 0-9 listed."""
    from harness.batches import Rec, kafka_python_batch
    from proxy.keyrange.engine import ConnectionRanges, KeyRangeEngine
    from proxy.records.keyhash import key_hash

    def batch(first: int, count: int) -> bytes:
        return kafka_python_batch([Rec(i - first, f"user-{i % 13}".encode(), b"v")
                                   for i in range(first, first + count)], base_offset=first)

    engine = KeyRangeEngine(cache_bytes=1 << 20, topic_settings=lambda name: OFFSETS_ONLY,
                            topic_name=lambda key: key)
    a, b = ConnectionRanges(), ConnectionRanges()
    plan_b, response_b = _fetch_through(engine, b, B, batch(0, 10) + batch(10, 10) + batch(20, 10), now=0.0)
    plan_a, response_a = _fetch_through(engine, a, A, batch(0, 10), now=0.0)
    engine.complete(a, plan_a, response_a, now=0.0)  # caches B's offsets in 0-9
    assert len(engine.cache) == 1
    got = engine.complete(b, plan_b, response_b, now=0.0).responses[0].partitions[0]
    want = [i for i in range(30) if key_hash(f"user-{i % 13}".encode(), i) >= B.start]
    assert _offsets_in(got.records) == want


def _transactional_log() -> bytes:
    """Offsets 0-4: a range-B record at 0, an aborted transaction of producer 7 holding
    range-B records at 1 and 2, its ABORT marker at 3, a range-A record at 4."""
    from harness.batches import Rec, control_batch, kafka_python_batch

    in_b = [f"user-{i}".encode() for i in range(100) if _key_hash(f"user-{i}".encode()) >= B.start][:2]
    in_a = [f"user-{i}".encode() for i in range(100) if _key_hash(f"user-{i}".encode()) < B.start][:1]
    return (kafka_python_batch([Rec(0, in_b[0], b"v")])
            + kafka_python_batch([Rec(0, in_b[0], b"v"), Rec(1, in_b[1], b"v")], base_offset=1, transactional=True,
                                 producer_id=7, producer_epoch=0, base_sequence=0)
            + control_batch(base_offset=3, commit=False, producer_id=7)
            + kafka_python_batch([Rec(0, in_a[0], b"v")], base_offset=4))


def _key_hash(key: bytes) -> int:
    from proxy.records.keyhash import key_hash

    return key_hash(key, 0)


def _range_fetch(engine, conn, ranges, offset, isolation_level, records=None, aborted=()):
    """One sessionless range fetch of partition 0; ``records``: the broker's answer if the
    plan reads the broker. Returns (plan, the client's partition answer)."""
    P = messages.body_class(ApiKey.FETCH, "response")
    plan = engine.plan(conn, 12, _request(0, -1, [(0, [ranges])], fetch_offset=offset,
                                          isolation_level=isolation_level), now=0.0)
    engine.finish(plan)
    response = None
    if plan.upstream_body is not None:
        response = messages.new_body(ApiKey.FETCH, 12, "response", responses=[P.FetchableTopicResponse(
            topic="t", partitions=[P.PartitionData(
                partition_index=0, high_watermark=5, last_stable_offset=5, records=records or b"",
                aborted_transactions=[P.AbortedTransaction(producer_id=p, first_offset=f) for p, f in aborted])])])
    return plan, engine.complete(conn, plan, response, now=0.0).responses[0].partitions[0]


def _handed_out(part, read_committed: bool) -> list[int]:
    from proxy.records.batch import RecordBatch, iter_batches
    from proxy.records.transactions import TransactionFilter, Verdict

    verdicts = TransactionFilter([(a.producer_id, a.first_offset) for a in part.aborted_transactions or ()],
                                 read_committed)
    return [r.offset for b in iter_batches(part.records or b"") if isinstance(b, RecordBatch)
            and verdicts.verdict(b) is Verdict.DELIVER for r in b.records()]


def test_a_read_committed_range_fetch_is_not_served_a_read_uncommitted_share():
    """The keyrange source with kafka.isolation.level=read_committed beside a read_uncommitted
    consumer of the other range: the share cached from the read_uncommitted read lists no
    aborted transaction, so serving it would hand out records 1 and 2."""
    from proxy.keyrange.engine import ConnectionRanges, KeyRangeEngine

    log = _transactional_log()
    engine = KeyRangeEngine(cache_bytes=1 << 20, topic_settings=lambda name: RECORDS_CACHED, topic_name=lambda k: k)
    a, b = ConnectionRanges(), ConnectionRanges()
    _range_fetch(engine, b, B, 5, READ_COMMITTED)  # the broker has served b this partition
    _range_fetch(engine, a, A, 0, READ_UNCOMMITTED, log)  # caches range B's share, read_uncommitted
    plan, got = _range_fetch(engine, b, B, 0, READ_COMMITTED, log, aborted=[(7, 1)])
    assert plan.upstream_body is not None, "served from a read of the other isolation level"
    assert _handed_out(got, read_committed=True) == [0]
    # A consumer at the level of the cached share is still served from it.
    c = ConnectionRanges()
    _range_fetch(engine, c, B, 5, READ_UNCOMMITTED)
    plan, got = _range_fetch(engine, c, B, 0, READ_UNCOMMITTED)
    assert plan.upstream_body is None and _handed_out(got, read_committed=False) == [0, 1, 2]


def test_offsets_only_shares_are_matched_only_at_the_isolation_level_of_their_read():
    from proxy.keyrange.engine import ConnectionRanges, KeyRangeEngine

    log = _transactional_log()
    engine = KeyRangeEngine(cache_bytes=1 << 20, topic_settings=lambda name: OFFSETS_ONLY,
                            topic_name=lambda k: k)
    _range_fetch(engine, ConnectionRanges(), B, 5, READ_COMMITTED)  # range B is asked for
    _range_fetch(engine, ConnectionRanges(), A, 0, READ_UNCOMMITTED, log)  # caches which offsets range B holds
    assert [s.isolation_level for s in engine.cache.shares()] == [READ_UNCOMMITTED]
    _, got = _range_fetch(engine, ConnectionRanges(), B, 0, READ_COMMITTED, log, aborted=[(7, 1)])
    assert _handed_out(got, read_committed=True) == [0]
    def range_b_matches():
        return [share.isolation_level for share in engine.cache.shares() if share.ranges == (B,)]

    assert range_b_matches() == [READ_UNCOMMITTED], "the read_uncommitted match was used by a read_committed read"
    _, got = _range_fetch(engine, ConnectionRanges(), B, 0, READ_UNCOMMITTED, log)
    assert _handed_out(got, read_committed=False) == [0, 1, 2] and range_b_matches() == []


def test_expired_range_sets_are_reported_from_reads_sweeps_and_overflow():
    dropped: list[tuple] = []
    active = ActiveRangeSets(ttl=10, max_sets_per_partition=2, on_expire=lambda p, r: dropped.append((p, r)))
    active.touch(("t", 0), (A,), now=0)
    active.touch(("t", 1), (A,), now=0)
    active.touch(("t", 0), (B,), now=5)
    assert active.active(("t", 0), now=12) == [(B,)]
    assert dropped == [(("t", 0), (A,))]
    # nobody reads partition 1 any more: a sweep, on a later touch of another partition, lets its set go
    active.touch(("t", 0), (B,), now=13)
    assert dropped == [(("t", 0), (A,)), (("t", 1), (A,))]
    # more sets than a partition may hold: the least recently requested goes
    c, d = equal_shares(4)[:2]
    active.touch(("t", 0), (c,), now=14)
    active.touch(("t", 0), (d,), now=14)
    assert dropped[-1] == (("t", 0), (B,))
    assert active.active(("t", 0), now=14) == [(c,), (d,)]


def test_dropping_a_set_removes_its_shares_at_both_isolation_levels_and_nothing_else():
    cache = ShareCache(10_000)
    for offset in (0, 10, 20):
        cache.put(_share(offset, 50))
    cache.put(_share(0, 50, isolation_level=READ_COMMITTED))
    cache.put(_share(0, 50, ranges=(B,)))
    cache.put(_share(0, 50, partition=("t", 1)))
    assert cache.drop_set(("t", 0), (A,)) == 4
    assert cache.stats.expired == 4
    assert [(s.partition, s.ranges) for s in cache.shares()] == [(("t", 0), (B,)), (("t", 1), (A,))]
    assert cache.bytes_held == _charged(cache)
    assert cache.drop_set(("t", 0), (A,)) == 0


def test_shares_of_a_consumer_that_left_do_not_outlive_its_interest():
    """Found by the soak benchmark (benchmarks/bench_soak.py): a range set whose consumer
    left (a member replaced, a rebalance that moved the ranges) kept every share the other
    consumers' reads cached for it, until the byte cap pushed them out, so the cache and the
    proxy's memory grew with every departed consumer up to max.bytes.key.range.results.
    Now they go with the set's interest: A reads on alone for two minutes, B left at once."""
    from harness.batches import Rec, kafka_python_batch
    from proxy.keyrange.engine import ConnectionRanges, KeyRangeEngine

    engine = KeyRangeEngine(cache_bytes=1 << 30, topic_settings=lambda name: OFFSETS_ONLY,
                            topic_name=lambda key: key, interest_seconds=30.0)
    a, b = ConnectionRanges(), ConnectionRanges()
    P = messages.body_class(ApiKey.FETCH, "response")

    def fetch(conn, ranges, offset: int, now: float) -> None:
        plan = engine.plan(conn, 12, _request(0, -1, [(0, [ranges])], fetch_offset=offset), now=now)
        engine.finish(plan)
        records = kafka_python_batch([Rec(i, f"user-{offset + i}".encode(), b"v") for i in range(10)],
                                     base_offset=offset)
        response = messages.new_body(ApiKey.FETCH, 12, "response", responses=[P.FetchableTopicResponse(
            topic="t", partitions=[P.PartitionData(partition_index=0, high_watermark=offset + 10,
                                                   records=records)])])
        engine.complete(conn, plan, response, now=now)

    fetch(b, B, 0, now=0.0)  # B asks once, then is gone
    held = []
    for second in range(1, 121):
        fetch(a, A, second * 10, now=float(second))  # every read of A caches B's share
        held.append(len(engine.cache))
    assert max(held) <= 31, "B's shares are cached only while B's interest lasts"
    assert held[-1] == 0 and engine.cache.bytes_held == 0
    assert engine.cache.stats.expired >= 29
    assert engine.active.active(("t", 0), now=120.0) == [(A,)]
