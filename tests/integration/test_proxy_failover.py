"""Three brokers behind the proxy: the partition leader stops mid-stream; producers and group
consumers recover through the proxy, and every acknowledged record is consumed."""

from __future__ import annotations

import uuid

from harness.wait import wait_until

from .conftest import proxy_ports, real_ports


def _leader(cluster, topic: str) -> int:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers, client_id="leader-probe")
    try:
        description = admin.describe_topics([topic])[0]
        partition = description["partitions"][0]
        return partition.get("leader_id", partition.get("leader"))
    finally:
        admin.close()


def test_leader_stops_mid_stream(kafka_cluster, cluster_proxy, topic_factory):
    from confluent_kafka import Consumer, Producer

    topic = topic_factory(kafka_cluster, partitions=1, replication_factor=3, configs={"min.insync.replicas": "2"})
    producer = Producer({"bootstrap.servers": cluster_proxy.bootstrap_servers, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 5, "message.timeout.ms": 120000})
    acknowledged: list[bytes] = []

    def on_delivery(err, msg):
        if err is None:
            acknowledged.append(msg.value())

    consumer = Consumer({"bootstrap.servers": cluster_proxy.bootstrap_servers, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": True})
    consumer.subscribe([topic])
    received: list[bytes] = []

    def consume_until(count: int):
        def done():
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                received.append(message.value())
            return len(set(received)) >= count
        return done

    for i in range(1000):
        producer.produce(topic, key=str(i % 17).encode(), value=f"before-{i}".encode(), on_delivery=on_delivery)
    assert producer.flush(60) == 0
    wait_until(consume_until(1000), timeout=60, interval=0, what="first half consumed")

    leader = _leader(kafka_cluster, topic)
    kafka_cluster.stop_node(leader)

    for i in range(1000):
        producer.produce(topic, key=str(i % 17).encode(), value=f"after-{i}".encode(), on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(120) == 0
    assert len(acknowledged) == 2000
    wait_until(consume_until(2000), timeout=120, interval=0, what="every acknowledged record consumed")
    assert set(received) == set(acknowledged)

    metadata = producer.list_topics(timeout=10)
    seen = {broker.port for broker in metadata.brokers.values()}
    assert seen <= proxy_ports(cluster_proxy)
    assert not seen & real_ports(kafka_cluster)
    assert _leader(kafka_cluster, topic) != leader
    consumer.close()
