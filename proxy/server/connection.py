"""One client connection and its one upstream connection.

Two tasks share a nursery: the reader takes frames from the client, routes them and
sends them upstream; the writer takes responses in request order (from upstream or from
the proxy itself) and sends them to the client. Between them a bounded channel of
exchanges caps the requests in flight: when it is full the reader stops reading, the
client's socket fills, and the client slows down; nothing buffers without limit.

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
a client that skips ApiVersions); and every frame read from a client holds its bytes in the proxy-wide
``RequestBudget`` until the reader has sent it on (or answered it), so a crowd of clients
makes the readers wait, never the heap grow.

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

import trio

from proxy.net import native_relay
from proxy.net.budget import RequestBudget
from proxy.net.native_relay import NativeRelay, NativeRelayThreads, native_now_ns
from proxy.net.streams import FrameStream, PartialFrame
from proxy.pipeline.chain import FeatureChain
from proxy.pipeline.context import ConnectionContext
from proxy.pipeline.route import OwnRequest
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
from proxy.server.exchange import Exchange
from proxy.server.limits import AUTHENTICATION_APIS, ConnectionSetup, LogThrottle
from proxy.server.metrics import ProxyMetrics

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
        self.client = FrameStream(client, max_frame_bytes, budget=budget, early_limit=early)
        self.open_upstream = open_upstream
        self.chain = chain
        self.metrics = metrics
        self.max_frame_bytes = max_frame_bytes
        self.max_inflight = max_inflight
        self.idle_timeout = idle_timeout
        self.setup_deadline = setup_deadline  # on trio's clock; see the module's docstring
        self.setup = ConnectionSetup()
        self._setup_closed = False  # counted and logged as a setup timeout
        self._setup_log = setup_log  # shared by the server's connections; None logs every closure
        self._refusal_log = refusal_log  # likewise, for frames refused for their size
        self.context = ConnectionContext(self.id, peer, target, send_own=self.send_own,
                                         own_responses=chain.decode_own_response)
        self._unsettled: set[Exchange] = set()  # exchanges whose route must be told they are over
        self._reader_scope = trio.CancelScope()
        self._first_request_scope: trio.CancelScope | None = None
        self._last_activity = trio.current_time()
        self._inflight = 0
        self._arriving = 0  # 1 while a request is passed on upstream as its bytes arrive
        self._scope: trio.CancelScope | None = None  # the connection's nursery, once it runs
        self._upstream: FrameStream | None = None
        self._exchanges: trio.MemorySendChannel | None = None
        self._sending = trio.Lock()  # held from queueing an exchange to its frame being sent
        self._awaiting_upstream = 0  # queued exchanges whose response comes from the broker
        self._unanswered = 0  # queued exchanges the writer has not finished with
        self._all_answered: trio.Event | None = None  # set by the writer when _unanswered reaches 0
        self._native_threads = native
        self._native: NativeRelay | None = None
        self.closed = trio.Event()

    # -- lifecycle -----------------------------------------------------------------------
    async def run(self) -> None:
        upstream: FrameStream | None = None
        try:
            # The upstream connection opens on the first request, so idle or port-scanning
            # clients cost the brokers nothing.
            first = None
            idle_deadline = self._last_activity + self.idle_timeout
            with trio.move_on_at(min(self.setup_deadline, idle_deadline)) as self._first_request_scope:
                try:
                    first = await self.client.receive_frame()
                except ProtocolError as exc:
                    self._log_protocol_error(exc)
                    return
                except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError):
                    return
            if first is None:
                if self._first_request_scope.cancelled_caught and trio.current_time() >= idle_deadline:
                    self._closing_idle()
                elif self._first_request_scope.cancelled_caught and trio.current_time() >= self.setup_deadline:
                    self._closing_unset_up()
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
                self._native = NativeRelay(self.client, upstream, threads, self.chain.native_classes(),
                                           max_frame_bytes=self.max_frame_bytes, max_inflight=self.max_inflight)
            async with trio.open_nursery() as nursery:
                self.context.nursery = nursery
                scope = self._scope = nursery.cancel_scope
                nursery.start_soon(self._guarded, self._read_client(upstream, send_exchanges, first), scope, False)
                nursery.start_soon(self._guarded, self._write_client(upstream, receive_exchanges, scope), scope)
                nursery.start_soon(self._watch, scope)
        finally:
            self.metrics.inflight_requests -= self._inflight
            self._inflight = 0
            unsettled, self._unsettled = self._unsettled, set()
            for exchange in unsettled:
                self._settle(exchange)
            self.context.close()
            if self._native is not None:
                self._native.close()
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
        metrics = self.metrics
        frame: bytes | bytearray | PartialFrame | None = first
        # Large requests the proxy only peeks at (Produce) go on while they arrive, their
        # bodies spliced from the client's socket into the broker's.
        pass_on_min = _PASS_ON_MIN if upstream.splices else None
        half_sent = False  # between queueing an exchange and the last byte of its request going upstream
        counted = True  # the first request has been counted towards the setup already (run)
        # Closed without a checkpoint: an error unwinding from here must reach ``_guarded``
        # (and its log line) before the writer, woken by the close, can cancel the connection.
        with exchanges:
            with self._reader_scope:
                while True:
                    if frame is None:
                        if self._native is not None and self.setup.past_authentication:
                            while await self._relay_natively(self._native, exchanges):
                                pass
                        frame = await self.client.receive_request(pass_on_min)
                        if frame is None:
                            return
                    received_at = trio.current_time()
                    self._last_activity = received_at
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
                    if counted:
                        counted = False
                    elif not self.setup.past_authentication:
                        if partial is not None:  # read whole, to be screened
                            whole, partial = await self.client.receive_rest(partial), None
                        screen_unauthenticated(whole)
                        self._set_up_by(peek.api_key, received_at)
                        if self.setup.past_authentication:
                            self.client.authenticated()
                    try:
                        route = await self.chain.route(self.context, peek, partial.head if partial else whole)
                    except ProtocolError:
                        if partial is None:
                            raise
                        # Its head was too short to route on (a huge transactional id?): read it all.
                        whole, partial = await self.client.receive_rest(partial), None
                        route = await self.chain.route(self.context, peek, whole)
                    size = partial.size if partial is not None else len(whole)
                    requests, request_bytes, _, _ = metrics.for_api(peek.api_key)
                    requests.inc()
                    request_bytes.inc(size + 4)
                    exchange = None
                    if route.expect_response or route.local is not None:
                        exchange = Exchange(
                            api_key=peek.api_key,
                            api_version=peek.api_version,
                            correlation_id=peek.correlation_id,
                            received_at=received_at,
                            request_bytes=size + 4,
                            transform=route.transform,
                            local=route.local,
                            relay=route.relay,
                            settle=route.settle,
                        )
                        if route.settle is not None:
                            self._unsettled.add(exchange)
                    elif route.settle is not None:
                        route.settle()  # nothing will come back: it is over once sent
                    sending = self._sending
                    try:  # no trip through the scheduler when nobody else is sending
                        sending.acquire_nowait()
                    except trio.WouldBlock:
                        await sending.acquire()
                    try:
                        half_sent = True
                        for ahead in route.before:
                            await self._queue(exchanges, Exchange.own(ahead, received_at))
                            await upstream.send_frame(ahead.frame)
                        if exchange is not None:
                            await self._queue(exchanges, exchange)
                            self._inflight += 1
                            metrics.inflight_requests += 1
                        if partial is not None and route.upstream_frame is partial.head:
                            self._arriving = 1
                            try:
                                await self.client.pass_on(partial, upstream)
                            finally:
                                self._arriving = 0
                            metrics.spliced_requests.inc()
                        elif partial is not None and route.upstream_frame is not None:
                            raise AssertionError("a route replaced a request it never saw whole")
                        elif route.upstream_frame is not None:
                            await upstream.send_frame(route.upstream_frame)
                        own = route.follow_up
                        if own is not None:
                            await self._queue(exchanges, Exchange.own(own, received_at))
                            await upstream.send_frame(own.frame)
                        half_sent = False
                    finally:
                        sending.release()
                    frame = None
                    self.client.release_frame()  # sent on or answered: its bytes leave the budget
            if half_sent:
                # Drained in the middle of a request (a large one still arriving from the
                # client, or an upstream socket that was full): the broker now holds part
                # of a frame and will answer nothing more, so the writer could only wait.
                raise trio.BrokenResourceError("drained while a request was on its way upstream")

    async def _queue(self, exchanges: trio.MemorySendChannel, exchange: Exchange) -> None:
        if exchange.local is None:
            self._awaiting_upstream += 1
        self._unanswered += 1
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
        if exchanges is None or upstream is None or self._awaiting_upstream:
            return False
        try:
            self._sending.acquire_nowait()
        except trio.WouldBlock:
            return False
        try:
            exchange = Exchange.own(own, trio.current_time())
            exchanges.send_nowait(exchange)
            self._awaiting_upstream += 1
            self._unanswered += 1
            await upstream.send_frame(own.frame)
        except trio.WouldBlock:
            return False
        finally:
            self._sending.release()
        return True

    async def _write_client(
        self, upstream: FrameStream, exchanges: trio.MemoryReceiveChannel, scope: trio.CancelScope
    ) -> None:
        metrics = self.metrics
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
                if exchange.local is None:
                    self._awaiting_upstream -= 1
                if exchange.sink is not None:
                    response = await upstream.receive_frame()
                    if response is None:
                        log.info("upstream closed conn=%s peer=%s target=%s", self.id, self.peer, self.target)
                        scope.cancel()
                        return
                    check_correlation_id(response, exchange)
                    await exchange.sink(response)
                    self._answered()
                    continue
                size: int | None
                if exchange.local is not None:
                    response = await exchange.local.wait()
                    await self.client.send_frame(response)
                    size = len(response)
                elif exchange.relay is not None:
                    # Passed on while it arrives, rewritten (if at all) in place.
                    size = await upstream.relay_frame(self.client, exchange.correlation_id, exchange.relay)
                else:
                    response, exchange.prefetched = exchange.prefetched, None
                    if response is None:
                        response = await upstream.receive_frame()
                    size = None
                    if response is not None:
                        check_correlation_id(response, exchange)
                        if exchange.transform is not None:
                            response = await exchange.transform(response)
                        await self.client.send_frame(response)
                        size = len(response)
                if exchange.settle is not None:
                    self._unsettled.discard(exchange)
                    self._settle(exchange)
                if size is None:
                    log.info("upstream closed conn=%s peer=%s target=%s", self.id, self.peer, self.target)
                    scope.cancel()
                    return
                now = trio.current_time()
                self._last_activity = now
                self._inflight -= 1
                metrics.inflight_requests -= 1
                _, _, response_bytes, latency = metrics.for_api(exchange.api_key)
                response_bytes.inc(size + 4)
                latency.observe(now - exchange.received_at)
                self._answered()
        # The reader is done and every exchange is answered: close in order.
        scope.cancel()

    def _answered(self) -> None:
        self._unanswered -= 1
        if not self._unanswered and self._all_answered is not None:
            self._all_answered.set()
            self._all_answered = None

    # -- the native relay ---------------------------------------------------------------------
    async def _relay_natively(self, native: NativeRelay, exchanges: trio.MemorySendChannel) -> bool:
        """Let the native loop carry the client's next requests, if it may: from here until a
        request or response that needs the event loop, whatever the loop left in flight
        queued for the writer. True when the next request may be the loop's again (the run
        went idle, or handed a response back), so the caller looks again; False when the
        event loop is to read it."""
        if not native.at_boundaries():
            return False
        cls = native.peek()
        if cls is None:
            await trio.lowlevel.wait_readable(native.client.socket)
            cls = native.peek()
        if not cls:
            return False
        while self._unanswered:  # the loop starts with nothing of the event loop's in flight
            self._all_answered = trio.Event()
            await self._all_answered.wait()
        if not native.at_boundaries():
            return False
        threads = native.threads
        if not threads.try_take(self):
            self.metrics.native_unavailable.inc()
            return False
        flights: list = []
        failure: Exception | None = None
        result: native_relay.RunResult | None = None
        nursery = self.context.nursery
        assert nursery is not None  # set before the reader starts
        await self._sending.acquire()  # no request of the proxy's own goes upstream meanwhile
        try:
            while True:
                refusals = threads.refusals
                ran = await native.run(flights, nursery)
                flights = ran.flights  # carried into the next run, or handed over below
                if ran.reason == native_relay.SLICE and threads.refusals == refusals:
                    self._native_accounting(ran)
                    continue
                break
        finally:
            result = native.last  # None when cancelled before the run: the carried flights stand
            held = None
            try:
                if result is not None:
                    flights, held = result.flights, result.held
                    self._native_accounting(result)
                    if result.reason == native_relay.PROTOCOL:
                        failure = ProtocolError(result.message)
                    elif result.reason in (native_relay.BROKEN, native_relay.ABORTED):
                        failure = trio.BrokenResourceError(result.message or "native relay aborted")
                if failure is None:
                    self._hand_over(flights, held, exchanges)
            finally:
                threads.give_back(self)
                self._sending.release()
        if failure is not None:
            raise failure
        return result is not None and result.reason in (native_relay.IDLE, native_relay.PYTHON_RESPONSE)

    def _native_accounting(self, result: native_relay.RunResult) -> None:
        metrics = self.metrics
        metrics.native_runs.labels(native_relay.ENDINGS[result.reason]).inc()
        metrics.native_requests.inc(result.forwarded)
        metrics.spliced_requests.inc(result.spliced)
        for api_key, request_size, response_size, latency_ns in result.answered:
            requests, request_bytes, response_bytes, latency = metrics.for_api(api_key)
            requests.inc()
            request_bytes.inc(request_size)
            response_bytes.inc(response_size)
            latency.observe(latency_ns / 1e9)
        if result.forwarded or result.answered or result.flights:  # a request in flight is not idleness
            self._last_activity = trio.current_time()

    def _hand_over(self, flights: list, held: bytes | None, exchanges: trio.MemorySendChannel) -> None:
        """Queue the requests the native loop forwarded and left unanswered, in order, as
        the event loop's own exchanges (the channel is empty: the loop started with nothing
        queued, and nothing else sends upstream while it runs)."""
        if not flights:
            return
        metrics = self.metrics
        now, now_ns = trio.current_time(), native_now_ns()
        for api_key, version, correlation_id, _, request_size, started_ns in flights:
            route = self.chain.native_route(self.context, api_key, version)
            exchange = Exchange(api_key=api_key, api_version=version, correlation_id=correlation_id,
                                received_at=now - (now_ns - started_ns) / 1e9, request_bytes=request_size,
                                transform=route.transform, relay=route.relay, prefetched=held)
            held = None
            requests, request_bytes, _, _ = metrics.for_api(api_key)
            requests.inc()
            request_bytes.inc(request_size)
            self._awaiting_upstream += 1
            self._unanswered += 1
            exchanges.send_nowait(exchange)
            self._inflight += 1
            metrics.inflight_requests += 1

    def _settle(self, exchange: Exchange) -> None:
        settle, exchange.settle = exchange.settle, None
        if settle is not None:
            try:
                settle()
            except Exception:  # noqa: BLE001 - a feature's clean-up must not take the connection down
                log.exception("settling a request failed conn=%s api_key=%s", self.id, exchange.api_key)

    async def _watch(self, scope: trio.CancelScope) -> None:
        """Close the connection at the setup deadline if it has not set up by then, or once
        it has been idle for ``idle_timeout``; one task for both (it costs every connection)."""
        setup_pending = math.isfinite(self.setup_deadline) and not self.setup.past_authentication
        while True:
            now = trio.current_time()
            if setup_pending and now >= self.setup_deadline:
                if not self.setup.complete:
                    self._closing_unset_up()
                    scope.cancel()
                    return
                setup_pending = False  # a SASL begun later is caught as it arrives (_set_up_by)
            idle_deadline = self._last_activity + self.idle_timeout
            if now >= idle_deadline and self._inflight - self._arriving == 0:
                self._closing_idle()
                scope.cancel()
                return
            wake = max(idle_deadline, now + 1.0)  # in flight past the deadline: look again each second
            if setup_pending:
                wake = min(wake, self.setup_deadline)
            if not math.isfinite(wake):
                return
            await trio.sleep_until(wake)

    def _closing_idle(self) -> None:
        self.metrics.connections_closed.labels("idle").inc()
        log.info("closing idle connection conn=%s peer=%s idle_s=%.0f", self.id, self.peer, self.idle_timeout)

    # -- setup ------------------------------------------------------------------------------
    def _set_up_by(self, api_key: int, now: float) -> None:
        """One more request while the connection may still be setting up (the reader's)."""
        self.setup.on_request(api_key)
        if not self.setup.complete and now >= self.setup_deadline and self._scope is not None:
            # SASL begun after the deadline, on a connection not yet past authentication.
            self._closing_unset_up()
            self._scope.cancel()

    def _closing_unset_up(self) -> None:
        if self._setup_closed:
            return
        self._setup_closed = True
        self.metrics.connections_closed.labels("setup_timeout").inc()
        unlogged = 0 if self._setup_log is None else self._setup_log.allow(trio.current_time())
        if unlogged is not None:  # a crowd of them (a slow-loris attack) is logged a line at a time
            log.info("closing connection not set up in time conn=%s peer=%s target=%s lacking=%r "
                     "closed_unlogged=%s", self.id, self.peer, self.target, self.setup.describe(), unlogged)

