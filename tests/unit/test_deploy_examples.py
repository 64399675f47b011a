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
    assert config.get("topology") == path.stem


def test_port_per_broker_example():
    config = load_config(str(DEPLOY / "port-per-broker.properties"), [])
    assert [host for host, _ in config.get("bootstrap.servers")] == [
        "kafka-1.example.internal", "kafka-2.example.internal", "kafka-3.example.internal"]
    assert (config.get("listen.port"), config.get("node.port.base")) == (9192, 9200)
    assert config.advertised_host == "proxy.example.internal"
    assert config.topic_setting("orders", "reserve.message.value.range.fetch") is True
    assert config.topic_setting("audit-log", "accept.range.fetch") is False
    assert config.get("virtual.topics.enabled") is True


def test_sidecar_example():
    config = load_config(str(DEPLOY / "sidecar.properties"), [])
    assert config.get("bootstrap.servers") == [("127.0.0.1", 9092)]
    assert config.get("sidecar.node.addresses") == {
        node: (f"kafka-{node}.example.internal", 9192) for node in (1, 2, 3)}
    assert config.advertised_host == "kafka-1.example.internal"
    # an override per host, as the file says
    other = load_config(str(DEPLOY / "sidecar.properties"), ["advertised.host=kafka-2.example.internal"])
    assert other.advertised_host == "kafka-2.example.internal"
