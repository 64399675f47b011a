"""Reloading a running proxy's settings (SIGHUP) under real TLS traffic: a rotated listener
certificate is what new connections get while the clients already connected lose nothing; a
bad file is refused whole, the old certificate still served; a new log level and a new
per-topic setting take effect; a restart-only setting is reported and kept."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import ssl
import threading
import time
import uuid
from pathlib import Path

import pytest

from harness.certificates import make_ca, make_server_cert, served_serial
from harness.raw_client import RawClient
from harness.wait import wait_until
from proxy.ranges import equal_shares

OLD_SERIAL, NEW_SERIAL, OTHER_SERIAL = 1001, 1002, 1003


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    directory = tmp_path_factory.mktemp("reload-tls")
    ca = make_ca(directory)
    return (ca, make_server_cert(ca, directory, OLD_SERIAL), make_server_cert(ca, directory, NEW_SERIAL),
            make_server_cert(ca, directory, OTHER_SERIAL))


def _replace(source: Path, target: Path) -> None:
    """``target`` gets ``source``'s contents at once (rename), as deployment tools rotate files."""
    staged = target.with_name(target.name + ".new")
    shutil.copy(source, staged)
    os.replace(staged, target)


def _write(path: Path, lines: dict[str, str]) -> None:
    staged = path.with_name(path.name + ".new")
    staged.write_text("".join(f"{key}={value}\n" for key, value in lines.items()))
    os.replace(staged, path)


def _tls_settings(cert: Path, key: Path) -> dict[str, str]:
    return {"ssl.listener.enabled": "true", "ssl.listener.certfile": str(cert), "ssl.listener.keyfile": str(key)}


def _reloaded(proxy, result: str, count: int) -> None:
    wait_until(lambda: proxy.metric("kafka_proxy_config_reloads_total", result=result) >= count,
               timeout=30, what=f"{count} reload(s) {result}")


