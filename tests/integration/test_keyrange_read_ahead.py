"""Wide read-ahead against a real broker: eight range consumers of one partition start
together, through one or two proxy instances with their defaults, while a producer writes.

A partition eight range sets share is read ahead about eight consumer limits at a time, so
each consumer's answers hold about a limit of its own records; a share above the limit (one
hot key) is served in parts within it. Every acknowledged record reaches the one consumer
whose range holds its key, once and in offset order, and the broker is read about once."""

from __future__ import annotations

import time

import pytest

from harness.history import History, check
from harness.live import LiveProducer, default_key, deliver_range, read_while_written
from harness.raw_client import RawClient, partition_bytes
from proxy.ranges import equal_shares
from proxy.records.batch import iter_batches

LIMIT = 16 * 1024  # each consumer's partition limit
CONSUMERS = 8


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
    over_limit: list[tuple[int, int, int]] = []  # (consumer, bytes, batches) of answers above the limit
    deadline = time.monotonic() + 90

    def consume(slot: int) -> None:
        def measure(blob: bytes) -> None:
            if len(blob) > LIMIT:
                over_limit.append((slot, len(blob), sum(1 for _ in iter_batches(blob))))

        with RawClient.to_leader(proxies[slot % instances].bootstrap_servers, topic) as client:
            deliver_range(client, topic, [shares[slot]], f"c{slot}", history, live, deadline, max_bytes=LIMIT,
                          on_answer=measure)

    read_while_written(consume, CONSUMERS, live)
    assert live.failed == backlog.failed == 0
    verdict = check(history)
    assert verdict.ok(), verdict.summary()
    assert all(batches == 1 for _, _, batches in over_limit), \
        f"answers above the consumers' limit of more than one batch: {over_limit[:5]}"
    assert sum(p.metric("kafka_proxy_keyrange_prefetch_wide_total") for p in proxies) > 0, "no wide read-ahead"
    if keys == "one hot key":
        assert sum(p.metric("kafka_proxy_keyrange_shares_cut_total") for p in proxies) > 0, \
            "the hot key's share never came in parts"
    end = max(a.offset for a in history.acks) + 1
    read = sum(p.metric("kafka_proxy_keyrange_broker_bytes_total") for p in proxies)
    amplification = read / partition_bytes(kafka.bootstrap_servers, topic, end)
    assert amplification <= 1.5 * instances, f"the broker read {amplification:.2f} x the partition"
