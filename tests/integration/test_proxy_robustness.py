"""Hostile and careless clients hurt only themselves; the proxy and its other clients go on."""

from __future__ import annotations

import select
import socket
import struct
import time
import urllib.request

import psutil
import pytest

from harness.wait import wait_until
from proxy.protocol import messages
from proxy.protocol.messages import ApiKey


def _connect(proxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _metadata_request(correlation_id: int, version: int = 12) -> bytes:
    header = messages.new_request_header(ApiKey.METADATA, version, correlation_id=correlation_id, client_id="probe")
    body = messages.new_body(ApiKey.METADATA, version, "request", topics=None, allow_auto_topic_creation=False)
    frame = messages.encode_request(header, body)
    return struct.pack(">i", len(frame)) + frame


def _read_frame(sock: socket.socket) -> bytes:
    def exact(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    (size,) = struct.unpack(">i", exact(4))
    return exact(size)


def _is_closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _healthy(proxy) -> bool:
    """A well-behaved client gets a correct Metadata answer through the proxy."""
    with _connect(proxy) as sock:
        sock.sendall(_metadata_request(42))
        frame = _read_frame(sock)
    _header, body = messages.decode_response(ApiKey.METADATA, 12, frame)
    assert _header.correlation_id == 42
    assert {b.port for b in body.brokers} <= {proxy.port, *proxy.node_ports.values()}
    return True


def _producer_roundtrip(proxy, topic: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap_servers, acks="all")
    producer.send(topic, b"still-fine").get(30)
    producer.close()
    consumer = KafkaConsumer(topic, bootstrap_servers=proxy.bootstrap_servers, auto_offset_reset="earliest",
                             consumer_timeout_ms=15000)
    first = next(iter(consumer), None)  # stops at the first record instead of idling out
    consumer.close()
    assert first is not None and first.value == b"still-fine"


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(b"\x00\x00\x00\x08" + b"\xff" * 8, id="bad-header"),
        pytest.param(struct.pack(">i", -3), id="negative-size"),
        pytest.param(struct.pack(">i", 6) + b"\x00\x03\x00\x0c\x00\x00", id="truncated-header"),
        pytest.param(struct.pack(">i", 14) + struct.pack(">hhih", 3, 999, 1, 0) + b"\x00\x00\x00\x00", id="unknown-version"),
    ],
)
def test_malformed_frame_closes_only_that_connection(proxy, garbage):
    bystander = _connect(proxy)
    bystander.sendall(_metadata_request(1))
    _read_frame(bystander)
    with _connect(proxy) as bad:
        bad.sendall(garbage)
        wait_until(lambda: _is_closed(bad), timeout=15, what="proxy closes the malformed connection")
    bystander.sendall(_metadata_request(2))
    frame = _read_frame(bystander)
    assert messages.decode_response(ApiKey.METADATA, 12, frame)[0].correlation_id == 2
    bystander.close()
    assert _healthy(proxy)


def test_frame_above_cap_is_refused_before_buffering(kafka, proxy_factory):
    small = proxy_factory(kafka, max_frame_bytes="65536")
    process = psutil.Process(small.pid)
    rss_before = process.memory_info().rss
    with _connect(small) as sock:
        sock.sendall(struct.pack(">i", 1_000_000_000) + b"\x00" * 1024)
        wait_until(lambda: _is_closed(sock), timeout=15, what="oversized frame refused")
    assert process.memory_info().rss - rss_before < 20 * 1024 * 1024
    assert "exceeds the 65536-byte limit" in small.log_text()
    assert _healthy(small)


def test_client_that_stops_reading_is_bounded(kafka, proxy_factory):
    """A client pipelines requests and never reads: the proxy stops reading it once
    max.inflight.requests.per.connection are waiting, instead of buffering responses."""
    slow = proxy_factory(kafka, max_inflight_requests_per_connection="8")
    process = psutil.Process(slow.pid)
    rss_before = process.memory_info().rss
    sock = _connect(slow)
    sock.setblocking(False)
    burst = _metadata_request(7) * 2000
    sent_bytes = 0
    limit = 512 * 1024 * 1024
    deadline = time.monotonic() + 60
    blocked = False
    while time.monotonic() < deadline and sent_bytes < limit:
        try:
            sent_bytes += sock.send(burst)
        except BlockingIOError:
            # Kernel buffers on both sides are full: confirm it stays that way.
            try:
                time.sleep(0.5)
                sent_bytes += sock.send(burst)
            except BlockingIOError:
                blocked = True
                break
    assert blocked, f"the proxy kept reading a client that never reads ({sent_bytes} bytes taken)"
    assert process.memory_info().rss - rss_before < 64 * 1024 * 1024
    assert _healthy(slow)
    sock.close()


def test_thousand_idle_connections(kafka, proxy, new_topic):
    sockets = []
    try:
        for _ in range(1000):
            sockets.append(socket.create_connection(("127.0.0.1", proxy.port), timeout=10))
        assert _healthy(proxy)
        _producer_roundtrip(proxy, new_topic)
    finally:
        for sock in sockets:
            sock.close()
    assert _healthy(proxy)


def _quiet_until(sock: socket.socket, deadline: float) -> None:
    """Fail if the proxy sends anything or closes ``sock`` before ``deadline`` (monotonic)."""
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([sock], [], [], left)
        assert not readable, f"the proxy closed or wrote to the connection {left:.2f} s before the deadline"


