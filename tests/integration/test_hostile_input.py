"""Hostile input against the real broker: what a client declares never becomes memory, and
requests over Kafka 4.4's protocol limits never reach the broker, while well-behaved
clients of the same proxy go on working.

- Connections declaring 100 MiB frames: an authentication request (ApiVersions) before
  authentication is closed at its size prefix and API key
  (``max.frame.bytes.unauthenticated``); any other request, before authentication or after,
  holds what it really sent (a buffer of a few KiB), not what it declared. Bound asserted:
  the proxy's resident memory grows by less than 40 MiB for 200 of each kind, where
  allocating the declared sizes would take 60 GiB; what 400 held connections cost anyway
  (their buffers and tasks, and an upstream connection for the 200 past authentication)
  is about 20 MiB.
- A flexible request header declaring 5,000,000 tagged fields and requests whose arrays
  declare 2,000,000 elements: the connection is closed with a log line, no answer, and the
  request is not counted as forwarded.
"""

from __future__ import annotations

import concurrent.futures
import socket
import struct

from harness.clients import confluent_roundtrip
from harness.wait import wait_until
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import EXTENSION_TAG_BYTES
from proxy.protocol.primitives import uvarint_bytes

from .test_connection_limits import _api_versions, _ask, _connect, _metadata_answered

