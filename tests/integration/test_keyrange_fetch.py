"""Key-range fetch through the proxy against a real broker, with a raw wire client."""

from __future__ import annotations

import random
import uuid
from collections import defaultdict

import pytest

from harness.raw_client import RawClient, records_of
from proxy.protocol import messages
from proxy.protocol.messages import ApiKey
from proxy.ranges import HASH_MAX, KeyRange, contains, equal_shares
from proxy.records.keyhash import key_hash

COMPRESSIONS = ["none", "gzip", "snappy", "lz4", "zstd"]


def _produce(bootstrap: str, topic: str, count: int, compression: str = "none", seed: int = 1) -> list:
    from kafka import KafkaProducer

    rng = random.Random(seed)
    hot = [f"hot-{i}".encode() for i in range(3)]
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20, batch_size=16384,
                             compression_type=None if compression == "none" else compression)
    sent = []
    for i in range(count):
        roll = rng.random()
        key = None if roll < 0.1 else rng.choice(hot) if roll < 0.4 else f"key-{rng.randrange(500)}".encode()
        value = f"value-{i}".encode()
        producer.send(topic, key=key, value=value)
        sent.append((key, value))
    producer.flush(60)
    producer.close()
    return sent


def _log_end(client: RawClient, topic_id) -> int:
    entry = client.range_fetch(topic_id, 0, 0, None, max_bytes=1)
    return entry.high_watermark


def _consume_range(client: RawClient, topic_id, ranges, end: int, max_bytes: int, **kwargs):
    """Fetch from 0 to ``end``; every response partition must carry KeyRangesApplied."""
    position, got, rounds = 0, [], 0
    while position < end:
        rounds += 1
        assert rounds < 10_000, "no progress"
        entry = client.range_fetch(topic_id, 0, position, ranges, max_bytes=max_bytes, **kwargs)
        assert entry.error_code == 0, entry.error_code
        assert [KeyRange(r.start, r.end) for r in entry.key_ranges_applied] == list(ranges)
        records, next_offset = records_of(entry.records)
        got.extend(r for r in records if r.offset >= position)
        assert next_offset is not None and next_offset > position, "position did not advance"
        position = next_offset
    return got, position


@pytest.fixture
def client(proxy):
    with RawClient.connect(proxy.bootstrap_servers) as raw:
        yield raw


def test_feature_advertised(client):
    body = client.call(ApiKey.API_VERSIONS, 3, client_software_name="raw", client_software_version="1")
    features = {f.name: (f.min_version, f.max_version) for f in body.supported_features}
    assert features["keyrange.fetch"] == (1, 1)


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_every_record_reaches_exactly_its_range(kafka, proxy, topic_factory, compression):
    topic = topic_factory(kafka)
    sent = _produce(kafka.bootstrap_servers, topic, 1500, compression)
    shares = equal_shares(4)
    with RawClient.connect(proxy.bootstrap_servers) as raw:
        topic_id = raw.topic_id(topic)
        end = _log_end(raw, topic_id)
        assert end == len(sent)
        per_share = []
        for i, share in enumerate(shares):
            got, position = _consume_range(raw, topic_id, [share], end, max_bytes=4096 * (i + 1))
            assert position == end
            per_share.append(got)
    seen_offsets = defaultdict(list)
    for i, got in enumerate(per_share):
        for record in got:
            h = key_hash(record.key, record.offset)
            assert contains([shares[i]], h), f"offset {record.offset} hash {h} outside share {i}"
            seen_offsets[record.offset].append(i)
        offsets = [r.offset for r in got]
        assert offsets == sorted(offsets), "log order broken within a share"
    assert sorted(seen_offsets) == list(range(len(sent)))
    assert all(len(owners) == 1 for owners in seen_offsets.values())
    for got in per_share:
        for record in got:
            assert (record.key, record.value) == sent[record.offset]


def test_range_matching_nothing_still_advances(kafka, proxy, topic_factory):
    topic = topic_factory(kafka)
    sent = _produce(kafka.bootstrap_servers, topic, 300)
    hashes = {key_hash(k, i) for i, (k, _v) in enumerate(sent)}
    # a one-value range that no record hashes to
    empty_point = next(h for h in range(12345, 12345 + 1000) if h not in hashes)
    with RawClient.connect(proxy.bootstrap_servers) as raw:
        topic_id = raw.topic_id(topic)
        got, position = _consume_range(raw, topic_id, [KeyRange(empty_point, empty_point)], len(sent),
                                       max_bytes=2048)
    assert got == []
    assert position == len(sent)


def test_top_level_ranges_apply_to_every_partition(kafka, proxy, topic_factory):
    topic = topic_factory(kafka)
    sent = _produce(kafka.bootstrap_servers, topic, 400)
    share = equal_shares(2)[1]
    with RawClient.connect(proxy.bootstrap_servers) as raw:
        topic_id = raw.topic_id(topic)
        got, _ = _consume_range(raw, topic_id, [share], len(sent), max_bytes=1 << 20, top_level=True)
    expected = [i for i, (k, _v) in enumerate(sent) if contains([share], key_hash(k, i))]
    assert [r.offset for r in got] == expected


