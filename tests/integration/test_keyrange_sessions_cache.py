"""Key-range fetch: fetch sessions, transactions, and the result cache against a real broker."""

from __future__ import annotations

import pytest

from harness.raw_client import RawClient, records_of
from harness.transactions import produce_transactions
from harness.wait import wait_until
from proxy.protocol import messages
from proxy.protocol.messages import ApiKey
from proxy.ranges import KeyRange, contains, equal_shares
from proxy.records.batch import RecordBatch, iter_batches
from proxy.records.keyhash import key_hash

from .test_keyrange_fetch import _produce

R = messages.body_class(ApiKey.FETCH, "request")


def _metric(proxy, name: str) -> float:
    return proxy.metric(name)


def _fetch_body(topic_id, offset, ranges, session_id, epoch, *, include_partition=True, isolation_level=0):
    partitions = []
    if include_partition:
        partitions.append(R.FetchPartition(
            partition=0, fetch_offset=offset, partition_max_bytes=2048,
            key_ranges=None if ranges is None else [R.KeyRange(start=r.start, end=r.end) for r in ranges]))
    return messages.new_body(ApiKey.FETCH, 17, "request", max_wait_ms=50, min_bytes=1, max_bytes=2048,
                             isolation_level=isolation_level, session_id=session_id, session_epoch=epoch,
                             topics=[R.FetchTopic(topic_id=topic_id, partitions=partitions)] if partitions else [])


def test_incremental_fetch_session_keeps_ranges(kafka, proxy, topic_factory):
    topic = topic_factory(kafka)
    sent = _produce(kafka.bootstrap_servers, topic, 600)
    share = equal_shares(3)[2]
    got = []
    with RawClient.connect(proxy.bootstrap_servers) as raw:
        topic_id = raw.topic_id(topic)
        first = raw.request(ApiKey.FETCH, 17, _fetch_body(topic_id, 0, [share], 0, 0))
        session_id = first.session_id
        assert session_id != 0, "the broker created a fetch session"
        partition = first.responses[0].partitions[0]
        records, position = records_of(partition.records)
        got.extend(records)
        epoch = 1
        while position < len(sent):
            assert epoch < 2000
            # re-sent without ranges: the session's ranges stay in force
            response = raw.request(ApiKey.FETCH, 17, _fetch_body(topic_id, position, None, session_id, epoch))
            assert response.error_code == 0
            epoch += 1
            for topic_entry in response.responses:
                for partition in topic_entry.partitions:
                    assert [KeyRange(r.start, r.end) for r in partition.key_ranges_applied] == [share]
                    records, next_offset = records_of(partition.records)
                    got.extend(r for r in records if r.offset >= position)
                    if next_offset is not None:
                        position = next_offset
    expected = [i for i, (k, _v) in enumerate(sent) if contains([share], key_hash(k, i))]
    assert [r.offset for r in got] == expected


@pytest.mark.parametrize("isolation_level", [0, 1])
def test_transactions_control_batches_and_aborted_list_unchanged(kafka, proxy, topic_factory, isolation_level):
    topic = topic_factory(kafka)
    produce_transactions(kafka.bootstrap_servers, topic, [
        ([(f"k{i % 9}".encode(), f"r{round_number}-{i}".encode()) for i in range(40)], round_number % 2 == 0)
        for round_number in range(4)])
    share = equal_shares(2)[0]
    with RawClient.connect(proxy.bootstrap_servers) as raw:
        topic_id = raw.topic_id(topic)

        def markers_written() -> bool:
            # EndTxn returns before the coordinator has written every marker; until the
            # last stable offset reaches the end, two fetches could see different data.
            probe = raw.range_fetch(topic_id, 0, 0, None, isolation_level=1, max_bytes=1)
            return probe.last_stable_offset == probe.high_watermark

        wait_until(markers_written, timeout=30, what="transaction markers written")
        position, end = 0, None
        while end is None or position < end:
            whole = raw.range_fetch(topic_id, 0, position, None, isolation_level=isolation_level, max_bytes=3000)
            part = raw.range_fetch(topic_id, 0, position, [share], isolation_level=isolation_level,
                                   max_bytes=3000)
            end = whole.last_stable_offset if isolation_level else whole.high_watermark
            assert part.aborted_transactions == whole.aborted_transactions
            controls_whole = [bytes(b.data) for b in iter_batches(whole.records)
                              if isinstance(b, RecordBatch) and b.header.is_control]
            controls_part = [bytes(b.data) for b in iter_batches(part.records)
                             if isinstance(b, RecordBatch) and b.header.is_control]
            assert controls_part == controls_whole
            records_whole, next_whole = records_of(whole.records)
            records_part, next_part = records_of(part.records)
            assert next_part == next_whole
            assert records_part == [r for r in records_whole if contains([share], key_hash(r.key, r.offset))]
            position = next_whole if next_whole is not None else end


