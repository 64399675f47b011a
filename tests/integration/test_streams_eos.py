"""Kafka Streams exactly-once through the proxy, and plain Java clients, while records are
written live and processes die by SIGKILL (``benchmarks/java/streams``, launched by
``harness.streams_app``).

- Two ``KeyCountApp`` instances (``exactly_once_v2``) count the records of each key of a
  2-partition topic, read through the proxy; the producer writes straight to the broker
  (acks=all, idempotent), so its acknowledgements are the truth. One instance is killed
  mid-stream and started again on its state directory. The last count of every key in the
  output, read with read_committed, must equal the number of acknowledged records of that
  key: none lost, none counted twice, whatever was processed again after the kill.
- Two ``PlainConsumer`` members of one group read through the proxy, committing after each
  poll; one is killed mid-stream and started again. Every acknowledged record must be
  handed out (at least once: the killed member's uncommitted records may come again), none
  that was never acknowledged, each member's records of a partition in offset order, and
  the group's committed offsets must reach the log end.
"""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter, defaultdict

import pytest

from harness.history import History, check
from harness.live import LiveProducer
from harness.streams_app import (
    FAST_FAILOVER,
    PlainConsumerProcess,
    PlainProducerProcess,
    StreamsAppError,
    StreamsFleet,
    build,
    read_counts,
)
from harness.wait import wait_until
from tests.integration.test_live_tail import _committed, _log_end

# the first run may build the module from an empty Maven cache before the clock of the test
pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

PARTITIONS = 2
RECORDS = 3000
SECONDS = 15.0
KEYS = 50
SEED = 7


@pytest.fixture(scope="module")
def streams_jars() -> None:
    try:
        build()
    except StreamsAppError as exc:
        pytest.fail(str(exc), pytrace=False)


def _difference(expected: Counter[str], counts: dict[str, int], limit: int = 8) -> str:
    wrong = sorted(k for k in set(expected) | set(counts) if counts.get(k, 0) != expected.get(k, 0))
    shown = ", ".join(f"{k}: {counts.get(k, 0)} counted, {expected.get(k, 0)} acknowledged" for k in wrong[:limit])
    more = f" and {len(wrong) - limit} more" if len(wrong) > limit else ""
    return (f"{len(wrong)} of {len(expected)} keys wrong ({sum(counts.values())} counted, "
            f"{sum(expected.values())} acknowledged): {shown}{more}")


def test_key_counts_are_exact_after_an_instance_is_killed_mid_stream(kafka, proxy_factory, topic_factory,
                                                                     streams_jars, tmp_path):
    rng = random.Random(SEED)
    proxy = proxy_factory(kafka)
    topic = topic_factory(kafka, partitions=PARTITIONS)
    output = f"{topic}-counts"
    history = History()
    producer = LiveProducer(kafka.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS,
                            seed=SEED, keys=KEYS)
    # No record cache: every record's new count goes to the store, the changelog and the output
    # inside the open transaction, so the kill leaves records to abort, not only offsets.
    with StreamsFleet(2, bootstrap=proxy.bootstrap_servers, input_topic=topic, output_topic=output,
                      workdir=tmp_path, application_id=f"keycount-{uuid.uuid4().hex[:8]}", progress_ms=250,
                      cache_max_bytes=0, configs=FAST_FAILOVER) as fleet:
        fleet.start()
        fleet.wait_running(60)
        producer.start()

        def busy() -> bool:
            fleet.check_alive()
            fleet.processed()
            return len(history.acks) >= RECORDS // 3 and any(i.processed > 0 for i in fleet)

        wait_until(busy, 30, what=lambda: f"the instances processing a third of the input ({len(history.acks)} "
                                          f"acknowledged, {[i.processed for i in fleet]} processed)")
        assert not producer.done, "the producer finished before the kill: not mid-stream"
        # one that has been processing (Streams may give both partitions to one instance)
        victim = max(fleet, key=lambda i: (i.processed, rng.random()))
        victim.kill()
        victim.start()
        victim.wait_running(60)
        producer.join(60)
        assert producer.failed == 0, producer.errors
        expected = Counter(ack.key.decode() for ack in history.acks if ack.key is not None)
        assert sum(expected.values()) == RECORDS

        last: dict[str, int] = {}

        def over() -> list[str]:
            return [k for k, n in last.items() if n > expected.get(k, 0)]

        def settled() -> bool:
            fleet.check_alive()
            last.clear()
            last.update(read_counts(proxy.bootstrap_servers, output, timeout=20))
            return last == expected or bool(over())  # a count above the input never comes down

        wait_until(settled, 45, interval=0.5,
                   what=lambda: f"the counts reaching the acknowledged ones ({_difference(expected, last)})")
        assert not over(), f"counted more than acknowledged: {_difference(expected, last)}"
        codes = fleet.stop()
        errors = fleet.errors()
        processed = fleet.processed()
    assert codes == [0, 0], f"exit codes on SIGTERM {codes}: " + "; ".join(i.stderr_tail(5) for i in fleet)
    assert not errors, errors
    # after both closed every transaction has ended: the final, committed counts
    final = read_counts(kafka.bootstrap_servers, output, timeout=30)
    assert final == expected, _difference(expected, final)
    print(f"{RECORDS} records, {len(expected)} keys: counts exact after the kill of {victim.name}; "
          f"{processed} records processed in all (a killed launch as of its last progress line)")


