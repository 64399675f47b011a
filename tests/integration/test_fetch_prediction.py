"""Fetch prediction through the real proxy: consumers get every record exactly once, in
order, whether their fetches are answered from an early fetch or not."""

from __future__ import annotations

import time

import pytest

from harness import java_tools

RECORDS = 3000


def _values(count: int) -> list[bytes]:
    # About 300 bytes each, distinct, so a lost, repeated or reordered record shows.
    return [b"record-%06d-" % i + b"x" * (i % 600) for i in range(count)]


def _fill(proxy, topic: str, values: list[bytes]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap_servers, acks="all", linger_ms=5,
                             batch_size=16384)
    for value in values:
        producer.send(topic, value=value)
    producer.flush(60)
    producer.close()


@pytest.fixture
def predicting_proxy(kafka, proxy_factory):
    return proxy_factory(kafka, metrics_port="0", fetch_prediction_enabled="true")


def test_java_consumer_is_answered_from_early_fetches(kafka, predicting_proxy, topic_factory):
    topic = topic_factory(kafka)
    values = _values(RECORDS)
    _fill(predicting_proxy, topic, values)
    # Small fetches: many round trips, each a chance to be answered from an early fetch.
    result = java_tools.console_consumer(predicting_proxy.bootstrap_servers, topic, max_messages=RECORDS,
                                         consumer_config={"max.partition.fetch.bytes": "32768"})
    assert result.stdout.encode().splitlines() == values
    hits = predicting_proxy.metric("kafka_proxy_fetch_prediction_hits_total")
    sent = predicting_proxy.metric("kafka_proxy_fetch_prediction_sent_total")
    # ~900 KB in 32 KB fetches: about 30 fetches; all but the first few come from early fetches.
    assert hits >= 10, (hits, sent)
    assert sent - hits <= 3  # at most the ones in flight when the consumer stopped
    assert predicting_proxy.metric("kafka_proxy_fetch_prediction_wasted_total") <= 3


def test_seeking_back_drops_the_early_fetch_and_reads_again(kafka, predicting_proxy, topic_factory):
    from kafka import KafkaConsumer, TopicPartition

    topic = topic_factory(kafka)
    values = _values(RECORDS)
    _fill(predicting_proxy, topic, values)
    partition = TopicPartition(topic, 0)
    consumer = KafkaConsumer(bootstrap_servers=predicting_proxy.bootstrap_servers, enable_auto_commit=False,
                             max_partition_fetch_bytes=16384, consumer_timeout_ms=20000)
    consumer.assign([partition])
    consumer.seek_to_beginning(partition)
    first = [message.value for _, message in zip(range(2000), consumer)]
    assert first == values[:2000]
    wasted_before = predicting_proxy.metric("kafka_proxy_fetch_prediction_wasted_total")
    consumer.seek(partition, 100)
    again = [message.value for _, message in zip(range(500), consumer)]
    consumer.close()
    assert again == values[100:600]
    assert predicting_proxy.metric("kafka_proxy_fetch_prediction_hits_total") > 0
    # The early fetch held for offset ~2000 was not what the consumer asked for after the seek.
    assert predicting_proxy.metric("kafka_proxy_fetch_prediction_wasted_total") > wasted_before


def test_read_committed_skips_every_aborted_transaction(kafka, predicting_proxy, topic_factory):
    from confluent_kafka import Producer

    topic = topic_factory(kafka)
    producer = Producer({"bootstrap.servers": predicting_proxy.bootstrap_servers, "linger.ms": 5,
                         "transactional.id": f"tx-{topic}"})
    producer.init_transactions(30)
    committed = []
    for transaction in range(20):
        producer.begin_transaction()
        values = _values(150)[transaction * 7:][:100]
        for value in values:
            producer.produce(topic, value=b"%02d-" % transaction + value)
        # Delivered before ending: librdkafka can fail an abort that races its own adding of
        # the partition to the transaction with INVALID_TXN_STATE (librdkafka issue 4849).
        producer.flush(30)
        if transaction % 3 == 1:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
            committed += [b"%02d-" % transaction + value for value in values]
    result = java_tools.console_consumer(predicting_proxy.bootstrap_servers, topic, max_messages=len(committed),
                                         consumer_config={"max.partition.fetch.bytes": "16384",
                                                          "isolation.level": "read_committed"})
    assert result.stdout.encode().splitlines() == committed
    assert predicting_proxy.metric("kafka_proxy_fetch_prediction_hits_total") > 0


@pytest.mark.parametrize("setting", [{"fetch_prediction_enabled": "false"},
                                     {"fetch_prediction_buffer_bytes": "0"},
                                     {"fetch_prediction_max_partitions": "1"},
                                     # the former name, still read (and, coming later, winning)
                                     {"fetch_readahead_enabled": "false"}],
                         ids=["off", "no-budget", "two-partitions", "off-by-former-name"])
def test_no_early_fetch_when_off_or_beyond_the_limits(kafka, proxy_factory, topic_factory, setting):
    proxy = proxy_factory(kafka, metrics_port="0", **{"fetch_prediction_enabled": "true", **setting})
    topic = topic_factory(kafka, partitions=2)
    values = _values(1000)
    _fill(proxy, topic, values)
    result = java_tools.console_consumer(proxy.bootstrap_servers, topic, max_messages=1000,
                                         consumer_config={"max.partition.fetch.bytes": "16384"})
    assert sorted(result.stdout.encode().splitlines()) == sorted(values)
    assert proxy.metric("kafka_proxy_fetch_prediction_sent_total") == 0


def test_aiokafka_and_librdkafka_read_every_record_once(kafka, predicting_proxy, topic_factory):
    from confluent_kafka import Consumer

    topic = topic_factory(kafka)
    values = _values(RECORDS)
    _fill(predicting_proxy, topic, values)
    consumer = Consumer({"bootstrap.servers": predicting_proxy.bootstrap_servers, "group.id": f"g-{topic}",
                         "auto.offset.reset": "earliest",
                         "max.partition.fetch.bytes": 16384})
    consumer.subscribe([topic])
    received = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and not message.error():
            received.append(message.value())
        if len(received) >= RECORDS:
            break
    consumer.close()
    assert received == values

    import asyncio

    from aiokafka import AIOKafkaConsumer

    async def consume() -> list[bytes]:
        aio = AIOKafkaConsumer(topic, bootstrap_servers=predicting_proxy.bootstrap_servers,
                               auto_offset_reset="earliest", max_partition_fetch_bytes=16384)
        await aio.start()
        try:
            got: list[bytes] = []
            async with asyncio.timeout(60):
                while len(got) < RECORDS:
                    batch = await aio.getmany(timeout_ms=1000)
                    got.extend(m.value for messages in batch.values() for m in messages)
            return got
        finally:
            await aio.stop()

    assert asyncio.run(consume()) == values
