"""The proxy process: listeners, connections, metrics, and an orderly shutdown.

Structure (one nursery each, nothing outlives its parent):

    ProxyServer.run
      ├── metrics endpoint (optional)
      ├── follow-ups of transactional commits (``pipeline.background``), cancelled last
      ├── the cluster: read until a broker answers, with backoff (clients may come first)
      ├── listeners: bootstrap/sidecar port, and one port per broker node (port per broker)
      └── connections: one ClientConnection each, with its own nursery inside

The features are listed once, in order, in ``_features``; everything the server knows about
them goes through ``proxy.pipeline.FeatureChain``.

Start-up does not wait for the cluster: a sidecar often starts before its broker. The
proxy listens at once; a client that connects before any broker has answered is held
(up to ``upstream.connect.timeout.ms``) until one does, then its connection is closed,
which every Kafka client takes as a retriable error, as it would a broker still starting.

Shutdown (SIGTERM/SIGINT, or ``ProxyServer.shutdown``): listeners close first so nothing
new arrives; every connection stops reading and finishes the requests in flight; after
``shutdown.drain.timeout.ms`` whatever is left is cancelled.

Reload (SIGHUP, or a watched file changing: ``config.watch.interval.ms``): the settings are
read again and put in force whole, or refused whole (``proxy.server.reloader``); open
connections keep what they were accepted with (``ProxyServer.apply_settings``).
"""

from __future__ import annotations

import gc
import logging
import math
import signal
import socket
import ssl
from typing import Any

import trio
from prometheus_client import Gauge

from proxy.commits.cluster import ClusterClient
from proxy.commits.metrics import CommitLogMetrics
from proxy.commits.service import CommitService
from proxy.coop.feature import CooperativeFetchFeature
from proxy.coop.grant_log import GrantLog
from proxy.coop.metrics import CooperativeFetchMetrics
from proxy.features.addresses import AddressRewrite
from proxy.features.cluster_feed import ClusterFeed
from proxy.individual.feature import IndividualCommitFeature
from proxy.individual.metrics import IndividualCommitMetrics
from proxy.keyrange.engine import SharedReads
from proxy.keyrange.feature import KeyRangeFetchFeature
from proxy.keyrange.metrics import KeyRangeMetrics
from proxy.net.broker_connection import BrokerConnectionError
from proxy.net.budget import RequestBudget
from proxy.net.connect import connect, tune_socket
from proxy.net.native_relay import NativeRelayThreads
from proxy.net.pool import BrokerPool, NoBrokerAnswered
from proxy.pipeline.background import Background
from proxy.pipeline.chain import FeatureChain
from proxy.pipeline.cluster import ClusterView
from proxy.pipeline.feature import Feature
from proxy.prediction.feature import FetchPredictionFeature
from proxy.prediction.metrics import FetchPredictionMetrics
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.errors import ProtocolError
from proxy.protocol.message_types import MetadataRequest, MetadataResponse
from proxy.server.addresses import ONE_PROCESS, AddressBook, NodeListener, NodePlacement, UnmappedNodeError
from proxy.server.collector import CollectorTuner
from proxy.server.config import ProxyConfig
from proxy.server.connection import ClientConnection, UpstreamUnavailable
from proxy.server.health import Health, watch_brokers
from proxy.server.limits import LogThrottle
from proxy.server.memory import HeapTrimmer
from proxy.server.metrics import ProxyMetrics, serve_metrics
from proxy.server.reloader import ConfigSource, PreparedReload, Reloader, ReloadMetrics
from proxy.server.tls import ListenerTls, load_listener_tls, load_upstream_tls
from proxy.settings import ConfigError
from proxy.virtual.commit_feature import VirtualCommitFeature
from proxy.virtual.fetch_feature import VirtualFetchFeature
from proxy.virtual.metrics import VirtualTopicsMetrics
from proxy.virtual.naming_feature import VirtualNamingFeature
from proxy.virtual.refusal_feature import VirtualRefusalFeature
from proxy.virtual.resolver import VirtualResolver

log = logging.getLogger("proxy.server")