def test_plain_java_consumers_hand_out_every_acknowledged_record(kafka, proxy_factory, topic_factory,
                                                                  streams_jars, tmp_path):
    proxy = proxy_factory(kafka)
    topic = topic_factory(kafka, partitions=PARTITIONS)
    group = f"plain-{topic}"
    history = History()
    consumers = [PlainConsumerProcess(proxy.bootstrap_servers, topic, group, workdir=tmp_path, name=f"c{i}",
                                      configs=FAST_FAILOVER) for i in range(2)]
    producer = PlainProducerProcess(kafka.bootstrap_servers, topic, records=RECORDS, keys=KEYS,
                                    rate=RECORDS / SECONDS * 1.25, workdir=tmp_path)
    try:
        for consumer in consumers:
            consumer.start()

        def balanced() -> bool:
            for consumer in consumers:
                consumer.check_alive()
                consumer.refresh()
            owned = [c.assignment for c in consumers]
            return all(owned) and set.union(*owned) == {(topic, p) for p in range(PARTITIONS)}

        wait_until(balanced, 60, what=lambda: f"both members owning a partition ({[c.assignment for c in consumers]})")
        producer.start()
        victim = consumers[1]

        def victim_busy() -> bool:
            producer.check_alive()
            producer.feed(history)
            victim.refresh()
            return len(history.acks) >= RECORDS // 3 and len(victim.records) > 0

        wait_until(victim_busy, 30, what=lambda: f"{victim.name} consuming while a third is written "
                                                 f"({len(history.acks)} acknowledged, {len(victim.records)} handed out)")
        assert producer.alive and producer.done is None, "the producer finished before the kill: not mid-stream"
        victim.kill()
        victim.start()
        sent, acked, failed = producer.wait_done(60)
        producer.feed(history)
        assert (sent, acked, failed) == (RECORDS, RECORDS, 0), producer.failures[:5]
        log_end = _log_end(kafka.bootstrap_servers, topic, PARTITIONS)

        def all_delivered_and_committed() -> bool:
            for consumer in consumers:
                consumer.check_alive()
                consumer.feed(history)
            return (history.missing() == 0
                    and _committed(kafka.bootstrap_servers, group, topic, PARTITIONS) == log_end)

        wait_until(all_delivered_and_committed, 45, interval=0.25,
                   what=lambda: f"every acknowledged record handed out ({history.missing()} missing) and "
                                f"committed ({_committed(kafka.bootstrap_servers, group, topic, PARTITIONS)} "
                                f"of {log_end})")
        codes = [consumer.stop(20) for consumer in consumers]
    finally:
        producer.close()
        for consumer in consumers:
            consumer.close()
    assert codes == [0, 0], [c.stderr_tail(5) for c in consumers]
    verdict = check(history, keyed_order=False, committed=_committed(kafka.bootstrap_servers, group, topic, PARTITIONS),
                    log_end=log_end)
    assert verdict.acknowledged == RECORDS
    assert verdict.ok(allow_duplicates=True), verdict.summary()
    # each launch of a member hands out a partition's records in offset order, each once
    by_launch: dict[tuple[str, int, int], list[int]] = defaultdict(list)
    for consumer in consumers:
        for record in consumer.records:
            by_launch[consumer.name, record.launch, record.partition].append(record.offset)
    for (name, launch, partition), offsets in by_launch.items():
        assert offsets == sorted(set(offsets)), f"{name} launch {launch} partition {partition} out of order"
    print(verdict.summary())


def test_read_counts_of_an_empty_output_is_empty(kafka, topic_factory, streams_jars):
    topic = topic_factory(kafka, partitions=2)
    started = time.monotonic()
    assert read_counts(kafka.bootstrap_servers, topic, timeout=20) == {}
    assert time.monotonic() - started < 20
