"""One client connection and its one upstream connection.

Three tasks share a nursery: the reader takes frames from the client, routes them and
sends them upstream; the writer takes responses in request order (from upstream or from
the proxy itself) and sends them to the client; the watch closes a connection that does
not do its part (below, ``proxy.server.watch``). Between reader and writer a bounded
channel of exchanges (``proxy.server.exchange``) caps the requests in flight, counted in
one ``InflightLedger``: when it is full the reader stops reading, the client's socket
fills, and the client slows down; nothing buffers without limit. Between two requests the
reader may hand both sockets to the native relay (``proxy.server.native_runs``).

The proxy may send requests of its own on the upstream connection (``send_own``, and a
route's ``before`` and ``follow_up``). Queue order must equal the order frames go
upstream, since the broker answers in that order: a lock covers "queue the exchange, send
its frame".

Bad bytes from the client close this connection only, with one log line naming the peer
and the reason.

What a client's frames may cost is bounded twice (``proxy.net.budget``): until the
connection is past authentication its ApiVersions, SaslHandshake and SaslAuthenticate
frames may declare no more than ``max.frame.bytes.unauthenticated`` (a broker's cap on
SASL frames), any other ``max.frame.bytes`` (a first request may be a large Produce from
a client that skips ApiVersions); and every frame read from a client holds its bytes in
the proxy-wide ``RequestBudget`` until the reader has sent it on (or answered it), so a
crowd of clients makes the readers wait, never the heap grow. Requests before
authentication are screened whole, and every request header's tagged fields counted,
against Kafka 4.4's limits (``screen_unauthenticated``, ``peek_request``).

Two clocks bound a connection that does not do its part:

- setup (``setup_deadline``, from ``connections.setup.timeout.ms`` after it was accepted):
  by then it must have delivered its first complete request and, if it began SASL
  authentication first, finished it (``proxy.server.limits.ConnectionSetup``). A client
  trickling its first frame a byte at a time is closed at the deadline like one that
  sends nothing.
- idle (``idle_timeout``): closed once no request has begun arriving and no response has
  left for that long, with nothing in flight. A request whose bytes are still arriving
  (passed on to the broker while it arrives) does not count as in flight here, so a
  client trickling the body of a large request is closed too.
"""

from __future__ import annotations

import itertools
import logging
import math
import ssl
from collections.abc import Awaitable, Callable
from typing import cast

import trio

from proxy.net.budget import RequestBudget
from proxy.net.native_relay import NativeRelay, NativeRelayThreads
from proxy.net.streams import ClientFrameStream, FrameStream, PartialFrame
from proxy.pipeline.chain import FeatureChain
from proxy.pipeline.context import ConnectionContext
from proxy.pipeline.route import OwnRequest, Route
from proxy.protocol import messages
from proxy.protocol.errors import ProtocolError, exceeded_limit
from proxy.protocol.framing import (
    FrameTooLarge,
    RequestHeaderPeek,
    check_request_header_tags,
    peek_correlation_id,
    peek_request_header,
)
from proxy.protocol.messages import request_header_flexible
from proxy.server.exchange import Exchange, InflightLedger, Local, Relayed, Tail, ToSink
from proxy.server.limits import AUTHENTICATION_APIS, LogThrottle
from proxy.server.metrics import ProxyMetrics
from proxy.server.native_runs import NativeRuns
from proxy.server.watch import ConnectionWatch

log = logging.getLogger("proxy.connection")

_connection_ids = itertools.count(1)

UpstreamOpener = Callable[[], Awaitable[trio.abc.Stream]]
_PASS_ON_MIN = 64 * 1024  # requests with this much still to arrive are spliced, not read


