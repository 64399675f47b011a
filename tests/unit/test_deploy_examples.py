"""The example configurations in ``deploy/`` load with the proxy's own loader, so a renamed
or retired setting, or a value the proxy would refuse, fails here rather than at a user's
start."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.server.config import load_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_both_topologies_have_an_example():
    assert sorted(path.name for path in DEPLOY.glob("*.properties")) == [
        "port-per-broker.properties", "sidecar.properties"]


@pytest.mark.parametrize("path", sorted(DEPLOY.glob("*.properties")), ids=lambda path: path.name)
def test_example_loads(path: Path):
    config = load_config(str(path), [])
    assert config.cluster.topology == path.stem
    assert config.renamed == (), "the examples use the current names"


def test_port_per_broker_example():
    config = load_config(str(DEPLOY / "port-per-broker.properties"), [])
    assert [host for host, _ in config.cluster.bootstrap_servers] == [
        "kafka-1.example.internal", "kafka-2.example.internal", "kafka-3.example.internal"]
    assert (config.cluster.listen_port, config.cluster.node_port_base) == (9192, 9200)
    assert config.advertised_host == "proxy.example.internal"
    assert config.keyrange.topics.of("orders").cache_records is True
    assert config.keyrange.topics.of("audit-log").fetch_enabled is False
    assert config.virtual.enabled is True


def test_sidecar_example():
    config = load_config(str(DEPLOY / "sidecar.properties"), [])
    assert config.cluster.bootstrap_servers == [("127.0.0.1", 9092)]
    assert config.cluster.sidecar_node_addresses == {
        node: (f"kafka-{node}.example.internal", 9192) for node in (1, 2, 3)}
    assert config.advertised_host == "kafka-1.example.internal"
    # an override per host, as the file says
    other = load_config(str(DEPLOY / "sidecar.properties"), ["advertised.host=kafka-2.example.internal"])
    assert other.advertised_host == "kafka-2.example.internal"
