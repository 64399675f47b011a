"""Both deployment shapes: port per broker and one sidecar per broker."""

from __future__ import annotations

from harness.clients import confluent_roundtrip

from .conftest import free_ports, real_ports


def _roundtrip(bootstrap: str, topic: str, count: int) -> tuple[set[int], list[bytes]]:
    return confluent_roundtrip({"bootstrap.servers": bootstrap}, topic, count)


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
