"""Standard-client round trips shared by the integration tests."""

from __future__ import annotations

import uuid

from harness.wait import wait_until


def confluent_roundtrip(config: dict, topic: str, count: int = 100) -> tuple[set[int], list[bytes]]:
    """Produce ``count`` keyed records with librdkafka (acks=all), then consume them as a
    fresh group. Returns the broker ports the producer's metadata named and the values
    consumed, in arrival order."""
    from confluent_kafka import Consumer, Producer

    producer = Producer({**config, "acks": "all", "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode())
    assert producer.flush(60) == 0
    ports = {broker.port for broker in producer.list_topics(timeout=10).brokers.values()}
    consumer = Consumer({**config, "group.id": f"g-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    values: list[bytes] = []
    errors: list[str] = []

    def drained() -> bool:
        message = consumer.poll(0.5)
        if message is not None:
            if message.error():
                errors.append(str(message.error()))
            else:
                values.append(message.value() or b"")
        return len(values) >= count

    try:
        wait_until(drained, timeout=90, interval=0,
                   what=lambda: f"{count} records consumed (got {len(values)}; consumer errors: {errors[-5:]})")
    finally:
        consumer.close()
    return ports, values


def commit_consumed(consumer) -> None:
    """A librdkafka consumer's synchronous commit of what it has consumed; nothing consumed
    since the last commit (``_NO_OFFSET``) is no error."""
    from confluent_kafka import KafkaError, KafkaException

    try:
        consumer.commit(asynchronous=False)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError._NO_OFFSET:
            raise
