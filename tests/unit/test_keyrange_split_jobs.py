"""The split of a broker read taken out of ``KeyRangeEngine.complete`` (``split_jobs``), to
run on a worker thread: the same answer and the same cached shares as a split made inside
``complete``; and ``SplitWorkers`` runs only the large ones, off the event loop."""

from __future__ import annotations

import threading

import pytest
import trio

from harness.batches import Rec, kafka_python_batch
from proxy.keyrange.engine import SETTLE_SECONDS, ConnectionRanges, KeyRangeEngine
from proxy.keyrange.settings import KeyRangeTopicSettings
from proxy.keyrange.workers import SplitWorkers, whole_blob_in_c
from proxy.protocol import messages
from proxy.protocol.messages import ApiKey
from proxy.ranges import equal_shares

RECORDS_CACHED = KeyRangeTopicSettings()  # the default: reserve.message.value.range.fetch=true
OFFSETS_ONLY = KeyRangeTopicSettings(cache_records=False)  # only the matching offsets are kept

R = messages.body_class(ApiKey.FETCH, "request")
P = messages.body_class(ApiKey.FETCH, "response")
SHARES = equal_shares(4)


def _engine() -> KeyRangeEngine:
    return KeyRangeEngine(cache_bytes=1 << 30, topic_settings=lambda name: RECORDS_CACHED, topic_name=lambda key: key)


def _request(ranges, offset: int):
    topics = [R.FetchTopic(topic="t", partitions=[R.FetchPartition(
        partition=0, fetch_offset=offset, partition_max_bytes=1 << 20,
        key_ranges=[R.KeyRange(start=r.start, end=r.end) for r in ranges])])]
    return messages.new_body(ApiKey.FETCH, 12, "request", session_id=0, session_epoch=-1, topics=topics)


