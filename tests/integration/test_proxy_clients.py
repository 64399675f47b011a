"""Real clients through the proxy: every record arrives exactly as sent, and no client ever
learns a real broker address."""

from __future__ import annotations

import uuid

import pytest

from harness import java_tools
from harness.wait import wait_until

from .conftest import proxy_ports, real_ports

COMPRESSIONS = ["none", "gzip", "snappy", "lz4", "zstd"]


def _records(count: int, tag: str) -> list[tuple[bytes | None, bytes]]:
    records = []
    for i in range(count):
        key = None if i % 7 == 0 else f"key-{i % 13}".encode()
        records.append((key, f"{tag}-value-{i}-".encode() + bytes(range(i % 50))))
    return records


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_kafka_python_produce_and_group_consume(kafka, proxy, topic_factory, compression):
    from kafka import KafkaConsumer, KafkaProducer

    topic = topic_factory(kafka, partitions=3)
    sent = _records(300, compression)
    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap_servers, acks="all",
                             compression_type=None if compression == "none" else compression, linger_ms=5)
    for key, value in sent:
        producer.send(topic, key=key, value=value)
    producer.flush(30)
    assert {b.port for b in producer._metadata.brokers()} <= proxy_ports(proxy)
    producer.close()

    consumer = KafkaConsumer(topic, bootstrap_servers=proxy.bootstrap_servers, group_id=f"g-{uuid.uuid4().hex[:8]}",
                             auto_offset_reset="earliest", enable_auto_commit=True, consumer_timeout_ms=20000)
    received = []
    for message in consumer:
        received.append((message.key, message.value))
        if len(received) >= len(sent):
            break
    seen_ports = {b.port for b in consumer._client.cluster.brokers()}
    consumer.close()
    assert sorted(received, key=repr) == sorted(sent, key=repr)
    assert seen_ports and seen_ports <= proxy_ports(proxy)
    assert not seen_ports & real_ports(kafka)


def test_confluent_idempotent_producer_and_group_consumer(kafka, proxy, topic_factory):
    from confluent_kafka import Consumer, Producer

    topic = topic_factory(kafka, partitions=2)
    sent = _records(500, "librdkafka")
    producer = Producer({"bootstrap.servers": proxy.bootstrap_servers, "enable.idempotence": True,
                         "compression.type": "lz4", "linger.ms": 5})
    failures = []
    for key, value in sent:
        producer.produce(topic, key=key, value=value, on_delivery=lambda err, msg: err and failures.append(err))
    assert producer.flush(30) == 0
    assert not failures
    metadata = producer.list_topics(timeout=10)
    assert {b.port for b in metadata.brokers.values()} <= proxy_ports(proxy)

    consumer = Consumer({"bootstrap.servers": proxy.bootstrap_servers, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    received = []

    def drained():
        message = consumer.poll(0.5)
        if message is not None and not message.error():
            received.append((message.key(), message.value()))
        return len(received) >= len(sent)

    wait_until(drained, timeout=60, interval=0, what="all records consumed by librdkafka")
    consumer.commit(asynchronous=False)
    consumer.close()
    assert sorted(received, key=repr) == sorted(sent, key=repr)


def test_confluent_transactions_read_committed(kafka, proxy, topic_factory):
    from confluent_kafka import Consumer, Producer

    topic = topic_factory(kafka)
    producer = Producer({"bootstrap.servers": proxy.bootstrap_servers, "transactional.id": f"tx-{uuid.uuid4().hex}",
                         "compression.type": "zstd"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(50):
        producer.produce(topic, key=f"k{i}".encode(), value=f"aborted-{i}".encode())
    assert producer.flush(30) == 0  # sent before the abort, which would otherwise purge them and race (librdkafka 4849)
    producer.abort_transaction(30)
    producer.begin_transaction()
    for i in range(50):
        producer.produce(topic, key=f"k{i}".encode(), value=f"committed-{i}".encode())
    producer.commit_transaction(30)

    consumer = Consumer({"bootstrap.servers": proxy.bootstrap_servers, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    consumer.subscribe([topic])
    values = []

    def drained():
        message = consumer.poll(0.5)
        if message is not None and not message.error():
            values.append(message.value())
        return len(values) >= 50

    wait_until(drained, timeout=60, interval=0, what="committed records consumed")
    # Anything beyond the committed 50 would show up within a few more polls.
    for _ in range(4):
        message = consumer.poll(0.25)
        if message is not None and not message.error():
            values.append(message.value())
    consumer.close()
    assert values == [f"committed-{i}".encode() for i in range(50)]


def _aiokafka_roundtrip(bootstrap: str, topic: str, compression: str, sent) -> list:
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                    compression_type=None if compression == "none" else compression)
        await producer.start()
        try:
            for key, value in sent:
                await producer.send(topic, key=key, value=value)
            await producer.flush()
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"g-{uuid.uuid4().hex[:8]}",
                                    auto_offset_reset="earliest")
        await consumer.start()
        received = []
        try:
            async with asyncio.timeout(60):
                while len(received) < len(sent):
                    batch = await consumer.getmany(timeout_ms=1000)
                    for messages in batch.values():
                        received.extend((m.key, m.value) for m in messages)
        finally:
            await consumer.stop()
        return received

    return asyncio.run(run())


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_aiokafka_roundtrip(kafka, proxy, topic_factory, compression):
    topic = topic_factory(kafka, partitions=2)
    sent = _records(200, f"aio-{compression}")
    received = _aiokafka_roundtrip(proxy.bootstrap_servers, topic, compression, sent)
    assert sorted(received, key=repr) == sorted(sent, key=repr)


def test_java_tools_through_the_proxy(kafka, proxy, topic_factory):
    topic = topic_factory(kafka, partitions=2)
    result = java_tools.producer_performance(proxy.bootstrap_servers, topic, 5000, record_size=200,
                                             producer_props={"acks": "all", "compression.type": "lz4"})
    assert "5000 records sent" in result.stdout
    group = f"console-{uuid.uuid4().hex[:8]}"
    consumed = java_tools.console_consumer(proxy.bootstrap_servers, topic, max_messages=5000, group=group,
                                           timeout_ms=30000)
    assert len(consumed.stdout.splitlines()) == 5000
    rows = java_tools.describe_group(proxy.bootstrap_servers, group)
    assert {row["TOPIC"] for row in rows} == {topic}
    assert sum(int(row["CURRENT-OFFSET"]) for row in rows) == 5000
    assert all(row["LAG"] == "0" for row in rows)
