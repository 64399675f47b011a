"""A client connection's runs on the native relay: when its next requests may go to the C
loop (``proxy.net.native_relay``), what it hands back, and how that is counted.

The loop starts only at frame boundaries with nothing of the event loop's in flight, and
holds the connection's send lock while it runs, so no request of the proxy's own goes
upstream meanwhile; the requests it forwarded and left unanswered come back as the
connection's ordinary exchanges, in order.
"""

from __future__ import annotations

import trio

from proxy.net import native_relay
from proxy.net.native_relay import NativeRelay, native_now_ns
from proxy.net.native_table import NativeClass
from proxy.pipeline.chain import FeatureChain
from proxy.pipeline.context import ConnectionContext
from proxy.protocol.errors import ProtocolError
from proxy.server.exchange import Exchange, InflightLedger
from proxy.server.metrics import ProxyMetrics
from proxy.server.watch import ConnectionWatch


class NativeRuns:
    """The native relay's runs on one connection (its reader's, between two requests)."""

    __slots__ = ("relay_loop", "ledger", "metrics", "chain", "context", "sending", "watch")

    def __init__(self, relay_loop: NativeRelay, *, ledger: InflightLedger, metrics: ProxyMetrics, chain: FeatureChain,
                 context: ConnectionContext, sending: trio.Lock, watch: ConnectionWatch) -> None:
        self.relay_loop = relay_loop
        self.ledger = ledger
        self.metrics = metrics
        self.chain = chain
        self.context = context
        self.sending = sending  # the connection's: held from queueing an exchange to its frame being sent
        self.watch = watch

    async def relay(self, exchanges: trio.MemorySendChannel) -> bool:
        """Let the native loop carry the client's next requests, if it may: from here until a
        request or response that needs the event loop, whatever the loop left in flight
        queued for the writer. True when the next request may be the loop's again (the run
        went idle, or handed a response back), so the caller looks again; False when the
        event loop is to read it."""
        native = self.relay_loop
        if not native.at_boundaries():
            return False
        cls = native.peek()
        if cls is None:
            await trio.lowlevel.wait_readable(native.client.socket)
            cls = native.peek()
        if not cls:
            return False
        await self.ledger.all_answered()  # the loop starts with nothing of the event loop's in flight
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
        await self.sending.acquire()  # no request of the proxy's own goes upstream meanwhile
        try:
            while True:
                refusals = threads.refusals
                ran = await native.run(flights, nursery)
                flights = ran.flights  # carried into the next run, or handed over below
                if ran.reason == native_relay.SLICE and threads.refusals == refusals:
                    self._accounting(ran)
                    continue
                break
        finally:
            result = native.last  # None when cancelled before the run: the carried flights stand
            held = None
            try:
                if result is not None:
                    flights, held = result.flights, result.held
                    self._accounting(result)
                    if result.reason == native_relay.PROTOCOL:
                        failure = ProtocolError(result.message)
                    elif result.reason in (native_relay.BROKEN, native_relay.ABORTED):
                        failure = trio.BrokenResourceError(result.message or "native relay aborted")
                if failure is None:
                    self._hand_over(flights, held, exchanges)
            finally:
                threads.give_back(self)
                self.sending.release()
        if failure is not None:
            raise failure
        return result is not None and result.reason in (native_relay.IDLE, native_relay.PYTHON_RESPONSE)

    def _accounting(self, result: native_relay.RunResult) -> None:
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
        answers = self.relay_loop.answers
        if result.taken and answers is not None:  # the cached shares the loop sent: the cache's bookkeeping
            answers.taken(result.taken)
        if result.forwarded or result.answered or result.flights:  # a request in flight is not idleness
            self.watch.last_activity = trio.current_time()

    def _hand_over(self, flights: list, held: bytes | None, exchanges: trio.MemorySendChannel) -> None:
        """Queue the requests the native loop forwarded and left unanswered, in order, as
        the event loop's own exchanges (the channel is empty: the loop started with nothing
        queued, and nothing else sends upstream while it runs)."""
        if not flights:
            return
        metrics = self.metrics
        now, now_ns = trio.current_time(), native_now_ns()
        for api_key, version, correlation_id, cls, request_size, started_ns in flights:
            route = self.chain.native_route(self.context, api_key, version)
            # a held response: whole (PRODUCE), or the tail of one the loop sent the rest of (FETCH)
            tail = held if cls == NativeClass.FETCH else None
            exchange = Exchange.of_route(route, api_key=api_key, api_version=version, correlation_id=correlation_id,
                                         received_at=now - (now_ns - started_ns) / 1e9, request_bytes=request_size,
                                         prefetched=None if tail is not None else held, tail=tail)
            held = None
            requests, request_bytes, _, _ = metrics.for_api(api_key)
            requests.inc()
            request_bytes.inc(request_size)
            self.ledger.queued(exchange)
            exchanges.send_nowait(exchange)
