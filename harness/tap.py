"""A recording TCP tap between Kafka clients and one broker, for protocol tests.

The tap listens on a loopback port and forwards every connection to the broker, frame by
frame. It records each request frame and each response frame (without the 4-byte size
prefix), the response matched to its request's api key and version by correlation id, in
the order they crossed the tap. A response transform hook may replace a response's bytes
on the way to the client (e.g. to filter Fetch records the way the proxy does).

To make clients use the tap for *every* connection, including the ones they open to the
node named in Metadata, the broker must advertise the tap's address; :class:`TappedKafka`
starts a dedicated single node that does:

    with TappedKafka.start(workdir) as tapped:
        producer = Producer({"bootstrap.servers": tapped.bootstrap_servers})
        ...
        for exchange in tapped.tap.exchanges():
            print(exchange.api_key, exchange.api_version, len(exchange.request.frame))

Plain threads (one acceptor, two per connection): clients under test block, so nothing here
shares an event loop with them. Memory is bounded: once ``max_recorded_bytes`` of frames
are held, later frames are recorded without their bytes (``frame is None``) and counted
in ``dropped_frames``.
"""

from __future__ import annotations

import itertools
import socket
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from proxy.protocol.errors import ProtocolError
from proxy.protocol.framing import (
    SIZE_PREFIX,
    FrameSplitter,
    peek_correlation_id,
    peek_request_header,
)

__all__ = [
    "Exchange",
    "KafkaTap",
    "ResponseTransform",
    "TapError",
    "TappedFrame",
    "TappedKafka",
]

HOST = "127.0.0.1"
DEFAULT_MAX_RECORDED_BYTES = 64 * 1024 * 1024
_RECV_BYTES = 256 * 1024
_ACCEPT_POLL_SECONDS = 0.2  # how quickly the acceptor notices close(); not a synchronisation

Direction = Literal["request", "response"]
# (api_key, api_version, response frame without size prefix) -> bytes to send instead.
ResponseTransform = Callable[[int, int, bytes], bytes]


@dataclass(frozen=True, slots=True)
class TappedFrame:
    """One frame that crossed the tap.

    ``frame`` is exactly what the sender wrote (size prefix removed), or None when the byte
    cap had been reached. For a response, ``sent`` holds what the client got instead when
    the transform changed it (None when it was forwarded unchanged). ``api_key`` and
    ``api_version`` of a response are its request's; None only for a response to a
    correlation id the tap never saw (which a broker does not send).
    """

    seq: int
    connection: int
    direction: Direction
    api_key: int | None
    api_version: int | None
    correlation_id: int
    client_id: str | None
    size: int
    frame: bytes | None
    sent: bytes | None = None


@dataclass(frozen=True, slots=True)
class Exchange:
    """A request and its response (None: no response yet, or none due, e.g. acks=0)."""

    request: TappedFrame
    response: TappedFrame | None

    @property
    def api_key(self) -> int:
        return self.request.api_key  # type: ignore[return-value]

    @property
    def api_version(self) -> int:
        return self.request.api_version  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class TapError:
    """Something the tap could not do; the connection it happened on was closed."""

    connection: int
    where: str
    api_key: int | None
    api_version: int | None
    detail: str


