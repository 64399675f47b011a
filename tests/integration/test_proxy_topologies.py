"""Both deployment shapes: port per broker and one sidecar per broker."""

from __future__ import annotations

import uuid

from proxy.testing.wait import wait_until

from .conftest import free_ports, real_ports


def _roundtrip(bootstrap: str, topic: str, count: int) -> tuple[set[int], list[bytes]]:
    from confluent_kafka import Consumer, Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode())
    assert producer.flush(60) == 0
    ports = {broker.port for broker in producer.list_topics(timeout=10).brokers.values()}
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    values: list[bytes] = []

    def drained():
        message = consumer.poll(0.5)
        if message is not None and not message.error():
            values.append(message.value())
        return len(values) >= count

    wait_until(drained, timeout=60, interval=0, what="records consumed")
    consumer.close()
    return ports, values


def test_port_per_broker_gives_each_node_its_port(kafka_cluster, cluster_proxy, topic_factory):
    assert set(cluster_proxy.node_ports) == {node.node_id for node in kafka_cluster.nodes}
    topic = topic_factory(kafka_cluster, partitions=3, replication_factor=3)
    ports, values = _roundtrip(cluster_proxy.bootstrap_servers, topic, 300)
    assert ports == set(cluster_proxy.node_ports.values())
    assert sorted(values) == sorted(f"v{i}".encode() for i in range(300))


def test_sidecar_per_broker(kafka_cluster, proxy_factory, topic_factory):
    nodes = sorted(kafka_cluster.nodes, key=lambda node: node.node_id)
    ports = free_ports(len(nodes))
    mapping = ",".join(f"{node.node_id}@127.0.0.1:{port}" for node, port in zip(nodes, ports))
    sidecars = [
        proxy_factory(kafka_cluster, bootstrap=f"127.0.0.1:{node.port}", listen_port=port,
                      topology="sidecar", sidecar_node_addresses=mapping)
        for node, port in zip(nodes, ports)
    ]
    topic = topic_factory(kafka_cluster, partitions=3, replication_factor=3)
    seen, values = _roundtrip(sidecars[1].bootstrap_servers, topic, 300)
    assert seen == set(ports)
    assert not seen & real_ports(kafka_cluster)
    assert sorted(values) == sorted(f"v{i}".encode() for i in range(300))
    for sidecar in sidecars:
        assert sidecar.node_ports == {}
