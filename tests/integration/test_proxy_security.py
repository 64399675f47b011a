"""SASL passes through the proxy untouched; TLS is terminated from clients and spoken to
brokers."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from harness.clients import confluent_roundtrip
from harness.kafka_cluster import KafkaCluster
from harness.wait import wait_until

USER, PASSWORD = "alice", "alice-secret"


@pytest.fixture(scope="module")
def scram_kafka(tmp_path_factory):
    """A node with a SASL_PLAINTEXT listener accepting SCRAM-SHA-256 (credentials bootstrapped
    at format time)."""
    cluster = KafkaCluster.start(
        1,
        workdir=tmp_path_factory.mktemp("kafka-scram"),
        extra_listeners={"SASL_PLAINTEXT": "SASL_PLAINTEXT"},
        broker_properties={
            "sasl.enabled.mechanisms": "SCRAM-SHA-256",
            "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        },
        format_args=["--add-scram", f"SCRAM-SHA-256=[name={USER},password={PASSWORD}]"],
    )
    yield cluster
    cluster.close()


def _sasl_client_config(bootstrap: str, password: str) -> dict:
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": USER, "sasl.password": password}


def _produce_consume(config: dict, topic: str, count: int = 100, seen_ports: set | None = None) -> list[bytes]:
    ports, values = confluent_roundtrip(config, topic, count)
    if seen_ports is not None:
        seen_ports.update(ports)
    return values


def _authentication_error(config: dict) -> str:
    """Whatever error librdkafka reports when it tries to reach the cluster."""
    from confluent_kafka import KafkaException, Producer

    errors: list[str] = []
    producer = Producer({**config, "error_cb": lambda err: errors.append(str(err))})
    with pytest.raises(KafkaException):
        producer.list_topics(timeout=5)

    def reported() -> bool:
        producer.poll(0.2)  # error callbacks are served from poll()
        return any("Authentication" in e or "SASL" in e for e in errors)

    wait_until(reported, timeout=20, interval=0, what="authentication failure reported")
    return next(e for e in errors if "Authentication" in e or "SASL" in e)


def test_scram_authentication_through_the_proxy(scram_kafka, proxy_factory):
    sasl_bootstrap = scram_kafka.bootstrap_servers_for("SASL_PLAINTEXT")
    proxy = proxy_factory(scram_kafka, bootstrap=sasl_bootstrap)
    topic = f"scram-{uuid.uuid4().hex[:8]}"
    seen: set[int] = set()
    values = _produce_consume(_sasl_client_config(proxy.bootstrap_servers, PASSWORD), topic, seen_ports=seen)
    assert sorted(values) == sorted(f"v{i}".encode() for i in range(100))
    real = {port for node in scram_kafka.nodes for port in node.listener_ports.values()}
    assert seen and not seen & real

    direct = _authentication_error(_sasl_client_config(sasl_bootstrap, "wrong"))
    proxied = _authentication_error(_sasl_client_config(proxy.bootstrap_servers, "wrong"))
    assert "Authentication failed" in direct and "Authentication failed" in proxied


def _self_signed(directory: Path) -> tuple[Path, Path, Path]:
    key, cert = directory / "key.pem", directory / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True,
    )
    bundle = directory / "keystore.pem"
    bundle.write_text(key.read_text() + cert.read_text())
    return key, cert, bundle


@pytest.fixture(scope="module")
def tls_material(tmp_path_factory):
    return _self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_kafka(tmp_path_factory, tls_material):
    _key, _cert, bundle = tls_material
    cluster = KafkaCluster.start(
        1,
        workdir=tmp_path_factory.mktemp("kafka-tls"),
        extra_listeners={"SSL": "SSL"},
        broker_properties={
            "listener.name.ssl.ssl.keystore.type": "PEM",
            "listener.name.ssl.ssl.keystore.location": str(bundle),
        },
    )
    yield cluster
    cluster.close()


def test_tls_from_clients_and_to_brokers(tls_kafka, tls_material, proxy_factory):
    key, cert, _bundle = tls_material
    proxy = proxy_factory(
        tls_kafka,
        bootstrap=tls_kafka.bootstrap_servers_for("SSL"),
        ssl_listener_enabled="true", ssl_listener_certfile=str(key.with_name("cert.pem")),
        ssl_listener_keyfile=str(key),
        ssl_upstream_enabled="true", ssl_upstream_cafile=str(cert),
    )
    config = {"bootstrap.servers": proxy.bootstrap_servers, "security.protocol": "SSL",
              "ssl.ca.location": str(cert)}
    values = _produce_consume(config, f"tls-{uuid.uuid4().hex[:8]}")
    assert sorted(values) == sorted(f"v{i}".encode() for i in range(100))


def test_plaintext_client_on_tls_listener_is_refused_alone(tls_kafka, tls_material, proxy_factory):
    import socket

    key, cert, _bundle = tls_material
    proxy = proxy_factory(
        tls_kafka, bootstrap=tls_kafka.bootstrap_servers_for("SSL"),
        ssl_listener_enabled="true", ssl_listener_certfile=str(cert), ssl_listener_keyfile=str(key),
        ssl_upstream_enabled="true", ssl_upstream_cafile=str(cert),
    )
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=15) as sock:
        sock.sendall(b"\x00\x00\x00\x0a" + b"\x00" * 10)  # a Kafka frame, not a TLS hello

        def closed() -> bool:
            try:
                return sock.recv(4096) == b""  # a TLS alert may come first, then the close
            except ConnectionResetError:
                return True

        wait_until(closed, timeout=20, interval=0, what="proxy closes the plaintext connection")
    config = {"bootstrap.servers": proxy.bootstrap_servers, "security.protocol": "SSL", "ssl.ca.location": str(cert)}
    values = _produce_consume(config, f"tls-{uuid.uuid4().hex[:8]}", count=10)
    assert len(values) == 10