def test_cache_serves_only_connections_the_broker_served(kafka, proxy_factory, topic_factory):
    topic = topic_factory(kafka)
    cached = proxy_factory(kafka, metrics_port="0", **{f"topic.{topic}.reserve.message.value.range.fetch": "true"})
    sent = _produce(kafka.bootstrap_servers, topic, 200)
    a, b = equal_shares(2)
    hits = "kafka_proxy_keyrange_cache_hits_total"
    leader = cached.bootstrap_servers, topic
    with RawClient.to_leader(*leader) as one, RawClient.to_leader(*leader) as two, RawClient.to_leader(*leader) as three:
        topic_id = one.topic_id(topic)
        two.topic_id(topic)
        three.topic_id(topic)
        first = one.range_fetch(topic_id, 0, 0, [a])  # broker read for one; b's records of it are cached
        # (range a is active; while sets join, the rest of the hash space is kept as a share: range b)
        before = _metric(cached, hits)
        fresh = three.range_fetch(topic_id, 0, 0, [b])  # three was never served: not from the cache
        assert _metric(cached, hits) == before
        again = three.range_fetch(topic_id, 0, 0, [b])  # three was served now: from the cache
        # (with key.range.native.answers.enabled, by the native relay: counted when its run ends)
        wait_until(lambda: _metric(cached, hits) == before + 1, timeout=10, what="the cache hit counted")
    for entry, share in ((first, a), (fresh, b), (again, b)):
        expected = [i for i, (k, _v) in enumerate(sent) if contains([share], key_hash(k, i))]
        records, _ = records_of(entry.records)
        assert records and [r.offset for r in records] == expected[: len(records)]


@pytest.mark.parametrize("records_cached", [True, False], ids=["records (the default)", "offsets only"])
def test_sixteen_consumers_at_different_speeds_stay_under_the_cap(kafka, proxy_factory, topic_factory,
                                                                   records_cached):
    topic = topic_factory(kafka)
    cap = 48 * 1024
    own = {} if records_cached else {f"topic.{topic}.reserve.message.value.range.fetch": "false"}
    cached = proxy_factory(kafka, metrics_port="0", max_bytes_key_range_results=str(cap), **own)
    sent = _produce(kafka.bootstrap_servers, topic, 3000)
    shares = equal_shares(16)
    clients = [RawClient.to_leader(cached.bootstrap_servers, topic) for _ in shares]
    try:
        topic_id = clients[0].topic_id(topic)
        for client in clients[1:]:
            client.topic_id(topic)
        positions = [0] * 16
        got = [[] for _ in shares]
        samples = []
        rounds = 0
        while min(positions) < len(sent):
            rounds += 1
            assert rounds < 5000
            for i, client in enumerate(clients):
                if positions[i] >= len(sent):
                    continue
                for _ in range(1 + i % 3):  # consumers run at three different speeds
                    entry = client.range_fetch(topic_id, 0, positions[i], [shares[i]], max_bytes=4096)
                    records, next_offset = records_of(entry.records)
                    got[i].extend(r for r in records if r.offset >= positions[i])
                    positions[i] = next_offset
                    if positions[i] >= len(sent):
                        break
                samples.append(_metric(cached, "kafka_proxy_keyrange_cache_bytes"))
        assert max(samples) <= cap
        assert _metric(cached, "kafka_proxy_keyrange_cache_hits_total") > 0
    finally:
        for client in clients:
            client.close()
    for i, share in enumerate(shares):
        expected = [n for n, (k, _v) in enumerate(sent) if contains([share], key_hash(k, n))]
        assert [r.offset for r in got[i]] == expected


@pytest.mark.parametrize("split_threads", [0, 1], ids=["split-on-loop", "split-on-thread"])
def test_consumers_sharing_a_partition_find_the_next_read_cached_while_it_is_written(kafka, proxy_factory,
                                                                                      topic_factory, split_threads):
    """Four raw consumers of equal key ranges read one partition while a producer writes it
    in bursts with idle gaps; the proxy prefetches each next position ahead of them, splitting
    reads on its event loop or on a worker thread. Every acknowledged record reaches the
    one consumer whose range holds its key, once and in offset order; the prefetches are
    used (cache hits)."""
    import threading
    import time

    from harness.history import History, check
    from harness.live import LiveProducer, deliver_range, read_while_written

    topic = topic_factory(kafka)
    cached = proxy_factory(kafka, metrics_port="0", key_range_split_threads=str(split_threads),
                           key_range_split_thread_min_bytes="0",
                           **{f"topic.{topic}.reserve.message.value.range.fetch": "true"})
    history = History()
    backlog = LiveProducer(kafka.bootstrap_servers, topic, history, records=2000, seconds=1.0, seed=3, partition=0)
    backlog.start().join()  # consumers start behind: there is always more to read than one fetch takes
    live = LiveProducer(kafka.bootstrap_servers, topic, history, records=1500, seconds=8.0, seed=4, partition=0)
    shares = equal_shares(4)
    deadline = time.monotonic() + 90
    # Every consumer's range set is known to the proxy before any of them reads on: the
    # proxy prefetches only for partitions two or more sets share, so a consumer that got
    # through the backlog alone (a slow start of the others) would leave nothing to test.
    all_known = threading.Barrier(4, timeout=60)

    def consume(slot: int) -> None:
        with RawClient.to_leader(cached.bootstrap_servers, topic) as client:
            client.range_fetch(client.topic_id(topic), 0, 0, [shares[slot]], max_bytes=1, max_wait_ms=0)  # again below
            all_known.wait()
            deliver_range(client, topic, [shares[slot]], f"c{slot}", history, live, deadline, max_bytes=4096)

    read_while_written(consume, 4, live)
    assert live.failed == backlog.failed == 0
    verdict = check(history)
    assert verdict.ok(), verdict.summary()
    assert _metric(cached, "kafka_proxy_keyrange_prefetch_sent_total") > 0
    assert _metric(cached, "kafka_proxy_keyrange_prefetch_shares_total") > 0
    assert _metric(cached, "kafka_proxy_keyrange_cache_hits_total") > 0
    offloaded = _metric(cached, "kafka_proxy_keyrange_splits_offloaded_total")
    assert offloaded > 0 if split_threads else offloaded == 0
