"""The proxy process: listeners, connections, metrics, and an orderly shutdown.

Structure (one nursery each, nothing outlives its parent):

    ProxyServer.run
      ├── metrics endpoint (optional)
      ├── listeners: bootstrap/sidecar port, and one port per broker node (port per broker)
      └── connections: one ClientConnection each, with its own nursery inside

Shutdown (SIGTERM/SIGINT, or ``ProxyServer.shutdown``): listeners close first so nothing
new arrives; every connection stops reading and finishes the requests in flight; after
``shutdown.drain.timeout.ms`` whatever is left is cancelled.
"""

from __future__ import annotations

import gc
import logging
import math
import signal
import socket
import ssl

import trio

from proxy.net.broker_connection import BrokerConnection, BrokerConnectionError
from proxy.protocol import messages
from proxy.protocol.messages import ApiKey
from proxy.server.addresses import AddressBook, NodeListener, UnmappedNodeError
from proxy.server.config import ProxyConfig
from proxy.server.connection import ClientConnection, UpstreamUnavailable
from proxy.server.metrics import ProxyMetrics, serve_metrics
from proxy.server.routing import Router
from proxy.net.connect import connect, listener_ssl_context, tune_socket, upstream_ssl_context

log = logging.getLogger("proxy.server")

METADATA_VERSION = 12  # every Kafka 4.x broker speaks it; it carries topic ids


class StartupError(Exception):
    """The proxy cannot start; the message says why in one sentence."""


