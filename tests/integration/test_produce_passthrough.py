"""Producing through a proxy on which no feature reads Produce (virtual topics off, the
default): large requests have their bodies spliced from the client's socket to the
broker's, and every record reaches the broker exactly as sent, whatever the client,
acks, compression or idempotence."""

from __future__ import annotations

import random
import socket
import struct
import uuid

import pytest

from harness import java_tools
from harness.wait import wait_until
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey


@pytest.fixture(scope="module", params=["2", "0"], ids=["native-relay", "event-loop"])
def plain_proxy(kafka, proxy_factory, request):
    """A proxy with no feature reading Produce requests, and a metrics endpoint; Produce
    requests relayed by the native loop, or by the event loop alone."""
    proxy = proxy_factory(kafka, metrics_port="0", virtual_topics_enabled="false", native_relay_threads=request.param)
    proxy.native = request.param != "0"
    return proxy


def _spliced(proxy) -> float:
    return proxy.metric("kafka_proxy_spliced_requests_total")


def _native(proxy) -> float:
    return proxy.metric("kafka_proxy_native_relay_requests_total")


def _records(count: int, seed: int) -> list[tuple[bytes, bytes]]:
    """Keyed records from a few hundred bytes to 300 KB, so requests span many socket reads."""
    rng = random.Random(seed)
    return [(f"key-{i % 5}".encode(), rng.randbytes(rng.choice((200, 5000, 60_000, 300_000)))) for i in range(count)]


def _read_direct(kafka, topic: str, count: int) -> list[tuple[bytes, bytes, int]]:
    """Every record of ``topic``, read from the broker itself (not through the proxy)."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": f"check-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False, "check.crcs": True,
                         "fetch.message.max.bytes": 4 * 1024 * 1024})
    consumer.subscribe([topic])
    received: list[tuple[bytes, bytes, int]] = []

    def drained() -> bool:
        message = consumer.poll(0.5)
        if message is not None:
            assert not message.error(), message.error()
            received.append((message.key(), message.value(), message.partition()))
        return len(received) >= count

    try:
        wait_until(drained, timeout=60, interval=0, what=f"{count} records read back from the broker")
    finally:
        consumer.close()
    return received


@pytest.mark.parametrize(("acks", "compression", "idempotent"), [
    ("1", "none", False),
    ("all", "none", True),
    ("all", "zstd", True),
    ("1", "lz4", False),
])
def test_librdkafka_produce_is_exact(kafka, plain_proxy, topic_factory, acks, compression, idempotent):
    from confluent_kafka import Producer

    topic = topic_factory(kafka, partitions=2)
    sent = _records(120, seed=len(acks + compression))
    before = _spliced(plain_proxy)
    producer = Producer({"bootstrap.servers": plain_proxy.bootstrap_servers, "acks": acks,
                         "compression.type": compression, "enable.idempotence": idempotent,
                         "linger.ms": 20, "batch.size": 900_000})
    failures = []
    for key, value in sent:
        producer.produce(topic, key=key, value=value, on_delivery=lambda err, msg: err and failures.append(err))
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not failures
    received = _read_direct(kafka, topic, len(sent))
    assert sorted((k, v) for k, v, _ in received) == sorted(sent)
    by_key: dict[bytes, list[bytes]] = {}
    for key, value, _ in received:
        by_key.setdefault(key, []).append(value)
    for key, values in by_key.items():  # one key, one partition: in the order sent
        assert values == [v for k, v in sent if k == key]
    if compression == "none":  # compressed, the random values may shrink below a socket read
        assert _spliced(plain_proxy) > before


@pytest.mark.parametrize("producer_props", [
    {"acks": "all", "enable.idempotence": "true", "compression.type": "none"},
    {"acks": "1", "enable.idempotence": "false", "compression.type": "lz4"},
])
def test_java_producer_large_requests_arrive_whole(kafka, plain_proxy, topic_factory, producer_props):
    topic = topic_factory(kafka)
    before, native_before = _spliced(plain_proxy), _native(plain_proxy)
    records = 400
    result = java_tools.producer_performance(
        plain_proxy.bootstrap_servers, topic, records, record_size=50_000,
        producer_props={**producer_props, "linger.ms": "20", "batch.size": "900000",
                        "max.request.size": str(4 * 1024 * 1024)})
    assert f"{records} records sent" in result.stdout
    received = _read_direct(kafka, topic, records)
    assert len(received) == records
    assert all(len(value) == 50_000 for _, value, _ in received)
    if producer_props["compression.type"] == "none":
        assert _spliced(plain_proxy) > before
    # a producer's requests go through the native loop when it is on, and never otherwise
    assert (_native(plain_proxy) > native_before) == plain_proxy.native


def _produce_head(topic: str, record_bytes: int) -> bytes:
    """The size prefix and first half of a Produce request for ``topic`` (acks=1)."""
    body_class = messages.body_class(ApiKey.PRODUCE, "request")
    data = body_class.PartitionProduceData(index=0, records=bytes(record_bytes))
    header = messages.new_request_header(ApiKey.PRODUCE, 9, 1, "dies-mid-body")
    body = messages.new_body(ApiKey.PRODUCE, 9, "request", transactional_id=None, acks=1, timeout_ms=30000,
                             topic_data=[body_class.TopicProduceData(name=topic, partition_data=[data])])
    frame = messages.encode_request(header, body)
    return (struct.pack(">i", len(frame)) + frame)[: len(frame) // 2]


def test_a_client_dying_mid_body_hurts_only_itself(kafka, plain_proxy, topic_factory):
    topic = topic_factory(kafka)
    with socket.create_connection(("127.0.0.1", plain_proxy.port), timeout=10) as doomed:
        doomed.sendall(_produce_head(topic, 2_000_000))
    sent = _records(30, seed=7)
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": plain_proxy.bootstrap_servers, "acks": "all", "linger.ms": 20})
    for key, value in sent:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(60) == 0
    received = _read_direct(kafka, topic, len(sent))
    assert [(k, v) for k, v, _ in received] == sent  # nothing of the broken request was written


def test_the_frame_size_limit_holds_without_a_feature_reading_produce(kafka, proxy_factory, topic_factory):
    topic = topic_factory(kafka)
    capped = proxy_factory(kafka, max_frame_bytes=str(1024 * 1024), virtual_topics_enabled="false")
    with socket.create_connection(("127.0.0.1", capped.port), timeout=10) as sock:
        head = _produce_head(topic, 3 * 1024 * 1024)
        try:
            sock.sendall(head)
        except OSError:
            pass  # closed on the size prefix while the rest was on its way
        wait_until(lambda: _is_closed(sock), timeout=15, what="oversized Produce refused")
    assert "exceeds the 1048576-byte limit" in capped.log_text()
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": capped.bootstrap_servers, "acks": "all"})
    producer.produce(topic, value=b"still-fine")
    assert producer.flush(30) == 0
    assert _read_direct(kafka, topic, 1)[0][1] == b"still-fine"


def _is_closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1 << 20) == b""
    except ConnectionResetError:
        return True
