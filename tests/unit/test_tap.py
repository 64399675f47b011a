"""The recording tap (harness/tap.py) against a small fake broker, no JVM needed."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from harness.tap import KafkaTap
from harness.wait import wait_until
from proxy.protocol.framing import FrameSplitter


class FakeBroker:
    """Answers each request frame with ``correlation id + b"re:" + request bytes``, except
    api key 0 with acks=0 (marked by client id "noack"), which gets no answer."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _serve(conn: socket.socket) -> None:
        splitter = FrameSplitter()
        with conn:
            while data := conn.recv(65536):
                splitter.feed(data)
                for frame in splitter.frames():
                    correlation_id = frame[4:8]
                    if b"noack" in frame:
                        continue
                    body = correlation_id + b"re:" + frame
                    conn.sendall(struct.pack(">i", len(body)) + body)

    def close(self) -> None:
        self.listener.close()
        for conn in self.connections:
            conn.close()


def request(api_key: int, version: int, correlation_id: int, client_id: bytes, payload: bytes = b"") -> bytes:
    return struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id + payload


class Client:
    """A client connection to the tap; keeps bytes that arrive ahead of the frame asked for."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.splitter = FrameSplitter()

    def send(self, frame: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)

    def receive(self) -> bytes:
        while (frame := self.splitter.next_frame()) is None:
            data = self.sock.recv(65536)
            assert data, "connection closed"
            self.splitter.feed(data)
        return frame

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


@pytest.fixture
def broker():
    fake = FakeBroker()
    yield fake
    fake.close()


def test_records_and_matches_requests_and_responses(broker):
    with KafkaTap(("127.0.0.1", broker.port)) as tap, Client(tap.port) as client:
        first = request(3, 12, 7, b"client")
        noack = request(0, 9, 8, b"noack", b"payload")
        second = request(18, 3, 9, b"client")
        for frame in (first, noack, second):
            client.send(frame)
        assert client.receive() == struct.pack(">i", 7) + b"re:" + first
        assert client.receive() == struct.pack(">i", 9) + b"re:" + second

        wait_until(lambda: len(tap.frames()) == 5, timeout=5, what="five frames recorded")
        exchanges = tap.exchanges()
        assert [(e.api_key, e.api_version, e.request.correlation_id) for e in exchanges] == [
            (3, 12, 7), (0, 9, 8), (18, 3, 9),
        ]
        assert [e.request.frame for e in exchanges] == [first, noack, second]
        assert exchanges[0].response.frame == struct.pack(">i", 7) + b"re:" + first
        assert exchanges[0].response.api_key == 3 and exchanges[0].response.api_version == 12
        assert exchanges[1].response is None  # acks=0: nothing due
        assert exchanges[2].response.client_id == "client"
        seqs = [f.seq for f in tap.frames()]
        assert seqs == sorted(seqs)
        assert tap.errors == []


def test_transform_replaces_response_and_failures_close_the_connection(broker):
    def transform(api_key: int, version: int, frame: bytes) -> bytes:
        if api_key == 1:
            raise ValueError("cannot filter")
        return frame[:4] + b"changed"

    with KafkaTap(("127.0.0.1", broker.port), transform=transform) as tap:
        with Client(tap.port) as client:
            frame = request(3, 12, 1, b"c")
            client.send(frame)
            assert client.receive() == struct.pack(">i", 1) + b"changed"
            wait_until(lambda: len(tap.frames()) == 2, timeout=5, what="two frames recorded")
            response = tap.exchanges()[0].response
            assert response.frame == struct.pack(">i", 1) + b"re:" + frame  # what the broker sent
            assert response.sent == struct.pack(">i", 1) + b"changed"  # what the client got

            client.send(request(1, 12, 2, b"c"))
            assert client.sock.recv(10) == b""  # the tap closed the connection
        assert [(e.where, e.api_key) for e in tap.errors] == [("transform", 1)]
        assert "cannot filter" in tap.errors[0].detail
        wait_until(lambda: tap.open_connections == 0, timeout=5, what="connection forgotten")


def test_byte_cap_keeps_metadata_but_not_bytes(broker):
    with KafkaTap(("127.0.0.1", broker.port), max_recorded_bytes=100) as tap:
        with Client(tap.port) as client:
            big = request(0, 9, 1, b"c", b"x" * 200)
            client.send(big)
            client.receive()
            wait_until(lambda: len(tap.frames()) == 2, timeout=5, what="two frames recorded")
        frames = tap.frames()
        assert [f.frame for f in frames] == [None, None]
        assert [f.size for f in frames] == [len(big), len(big) + 7]
        assert tap.dropped_frames == 2 and tap.recorded_bytes == 0
        tap.clear()
        assert tap.frames() == [] and tap.dropped_frames == 0


def test_client_without_upstream_is_disconnected():
    with KafkaTap() as tap, Client(tap.port) as client:
        assert client.sock.recv(10) == b""
