"""Wide read-ahead against a real broker: eight range consumers of one partition start
together, through one or two proxy instances with their defaults, while a producer writes.

A partition eight range sets share is read ahead about eight consumer limits at a time, so
each consumer's answers hold about a limit of its own records; a share above the limit (one
hot key) is served in parts within it. Every acknowledged record reaches the one consumer
whose range holds its key, once and in offset order, and the broker is read about once."""

from __future__ import annotations

import re
import threading
import time
import urllib.request

import pytest

from harness.history import History, check
from harness.live import LiveProducer, default_key
from harness.raw_client import RawClient, records_of
from proxy.ranges import contains, equal_shares
from proxy.records.batch import RecordBatch, iter_batches
from proxy.records.keyhash import key_hash

LIMIT = 16 * 1024  # each consumer's partition limit
CONSUMERS = 8


def _metric(proxy, name: str) -> float:
    text = urllib.request.urlopen(proxy.metrics_url, timeout=10).read().decode()
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M))


def _partition_bytes(bootstrap: str, topic: str, end: int) -> int:
    """The record bytes of offsets [0, end) of partition 0, read straight from the broker."""
    size = position = 0
    with RawClient.connect(bootstrap) as client:
        topic_id = client.topic_id(topic)
        while position < end:
            entry = client.range_fetch(topic_id, 0, position, None, max_bytes=1 << 20)
            for batch in iter_batches(entry.records or b""):
                if isinstance(batch, RecordBatch):
                    size += batch.header.size
                    position = batch.header.next_offset
    return size


def _hot(seq, rng, keys) -> bytes:
    return b"hot" if rng.random() < 0.5 else default_key(seq, rng, keys)


@pytest.mark.parametrize("keys, instances", [("spread", 1), ("one hot key", 1), ("spread", 2)],
                         ids=["keys-spread", "one-hot-key", "two-instances"])
def test_range_consumers_read_wide_within_their_limits_and_get_every_record_once(kafka, proxy_factory, topic_factory,
                                                                                 keys, instances):
    topic = topic_factory(kafka)
    proxies = [proxy_factory(kafka, metrics_port="0") for _ in range(instances)]
    history = History()
    key_of = _hot if keys == "one hot key" else default_key
    small_batches = {"batch.size": 4096}  # answers made of many batches, so a limit cuts between them
    backlog = LiveProducer(kafka.bootstrap_servers, topic, history, records=120_000, seconds=1.5, seed=5,
                           partition=0, key_of=key_of, config=small_batches)
    backlog.start().join()  # consumers start behind: there is more to read than one fetch takes
    live = LiveProducer(kafka.bootstrap_servers, topic, history, records=8000, seconds=4.0, seed=6, partition=0,
                        key_of=key_of, config=small_batches)
    shares = equal_shares(CONSUMERS)
    errors: list[BaseException] = []
    over_limit: list[tuple[int, int, int]] = []  # (consumer, bytes, batches) of answers above the limit
    deadline = time.monotonic() + 90

    def consume(slot: int) -> None:
        try:
            with RawClient.connect(proxies[slot % instances].bootstrap_servers) as client:
                topic_id = client.topic_id(topic)
                position = 0
                while time.monotonic() < deadline:
                    if live.done and history.acks and position > max(a.offset for a in history.acks):
                        return
                    entry = client.range_fetch(topic_id, 0, position, [shares[slot]], max_bytes=LIMIT,
                                               max_wait_ms=200)
                    assert entry.error_code == 0, entry.error_code
                    blob = entry.records or b""
                    if len(blob) > LIMIT:
                        over_limit.append((slot, len(blob), sum(1 for _ in iter_batches(blob))))
                    records, next_offset = records_of(blob)
                    for record in records:
                        if record.offset >= position:
                            assert contains([shares[slot]], key_hash(record.key, record.offset))
                            history.deliver(f"c{slot}", topic, 0, record.offset, record.key)
                    if next_offset is not None:
                        position = max(position, next_offset)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(slot,)) for slot in range(CONSUMERS)]
    for thread in threads:
        thread.start()
    live.start()
    live.join()
    for thread in threads:
        thread.join(120)
    assert not errors, errors[0]
    assert live.failed == backlog.failed == 0
    verdict = check(history)
    assert verdict.ok(), verdict.summary()
    assert all(batches == 1 for _, _, batches in over_limit), \
        f"answers above the consumers' limit of more than one batch: {over_limit[:5]}"
    assert sum(_metric(p, "kafka_proxy_keyrange_prefetch_wide_total") for p in proxies) > 0, "no wide read-ahead"
    if keys == "one hot key":
        assert sum(_metric(p, "kafka_proxy_keyrange_shares_cut_total") for p in proxies) > 0, \
            "the hot key's share never came in parts"
    end = max(a.offset for a in history.acks) + 1
    read = sum(_metric(p, "kafka_proxy_keyrange_broker_bytes_total") for p in proxies)
    amplification = read / _partition_bytes(kafka.bootstrap_servers, topic, end)
    assert amplification <= 1.5 * instances, f"the broker read {amplification:.2f} x the partition"