MIB = 1024 * 1024
HELD = 200  # connections of each kind


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _closed_without_answer(sock: socket.socket, timeout: float = 15.0) -> bool:
    """True when the proxy closes ``sock`` without sending a byte."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _send_refused(sock: socket.socket, data: bytes) -> None:
    """Send ``data``; the proxy may close the connection before all of it is sent."""
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


def _header_tag_bomb(correlation_id: int, fields: int) -> bytes:
    """An ApiVersions v3 request whose (flexible) header declares ``fields`` empty tagged
    fields, and has them all."""
    head = struct.pack(">hhih", ApiKey.API_VERSIONS, 3, correlation_id, 5) + b"bombs"
    tags = bytearray(uvarint_bytes(fields))
    for tag in range(fields):
        tags += uvarint_bytes(tag)
        tags += b"\x00"
    body = head + bytes(tags) + b"\x00\x00\x00"  # an empty body (two empty compact strings, no tags)
    return struct.pack(">i", len(body)) + body


def _array_bomb(api_key: int, version: int, correlation_id: int, prefix: bytes, elements: int,
                trailer: bytes = b"") -> bytes:
    """A flexible request whose first array (after ``prefix`` of its body) declares
    ``elements`` elements, and holds a few bytes of them (and ``trailer``)."""
    head = struct.pack(">hhih", api_key, version, correlation_id, 5) + b"array" + b"\x00"
    body = head + prefix + uvarint_bytes(elements + 1) + bytes(64) + trailer
    return struct.pack(">i", len(body)) + body


def _past_authentication(port: int, correlation_id: int) -> socket.socket:
    sock = _connect(port)
    _ask(sock, _api_versions(correlation_id), correlation_id)
    assert _metadata_answered(sock, correlation_id + 1)
    return sock


def test_declared_frame_sizes_never_become_memory_and_other_clients_work(kafka, proxy_factory, new_topic):
    proxy = proxy_factory(kafka, metrics_port="0")
    # Warm the proxy up first: the first client's work (metadata, an upstream pool, imports)
    # is not what is measured.
    assert len(confluent_roundtrip({"bootstrap.servers": proxy.bootstrap_servers}, new_topic, 50)[1]) == 50
    before = _rss(proxy.pid)
    declared = struct.pack(">i", 100 * MIB)
    unauthenticated = [_connect(proxy.port) for _ in range(HELD)]
    for sock in unauthenticated:  # ApiVersions v3, correlation id 1
        sock.sendall(declared + struct.pack(">hhi", ApiKey.API_VERSIONS, 3, 1))
    first = [_connect(proxy.port) for _ in range(HELD)]
    for sock in first:  # Produce v9 as a first request
        sock.sendall(declared + struct.pack(">hhi", ApiKey.PRODUCE, 9, 1))
    authenticated = [_past_authentication(proxy.port, 10 * i) for i in range(HELD)]
    for sock in authenticated:
        sock.sendall(declared + struct.pack(">hhi", ApiKey.PRODUCE, 9, 1))
    try:
        # Before authentication: closed at the size prefix, counted and logged.
        for sock in unauthenticated:
            assert _closed_without_answer(sock)
        wait_until(lambda: proxy.metric("kafka_proxy_frames_refused_total",
                                        limit="max.frame.bytes.unauthenticated") == HELD,
                   timeout=15, interval=0.1, what="every unauthenticated 100 MiB frame refused")
        lines = [line for line in proxy.log_text().splitlines()
                 if "exceeds the 524288-byte limit (max.frame.bytes.unauthenticated)" in line]
        assert 1 <= len(lines) <= 3, len(lines)  # a crowd is logged a line at a time, with its count
        # The others: every connection is still open, waiting for the rest of its frame, and
        # holds at most a few KiB of the budget for it.
        for sock in first + authenticated:
            sock.setblocking(False)
            try:
                got = sock.recv(1)
            except BlockingIOError:
                continue
            raise AssertionError(f"a held connection got {got!r}")
        held = proxy.metric("kafka_proxy_request_bytes_held")
        assert held <= 2 * HELD * 64 * 1024, held
        grown = _rss(proxy.pid) - before
        assert grown < 40 * MIB, f"resident memory grew {grown / MIB:.1f} MiB"
        # Meanwhile a librdkafka producer and group consumer through the same proxy.
        _, values = confluent_roundtrip({"bootstrap.servers": proxy.bootstrap_servers}, new_topic, 300)
        assert len(values) == 300
    finally:
        for sock in unauthenticated + first + authenticated:
            sock.close()
    # Their frames leave the budget with them.
    wait_until(lambda: proxy.metric("kafka_proxy_request_bytes_held") == 0, timeout=15, interval=0.1,
               what="the budget freed")


def test_protocol_bombs_are_refused_before_the_broker_and_other_clients_work(kafka, proxy_factory, new_topic):
    proxy = proxy_factory(kafka, metrics_port="0")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        roundtrip = pool.submit(confluent_roundtrip, {"bootstrap.servers": proxy.bootstrap_servers}, new_topic, 300)
        # 5,000,000 tagged fields in a request header, after authentication (the frame is
        # too large before it: the size limit refuses it first, see below).
        bomb = _header_tag_bomb(900, 5_000_000)
        assert len(bomb) > MIB
        sock = _past_authentication(proxy.port, 100)
        _send_refused(sock, bomb)
        assert _closed_without_answer(sock)
        sock.close()
        # Before authentication: the same bomb is too large; a smaller one (20,000 fields)
        # fits the frame limit and is refused for its fields.
        for fields, reason in ((5_000_000, "max.frame.bytes.unauthenticated"), (20_000, "tagged-field section of 20000 fields exceeds the limit of 10000")):
            sock = _connect(proxy.port)
            _send_refused(sock, _header_tag_bomb(901, fields))
            assert _closed_without_answer(sock)
            sock.close()
            assert reason in proxy.log_text()
        # 2,000,000-element arrays. Before authentication every request is read whole: a
        # first Metadata v12 whose topics declare them. After it, wherever a feature decodes
        # the request: a key-range Fetch v12 whose topics declare them.
        sock = _connect(proxy.port)
        _send_refused(sock, _array_bomb(ApiKey.METADATA, 12, 950, b"", 2_000_000))
        assert _closed_without_answer(sock), "Metadata answered"
        sock.close()
        fetch_fixed = struct.pack(">iiiib", -1, 500, 1, 1024, 0) + struct.pack(">ii", 0, -1)  # through session epoch
        sock = _past_authentication(proxy.port, 200)
        _send_refused(sock, _array_bomb(ApiKey.FETCH, 12, 951, fetch_fixed, 2_000_000, EXTENSION_TAG_BYTES))
        assert _closed_without_answer(sock), "Fetch answered"
        sock.close()
        _, values = roundtrip.result(timeout=120)
    assert len(values) == 300
    # Each was refused by the proxy (an answer from the broker would have been relayed on
    # the authenticated connections, whose upstream connections were open).
    assert proxy.metric("kafka_proxy_protocol_limits_refused_total", limit="tagged_fields") >= 2
    assert proxy.metric("kafka_proxy_protocol_limits_refused_total", limit="array") >= 2
    wait_until(lambda: proxy.metric("kafka_proxy_client_connections") <= 2, timeout=15, interval=0.1,
               what="the bombers' connections closed")
