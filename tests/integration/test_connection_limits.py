"""Connection load against the real broker: max.connections refuses cleanly at the limit,
slow and silent clients are closed on time (connections.setup.timeout.ms before their
first request, or before SASL is over; connections.max.idle.ms after it), and well-behaved
clients of the same proxy notice none of it."""

from __future__ import annotations

import concurrent.futures
import select
import socket
import struct
import time
import uuid

import pytest

from harness.clients import confluent_roundtrip
from harness.kafka_cluster import KafkaCluster
from harness.wait import wait_until
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey

from .test_proxy_robustness import _read_frame
from .test_proxy_security import PASSWORD, USER, _sasl_client_config

SLACK = 2.0  # seconds beyond a timeout within which the proxy must have closed the connection
PRODUCE = messages.body_class(ApiKey.PRODUCE, "request")
METADATA_TOPIC = messages.body_class(ApiKey.METADATA, "request").MetadataRequestTopic


# -- raw Kafka requests over plain sockets ----------------------------------------------------
def _frame(api_key: int, version: int, correlation_id: int, **fields) -> bytes:
    header = messages.new_request_header(api_key, version, correlation_id, "limits-probe")
    body = messages.encode_request(header, messages.new_body(api_key, version, "request", **fields))
    return struct.pack(">i", len(body)) + body


def _api_versions(correlation_id: int) -> bytes:
    return _frame(ApiKey.API_VERSIONS, 3, correlation_id, client_software_name="probe", client_software_version="1")


def _metadata(correlation_id: int, topics: int = 0) -> bytes:
    return _frame(ApiKey.METADATA, 12, correlation_id, allow_auto_topic_creation=False,
                  topics=[METADATA_TOPIC(name=f"no-such-topic-{i:08d}") for i in range(topics)])


def _large_produce(correlation_id: int, record_bytes: int) -> bytes:
    data = PRODUCE.PartitionProduceData(index=0, records=b"\x00" * record_bytes)
    return _frame(ApiKey.PRODUCE, 9, correlation_id, transactional_id=None, acks=1, timeout_ms=30000,
                  topic_data=[PRODUCE.TopicProduceData(name="nowhere", partition_data=[data])])


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _ask(sock: socket.socket, request: bytes, correlation_id: int) -> bytes:
    sock.sendall(request)
    frame = _read_frame(sock)
    assert struct.unpack_from(">i", frame)[0] == correlation_id
    return frame


def _metadata_answered(sock: socket.socket, correlation_id: int) -> bool:
    frame = _ask(sock, _metadata(correlation_id), correlation_id)
    header, body = messages.decode_response(ApiKey.METADATA, 12, frame)
    return header.correlation_id == correlation_id and len(body.brokers) >= 1


class Closed(Exception):
    """Raised by ``_watch`` for a socket that got bytes instead of being closed."""


def _watch(sockets: dict[socket.socket, bytes], timeout: float, every: float = 0.2) -> dict[socket.socket, float]:
    """Trickle each socket's bytes (one byte per ``every`` seconds; none for b"") until the
    proxy closes it; the monotonic time each one was seen closed. Fails if the proxy sends
    anything, or if a socket is still open ``timeout`` seconds from now."""
    deadline = time.monotonic() + timeout
    sent = dict.fromkeys(sockets, 0)
    next_send = dict.fromkeys(sockets, time.monotonic())
    closed: dict[socket.socket, float] = {}
    while len(closed) < len(sockets):
        now = time.monotonic()
        assert now < deadline, f"{len(sockets) - len(closed)} connection(s) still open after {timeout} s"
        for sock, data in sockets.items():
            if sock in closed or sent[sock] >= len(data) or now < next_send[sock]:
                continue
            try:
                sock.send(data[sent[sock]:sent[sock] + 1])
            except (BrokenPipeError, ConnectionResetError):
                closed[sock] = now
                continue
            sent[sock] += 1
            next_send[sock] = now + every
        waiting = [sock for sock in sockets if sock not in closed]
        pending = [next_send[s] for s in waiting if sent[s] < len(sockets[s])]
        wake = min([deadline, *pending])
        readable, _, _ = select.select(waiting, [], [], max(0.0, wake - time.monotonic()))
        for sock in readable:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if chunk:
                raise Closed(f"the proxy answered instead of closing: {chunk[:40]!r}")
            closed[sock] = time.monotonic()
    return closed