class ProxyServer:
    def __init__(self, config: ProxyConfig, metrics: ProxyMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or ProxyMetrics()
        self._upstream_ssl = (
            upstream_ssl_context(config.get("ssl.upstream.cafile"), config.get("ssl.upstream.check.hostname"))
            if config.get("ssl.upstream.enabled")
            else None
        )
        self._listener_ssl = (
            listener_ssl_context(config.get("ssl.listener.certfile"), config.get("ssl.listener.keyfile"))
            if config.get("ssl.listener.enabled")
            else None
        )
        self._main_socket = self._bind(config.get("listen.host"), config.get("listen.port"))
        self.port = self._main_socket.getsockname()[1]
        self._pending_listeners: list[NodeListener] = []
        self.book = AddressBook(
            topology=config.get("topology"),
            advertised_host=config.advertised_host,
            listen_host=config.get("listen.host"),
            node_port_base=config.get("node.port.base"),
            own_port=self.port,
            sidecar_addresses=config.get("sidecar.node.addresses"),
            on_new_listener=self._on_new_listener,
        )
        self.router = Router(self.book)
        from proxy.keyrange.feature import KeyRangeFetchFeature

        self.keyrange = KeyRangeFetchFeature(config, self.router, self.metrics,
                                             lookup_topic_names=self._topic_names)
        if config.get("fetch.readahead.enabled"):
            from proxy.readahead.feature import ReadAheadFeature

            # After key-range fetch: it takes the extended Fetches, this the plain ones.
            self.readahead = ReadAheadFeature(config, self.router, self.metrics)
        from proxy.commits.feature import IndividualCommitFeature

        self.commits = IndividualCommitFeature(config, self.router, self.metrics, ssl_context=self._upstream_ssl)
        self.connections: set[ClientConnection] = set()
        self.node_ports: dict[int, int] = {}
        self.metrics_port: int | None = None
        self._listener_nursery: trio.Nursery | None = None
        self._connection_nursery: trio.Nursery | None = None
        self._shutdown = trio.Event()
        self.started = trio.Event()

    # -- public -----------------------------------------------------------------------------
    async def run(self, *, handle_signals: bool = True) -> None:
        messages.precompile(list(self.router.known_versions()))
        # Everything allocated so far lives as long as the process: keep the collector
        # from walking it on every generation-2 collection.
        gc.freeze()
        await self._learn_cluster()
        async with trio.open_nursery() as root:
            if handle_signals:
                root.start_soon(self._watch_signals)
            if self.config.get("metrics.port") >= 0:
                self.metrics_port = await root.start(
                    serve_metrics, self.metrics, self.config.get("listen.host"), self.config.get("metrics.port")
                )
            async with trio.open_nursery() as connections:
                self._connection_nursery = connections
                async with trio.open_nursery() as listeners:
                    self._listener_nursery = listeners
                    listeners.start_soon(self._serve_socket, self._main_socket, None)
                    for pending in self._pending_listeners:
                        listeners.start_soon(self._serve_socket, pending.sock, pending.node_id)
                    self._pending_listeners.clear()
                    log.info("proxy listening host=%s port=%s topology=%s nodes=%s",
                             self.config.get("listen.host"), self.port, self.config.get("topology"),
                             dict(sorted(self.node_ports.items())))
                    self.started.set()
                    await self._shutdown.wait()
                    listeners.cancel_scope.cancel()
                await self._drain()
                connections.cancel_scope.cancel()
            root.cancel_scope.cancel()
        log.info("proxy stopped")

    def shutdown(self) -> None:
        self._shutdown.set()

    # -- start-up -----------------------------------------------------------------------------
    def _bind(self, host: str, port: int) -> socket.socket:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(1024)
        except OSError as exc:
            sock.close()
            raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        return sock

    async def _learn_cluster(self) -> None:
        """Read the cluster's brokers before accepting clients, so node ports exist from
        the start (clients that reconnect after a proxy restart go straight to them).

        A broker that accepts the connection but not an unauthenticated request (a SASL
        listener) is reachable: the proxy starts anyway and learns the nodes from the
        responses clients receive after they authenticate.
        """
        errors = []
        reachable = False
        for host, port in self.config.get("bootstrap.servers"):
            try:
                body = await self._fetch_metadata(host, port)
            except BrokerConnectionError as exc:
                reachable = True
                errors.append(f"{host}:{port} ({exc})")
                continue
            except (OSError, trio.TooSlowError, ssl.SSLError) as exc:
                errors.append(f"{host}:{port} ({exc})")
                continue
            for broker in body.brokers:
                self.book.learn(broker.node_id, broker.host, broker.port)
            if self.config.get("topology") == "sidecar":
                self._identify_sidecar_node(host, port, body)
            else:
                for broker in body.brokers:
                    self.book.advertised(broker.node_id)
            return
        if not reachable:
            raise StartupError("cannot reach any bootstrap server: " + "; ".join(errors))
        if self.config.get("topology") == "sidecar":
            if self.config.get("sidecar.node.id") < 0:
                raise StartupError(
                    "the broker refused an unauthenticated Metadata request; set sidecar.node.id "
                    "to the id of the broker this sidecar fronts"
                )
            self.book.sidecar_node_id = self.config.get("sidecar.node.id")
        log.warning("cluster metadata unavailable at start (%s); node ports open as clients discover nodes",
                    "; ".join(errors))

    async def _fetch_metadata(self, host: str, port: int):
        timeout = self.config.get("upstream.connect.timeout.ms") / 1000
        connection = await BrokerConnection.open(host, port, timeout=timeout, ssl_context=self._upstream_ssl)
        async with connection:
            body = messages.new_body(ApiKey.METADATA, METADATA_VERSION, "request", topics=[],
                                     allow_auto_topic_creation=False)
            return await connection.request(ApiKey.METADATA, METADATA_VERSION, body, timeout=timeout)

    async def _topic_names(self) -> dict:
        """Every topic id -> name the cluster knows, from one Metadata request to any
        broker the proxy knows."""
        candidates = list(self.book.known_nodes().values()) or list(self.config.get("bootstrap.servers"))
        timeout = self.config.get("upstream.connect.timeout.ms") / 1000
        for host, port in candidates:
            try:
                connection = await BrokerConnection.open(host, port, timeout=timeout, ssl_context=self._upstream_ssl)
                async with connection:
                    body = messages.new_body(ApiKey.METADATA, METADATA_VERSION, "request", topics=None,
                                             allow_auto_topic_creation=False)
                    response = await connection.request(ApiKey.METADATA, METADATA_VERSION, body, timeout=timeout)
            except (OSError, trio.TooSlowError, BrokerConnectionError, ssl.SSLError):
                continue
            return {t.topic_id: t.name for t in response.topics if t.name and int(t.topic_id) != 0}
        return {}

    def _identify_sidecar_node(self, host: str, port: int, body) -> None:
        if self.config.get("sidecar.node.id") >= 0:
            self.book.sidecar_node_id = self.config.get("sidecar.node.id")
            return
        matches = [b.node_id for b in body.brokers if b.port == port and (b.host == host or len(body.brokers) == 1)]
        if not matches:
            matches = [b.node_id for b in body.brokers if b.port == port]
        if len(matches) != 1:
            raise StartupError(
                f"cannot tell which broker {host}:{port} is in the cluster metadata; "
                "point bootstrap.servers at the broker's advertised address"
            )
        self.book.sidecar_node_id = matches[0]
        log.info("sidecar fronts node_id=%s", matches[0])

    # -- listeners --------------------------------------------------------------------------------
    def _on_new_listener(self, listener: NodeListener) -> None:
        self.node_ports[listener.node_id] = listener.port
        if self._listener_nursery is None:
            self._pending_listeners.append(listener)
        else:
            self._listener_nursery.start_soon(self._serve_socket, listener.sock, listener.node_id)

    async def _serve_socket(self, sock: socket.socket, node_id: int | None) -> None:
        trio_sock = trio.socket.from_stdlib_socket(sock)
        listener: trio.abc.Listener = trio.SocketListener(trio_sock)
        if self._listener_ssl is not None:
            listener = trio.SSLListener(listener, self._listener_ssl, https_compatible=False)
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:  # e.g. EMFILE: keep serving the connections we have
                    log.error("accept failed node_id=%s reason=%r", node_id, str(exc))
                    self.metrics.errors.labels("accept").inc()
                    await trio.sleep(0.1)
                    continue
                self._connection_nursery.start_soon(self._handle, stream, node_id)

    async def _handle(self, stream: trio.abc.Stream, node_id: int | None) -> None:
        peer = _peer_name(stream)
        if len(self.connections) >= self.config.get("max.connections"):
            self.metrics.connections_refused.labels("max_connections").inc()
            log.warning("refusing connection peer=%s reason=max.connections (%s) reached",
                        peer, self.config.get("max.connections"))
            await trio.aclose_forcefully(stream)
            return
        if self._listener_ssl is not None:
            try:
                with trio.fail_after(10):
                    await stream.do_handshake()
            except (trio.BrokenResourceError, trio.TooSlowError, ssl.SSLError, OSError) as exc:
                log.info("TLS handshake failed peer=%s reason=%r", peer, str(exc))
                self.metrics.errors.labels("tls_handshake").inc()
                await trio.aclose_forcefully(stream)
                return
        tune_socket(stream, self.config.get("socket.send.buffer.bytes"))
        idle_ms = self.config.get("connections.max.idle.ms")
        connection = ClientConnection(
            stream,
            peer,
            open_upstream=lambda: self._open_upstream(node_id),
            router=self.router,
            metrics=self.metrics,
            max_frame_bytes=self.config.get("max.frame.bytes"),
            max_inflight=self.config.get("max.inflight.requests.per.connection"),
            idle_timeout=idle_ms / 1000 if idle_ms > 0 else math.inf,
            target="bootstrap" if node_id is None else f"node-{node_id}",
        )
        self.connections.add(connection)
        self.metrics.connections.inc()
        self.metrics.connections_total.inc()
        try:
            await connection.run()
        finally:
            self.connections.discard(connection)
            self.metrics.connections.dec()

    async def _open_upstream(self, node_id: int | None) -> trio.abc.Stream:
        timeout = self.config.get("upstream.connect.timeout.ms") / 1000
        if node_id is None:
            if self.config.get("topology") == "sidecar" and self.book.sidecar_node_id is not None:
                candidates = [self.book.real_address(self.book.sidecar_node_id)]
            else:
                candidates = list(self.config.get("bootstrap.servers"))
        else:
            address = self.book.real_address(node_id)
            if address is None:
                raise UpstreamUnavailable(f"node {node_id} is not in the cluster metadata the proxy has seen")
            candidates = [address]
        failures = []
        for host, port in candidates:
            try:
                stream = await connect(host, port, timeout=timeout, ssl_context=self._upstream_ssl)
            except (OSError, trio.TooSlowError, ssl.SSLError) as exc:
                self.metrics.upstream_connect_failures.inc()
                failures.append(f"{host}:{port} ({exc})")
                continue
            self.metrics.upstream_connects.inc()
            tune_socket(stream, self.config.get("socket.send.buffer.bytes"))
            return stream
        raise UpstreamUnavailable("; ".join(failures) or "no broker address known")

    # -- shutdown ---------------------------------------------------------------------------------
    async def _watch_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("signal received signal=%s; draining", signal.Signals(signum).name)
                self.shutdown()
                return

    async def _drain(self) -> None:
        timeout = self.config.get("shutdown.drain.timeout.ms") / 1000
        open_connections = list(self.connections)
        for connection in open_connections:
            connection.drain()
        with trio.move_on_after(timeout) as scope:
            for connection in open_connections:
                await connection.closed.wait()
        if scope.cancelled_caught:
            log.warning("drain timeout reached; closing %s connections", len(self.connections))


def _peer_name(stream: trio.abc.Stream) -> str:
    inner = getattr(stream, "transport_stream", stream)
    try:
        host, port = inner.socket.getpeername()[:2]
        return f"{host}:{port}"
    except (AttributeError, OSError):
        return "unknown"


__all__ = ["ProxyServer", "StartupError", "UnmappedNodeError"]