class Traffic:
    """A confluent-kafka producer and a group consumer over TLS, each on its own thread:
    what the broker acknowledged, and what the consumer received. ``stop`` ends the
    producer, then lets the consumer catch up with every acknowledged record (60 s at most)."""

    def __init__(self, bootstrap: str, cafile: Path, topic: str) -> None:
        self.tls = {"bootstrap.servers": bootstrap, "security.protocol": "SSL", "ssl.ca.location": str(cafile)}
        self.topic = topic
        self.acknowledged: list[bytes] = []
        self.received: list[bytes] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._produced = threading.Event()  # every acknowledgement is in
        self._producer = threading.Thread(target=self._produce, daemon=True)
        self._consumer = threading.Thread(target=self._consume, daemon=True)

    def start(self) -> Traffic:
        self._producer.start()
        self._consumer.start()
        return self

    def _produce(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({**self.tls, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
                             "message.timeout.ms": 60000})

        def on_delivery(err, msg) -> None:
            if err is None:
                self.acknowledged.append(msg.value())
            else:
                self.errors.append(str(err))

        for i in range(1_000_000):  # bounded; ``stop`` ends it long before
            if self._stop.is_set():
                break
            producer.produce(self.topic, key=str(i % 13).encode(), value=f"v-{i}".encode(), on_delivery=on_delivery)
            producer.poll(0.005)
        remaining = producer.flush(60)
        if remaining:
            self.errors.append(f"{remaining} records unacknowledged at the end")

    def _consume(self) -> None:
        from confluent_kafka import Consumer

        consumer = Consumer({**self.tls, "group.id": f"reload-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest"})
        consumer.subscribe([self.topic])
        seen: set[bytes] = set()
        deadline = None
        try:
            for _ in range(10_000_000):  # bounded; ends when caught up after ``stop``
                message = consumer.poll(0.2)
                if message is not None and not message.error():
                    self.received.append(message.value())
                    seen.add(message.value())
                if self._produced.is_set():
                    deadline = deadline or time.monotonic() + 60
                    if seen.issuperset(self.acknowledged) or time.monotonic() > deadline:
                        break
        finally:
            consumer.close()

    def stop(self) -> None:
        self._stop.set()
        self._producer.join(timeout=120)
        assert not self._producer.is_alive(), "the producer did not end"
        self._produced.set()
        self._consumer.join(timeout=120)
        assert not self._consumer.is_alive(), "the consumer did not end"


def test_a_rotated_certificate_is_served_to_new_connections_while_traffic_goes_on(
        kafka, proxy_factory, topic_factory, certificates, tmp_path):
    ca, old, new, other = certificates
    cert, key = tmp_path / "listener.pem", tmp_path / "listener.key"
    shutil.copy(old.cert, cert)
    shutil.copy(old.key, key)
    properties = tmp_path / "proxy.properties"
    _write(properties, _tls_settings(cert, key))
    proxy = proxy_factory(kafka, config_file=properties, metrics_port="0")
    assert served_serial("127.0.0.1", proxy.port, ca.cert) == OLD_SERIAL

    topic = topic_factory(kafka, partitions=3)
    traffic = Traffic(proxy.bootstrap_servers, ca.cert, topic).start()
    try:
        wait_until(lambda: len(traffic.acknowledged) >= 300 and len(traffic.received) >= 100, timeout=60,
                   what=lambda: f"traffic before the rotation ({len(traffic.acknowledged)} acknowledged, "
                                f"{len(traffic.received)} received, errors {traffic.errors[:3]})")
        # the certificate is rotated in place (same paths), then the proxy told
        _replace(new.cert, cert)
        _replace(new.key, key)
        proxy.process.send_signal(signal.SIGHUP)
        _reloaded(proxy, "ok", 1)
        assert served_serial("127.0.0.1", proxy.port, ca.cert) == NEW_SERIAL
        for node_port in proxy.node_ports.values():
            assert served_serial("127.0.0.1", node_port, ca.cert) == NEW_SERIAL
        assert "listener certificate reloaded certfile=" in proxy.log_text()

        # a bad file: a key that does not match its certificate; refused whole, the new certificate still served
        _write(properties, {**_tls_settings(other.cert, old.key), "max.connections": "1"})
        proxy.process.send_signal(signal.SIGHUP)
        _reloaded(proxy, "refused", 1)
        refusal = (f"settings reload refused trigger=SIGHUP source={properties} reason=ssl.listener.keyfile: the key "
                   f"in {str(old.key)!r} does not match the certificate in {str(other.cert)!r}; every setting in "
                   f"force stays as it was (generation 2)")
        assert refusal in proxy.log_text()
        assert served_serial("127.0.0.1", proxy.port, ca.cert) == NEW_SERIAL
        assert proxy.metric("kafka_proxy_config_generation") == 2
        # max.connections=1 was not put in force either: beside the clients' connections, two more are served
        client_tls = ssl.create_default_context(cafile=str(ca.cert))
        with client_tls.wrap_socket(socket.create_connection(("127.0.0.1", proxy.port), timeout=10),
                                    server_hostname="127.0.0.1"):
            assert served_serial("127.0.0.1", proxy.port, ca.cert) == NEW_SERIAL

        # the clients already connected kept going throughout
        before = len(traffic.acknowledged)
        wait_until(lambda: len(traffic.acknowledged) >= before + 300, timeout=60,
                   what="traffic after the reloads")
    finally:
        traffic.stop()
    assert traffic.errors == []
    acknowledged = set(traffic.acknowledged)
    assert len(acknowledged) == len(traffic.acknowledged), "every record acknowledged once"
    assert acknowledged <= set(traffic.received), (
        f"{len(acknowledged - set(traffic.received))} acknowledged records never delivered")
    assert proxy.metric("kafka_proxy_connection_errors_total", kind="tls_handshake") == 0
    print(f"\ncertificate rotated under live TLS traffic: serial {OLD_SERIAL:#x} -> {NEW_SERIAL:#x} on the bootstrap "
          f"and {len(proxy.node_ports)} node port(s); a mismatched key refused, the new certificate kept; "
          f"{len(acknowledged)} records acknowledged, all delivered, 0 client errors, 0 failed handshakes")


def _handshake_failure(proxy, count: int) -> None:
    """A client that speaks plaintext to the TLS port: its handshake fails (an INFO line)."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(b"\x00\x00\x00\x10not a tls hello!")
        wait_until(lambda: proxy.metric("kafka_proxy_connection_errors_total", kind="tls_handshake") >= count,
                   timeout=30, what=f"{count} failed handshakes counted")


def _handshake_lines(proxy) -> int:
    return proxy.log_text().count("TLS handshake failed peer=")


def test_a_new_log_level_and_a_new_topic_setting_take_effect(kafka, proxy_factory, topic_factory, certificates,
                                                             tmp_path):
    from confluent_kafka import Producer

    ca, old, _, _ = certificates
    topic = topic_factory(kafka)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for i in range(20):
        producer.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode())
    assert producer.flush(30) == 0

    properties = tmp_path / "proxy.properties"
    settings = {**_tls_settings(old.cert, old.key), "log.level": "INFO", f"topic.{topic}.key.range.fetch.enabled": "true"}
    _write(properties, settings)
    proxy = proxy_factory(kafka, config_file=properties, metrics_port="0")
    client_tls = ssl.create_default_context(cafile=str(ca.cert))

    def range_fetch_error() -> int:
        with RawClient.connect(proxy.bootstrap_servers, ssl_context=client_tls) as raw:
            return raw.range_fetch(raw.topic_id(topic), 0, 0, equal_shares(2)[:1]).error_code

    assert range_fetch_error() == 0
    _handshake_failure(proxy, 1)
    assert _handshake_lines(proxy) == 1

    # WARNING: the INFO line of a failed handshake is no longer written; the topic refuses key-range fetches;
    # node.port.base cannot change while running: reported, kept
    _write(properties, {**settings, "log.level": "WARNING", f"topic.{topic}.key.range.fetch.enabled": "false",
                        "node.port.base": "40000"})
    proxy.process.send_signal(signal.SIGHUP)
    _reloaded(proxy, "ok", 1)
    log = proxy.log_text()
    assert "setting reloaded key=log.level old=INFO new=WARNING" in log
    assert f"setting reloaded key=topic.{topic}.key.range.fetch.enabled old=true new=false" in log
    # in force: 0 in one process; listen.port + 1, as the supervisor hands it out, in a worker
    assert re.search(r"setting not reloaded key=node\.port\.base in_force=\d+ read=40000 "
                     r"reason=changing it needs a restart", log)
    assert proxy.metric("kafka_proxy_config_restart_pending") == 1
    assert range_fetch_error() == 42  # INVALID_REQUEST: the topic does not accept range fetches
    _handshake_failure(proxy, 2)
    assert _handshake_lines(proxy) == 1

    # back to INFO, and the topic serves key-range fetches again
    _write(properties, settings)
    proxy.process.send_signal(signal.SIGHUP)
    _reloaded(proxy, "ok", 2)
    assert range_fetch_error() == 0
    _handshake_failure(proxy, 3)
    assert _handshake_lines(proxy) == 2
    assert proxy.metric("kafka_proxy_config_generation") == 3
    assert proxy.metric("kafka_proxy_config_restart_pending") == 0