@pytest.mark.parametrize(
    "ranges, reason",
    [
        ([KeyRange(10, 5)], "start after end"),
        ([KeyRange(100, 200), KeyRange(150, 300)], "overlapping"),
        ([KeyRange(500, 600), KeyRange(0, 10)], "unsorted"),
        ([KeyRange(-5, 10)], "negative"),
        ([KeyRange(-(2**63), HASH_MAX)], "int64 minimum"),
    ],
)
def test_invalid_ranges_get_invalid_request_for_that_partition_only(kafka, proxy, topic_factory, ranges, reason):
    topic = topic_factory(kafka, partitions=2)
    _produce(kafka.bootstrap_servers, topic, 50)
    cls = messages.body_class(ApiKey.FETCH, "request")
    with RawClient.connect(proxy.bootstrap_servers) as raw:
        topic_id = raw.topic_id(topic)
        body = messages.new_body(
            ApiKey.FETCH, 17, "request", max_wait_ms=100, min_bytes=1, max_bytes=1 << 20, session_id=0,
            session_epoch=-1,
            topics=[cls.FetchTopic(topic_id=topic_id, partitions=[
                cls.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20,
                                   key_ranges=[cls.KeyRange(start=r.start, end=r.end) for r in ranges]),
                cls.FetchPartition(partition=1, fetch_offset=0, partition_max_bytes=1 << 20),
            ])],
        )
        response = raw.request(ApiKey.FETCH, 17, body)
    partitions = {p.partition_index: p for p in response.responses[0].partitions}
    assert partitions[0].error_code == 42, reason
    assert not partitions[0].records
    assert partitions[1].error_code == 0
    assert partitions[1].key_ranges_applied is None
    assert records_of(partitions[1].records)[0], "the other partition is served normally"


def test_topic_refusing_range_fetch(kafka, proxy_factory, topic_factory):
    topic = topic_factory(kafka)
    refusing = proxy_factory(kafka, **{f"topic.{topic}.key.range.fetch.enabled": "false"})
    _produce(kafka.bootstrap_servers, topic, 20)
    with RawClient.connect(refusing.bootstrap_servers) as raw:
        topic_id = raw.topic_id(topic)
        entry = raw.range_fetch(topic_id, 0, 0, equal_shares(2)[:1])
        assert entry.error_code == 42 and not entry.records
        whole = raw.range_fetch(topic_id, 0, 0, None)
        assert whole.error_code == 0 and len(records_of(whole.records)[0]) == 20


def test_standard_fetch_on_the_same_proxy_is_unfiltered(kafka, proxy, topic_factory):
    from kafka import KafkaConsumer

    topic = topic_factory(kafka)
    sent = _produce(kafka.bootstrap_servers, topic, 200)
    with RawClient.connect(proxy.bootstrap_servers) as raw:
        topic_id = raw.topic_id(topic)
        _consume_range(raw, topic_id, [equal_shares(4)[0]], len(sent), max_bytes=1 << 20)
    consumer = KafkaConsumer(topic, bootstrap_servers=proxy.bootstrap_servers, auto_offset_reset="earliest",
                             consumer_timeout_ms=10000, group_id=f"g-{uuid.uuid4().hex[:6]}")
    got = [(m.key, m.value) for m in consumer]
    consumer.close()
    assert got == sent


def _random_split(rng: random.Random, n: int) -> list[list[KeyRange]]:
    """n range sets covering the hash space exactly once, each a union of 1-3 pieces."""
    cuts = sorted(rng.sample(range(1, HASH_MAX), 3 * n - 1))
    pieces = [KeyRange(lo, hi - 1) for lo, hi in zip([0, *cuts], [*cuts, HASH_MAX + 1])]
    owners = [i % n for i in range(len(pieces))]
    rng.shuffle(owners)
    sets = [[p for p, owner in zip(pieces, owners) if owner == i] for i in range(n)]
    return [s for s in sets if s]


@pytest.mark.parametrize("seed", [11, 22, 33, 44])
def test_random_splits_and_fetch_sizes(kafka, proxy, topic_factory, seed):
    """Random keys (null and hot keys included), a random split of the hash space into
    2..16 sets, random fetch sizes: every record reaches exactly the set its hash names,
    in log order, and every set's position reaches the end of the log."""
    rng = random.Random(seed)
    topic = topic_factory(kafka)
    sent = _produce(kafka.bootstrap_servers, topic, 800, rng.choice(COMPRESSIONS), seed=seed)
    sets = _random_split(rng, rng.randint(2, 16))
    owner_of = {}
    with RawClient.connect(proxy.bootstrap_servers) as raw:
        topic_id = raw.topic_id(topic)
        for index, ranges in enumerate(sets):
            position, rounds = 0, 0
            while position < len(sent):
                rounds += 1
                assert rounds < 5000, "no progress"
                entry = raw.range_fetch(topic_id, 0, position, ranges, max_bytes=rng.choice([64, 700, 4096, 1 << 20]))
                assert entry.error_code == 0
                records, next_offset = records_of(entry.records)
                fresh = [r for r in records if r.offset >= position]
                assert [r.offset for r in fresh] == sorted(r.offset for r in fresh)
                for record in fresh:
                    assert contains(ranges, key_hash(record.key, record.offset))
                    assert record.offset not in owner_of, "a record reached two sets"
                    owner_of[record.offset] = index
                assert next_offset is not None and next_offset > position
                position = next_offset
    assert sorted(owner_of) == list(range(len(sent)))


def test_topic_settings_apply_to_a_topic_id_never_seen_in_metadata(kafka, proxy_factory, topic_factory):
    """A client that learned the topic id elsewhere (e.g. before a proxy restart) fetches by
    id straight away: the proxy looks the name up, so the topic's settings still apply."""
    topic = topic_factory(kafka)
    _produce(kafka.bootstrap_servers, topic, 10)
    with RawClient.connect(kafka.bootstrap_servers) as direct:
        topic_id = direct.topic_id(topic)
    fresh = proxy_factory(kafka, **{f"topic.{topic}.key.range.fetch.enabled": "false"})
    with RawClient.connect(fresh.bootstrap_servers) as raw:
        entry = raw.range_fetch(topic_id, 0, 0, equal_shares(2)[:1])
    assert entry.error_code == 42