METADATA_VERSION = 12  # every Kafka 4.x broker speaks it; it carries topic ids
_RETRY_FIRST = 0.25  # seconds before the second try to reach the cluster; doubles up to _RETRY_MAX
_RETRY_MAX = 10.0
# With several workers, how often each reads the cluster's nodes: a broker that joins gets
# its port from the worker that serves it even when no client's Metadata passes there.
NODE_FOLLOW_SECONDS = 10.0
_TLS_HANDSHAKE_TIMEOUT = 10.0  # seconds, or less when connections.setup.timeout.ms ends sooner
_CROWD_LOG_INTERVAL = 10.0  # seconds between two log lines about refusals, or about setup timeouts


class StartupError(Exception):
    """The proxy cannot start; the message says why in one sentence."""


class ProxyServer:
    def __init__(self, config: ProxyConfig, metrics: ProxyMetrics | None = None,
                 source: ConfigSource | None = None, placement: NodePlacement = ONE_PROCESS) -> None:
        """``source``: where a reload reads the settings again (none: SIGHUP has nothing to read);
        ``placement``: which node ports this process listens on when it is one of ``workers``."""
        self.config = config
        self.metrics = metrics or ProxyMetrics()
        cluster, tls, limits = config.cluster, config.tls, config.limits
        try:
            self._upstream_ssl = (load_upstream_tls(tls.upstream_cafile, tls.upstream_check_hostname)
                                  if tls.upstream_enabled else None)
            # what new client connections are served with: a reload replaces it
            self.listener_tls: ListenerTls | None = (load_listener_tls(tls.listener_certfile, tls.listener_keyfile)
                                                    if tls.listener_enabled else None)
        except ConfigError as exc:
            raise StartupError(str(exc)) from None
        self._main_socket = self._bind(cluster.listen_host, cluster.listen_port)
        self.port = self._main_socket.getsockname()[1]
        self._pending_listeners: list[NodeListener] = []
        self.cluster = ClusterView()
        self._connect_timeout = cluster.upstream_connect_timeout_ms / 1000
        self.pool = BrokerPool(
            cluster.bootstrap_servers,
            known_addresses=self.cluster.addresses,
            ssl_context=self._upstream_ssl,
            timeout=self._connect_timeout,
        )
        self.cluster.reader = self._read_metadata
        self.book = AddressBook(
            self.cluster,
            topology=cluster.topology,
            advertised_host=cluster.advertised_host,
            listen_host=cluster.listen_host,
            node_port_base=cluster.node_port_base,
            own_port=self.port,
            sidecar_addresses=cluster.sidecar_node_addresses,
            reuse_port=cluster.listen_reuse_port,
            placement=placement,
            on_new_listener=self._on_new_listener,
        )
        self.background = Background()  # follow-ups that outlive a client's connection
        registry = self.metrics.registry
        self.collector = CollectorTuner(config.operations.gc_freeze_interval_ms / 1000)
        registry.register(self.collector)
        Gauge("kafka_proxy_followups_running", "Follow-ups of transactional commits running (fold, S).",
              registry=registry).set_function(lambda: self.background.running)
        Gauge("kafka_proxy_followups_refused", "Follow-ups of transactional commits not started (limit reached); "
              "the next commit or OffsetFetch of their partitions does their work.",
              registry=registry).set_function(lambda: self.background.refused)
        self.chain = FeatureChain(self._features())
        self.connections: set[ClientConnection] = set()
        self._handshaking = 0  # TLS connections accepted, in their handshake: they count towards max.connections
        self._refusals = LogThrottle(_CROWD_LOG_INTERVAL)
        self._setup_timeouts = LogThrottle(_CROWD_LOG_INTERVAL)
        self._frame_refusals = LogThrottle(_CROWD_LOG_INTERVAL)
        self.request_budget = RequestBudget(limits.queued_max_request_bytes)
        self.metrics.watch_budget(self.request_budget)
        self.native_threads = NativeRelayThreads(config.native_relay.threads, slice_ms=config.native_relay.slice_ms)
        self.node_ports: dict[int, int] = {}
        self.metrics_port: int | None = None
        self._listener_nursery: trio.Nursery | None = None
        self._connection_nursery: trio.Nursery | None = None
        self._shutdown = trio.Event()
        self.health = Health()
        self.started = trio.Event()  # listening, and the first try to reach the cluster is over
        self._startup_error: StartupError | None = None
        self.reloader = Reloader(self, source, ReloadMetrics(self.metrics.registry))

    def _features(self) -> list[Feature]:
        """The features, in the order their stages run (see ``proxy.pipeline.feature``)."""
        config, metrics = self.config, self.metrics
        registry = metrics.registry
        features: list[Feature] = [ClusterFeed(self.cluster)]  # before addresses: it needs the real ones
        keyrange = self._keyrange = KeyRangeFetchFeature(config.keyrange, self.cluster, KeyRangeMetrics(registry))
        commits = CommitService(config.commit_log, self.cluster, CommitLogMetrics(registry), pool=self.pool,  # the commit layer they stand on
                                background=self.background)
        if config.virtual.enabled:  # virtual names become real before any other feature sees them
            # which names are virtual, for the four below; a topic without key-range fetches has none
            virtual = VirtualResolver(config.virtual, self.cluster,  # as in force: a reload may change it
                                      lambda topic: self.config.keyrange.topics.of(topic).fetch_enabled)
            virtual_metrics = VirtualTopicsMetrics(registry)
            features.append(VirtualNamingFeature(virtual))  # Metadata and the requests naming topics
            features.append(VirtualRefusalFeature(virtual, virtual_metrics))  # writes, KIP-848 groups
            features.append(VirtualFetchFeature(virtual, virtual_metrics, SharedReads(keyrange.engine)))
            features.append(VirtualCommitFeature(virtual, virtual_metrics, commits))  # share watermarks
        if config.coop.enabled:  # Fetch partitions tagged Cooperative: before key ranges
            # who holds which chunk is the log's: replicated across proxy instances
            grants = GrantLog(ClusterClient(self.pool, self.cluster), self.background, lease_ms=config.coop.lease_ms)
            features.append(CooperativeFetchFeature(config.coop, self.cluster, commits.reads,
                                                    CooperativeFetchMetrics(registry), grants=grants))
        features.append(keyrange)  # extended Fetches
        if config.prediction.enabled:  # plain Fetches the key-range one passed on
            features.append(FetchPredictionFeature(config.prediction, FetchPredictionMetrics(registry)))
        features.append(IndividualCommitFeature(config.individual, self.cluster, IndividualCommitMetrics(registry),
                                                commits=commits, virtual_topics=config.virtual.enabled))
        features.append(AddressRewrite(self.book))  # last: every other feature's responses pass it too
        return features

    # -- public -----------------------------------------------------------------------------
    async def run(self, *, handle_signals: bool = True) -> None:
        for old, new in self.config.renamed:
            log.warning("setting %s is deprecated: it is read as %s; write that instead", old, new)
        messages.precompile(list(self.chain.known_versions()))
        # Everything allocated so far lives as long as the process: keep the collector
        # from walking it on every generation-2 collection.
        gc.freeze()
        async with trio.open_nursery() as root:
            if handle_signals:
                root.start_soon(self._watch_signals, root)
            if self.config.operations.config_watch_interval_ms > 0 and self.reloader.source is not None:
                await root.start(self.reloader.watch, self.config.operations.config_watch_interval_ms / 1000)
            await root.start(self.background.run)
            operations = self.config.operations
            await root.start(HeapTrimmer(operations.memory_trim_interval_ms / 1000, self.metrics).run)
            await root.start(self.collector.run)
            if operations.metrics_port >= 0:
                self.metrics_port = await root.start(
                    serve_metrics, self.metrics, self.config.cluster.listen_host, operations.metrics_port, self.health
                )
                await root.start(watch_brokers, self.health, self._fronted_brokers, self.cluster.answered.is_set)
            async with trio.open_nursery() as connections:
                self._connection_nursery = connections
                async with trio.open_nursery() as listeners:
                    self._listener_nursery = listeners
                    listeners.start_soon(self._serve_socket, self._main_socket, None)
                    log.info("proxy listening host=%s port=%s topology=%s", self.config.cluster.listen_host,
                             self.port, self.config.cluster.topology)
                    first_try = trio.Event()
                    listeners.start_soon(self._learn_cluster, first_try)
                    if self.book.placement.count > 1 and not self.config.cluster.sidecar:
                        listeners.start_soon(self._follow_nodes)
                    await first_try.wait()
                    self._open_pending_listeners()
                    self.started.set()
                    await self._shutdown.wait()
                    listeners.cancel_scope.cancel()
                await self._drain()
                connections.cancel_scope.cancel()
            root.cancel_scope.cancel()
        await self.pool.aclose()
        if self._startup_error is not None:
            raise self._startup_error
        log.info("proxy stopped")

    def shutdown(self) -> None:
        self._shutdown.set()

    # -- start-up -----------------------------------------------------------------------------
    def _bind(self, host: str, port: int) -> socket.socket:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.config.cluster.listen_reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            sock.listen(1024)
        except OSError as exc:
            sock.close()
            raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        return sock

    async def _learn_cluster(self, first_try: trio.Event) -> None:
        """Read the cluster's brokers until one answers, with backoff, so node ports open
        (clients that reconnect after a proxy restart go straight to them).

        A broker that accepts the connection but not an unauthenticated request (a SASL
        listener) is reachable: the proxy then learns the nodes from the responses clients
        receive after they authenticate. A configuration the cluster's answer shows to be
        wrong (a sidecar that cannot tell which broker it fronts) stops the proxy.
        """
        delay = _RETRY_FIRST
        attempt = 0
        try:
            while True:
                attempt += 1
                outcome = await self._try_cluster()
                if outcome is None:
                    return
                if outcome == "refused":
                    self._settle_unauthenticated()
                    return
                log.warning("cluster unreachable attempt=%s retry_in_s=%.2f reason=%r", attempt, delay, outcome)
                first_try.set()
                await trio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX)
        except StartupError as exc:
            self._startup_error = exc
            log.error("%s", exc)
            self.shutdown()
        finally:
            first_try.set()

    async def _try_cluster(self) -> str | None:
        """None when a broker answered (the view and the address book know the nodes now);
        "refused" when one was reached but refused an unauthenticated request; else why not."""
        errors = []
        reachable = False
        timeout = self._connect_timeout
        for host, port in self.config.cluster.bootstrap_servers:
            try:
                body = await self._read_metadata([], addresses=[(host, port)], timeout=timeout)
            except NoBrokerAnswered as exc:
                reachable |= any(isinstance(cause, BrokerConnectionError) for cause in exc.causes)
                errors.append(str(exc).removeprefix("no broker answered: "))
                continue
            self.cluster.learn_metadata(body)
            if self.config.cluster.sidecar:
                self._identify_sidecar_node(host, port, body)
            else:
                for broker in body.brokers:
                    self.book.advertised(broker.node_id)
            log.info("cluster reached nodes=%s", dict(sorted(self.cluster.nodes.items())))
            return None
        if reachable:
            log.warning("cluster metadata unavailable at start (%s); node ports open as clients discover nodes",
                        "; ".join(errors))
            return "refused"
        return "; ".join(errors)

    async def _follow_nodes(self) -> None:
        """Read the cluster's nodes now and then, so that this worker listens on the port of
        a node it serves as soon as another worker may advertise it."""
        while self.book.placement.count > 1:
            await trio.sleep(NODE_FOLLOW_SECONDS)
            try:
                body = await self._read_metadata([], timeout=self._connect_timeout)
            except (NoBrokerAnswered, ProtocolError) as exc:
                log.debug("cluster nodes not read reason=%r", exc)
                continue
            self.cluster.learn_metadata(body)
            for broker in body.brokers:
                try:
                    self.book.advertised(broker.node_id)
                except UnmappedNodeError as exc:
                    log.warning("node not served reason=%r", str(exc))

    def _settle_unauthenticated(self) -> None:
        if self.config.cluster.sidecar:
            if self.config.cluster.sidecar_node_id < 0:
                raise StartupError(
                    "the broker refused an unauthenticated Metadata request; set sidecar.node.id "
                    "to the id of the broker this sidecar fronts"
                )
            self.book.sidecar_node_id = self.config.cluster.sidecar_node_id
        elif self.book.placement.count > 1:
            # The node a worker serves would open its port only once a client's Metadata
            # passed through that very worker; every worker listens on every node it learns.
            self.book.placement = ONE_PROCESS
            log.warning("workers share the node ports: the cluster answers Metadata only after a client "
                        "authenticates, so no worker can learn the nodes it alone serves; the consumers of a "
                        "partition may reach different workers (each reading it for its own)")
        self.cluster.answered.set()  # as far as it will until clients authenticate

    async def _read_metadata(self, topics: list[str] | None, *, addresses=None,
                             timeout: float | None = None) -> MetadataResponse:
        """A Metadata response from the cluster (``topics`` None: every topic), never creating one."""
        cls = MetadataRequest
        body = cls(topics=None if topics is None else [cls.MetadataRequestTopic(name=t) for t in topics],
                   allow_auto_topic_creation=False)
        return await self.pool.request_any(ApiKey.METADATA, METADATA_VERSION, body, timeout=timeout,
                                           addresses=addresses)

    def _identify_sidecar_node(self, host: str, port: int, body: MetadataResponse) -> None:
        if self.config.cluster.sidecar_node_id >= 0:
            self.book.sidecar_node_id = self.config.cluster.sidecar_node_id
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
        if self._listener_nursery is None or not self.started.is_set():
            self._pending_listeners.append(listener)
        else:
            self._listener_nursery.start_soon(self._serve_socket, listener.sock, listener.node_id)

    def _open_pending_listeners(self) -> None:
        assert self._listener_nursery is not None
        for pending in self._pending_listeners:
            self._listener_nursery.start_soon(self._serve_socket, pending.sock, pending.node_id)
        self._pending_listeners.clear()
        if self.node_ports:
            log.info("node listeners nodes=%s", dict(sorted(self.node_ports.items())))

    async def _serve_socket(self, sock: socket.socket, node_id: int | None) -> None:
        trio_sock = trio.socket.from_stdlib_socket(sock)
        listener = trio.SocketListener(trio_sock)
        async with listener:
            while True:
                try:
                    stream: trio.abc.Stream = await listener.accept()
                except OSError as exc:  # e.g. EMFILE: keep serving the connections we have
                    log.error("accept failed node_id=%s reason=%r", node_id, str(exc))
                    self.metrics.errors.labels("accept").inc()
                    await trio.sleep(0.1)
                    continue
                tls = self.listener_tls  # the one in force at acceptance, for this connection's life
                if tls is not None:
                    stream = trio.SSLStream(stream, tls.context, server_side=True, https_compatible=False)
                assert self._connection_nursery is not None  # listeners run inside it
                self._connection_nursery.start_soon(self._handle, stream, node_id)

    async def _handle(self, stream: trio.abc.Stream, node_id: int | None) -> None:
        accepted_at = trio.current_time()
        limits = self.config.limits
        setup_deadline = accepted_at + limits.setup_timeout_ms / 1000
        peer = _peer_name(stream)
        if len(self.connections) + self._handshaking >= limits.max_connections:
            await self._refuse(stream, peer)
            return
        if isinstance(stream, trio.SSLStream):
            self._handshaking += 1
            try:
                with trio.fail_at(min(accepted_at + _TLS_HANDSHAKE_TIMEOUT, setup_deadline)):
                    await stream.do_handshake()
            except (trio.BrokenResourceError, trio.TooSlowError, ssl.SSLError, OSError) as exc:
                log.info("TLS handshake failed peer=%s reason=%r", peer, str(exc))
                self.metrics.errors.labels("tls_handshake").inc()
                await trio.aclose_forcefully(stream)
                return
            finally:
                self._handshaking -= 1
        tune_socket(stream, limits.socket_send_buffer_bytes)
        idle_ms = limits.idle_ms
        connection = ClientConnection(
            stream,
            peer,
            open_upstream=lambda: self._open_upstream(node_id),
            chain=self.chain,
            metrics=self.metrics,
            max_frame_bytes=limits.max_frame_bytes,
            max_inflight=limits.max_inflight_requests,
            idle_timeout=idle_ms / 1000 if idle_ms > 0 else math.inf,
            target="bootstrap" if node_id is None else f"node-{node_id}",
            setup_deadline=setup_deadline,
            setup_log=self._setup_timeouts,
            native=self.native_threads,
            budget=self.request_budget,
            max_unauthenticated_frame_bytes=limits.max_frame_bytes_unauthenticated,
            refusal_log=self._frame_refusals,
        )
        self.connections.add(connection)
        self.metrics.connections.inc()
        self.metrics.connections_total.inc()
        try:
            await connection.run()
        except Exception:  # the connection's own guard should have caught it: never the whole proxy
            self.metrics.errors.labels("internal").inc()
            log.exception("connection failed conn=%s peer=%s", connection.id, peer)
        finally:
            self.connections.discard(connection)
            self.metrics.connections.dec()

    async def _refuse(self, stream: trio.abc.Stream, peer: str) -> None:
        """Close a connection beyond max.connections at once: no byte read, none written.
        Counted every time; logged at once, then at most every _CROWD_LOG_INTERVAL."""
        self.metrics.connections_refused.labels("max_connections").inc()
        unlogged = self._refusals.allow(trio.current_time())
        if unlogged is not None:
            log.warning("refusing connection peer=%s reason=max.connections (%s) reached refused_unlogged=%s",
                        peer, self.config.limits.max_connections, unlogged)
        await trio.aclose_forcefully(stream)

    async def _open_upstream(self, node_id: int | None) -> trio.abc.Stream:
        timeout = self._connect_timeout
        if not self.cluster.answered.is_set():
            # No broker has answered yet (the proxy started first): hold the client as a
            # starting broker would, then try anyway.
            with trio.move_on_after(timeout):
                await self.cluster.answered.wait()
        candidates: list[tuple[str, int]]
        if node_id is None:
            fronted = None
            if self.config.cluster.sidecar and self.book.sidecar_node_id is not None:
                fronted = self.book.real_address(self.book.sidecar_node_id)
            candidates = [fronted] if fronted is not None else list(self.config.cluster.bootstrap_servers)
        else:
            address = self.book.real_address(node_id)
            if address is None:
                raise UpstreamUnavailable(f"node {node_id} is not in the cluster metadata the proxy has seen")
            candidates = [address]
        failures: list[str] = []
        for host, port in candidates:
            try:
                stream = await connect(host, port, timeout=timeout, ssl_context=self._upstream_ssl)
            except (OSError, trio.TooSlowError, ssl.SSLError) as exc:
                self.metrics.upstream_connect_failures.inc()
                failures.append(f"{host}:{port} ({exc})")
                continue
            self.metrics.upstream_connects.inc()
            tune_socket(stream, self.config.limits.socket_send_buffer_bytes)
            return stream
        raise UpstreamUnavailable("; ".join(failures) or "no broker address known")

    # -- reloads ----------------------------------------------------------------------------------
    def apply_settings(self, prepared: PreparedReload) -> None:
        """Put reloaded settings in force (``proxy.server.reloader`` has read and checked
        them and built their TLS contexts): assignments that cannot fail, so a reload is
        applied whole. A connection keeps what it was accepted with (its TLS context, frame
        limits, timeouts); connections accepted from now on, broker connections opened from
        now on, the proxy-wide limits (max.connections, queued.max.request.bytes) and the
        key-range settings take the new values at once."""
        config = prepared.plan.config
        self.config = config
        self.listener_tls = prepared.listener_tls
        self._upstream_ssl = self.pool.ssl_context = prepared.upstream_ssl
        self._connect_timeout = self.pool.timeout = config.cluster.upstream_connect_timeout_ms / 1000
        self.request_budget.resize(config.limits.queued_max_request_bytes)
        self._keyrange.reconfigure(config.keyrange)

    # -- shutdown ---------------------------------------------------------------------------------
    async def _watch_signals(self, nursery: trio.Nursery) -> None:
        """SIGTERM and SIGINT drain and stop the proxy; SIGHUP reloads the settings (beside
        this loop, so a slow reload never delays a SIGTERM)."""
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for signum in signals:
                if signum == signal.SIGHUP:
                    nursery.start_soon(self.reloader.reload, "SIGHUP")
                    continue
                log.info("signal received signal=%s; draining", signal.Signals(signum).name)
                self.shutdown()
                return

    def _fronted_brokers(self) -> dict[int, tuple[str, int]]:
        """The brokers this instance fronts (readiness): a sidecar's own, else every broker."""
        if self.config.cluster.sidecar:
            node = self.book.sidecar_node_id
            address = None if node is None else self.book.real_address(node)
            return {} if node is None or address is None else {node: address}
        return dict(self.cluster.nodes)

    async def _drain(self) -> None:
        self.health.draining = True  # not ready: a load balancer stops sending clients
        self.health.note()
        timeout = self.config.operations.shutdown_drain_timeout_ms / 1000
        open_connections = list(self.connections)
        for connection in open_connections:
            connection.drain()
        with trio.move_on_after(timeout) as scope:
            for connection in open_connections:
                await connection.closed.wait()
        if scope.cancelled_caught:
            log.warning("drain timeout reached; closing %s connections", len(self.connections))


def _peer_name(stream: trio.abc.Stream) -> str:
    inner: Any = getattr(stream, "transport_stream", stream)
    try:
        host, port = inner.socket.getpeername()[:2]
        return f"{host}:{port}"
    except (AttributeError, OSError):
        return "unknown"


__all__ = ["ProxyServer", "StartupError", "UnmappedNodeError"]
