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


def commit_consumed(consumer, *, coordinator_may_be_away: bool = False) -> None:
    """A librdkafka consumer's synchronous commit of what it has consumed; nothing consumed
    since the last commit (``_NO_OFFSET``) is no error. With ``coordinator_may_be_away`` (a
    test that kills what the coordinator connection runs through) a commit refused because
    librdkafka is still finding its coordinator is no error either: the next commit carries
    the same positions, and the test checks the committed offsets at its end."""
    from confluent_kafka import KafkaError, KafkaException

    away = {KafkaError._WAIT_COORD, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
            KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR}
    try:
        consumer.commit(asynchronous=False)
    except KafkaException as exc:
        code = exc.args[0].code()
        if code != KafkaError._NO_OFFSET and not (coordinator_may_be_away and code in away):
            raise


def rdkafka_virtual_member(bootstrap: str, group: str, virtual: str, topic: str, shares: int, history, name: str,
                           stop, errors: list[str], *, skip_errors: bool = False) -> None:
    """An unmodified librdkafka member of ``group`` on the virtual range topic ``virtual``
    (``topic.kr<shares>``) until ``stop`` is set: each record handed out is recorded in
    ``history`` under its real partition (virtual partition v is share v % K of real
    partition v // K), and it commits synchronously after each batch and once a second
    when idle (positions moved past other shares' records are committed too). A message
    error goes to ``errors``, unless ``skip_errors`` (a test that breaks connections on
    purpose: librdkafka reconnects by itself, and a commit made while it finds its coordinator
    again is retried by the next); an exception ends the member into ``errors``."""
    import time

    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "session.timeout.ms": 10000, "heartbeat.interval.ms": 500,
                         "fetch.wait.max.ms": 300})
    consumer.subscribe([virtual], on_revoke=lambda c, _partitions: commit_consumed(
        c, coordinator_may_be_away=skip_errors))
    last_commit = time.monotonic()
    try:
        while not stop.is_set():
            batch = consumer.consume(100, 0.3)
            for message in batch:
                if message.error():
                    if not skip_errors:
                        errors.append(str(message.error()))
                    continue
                virtual_partition, offset = message.partition(), message.offset()
                assert virtual_partition is not None and offset is not None  # set on every record
                history.deliver(name, topic, virtual_partition // shares, offset, message.key())
            if batch or time.monotonic() - last_commit > 1.0:
                commit_consumed(consumer, coordinator_may_be_away=skip_errors)
                last_commit = time.monotonic()
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(repr(exc))
    finally:
        consumer.close()