def test_idle_connection_is_closed(kafka, proxy_factory):
    """An active connection stays open past the idle timeout; once it falls silent it stays
    open until the timeout has passed, and is closed after it."""
    idle = 2.0
    short = proxy_factory(kafka, connections_max_idle_ms=str(int(idle * 1000)))
    with _connect(short) as sock:
        # Active for twice the idle timeout: a request every quarter of it, each answered.
        for correlation_id in range(1, 9):
            sock.sendall(_metadata_request(correlation_id))
            _read_frame(sock)
            _quiet_until(sock, time.monotonic() + idle / 4)
        sock.sendall(_metadata_request(100))
        _read_frame(sock)
        last_answer = time.monotonic()
        # Silent, but well inside the timeout: still open.
        _quiet_until(sock, last_answer + idle / 2)
        wait_until(lambda: _is_closed(sock), timeout=15, interval=0.05, what="idle connection closed")
        silent_for = time.monotonic() - last_answer
    # The proxy counts idleness from when it sent the last answer, a moment before it arrived.
    assert silent_for >= idle - 0.1, f"closed after {silent_for:.2f} s of silence, before the {idle} s timeout"


def test_max_connections_refuses_extra_clients(kafka, proxy_factory):
    capped = proxy_factory(kafka, max_connections="3", workers="1")  # the limit of each worker
    held = [_connect(capped) for _ in range(3)]
    try:
        for sock in held:
            sock.sendall(_metadata_request(1))
            _read_frame(sock)
        with _connect(capped) as extra:
            wait_until(lambda: _is_closed(extra), timeout=15, what="connection beyond max.connections refused")
    finally:
        for sock in held:
            sock.close()
    wait_until(lambda: _healthy(capped), timeout=15, what="proxy accepts again once connections close")


def test_metrics_endpoint_counts_requests(proxy):
    assert _healthy(proxy)
    text = urllib.request.urlopen(proxy.metrics_url, timeout=10).read().decode()
    assert 'kafka_proxy_requests_total{api="Metadata"}' in text
    assert "kafka_proxy_request_latency_seconds_bucket" in text
    assert "kafka_proxy_client_connections " in text


def test_sigterm_drains_and_exits_cleanly(kafka, proxy_factory, new_topic):
    doomed = proxy_factory(kafka)
    _producer_roundtrip(doomed, new_topic)
    assert doomed.stop(timeout=30) == 0
    assert "proxy stopped" in doomed.log_text()


def test_bad_configuration_fails_with_a_clear_message(kafka, tmp_path):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "proxy.server.cli", "--bootstrap-server", kafka.bootstrap_servers,
         "--override", "max.inflight.requests.per.connection=0"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "keyrange-proxy: configuration error: max.inflight.requests.per.connection: must be at least 1 (got '0')"
    )


def test_the_proxy_starts_before_its_broker_and_serves_once_it_answers(kafka, new_topic, tmp_path):
    """A sidecar often starts first: the proxy listens at once, keeps trying the cluster
    with backoff, closes (retriable for every client) what arrives meanwhile, and serves
    normally once a broker answers."""
    import subprocess
    import sys

    from harness.raw_client import RawClient
    from proxy.local_kafka import ProxyProcess

    with socket.socket() as probe:  # a loopback port with nothing behind it yet
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proxy = ProxyProcess.start(f"127.0.0.1:{port}", overrides={"upstream.connect.timeout.ms": "1000"},
                               workdir=tmp_path / "proxy")
    relay = None
    try:
        wait_until(lambda: proxy.log_text().count("cluster unreachable") >= 2, timeout=30,
                   what="two logged attempts to reach the cluster")
        assert proxy.process.poll() is None
        early = _connect(proxy)
        early.sendall(_metadata_request(1))
        started = time.monotonic()
        with pytest.raises(ConnectionError):
            _read_frame(early)  # held for upstream.connect.timeout.ms, then closed: no hang, no answer
        assert time.monotonic() - started >= 0.5
        early.close()
        # The broker "comes up" at the bootstrap address: a plain TCP relay to the real one.
        relay = subprocess.Popen([sys.executable, "-m", "benchmarks.bare_relay", str(port), kafka.bootstrap_servers])
        wait_until(lambda: "cluster reached" in proxy.log_text(), timeout=60, what="the proxy reaching the cluster")
        with RawClient.connect(proxy.bootstrap_servers) as raw:
            assert raw.topic_id(new_topic) is not None
        assert proxy.process.poll() is None
    finally:
        if relay is not None:
            relay.terminate()
            relay.wait(10)
        assert proxy.stop() == 0


def test_sigterm_answers_requests_in_flight_before_closing(kafka, proxy_factory, new_topic):
    """A long-poll Fetch is waiting at the broker when SIGTERM arrives: its response still
    reaches the client, then the connection closes and the proxy exits cleanly."""
    from harness.raw_client import RawClient

    draining = proxy_factory(kafka)
    with RawClient.connect(draining.bootstrap_servers) as raw:
        topic_id = raw.topic_id(new_topic)
        cls = messages.body_class(ApiKey.FETCH, "request")
        body = messages.new_body(
            ApiKey.FETCH, 17, "request", max_wait_ms=3000, min_bytes=1, max_bytes=1024, session_id=0,
            session_epoch=-1,
            topics=[cls.FetchTopic(topic_id=topic_id, partitions=[
                cls.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1024)])],
        )
        correlation = raw.send(ApiKey.FETCH, 17, body)  # empty topic: the broker holds it max_wait_ms
        draining.process.send_signal(__import__("signal").SIGTERM)
        header, response = messages.decode_response(ApiKey.FETCH, 17, raw.receive())
        assert header.correlation_id == correlation
        assert response.error_code == 0
        wait_until(lambda: _is_closed(raw.sock), timeout=15, what="connection closed after the drain")
    assert draining.process.wait(30) == 0