def peek_request(frame: bytes | bytearray) -> RequestHeaderPeek | None:
    """A request's header, peeked; refused (ProtocolError) when its flexible header declares
    more tagged fields than Kafka 4.4 reads, so no broker behind the proxy ever sees such a
    request (brokers before 4.4 allocate per declared field before authentication). None
    when ``frame`` is the head of a request and ends before the header's count of tagged
    fields (a client id of kilobytes): the caller reads the whole request and asks again."""
    peek = peek_request_header(frame)
    if check_request_header_tags(frame, request_header_flexible(peek.api_key, peek.api_version)) is None:
        return None
    return peek


def peek_whole_request(frame: bytes | bytearray) -> RequestHeaderPeek:
    peek = peek_request(frame)
    if peek is None:
        raise ProtocolError("request header ends before its tagged fields", offset=len(frame))
    return peek


def screen_unauthenticated(frame: bytes | bytearray) -> None:
    """Decode a request that arrived before its connection was past authentication, to
    refuse (ProtocolError) any array or tagged-field section over Kafka 4.4's limits
    anywhere in it: brokers before 4.4 allocate per declared element while they read such
    a request, before they know who sent it. These requests are few (ApiVersions, the SASL
    exchange, a first request) and small (``max.frame.bytes.unauthenticated``), so reading
    them whole costs little. Any other fault is the broker's to answer, as before: the
    request goes on."""
    try:
        messages.decode_request(frame, strict=False)
    except ProtocolError as exc:
        if exceeded_limit(exc) is not None:
            raise


def check_correlation_id(response, exchange: Exchange) -> None:
    correlation_id = peek_correlation_id(response)
    if correlation_id != exchange.correlation_id:
        raise ProtocolError(
            f"broker answered correlation id {correlation_id}, expected {exchange.correlation_id}",
            api_key=exchange.api_key,
            version=exchange.api_version,
        )


class UpstreamUnavailable(Exception):
    """No broker could be reached for this connection."""


