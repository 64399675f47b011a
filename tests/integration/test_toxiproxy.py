"""The fault harness itself (``harness.toxiproxy``): each fault does to a real
connection what the fault tests rely on it to do, and is gone once its block ends.

An echo server stands for the proxy; no Kafka is needed."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from harness.toxiproxy import Proxy, ToxiproxyError, ToxiproxyServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def echo_port() -> Iterator[int]:
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while not stop.is_set():
                try:
                    data = conn.recv(65536)
                    if not data:
                        return
                    conn.sendall(data)
                except OSError:
                    return

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield listener.getsockname()[1]
    stop.set()
    listener.close()


@pytest.fixture
def link(toxiproxy: ToxiproxyServer, echo_port: int, request) -> Iterator[Proxy]:
    proxy = toxiproxy.create_proxy(f"echo-{request.node.name[-40:]}", upstream=("127.0.0.1", echo_port))
    yield proxy
    proxy.delete()


def round_trip(link: Proxy, payload: bytes = b"ping", timeout: float = 3.0) -> tuple[float, int]:
    """Seconds until ``payload`` came back through ``link``, and in how many reads."""
    with socket.create_connection(link.listen, timeout=timeout) as sock:
        began = time.monotonic()
        sock.sendall(payload)
        got, reads = b"", 0
        while len(got) < len(payload):
            data = sock.recv(65536)
            if not data:
                raise ConnectionError(f"closed after {len(got)} of {len(payload)} bytes")
            got += data
            reads += 1
        assert got == payload
        return time.monotonic() - began, reads


def test_latency_delays_the_data_and_ends_with_its_block(link):
    with link.latency(300, jitter=20):
        assert round_trip(link)[0] >= 0.25
    assert round_trip(link)[0] < 0.2
    assert link.toxics() == []


def test_reset_peer_resets_connections_that_carry_data(link):
    with link.reset_peer(), pytest.raises(ConnectionResetError):
        round_trip(link)
    round_trip(link)


def test_blackhole_swallows_everything_until_it_ends(link):
    with socket.create_connection(link.listen, timeout=5) as sock:
        with link.blackhole():
            sock.sendall(b"lost")
            sock.settimeout(0.5)
            with pytest.raises(TimeoutError):
                sock.recv(16)
        sock.settimeout(5)
        try:
            assert sock.recv(16) == b""  # Toxiproxy closes what the blackhole held
        except ConnectionResetError:
            pass
    round_trip(link)


def test_a_disabled_link_refuses_and_listens_again_on_the_same_port(link):
    port = link.listen_port
    with link.down():
        assert not link.enabled
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(link.listen, timeout=2).close()
    assert link.enabled and link.listen_port == port
    round_trip(link)


def test_limit_data_closes_a_connection_after_that_many_bytes(link):
    with link.limit_data(1000), pytest.raises((ConnectionError, OSError)):
        round_trip(link, b"x" * 5000)
    round_trip(link, b"x" * 5000)


def test_slicer_delivers_the_stream_in_small_pieces(link):
    with link.slicer(10, delay_us=500):
        _, reads = round_trip(link, b"y" * 2000)
    assert reads > 20


def test_bandwidth_slows_the_link(link):
    with link.bandwidth(20):
        assert round_trip(link, b"z" * 30_000, timeout=10)[0] >= 1.0


def test_toxics_on_both_streams_go_when_the_block_raises(link):
    with pytest.raises(RuntimeError), link.latency(10, stream="both") as placed:
        assert {t["stream"] for t in link.toxics()} == {"upstream", "downstream"} == {t.stream for t in placed}
        raise RuntimeError("the block fails")
    assert link.toxics() == []


def test_api_errors_say_what_toxiproxy_said(link, toxiproxy):
    with pytest.raises(ToxiproxyError, match="toxic not found"):
        link.remove_toxic("no-such-toxic")
    with pytest.raises(ToxiproxyError, match="proxy already exists"):
        toxiproxy.create_proxy(link.name, upstream=link.upstream)