def _response(offset: int, count: int):
    records = b"".join(kafka_python_batch([Rec(i, f"key-{offset + b * 50 + i}".encode(), b"v" * 40)
                                           for i in range(50)], base_offset=offset + b * 50)
                       for b in range(count // 50))
    return messages.new_body(ApiKey.FETCH, 12, "response", responses=[P.FetchableTopicResponse(
        topic="t", partitions=[P.PartitionData(partition_index=0, high_watermark=offset + count, records=records)])])


def _read(engine: KeyRangeEngine, conn: ConnectionRanges, share: int, offset: int, *, run) -> bytes:
    plan = engine.plan(conn, 12, _request([SHARES[share]], offset), now=1.0)
    engine.finish(plan)
    response = _response(offset, 400)
    splits = run(engine, plan, response)
    done = engine.complete(conn, plan, response, now=1.0, splits=splits)
    return bytes(done.responses[0].partitions[0].records)


def _inline(engine, plan, response):
    return None


def _on_a_thread(engine, plan, response):
    splits = engine.split_jobs(plan, response, now=1.0)
    worker = threading.Thread(target=lambda: [job.run() for job in splits.values()])
    worker.start()
    worker.join()
    assert all(job.result is not None for job in splits.values())
    return splits


def _not_run(engine, plan, response):
    return engine.split_jobs(plan, response, now=1.0)  # complete runs them


@pytest.mark.parametrize("run", [_on_a_thread, _not_run])
def test_a_split_made_apart_answers_and_caches_as_one_made_inside(run):
    answers = {}
    for how in (_inline, run):
        engine = _engine()
        conns = [ConnectionRanges() for _ in SHARES]
        for share, conn in enumerate(conns):  # every set asks once: all four become active
            _read(engine, conn, share, 0, run=how)
        mine = _read(engine, conns[0], 0, 400, run=how)
        cached = sorted((share.ranges, share.start_offset, bytes(share.records)) for share in engine.cache.shares())
        answers[how] = (mine, cached)
    assert answers[_inline] == answers[run]
    mine, cached = answers[run]
    assert mine
    assert sorted(ranges for ranges, start, _ in cached if start == 400) == [(r,) for r in SHARES[1:]], \
        "the second read cached the other three sets' shares"


def test_no_job_for_an_offsets_only_topic_or_a_failed_partition():
    engine = KeyRangeEngine(cache_bytes=1 << 20, topic_settings=lambda name: OFFSETS_ONLY,
                            topic_name=lambda key: key)
    plan = engine.plan(ConnectionRanges(), 12, _request([SHARES[0]], 0), now=1.0)
    engine.finish(plan)
    assert engine.split_jobs(plan, _response(0, 100), now=1.0) == {}
    engine = _engine()
    plan = engine.plan(ConnectionRanges(), 12, _request([SHARES[0]], 0), now=1.0)
    engine.finish(plan)
    failed = _response(0, 100)
    failed.responses[0].partitions[0].error_code = 6
    assert engine.split_jobs(plan, failed, now=1.0) == {}


def test_workers_take_the_large_splits_and_leave_the_small_ones():
    engine = _engine()
    plan = engine.plan(ConnectionRanges(), 12, _request([SHARES[0]], 0), now=1.0)
    engine.finish(plan)
    large = engine.split_jobs(plan, _response(0, 400), now=1.0)
    small = engine.split_jobs(plan, _response(0, 50), now=1.0)
    size = next(iter(large.values())).size
    workers = SplitWorkers(threads=1, min_bytes=size)

    async def main() -> None:
        await workers.run([*large.values(), *small.values()])

    trio.run(main)
    ran_large = next(iter(large.values())).result is not None
    assert ran_large == whole_blob_in_c(), "large reads go to the thread exactly when the C kernel takes the blob"
    assert next(iter(small.values())).result is None, "a small read is left to the event loop"
    assert SplitWorkers(threads=0, min_bytes=0).threads == 0


# -- key-range prefetch ---------------------------------------------------------------------------

def _served(engine: KeyRangeEngine, conn: ConnectionRanges, share: int, offset: int, count: int, *,
            high_watermark: int):
    """A consumer's read of ``count`` records at ``offset`` from the broker; its plan."""
    plan = engine.plan(conn, 12, _request([SHARES[share]], offset), now=1.0)
    engine.finish(plan)
    response = _response(offset, count)
    response.responses[0].partitions[0].high_watermark = high_watermark
    engine.complete(conn, plan, response, now=1.0)
    return plan


def test_a_read_of_a_shared_partition_prefetches_the_next_position_for_every_set():
    engine = _engine()
    a, b = ConnectionRanges(), ConnectionRanges()
    _served(engine, b, 1, 0, 100, high_watermark=1000)  # B's set is active
    plan = _served(engine, a, 0, 0, 100, high_watermark=1000)
    ahead = engine.prefetch(plan, lambda key: False, now=1.0)
    assert ahead is not None and ahead.positions == {("t", 0): 100}
    partition = ahead.body.topics[0].partitions[0]
    assert (partition.fetch_offset, partition.key_ranges) == (100, None), "a plain Fetch of the next position"
    assert (ahead.body.session_id, ahead.body.session_epoch, ahead.body.min_bytes) == (0, -1, 1)
    assert plan.request.topics[0].partitions[0].fetch_offset == 0, "the consumer's request is left alone"

    answer = _response(100, 200)
    jobs = engine.prefetch_jobs(ahead, answer, now=1.0 + 2 * SETTLE_SECONDS)  # no set joining: no rest kept
    assert engine.cache_prefetch(ahead, jobs) == 2, "both sets' shares cached"
    for conn, share in ((a, 0), (b, 1)):
        hit = engine.plan(conn, 12, _request([SHARES[share]], 100), now=1.0)
        assert hit.hits, "the consumers find their shares of the next position"
        engine.finish(hit)
        assert hit.upstream_body is None
        body = engine.complete(conn, hit, None, now=1.0)
        assert hit.reached[next(iter(hit.hits))] == (300, 300), "where the share leaves them, and the end it saw"
        assert body.responses[0].partitions[0].records


def test_no_prefetch_alone_at_the_end_under_way_or_cached():
    def shared(high_watermark: int = 1000):
        engine = _engine()
        a, b = ConnectionRanges(), ConnectionRanges()
        _served(engine, b, 1, 500, 100, high_watermark=1000)  # B's set is active, elsewhere
        return engine, a, b, _served(engine, a, 0, 0, 100, high_watermark=high_watermark)

    engine, _, _, plan = shared()
    assert engine.prefetch(plan, lambda key: False, now=1.0) is not None, "the control: shared, more to read"
    engine = _engine()
    alone = _served(engine, ConnectionRanges(), 0, 0, 100, high_watermark=1000)
    assert engine.prefetch(alone, lambda key: False, now=1.0) is None, "one range set: nobody shares the read"
    engine, _, _, at_end = shared(high_watermark=100)
    assert engine.prefetch(at_end, lambda key: False, now=1.0) is None, "nothing beyond what was served"
    engine, _, _, plan = shared()
    assert engine.prefetch(plan, lambda key: key == ("t", 0, 100, 0), now=1.0) is None, "a read is under way"
    engine, _, b, plan = shared()
    _served(engine, b, 1, 100, 100, high_watermark=1000)  # B read the next position itself: A's share is cached
    assert engine.prefetch(plan, lambda key: False, now=1.0) is None, "the next position is cached"
    offsets_only = KeyRangeEngine(cache_bytes=1 << 20, topic_name=lambda key: key,
                                  topic_settings=lambda name: OFFSETS_ONLY)
    a, b = ConnectionRanges(), ConnectionRanges()
    _served(offsets_only, b, 1, 500, 100, high_watermark=1000)
    plan = _served(offsets_only, a, 0, 0, 100, high_watermark=1000)
    assert offsets_only.prefetch(plan, lambda key: False, now=1.0) is None, "only cached records are prefetched"