class KafkaTap:
    """Forward loopback connections to ``upstream`` and record every frame.

    ``upstream`` may be set after construction (``tap.upstream = (host, port)``), so the
    tap's port can be chosen before the broker that must advertise it is started; a client
    that connects while it is unset is disconnected.
    """

    def __init__(
        self,
        upstream: tuple[str, int] | None = None,
        *,
        host: str = HOST,
        port: int = 0,
        max_recorded_bytes: int = DEFAULT_MAX_RECORDED_BYTES,
        transform: ResponseTransform | None = None,
        max_frame_bytes: int = 100 * 1024 * 1024,
    ) -> None:
        self.upstream = upstream
        self.max_recorded_bytes = max_recorded_bytes
        self.transform = transform
        self._max_frame_bytes = max_frame_bytes
        self._lock = threading.Lock()
        self._frames: list[TappedFrame] = []
        self._seq = itertools.count()
        self._connection_ids = itertools.count(1)
        self._recorded_bytes = 0
        self.dropped_frames = 0
        self.errors: list[TapError] = []
        self.connections_accepted = 0
        self._connections: dict[int, _Connection] = {}
        self._closed = threading.Event()
        self._listener = socket.create_server((host, port), backlog=64)
        self._listener.settimeout(_ACCEPT_POLL_SECONDS)
        self.host, self.port = self._listener.getsockname()[:2]
        self._acceptor = threading.Thread(target=self._accept_loop, name=f"tap-{self.port}", daemon=True)
        self._acceptor.start()

    # -- public ------------------------------------------------------------------------

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def frames(self, since: int = 0) -> list[TappedFrame]:
        """A snapshot of the recorded frames with ``seq >= since``, in crossing order."""
        with self._lock:
            return [f for f in self._frames if f.seq >= since]

    def mark(self) -> int:
        """The seq the next recorded frame will get; pass it to frames()/exchanges()."""
        with self._lock:
            return self._frames[-1].seq + 1 if self._frames else 0

    def exchanges(self, since: int = 0) -> list[Exchange]:
        """Requests (seq >= since) in crossing order, each with its response if recorded."""
        frames = self.frames(since)
        responses = {
            (f.connection, f.correlation_id): f for f in frames if f.direction == "response"
        }
        return [
            Exchange(f, responses.get((f.connection, f.correlation_id)))
            for f in frames
            if f.direction == "request"
        ]

    def clear(self) -> None:
        """Forget every recorded frame and error (the byte budget is free again)."""
        with self._lock:
            self._frames.clear()
            self._recorded_bytes = 0
            self.dropped_frames = 0
            self.errors.clear()

    @property
    def recorded_bytes(self) -> int:
        return self._recorded_bytes

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._connections)

    def close(self) -> None:
        """Stop accepting, close every connection and wait for the tap's threads."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._acceptor.join(timeout=5)
        self._listener.close()
        with self._lock:
            connections = list(self._connections.values())
        for conn in connections:
            conn.shutdown()
        for conn in connections:
            conn.join(timeout=5)

    def __enter__(self) -> KafkaTap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._closed.is_set():
                    return
                continue
            client.settimeout(None)
            upstream = self.upstream
            if upstream is None:
                client.close()
                continue
            try:
                broker = socket.create_connection(upstream, timeout=10)
            except OSError as exc:
                self._error(0, "connect", None, None, f"cannot connect to {upstream}: {exc}")
                client.close()
                continue
            broker.settimeout(None)
            for sock in (client, broker):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn_id = next(self._connection_ids)
            conn = _Connection(self, conn_id, client, broker)
            with self._lock:
                self.connections_accepted += 1
                self._connections[conn_id] = conn
            conn.start()

    def _record(
        self,
        conn: int,
        direction: Direction,
        api_key: int | None,
        api_version: int | None,
        correlation_id: int,
        client_id: str | None,
        frame: bytes,
        sent: bytes | None = None,
    ) -> None:
        with self._lock:
            held = len(frame) + (len(sent) if sent is not None else 0)
            keep = self._recorded_bytes + held <= self.max_recorded_bytes
            if keep:
                self._recorded_bytes += held
            else:
                self.dropped_frames += 1
            self._frames.append(
                TappedFrame(
                    seq=next(self._seq),
                    connection=conn,
                    direction=direction,
                    api_key=api_key,
                    api_version=api_version,
                    correlation_id=correlation_id,
                    client_id=client_id,
                    size=len(frame),
                    frame=frame if keep else None,
                    sent=sent if keep else None,
                )
            )

    def _error(self, conn: int, where: str, api_key: int | None, api_version: int | None, detail: str) -> None:
        with self._lock:
            self.errors.append(TapError(conn, where, api_key, api_version, detail))

    def _forget(self, conn_id: int) -> None:
        with self._lock:
            self._connections.pop(conn_id, None)


class _Connection:
    """One client connection and its broker connection; a thread per direction."""

    def __init__(self, tap: KafkaTap, conn_id: int, client: socket.socket, broker: socket.socket) -> None:
        self.tap = tap
        self.id = conn_id
        self.client = client
        self.broker = broker
        # correlation id -> (api key, version, client id) of requests awaiting a response
        self.pending: dict[int, tuple[int, int, str | None]] = {}
        self.pending_lock = threading.Lock()
        self._done = 0
        self._done_lock = threading.Lock()
        self._closed = False
        self.threads = [
            threading.Thread(target=self._run, args=(self._requests,), name=f"tap-c{conn_id}-req", daemon=True),
            threading.Thread(target=self._run, args=(self._responses,), name=f"tap-c{conn_id}-resp", daemon=True),
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self, timeout: float) -> None:
        for t in self.threads:
            t.join(timeout)

    def shutdown(self) -> None:
        """Wake both threads: Kafka has no half-close, one side ending ends the connection."""
        for sock in (self.client, self.broker):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _run(self, pump: Callable[[], None]) -> None:
        try:
            pump()
        except (OSError, ProtocolError):
            pass  # a peer closed or the connection was shut down
        except Exception:  # noqa: BLE001 - reported, then the connection is closed
            self.tap._error(self.id, pump.__name__, None, None, traceback.format_exc())
        finally:
            self.shutdown()
            with self._done_lock:
                self._done += 1
                last = self._done == len(self.threads)
            if last:
                self.client.close()
                self.broker.close()
                self.tap._forget(self.id)

    @staticmethod
    def _frames(sock: socket.socket, max_frame_bytes: int) -> Iterator[bytes]:
        splitter = FrameSplitter(max_frame_bytes)
        while True:
            data = sock.recv(_RECV_BYTES)
            if not data:
                return
            splitter.feed(data)
            yield from splitter.frames()

    def _requests(self) -> None:
        tap = self.tap
        for frame in self._frames(self.client, tap._max_frame_bytes):
            head = peek_request_header(frame)
            with self.pending_lock:
                self.pending[head.correlation_id] = (head.api_key, head.api_version, head.client_id)
            tap._record(self.id, "request", head.api_key, head.api_version, head.correlation_id, head.client_id, frame)
            self.broker.sendall(SIZE_PREFIX.pack(len(frame)) + frame)

    def _responses(self) -> None:
        tap = self.tap
        for frame in self._frames(self.broker, tap._max_frame_bytes):
            correlation_id = peek_correlation_id(frame)
            with self.pending_lock:
                api_key, api_version, client_id = self.pending.pop(correlation_id, (None, None, None))
            out = frame
            transform = tap.transform
            if transform is not None and api_key is not None:
                try:
                    out = transform(api_key, api_version, frame)  # type: ignore[arg-type]
                except Exception:  # noqa: BLE001 - reported; the client sees the connection close
                    tap._record(self.id, "response", api_key, api_version, correlation_id, client_id, frame)
                    tap._error(self.id, "transform", api_key, api_version, traceback.format_exc())
                    return
            sent = None if out is frame or out == frame else bytes(out)
            tap._record(self.id, "response", api_key, api_version, correlation_id, client_id, frame, sent)
            self.client.sendall(SIZE_PREFIX.pack(len(out)) + out)


class TappedKafka:
    """A dedicated single Kafka node whose advertised address is a :class:`KafkaTap`.

    The tap's port is chosen first and the broker advertises
    ``PLAINTEXT://127.0.0.1:<tap port>`` (the harness's client listener name), so every
    client connection, bootstrap or not, goes through the tap. The harness itself talks to
    the real port for its readiness probe.
    """

    def __init__(self, cluster, tap: KafkaTap) -> None:  # cluster: KafkaCluster
        self.cluster = cluster
        self.tap = tap

    @classmethod
    def start(
        cls,
        workdir: Path | None = None,
        *,
        broker_properties: Mapping[str, str] | None = None,
        max_recorded_bytes: int = DEFAULT_MAX_RECORDED_BYTES,
        timeout: float = 120.0,
    ) -> TappedKafka:
        from harness.kafka_cluster import KafkaCluster
        from proxy.local_kafka import CLIENT_LISTENER

        tap = KafkaTap(max_recorded_bytes=max_recorded_bytes)
        props = {"advertised.listeners": f"{CLIENT_LISTENER}://{tap.host}:{tap.port}"}
        props.update(broker_properties or {})
        try:
            cluster = KafkaCluster.start(1, workdir=workdir, broker_properties=props, timeout=timeout)
        except BaseException:
            tap.close()
            raise
        node = cluster.nodes[0]
        tap.upstream = (node.host, node.port)
        return cls(cluster, tap)

    @property
    def bootstrap_servers(self) -> str:
        """The tap's address: use it for every client under test."""
        return self.tap.address

    def close(self) -> None:
        try:
            self.cluster.close()
        finally:
            self.tap.close()

    def __enter__(self) -> TappedKafka:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