# -- max.connections ---------------------------------------------------------------------------
def test_max_connections_refuses_the_one_beyond_and_admits_again_after_a_close(kafka, proxy_factory):
    limit = 20
    # the limit holds for each worker (each its own memory): one worker, so one limit to reach
    proxy = proxy_factory(kafka, max_connections=str(limit), metrics_port="0", workers="1")
    def refused() -> float:
        return proxy.metric("kafka_proxy_client_connections_refused_total", reason="max_connections")

    held = [_connect(proxy.port) for _ in range(limit)]
    extra: list[socket.socket] = []
    try:
        for index, sock in enumerate(held):
            _ask(sock, _api_versions(index), index)  # each holds an upstream connection now
        assert proxy.metric("kafka_proxy_client_connections") == limit

        # The 21st: accepted by the kernel, then closed by the proxy without a byte of answer.
        beyond = _connect(proxy.port)
        extra.append(beyond)
        beyond.sendall(_api_versions(99))
        _watch({beyond: b""}, timeout=10)
        assert refused() == 1

        # The 20 are untouched.
        for index, sock in enumerate(held):
            assert _metadata_answered(sock, 1000 + index)

        # A storm of refusals is counted in full and logged a few times, not once each.
        storm = [_connect(proxy.port) for _ in range(50)]
        extra += storm
        _watch(dict.fromkeys(storm, b""), timeout=15)
        assert refused() == 51
        lines = [line for line in proxy.log_text().splitlines() if "refusing connection" in line]
        assert 1 <= len(lines) <= 3, lines
        assert "max.connections (20) reached" in lines[0]

        # One of the 20 leaves: a new client gets its place once the proxy has seen it go.
        held.pop().close()
        wait_until(lambda: proxy.metric("kafka_proxy_client_connections") == limit - 1, timeout=10,
                   interval=0.05, what="the proxy saw a held connection close")
        newcomer = _connect(proxy.port)
        held.append(newcomer)
        _ask(newcomer, _api_versions(7), 7)
        assert _metadata_answered(newcomer, 8)
        assert refused() == 51
    finally:
        for sock in held + extra:
            sock.close()


# -- connections.setup.timeout.ms --------------------------------------------------------------
def test_silent_and_trickling_clients_are_closed_at_the_setup_timeout_while_a_real_client_works(
        kafka, proxy_factory, new_topic):
    setup = 1.0
    proxy = proxy_factory(kafka, connections_setup_timeout_ms=str(int(setup * 1000)), metrics_port="0")
    first = _metadata(1, topics=10)
    assert len(first) * 0.2 > 2 * setup  # trickled at 5 bytes/s it could not arrive in time
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        silent, trickler = _connect(proxy.port), _connect(proxy.port)
        opened = time.monotonic()
        # A librdkafka producer and consumer group through the same proxy meanwhile.
        roundtrip = pool.submit(confluent_roundtrip, {"bootstrap.servers": proxy.bootstrap_servers}, new_topic, 200)
        closed = _watch({silent: b"", trickler: first}, timeout=setup + SLACK + 5)
        _, values = roundtrip.result(timeout=120)
    for sock in (silent, trickler):
        sock.close()
        assert setup - 0.05 <= closed[sock] - opened <= setup + SLACK, closed[sock] - opened
    assert len(values) == 200
    assert proxy.metric("kafka_proxy_client_connections_closed_total", reason="setup_timeout") == 2
    lines = [line for line in proxy.log_text().splitlines() if "closing connection not set up in time" in line]
    assert 1 <= len(lines) <= 2, lines  # two at once: the second may be held back (one line per 10 s)


# -- connections.max.idle.ms after the first request --------------------------------------------
@pytest.mark.parametrize("virtual_topics", ["true", "false"])
def test_after_a_first_request_silence_and_partial_frames_are_closed_at_the_idle_timeout(
        kafka, proxy_factory, virtual_topics):
    """With virtual topics off no feature reads Produce, so a large one is passed on to the
    broker while it arrives; trickling its body must not hold the connection open either."""
    idle = 1.0
    proxy = proxy_factory(kafka, connections_max_idle_ms=str(int(idle * 1000)), metrics_port="0",
                          virtual_topics_enabled=virtual_topics)
    silent, partial, large = (_connect(proxy.port) for _ in range(3))
    answered = {}
    for index, sock in enumerate((silent, partial, large)):
        _ask(sock, _api_versions(index), index)
        answered[sock] = time.monotonic()
    second = _metadata(10, topics=10)
    partial.sendall(second[:6])  # the size prefix and a little of the header, then a byte every 200 ms
    produce = _large_produce(11, 1024 * 1024)
    large.sendall(produce[:16 * 1024])  # enough to route it; then its body a byte every 200 ms
    closed = _watch({silent: b"", partial: second[6:], large: produce[16 * 1024:]}, timeout=idle + SLACK + 5)
    for sock in (silent, partial, large):
        sock.close()
        assert idle - 0.05 <= closed[sock] - answered[sock] <= idle + SLACK, closed[sock] - answered[sock]
    assert proxy.metric("kafka_proxy_client_connections_closed_total", reason="idle") == 3
    assert proxy.metric("kafka_proxy_client_connections_closed_total", reason="setup_timeout") == 0