class ClientConnection:
    def __init__(
        self,
        client: trio.abc.Stream,
        peer: str,
        *,
        open_upstream: UpstreamOpener,
        chain: FeatureChain,
        metrics: ProxyMetrics,
        max_frame_bytes: int,
        max_inflight: int,
        idle_timeout: float,
        target: str,
        setup_deadline: float = math.inf,
        setup_log: LogThrottle | None = None,
        native: NativeRelayThreads | None = None,
        budget: RequestBudget | None = None,
        max_unauthenticated_frame_bytes: int | None = None,
        refusal_log: LogThrottle | None = None,
    ) -> None:
        self.id = next(_connection_ids)
        self.peer = peer
        self.target = target  # "bootstrap" or "node-<id>", for logs
        if budget is None:  # a connection of its own (tests): a budget no frame can spend
            budget = RequestBudget(1 << 62)
        early = None
        if max_unauthenticated_frame_bytes is not None:
            early = (max_unauthenticated_frame_bytes, "max.frame.bytes.unauthenticated", AUTHENTICATION_APIS)
        self.client = ClientFrameStream(client, max_frame_bytes, budget=budget, early_limit=early)
        self.open_upstream = open_upstream
        self.chain = chain
        self.metrics = metrics
        self.max_frame_bytes = max_frame_bytes
        self.max_inflight = max_inflight
        self.watch = ConnectionWatch(setup_deadline=setup_deadline, idle_timeout=idle_timeout, setup_log=setup_log,
                                     metrics=metrics, names=(self.id, peer, target))
        self.setup = self.watch.setup
        self._refusal_log = refusal_log  # likewise, for frames refused for their size
        self.context = ConnectionContext(self.id, peer, target, send_own=self.send_own,
                                         own_responses=chain.decode_own_response)
        self._unsettled: set[Exchange] = set()  # exchanges whose route must be told they are over
        self._reader_scope = trio.CancelScope()
        self._first_request_scope: trio.CancelScope | None = None
        self._ledger = InflightLedger(metrics)
        self._scope: trio.CancelScope | None = None  # the connection's nursery, once it runs
        self._upstream: FrameStream | None = None
        self._exchanges: trio.MemorySendChannel | None = None
        self._sending = trio.Lock()  # held from queueing an exchange to its frame being sent
        self._half_sent = False  # between queueing a request's exchange and its last byte going upstream
        self._native_threads = native
        self._native: NativeRuns | None = None
        self.closed = trio.Event()

    # -- lifecycle -----------------------------------------------------------------------
    async def run(self) -> None:
        upstream: FrameStream | None = None
        try:
            # The upstream connection opens on the first request, so idle or port-scanning
            # clients cost the brokers nothing.
            first = None
            idle_deadline = self.watch.idle_deadline
            with trio.move_on_at(min(self.watch.setup_deadline, idle_deadline)) as self._first_request_scope:
                try:
                    first = await self.client.receive_frame()
                except ProtocolError as exc:
                    self._log_protocol_error(exc)
                    return
                except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError):
                    return
            if first is None:
                if self._first_request_scope.cancelled_caught and trio.current_time() >= idle_deadline:
                    self.watch.closing_idle()
                elif self._first_request_scope.cancelled_caught and trio.current_time() >= self.watch.setup_deadline:
                    self.watch.closing_unset_up()
                return
            try:
                screen_unauthenticated(first)
                self.setup.on_request(peek_whole_request(first).api_key)
            except ProtocolError as exc:  # not a request: no broker connection for it
                self._log_protocol_error(exc)
                return
            if self.setup.past_authentication:
                self.client.authenticated()
            try:
                upstream = FrameStream(await self.open_upstream(), self.max_frame_bytes)
            except (OSError, trio.TooSlowError, ssl.SSLError, UpstreamUnavailable) as exc:
                log.warning("upstream unavailable conn=%s peer=%s target=%s reason=%r",
                            self.id, self.peer, self.target, str(exc))
                self.metrics.errors.labels("upstream_unavailable").inc()
                return
            send_exchanges, receive_exchanges = trio.open_memory_channel[Exchange](self.max_inflight)
            self._upstream, self._exchanges = upstream, send_exchanges
            threads = self._native_threads
            if threads is not None and NativeRelay.usable(self.client, upstream, threads):
                chain, context = self.chain, self.context
                answers = chain.native_answers
                relay = NativeRelay(self.client, upstream, threads, lambda: chain.native_classes_for(context),
                                    max_frame_bytes=self.max_frame_bytes, max_inflight=self.max_inflight,
                                    guard=chain.native_guard, known=chain.native_known, answers=answers,
                                    served=None if answers is None else lambda: answers.served(context))
                self._native = NativeRuns(relay, ledger=self._ledger, metrics=self.metrics, chain=self.chain,
                                          context=self.context, sending=self._sending, watch=self.watch)
            async with trio.open_nursery() as nursery:
                self.context.nursery = nursery
                scope = self._scope = nursery.cancel_scope
                nursery.start_soon(self._guarded, self._read_client(upstream, send_exchanges, first), scope, False)
                nursery.start_soon(self._guarded, self._write_client(upstream, receive_exchanges, scope), scope)
                nursery.start_soon(self.watch.run, scope, lambda: self._ledger.idle)
        finally:
            self._ledger.close()
            unsettled, self._unsettled = self._unsettled, set()
            for exchange in unsettled:
                self._settle(exchange)
            self.context.close()
            if self._native is not None:
                self._native.relay_loop.close()
            if upstream is not None:
                await upstream.aclose()
            await self.client.aclose()
            self.closed.set()

    def _log_protocol_error(self, exc: ProtocolError) -> None:
        self.metrics.errors.labels("protocol").inc()
        if isinstance(exc, FrameTooLarge):
            self.metrics.frames_refused.labels(exc.limit_name).inc()
            # A crowd of them (an attack) is logged a line at a time, saying how many it stands for.
            unlogged = 0 if self._refusal_log is None else self._refusal_log.allow(trio.current_time())
            if unlogged is not None:
                log.warning("closing connection conn=%s peer=%s target=%s reason=%r closed_unlogged=%s",
                            self.id, self.peer, self.target, str(exc), unlogged)
            return
        limit = exceeded_limit(exc)
        if limit is not None:
            self.metrics.protocol_limits.labels(limit).inc()
        log.warning("closing connection conn=%s peer=%s target=%s reason=%r",
                    self.id, self.peer, self.target, str(exc))

    async def _guarded(self, task: Awaitable[None], scope: trio.CancelScope, end_on_return: bool = True) -> None:
        """Run one of the connection's tasks; any way it fails ends the whole connection,
        and only this connection. The reader returning (client closed, or drain) must not
        end it: the writer still owes the responses in flight."""
        try:
            await task
            if not end_on_return:
                return
        except ProtocolError as exc:
            self._log_protocol_error(exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError) as exc:
            log.debug("connection ended conn=%s peer=%s reason=%r", self.id, self.peer, str(exc))
        except Exception:  # a fault of ours (a feature's bug): this connection ends, nothing else
            self.metrics.errors.labels("internal").inc()
            log.exception("closing connection on an internal error conn=%s peer=%s target=%s",
                          self.id, self.peer, self.target)
        scope.cancel()

    def drain(self) -> None:
        """Stop taking requests; the writer finishes those in flight, then the connection closes."""
        if self._first_request_scope is not None:
            self._first_request_scope.cancel()
        self._reader_scope.cancel()

    # -- tasks ------------------------------------------------------------------------------
    async def _read_client(self, upstream: FrameStream, exchanges: trio.MemorySendChannel, first: bytes | bytearray) -> None:
        """The reader: each request of the client, in order, routed and sent upstream."""
        frame: bytes | bytearray | PartialFrame | None = first
        # Large requests the proxy only peeks at (Produce) go on while they arrive, their
        # bodies spliced from the client's socket into the broker's.
        pass_on_min = _PASS_ON_MIN if upstream.splices else None
        counted = True  # the first request has been counted towards the setup already (run)
        # Closed without a checkpoint: an error unwinding from here must reach ``_guarded``
        # (and its log line) before the writer, woken by the close, can cancel the connection.
        with exchanges:
            with self._reader_scope:
                while True:
                    if frame is None:
                        if self._native is not None and self.setup.past_authentication:
                            while await self._native.relay(exchanges):
                                pass
                        frame = await self.client.receive_request(pass_on_min)
                        if frame is None:
                            return
                    received_at = trio.current_time()
                    self.watch.last_activity = received_at
                    peek, whole, partial = await self._take_request(frame, received_at, counted)
                    counted = False
                    route, whole, partial = await self._route(peek, whole, partial)
                    exchange = self._exchange_for(route, peek, partial.size if partial else len(whole), received_at)
                    await self._send(route, exchange, partial, upstream, exchanges, received_at)
                    frame = None
                    self.client.release_frame()  # sent on or answered: its bytes leave the budget
            if self._half_sent:
                # Drained in the middle of a request (a large one still arriving from the
                # client, or an upstream socket that was full): the broker now holds part
                # of a frame and will answer nothing more, so the writer could only wait.
                raise trio.BrokenResourceError("drained while a request was on its way upstream")

    async def _take_request(self, frame: bytes | bytearray | PartialFrame, received_at: float, counted: bool
                            ) -> tuple[RequestHeaderPeek, bytes | bytearray, PartialFrame | None]:
        """A request's header peeked (and refused if it declares too many tagged fields);
        read whole if a feature reads it or the connection is not past authentication
        (then screened, and counted towards its setup)."""
        partial: PartialFrame | None = None
        whole: bytes | bytearray = b""
        if isinstance(frame, PartialFrame):
            partial = frame
            head_peek = peek_request(partial.head)
            if head_peek is None or self.chain.reads_requests(head_peek.api_key):
                whole, partial = await self.client.receive_rest(partial), None
                peek = peek_whole_request(whole)
            else:
                peek = head_peek
        else:
            whole = frame
            peek = peek_whole_request(whole)
        if not counted and not self.setup.past_authentication:
            if partial is not None:  # read whole, to be screened
                whole, partial = await self.client.receive_rest(partial), None
            screen_unauthenticated(whole)
            if not self.watch.set_up_by(peek.api_key, received_at) and self._scope is not None:
                self._scope.cancel()
            if self.setup.past_authentication:
                self.client.authenticated()
        return peek, whole, partial

    async def _route(self, peek: RequestHeaderPeek, whole: bytes | bytearray, partial: PartialFrame | None
                     ) -> tuple[Route, bytes | bytearray, PartialFrame | None]:
        try:
            return await self.chain.route(self.context, peek, partial.head if partial else whole), whole, partial
        except ProtocolError:
            if partial is None:
                raise
        # Its head was too short to route on (a huge transactional id?): read it all.
        whole = await self.client.receive_rest(partial)
        return await self.chain.route(self.context, peek, whole), whole, None

    def _exchange_for(self, route: Route, peek: RequestHeaderPeek, size: int, received_at: float) -> Exchange | None:
        """The request counted, and its exchange (None when nothing will answer it)."""
        requests, request_bytes, _, _ = self.metrics.for_api(peek.api_key)
        requests.inc()
        request_bytes.inc(size + 4)
        if route.expect_response or route.local is not None:
            exchange = Exchange.of_route(route, api_key=peek.api_key, api_version=peek.api_version,
                                         correlation_id=peek.correlation_id, received_at=received_at,
                                         request_bytes=size + 4)
            if route.settle is not None:
                self._unsettled.add(exchange)
            return exchange
        if route.settle is not None:
            route.settle()  # nothing will come back: it is over once sent
        return None

    async def _send(self, route: Route, exchange: Exchange | None, partial: PartialFrame | None,
                    upstream: FrameStream, exchanges: trio.MemorySendChannel, received_at: float) -> None:
        """Queue the exchanges and send the frames of one request upstream, in the order
        the broker will answer them; nothing else goes upstream meanwhile."""
        sending = self._sending
        try:  # no trip through the scheduler when nobody else is sending
            sending.acquire_nowait()
        except trio.WouldBlock:
            await sending.acquire()
        try:
            self._half_sent = True
            for ahead in route.before:
                await self._queue(exchanges, Exchange.own(ahead, received_at))
                await upstream.send_frame(ahead.frame)
            if exchange is not None:
                await self._queue(exchanges, exchange)
            if partial is not None and route.upstream_frame is partial.head:
                self._ledger.arriving = 1
                try:
                    await self.client.pass_on(partial, upstream)
                finally:
                    self._ledger.arriving = 0
                self.metrics.spliced_requests.inc()
            elif partial is not None and route.upstream_frame is not None:
                raise AssertionError("a route replaced a request it never saw whole")
            elif route.upstream_frame is not None:
                await upstream.send_frame(route.upstream_frame)
            own = route.follow_up
            if own is not None:
                exchange = Exchange.own(own, received_at)
                if exchange.settle is not None:
                    self._unsettled.add(exchange)
                await self._queue(exchanges, exchange)
                await upstream.send_frame(own.frame)
            self._half_sent = False
        finally:
            sending.release()

    async def _queue(self, exchanges: trio.MemorySendChannel, exchange: Exchange) -> None:
        self._ledger.queued(exchange)
        try:  # no trip through the scheduler while there is room
            exchanges.send_nowait(exchange)
        except trio.WouldBlock:
            # max_inflight exchanges wait: stop reading, backpressure on the client.
            await exchanges.send(exchange)

    async def send_own(self, own: OwnRequest) -> bool:
        """Send a request of the proxy's own upstream, if that cannot hold anything up.

        Called from the writer (while it handles a response): only when every queued
        exchange is answered by the proxy itself and no frame is on its way upstream, so
        the upstream socket is idle (a small frame goes out at once) and the broker's
        answer cannot be mistaken for another's. False when it was not sent.
        """
        exchanges, upstream = self._exchanges, self._upstream
        if exchanges is None or upstream is None or self._ledger.from_broker:
            return False
        try:
            self._sending.acquire_nowait()
        except trio.WouldBlock:
            return False
        try:
            exchange = Exchange.own(own, trio.current_time())
            exchanges.send_nowait(exchange)
            self._ledger.queued(exchange)
            if exchange.settle is not None:
                self._unsettled.add(exchange)
            await upstream.send_frame(own.frame)
        except trio.WouldBlock:
            return False
        finally:
            self._sending.release()
        return True

    async def _write_client(
        self, upstream: FrameStream, exchanges: trio.MemoryReceiveChannel, scope: trio.CancelScope
    ) -> None:
        """The writer: each queued exchange's response, in order. (The per-response loop of
        every connection, kept in one function: no call or await beyond the response's own.)"""
        metrics = self.metrics
        ledger = self._ledger
        async with exchanges:
            while True:
                # A queued exchange is taken without a trip through the scheduler: the
                # response's receive below is this turn's checkpoint (each way of
                # producing a response is one, waited or not).
                try:
                    exchange = exchanges.receive_nowait()
                except trio.WouldBlock:
                    try:
                        exchange = await exchanges.receive()
                    except trio.EndOfChannel:
                        break
                except trio.EndOfChannel:
                    break
                ledger.taken(exchange)
                source = exchange.response
                size: int | None
                if isinstance(source, ToSink):
                    response = await upstream.receive_frame()
                    if response is None:
                        log.info("upstream closed conn=%s peer=%s target=%s", self.id, self.peer, self.target)
                        scope.cancel()
                        return
                    check_correlation_id(response, exchange)
                    await source.sink(cast(bytes, response))  # read only, like bytes, by every sink
                    if exchange.settle is not None:
                        self._unsettled.discard(exchange)
                        self._settle(exchange)
                    ledger.answered(exchange)
                    continue
                if isinstance(source, Local):
                    answer = await source.answer.wait()
                    await self.client.send_frame(answer)
                    size = len(answer)
                elif isinstance(source, Relayed):
                    # Passed on while it arrives, rewritten (if at all) in place.
                    size = await upstream.relay_frame(self.client, exchange.correlation_id, source.relay)
                elif isinstance(source, Tail):
                    # The native relay sent the rest: the tail goes on, rewritten in place.
                    await self.client.send_rest(source.rest())
                    size = source.size
                else:
                    response, source.prefetched = source.prefetched, None
                    if response is None:
                        response = await upstream.receive_frame()
                    size = None
                    if response is not None:
                        check_correlation_id(response, exchange)
                        outgoing = response if source.transform is None else await source.transform(response)
                        await self.client.send_frame(outgoing)
                        size = len(outgoing)
                if exchange.settle is not None:
                    self._unsettled.discard(exchange)
                    self._settle(exchange)
                if size is None:
                    log.info("upstream closed conn=%s peer=%s target=%s", self.id, self.peer, self.target)
                    scope.cancel()
                    return
                now = trio.current_time()
                self.watch.last_activity = now
                _, _, response_bytes, latency = metrics.for_api(exchange.api_key)
                response_bytes.inc(size + 4)
                latency.observe(now - exchange.received_at)
                ledger.answered(exchange)
        # The reader is done and every exchange is answered: close in order.
        scope.cancel()

    def _settle(self, exchange: Exchange) -> None:
        settle, exchange.settle = exchange.settle, None
        if settle is not None:
            try:
                settle()
            except Exception:  # noqa: BLE001 - a feature's clean-up must not take the connection down
                log.exception("settling a request failed conn=%s api_key=%s", self.id, exchange.api_key)