# -- SASL: setup lasts until authentication is over ---------------------------------------------
@pytest.fixture(scope="module")
def sasl_kafka(tmp_path_factory):
    """One node whose SASL_PLAINTEXT listener takes SCRAM-SHA-256 for USER (as the security
    tests' node)."""
    cluster = KafkaCluster.start(
        1, workdir=tmp_path_factory.mktemp("kafka-sasl-limits"),
        extra_listeners={"SASL_PLAINTEXT": "SASL_PLAINTEXT"},
        broker_properties={"sasl.enabled.mechanisms": "SCRAM-SHA-256",
                           "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config":
                               "org.apache.kafka.common.security.scram.ScramLoginModule required;"},
        format_args=["--add-scram", f"SCRAM-SHA-256=[name={USER},password={PASSWORD}]"],
    )
    yield cluster
    cluster.close()


def _sasl_handshake(correlation_id: int) -> bytes:
    return _frame(ApiKey.SASL_HANDSHAKE, 1, correlation_id, mechanism="SCRAM-SHA-256")


def _sasl_authenticate(correlation_id: int, token: bytes) -> bytes:
    return _frame(ApiKey.SASL_AUTHENTICATE, 2, correlation_id, auth_bytes=token)


def test_sasl_not_finished_by_the_setup_timeout_is_closed_while_sasl_clients_work(sasl_kafka, proxy_factory):
    setup = 1.0
    proxy = proxy_factory(sasl_kafka, bootstrap=sasl_kafka.bootstrap_servers_for("SASL_PLAINTEXT"),
                          connections_setup_timeout_ms=str(int(setup * 1000)), metrics_port="0")
    # Stalls after the handshake; stalls after the first SCRAM round, which the broker
    # answered with error code 0 (its server-first message): neither has authenticated.
    after_handshake, after_first_round = _connect(proxy.port), _connect(proxy.port)
    opened = time.monotonic()
    for sock in (after_handshake, after_first_round):
        _ask(sock, _api_versions(1), 1)
        handshake = messages.decode_response(ApiKey.SASL_HANDSHAKE, 1, _ask(sock, _sasl_handshake(2), 2))[1]
        assert handshake.error_code == 0
    client_first = f"n,,n={USER},r={uuid.uuid4().hex}".encode()
    frame = _ask(after_first_round, _sasl_authenticate(3, client_first), 3)
    round_one = messages.decode_response(ApiKey.SASL_AUTHENTICATE, 2, frame)[1]
    assert round_one.error_code == 0 and round_one.auth_bytes.startswith(b"r=")
    # A client that did ApiVersions and nothing more has set up (no SASL begun): idle rules it.
    plain = _connect(proxy.port)
    _ask(plain, _api_versions(1), 1)
    try:
        closed = _watch({after_handshake: b"", after_first_round: b""}, timeout=setup + SLACK + 5)
        for sock in (after_handshake, after_first_round):
            assert setup - 0.05 <= closed[sock] - opened <= setup + SLACK, closed[sock] - opened
        # librdkafka authenticates (SCRAM) through the same proxy and produces and consumes.
        topic = f"limits-{uuid.uuid4().hex[:8]}"
        _, values = confluent_roundtrip(_sasl_client_config(proxy.bootstrap_servers, PASSWORD), topic, 50)
        assert len(values) == 50
        readable, _, _ = select.select([plain], [], [], 0)
        assert not readable, "a connection that set up without SASL was closed by the setup timeout"
    finally:
        for sock in (after_handshake, after_first_round, plain):
            sock.close()
    assert proxy.metric("kafka_proxy_client_connections_closed_total", reason="setup_timeout") == 2
    if proxy.info.get("workers"):  # no worker could learn the nodes it alone would serve
        assert "workers share the node ports" in proxy.log_text()
