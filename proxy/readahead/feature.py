"""Fetch read-ahead, the I/O edge: a Fetch hook, the held responses, and their metrics.

A read-ahead is the Fetch the consumer is predicted to send next (``plan.next_request``),
sent upstream on the client's own connection (so it carries the client's authentication,
and the broker answers in order), and its response held until the client asks. A request
equal to the oldest prediction is answered from it; any other request drops every held
one and goes to the broker as usual.

Bounded: ``DEPTH`` read-aheads per connection, each at most ``fetch.readahead.max.bytes``, all
together at most ``fetch.readahead.buffer.bytes`` (reserved before sending, so the cap
holds while responses are on their way). A connection whose read-aheads go unused three
times running stops reading ahead for a minute: a consumer whose next request cannot be
predicted costs the broker nothing extra for long.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging

import trio
from prometheus_client import Counter, Gauge

from proxy.protocol import messages
from proxy.protocol.framing import RequestHeaderPeek
from proxy.protocol.messages import ApiKey
from proxy.readahead import plan
from proxy.server.exchange import LocalAnswer, OwnRequest
from proxy.server.rewrite import rewrite_node_endpoints
from proxy.server.routing import Route

log = logging.getLogger("proxy.readahead")

# Fetch v4 brought isolation levels and the last stable offset; older consumers are rare
# enough not to be worth a prediction path of their own.
FIRST_VERSION = 4
# Read-aheads per connection: with two, the next response is on its way from the broker
# while the one after the client's current one waits, so a client that asks before the
# broker's answer is in (the broker shares the machine) still rarely waits.
DEPTH = 2
WASTED_LIMIT = 3  # unused read-aheads in a row before a connection pauses
PAUSE_SECONDS = 60.0


class ByteBudget:
    """Bytes all held read-aheads may take together."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, count: int) -> bool:
        if self.used + count > self.limit:
            return False
        self.used += count
        return True

    def give(self, count: int) -> None:
        self.used -= count
        assert self.used >= 0

    def resize(self, old: int, new: int) -> None:
        """A reservation of ``old`` bytes now holds ``new``: what actually arrived, which
        may exceed the limit (a broker returns a first batch larger than max_bytes whole)."""
        self.used += new - old


class Prediction:
    """The request a consumer is expected to send next, ready to compare and to send.

    ``expected`` is the client's frame as it will arrive, correlation id aside; a frame
    matches when its bytes before and after the correlation id are these, so a hit costs
    a comparison, not a decoding.
    """

    __slots__ = ("predicted", "header", "client_epoch", "expected", "upstream_body")

    def __init__(self, predicted, header, client_epoch: int, upstream_body) -> None:
        self.predicted = predicted  # sessionless, as the proxy forwards it
        self.header = header  # the client's request header (client id), for our own requests
        self.client_epoch = client_epoch  # the session epoch the client sends (0 or -1)
        as_sent = predicted if predicted.session_epoch == client_epoch else dataclasses.replace(
            predicted, session_epoch=client_epoch)
        self.expected = messages.encode_request(header, as_sent)
        self.upstream_body = upstream_body

    def matches(self, frame) -> bool:
        expected = self.expected
        view = memoryview(frame)
        return len(view) == len(expected) and view[:4] == expected[:4] and view[8:] == expected[8:]


class HeldRead:
    """One read-ahead: the request it answers, and the broker's response once it arrives."""

    __slots__ = ("prediction", "reserved", "frame", "after", "claim")

    def __init__(self, prediction: Prediction, reserved: int) -> None:
        self.prediction = prediction
        self.reserved = reserved  # bytes of the budget this holds
        self.frame: bytearray | None = None  # the response frame, ready for a client
        self.after: Prediction | None = None  # the request expected once this is consumed
        self.claim: tuple[LocalAnswer, int] | None = None  # a client request waiting for it


class ConnectionReadAhead:
    """Read-ahead state of one client connection."""

    __slots__ = ("queue", "claimed", "newest", "wasted", "paused_until", "_budget")

    def __init__(self, budget: ByteBudget) -> None:
        self.queue: collections.deque[HeldRead] = collections.deque()  # not matched yet, in order
        self.claimed: list[HeldRead] = []  # ones a request matched before they arrived
        self.newest: HeldRead | None = None  # the last one started: the next follows on from it
        self.wasted = 0
        self.paused_until = -float("inf")
        self._budget = budget

    @property
    def outstanding(self) -> int:
        return len(self.queue) + len(self.claimed)

    def release(self, held: HeldRead) -> None:
        if held.reserved:
            self._budget.give(held.reserved)
            held.reserved = 0

    def close(self) -> None:
        """The connection ended: whatever it held goes back to the budget."""
        for held in (*self.queue, *self.claimed):
            self.release(held)
        self.queue.clear()
        self.claimed.clear()
        self.newest = None


def _answer_frame(held: HeldRead, correlation_id: int) -> bytearray:
    frame = held.frame
    frame[0:4] = correlation_id.to_bytes(4, "big", signed=True)
    return frame


class ReadAheadFeature:
    def __init__(self, config, router, metrics) -> None:
        self.router = router
        self.max_bytes = config.get("fetch.readahead.max.bytes")
        self.max_partitions = config.get("fetch.readahead.max.partitions")
        self.budget = ByteBudget(config.get("fetch.readahead.buffer.bytes"))
        self._ids = itertools.count(1)
        registry = metrics.registry
        self._sent, self._hits, self._wasted = (
            Counter(f"kafka_proxy_readahead_{name}", text, registry=registry) for name, text in (
                ("sent", "Fetches the proxy sent ahead of its clients."),
                ("hits", "Client fetches answered from a read-ahead."),
                ("wasted", "Read-aheads dropped because the client asked for something else.")))
        self._held = Gauge("kafka_proxy_readahead_bytes", "Bytes reserved or held by read-aheads.", registry=registry)
        router.register(ApiKey.FETCH, self.on_fetch)

    # -- requests --------------------------------------------------------------------------
    async def on_fetch(self, conn, peek: RequestHeaderPeek, frame) -> Route | None:
        state = conn.state.get("readahead")
        if state is not None and state.queue and state.queue[0].prediction.matches(frame):
            return self._hit(conn, state, peek.correlation_id)
        version = peek.api_version
        if version < FIRST_VERSION:
            return None
        header, body = messages.decode_request(frame)
        request = None
        if sum(len(topic.partitions) for topic in body.topics) <= self.max_partitions:
            request = plan.without_session(body, version)
        if request is None or not plan.is_plain_consumer_fetch(request, version):
            if state is not None and state.queue:
                self._drop(state)
            return None
        if state is None:
            state = conn.state["readahead"] = ConnectionReadAhead(self.budget)
        if state.queue:
            if log.isEnabledFor(logging.DEBUG):
                log.debug("read-ahead unused conn=%s predicted=%r asked=%r", conn.id,
                          state.queue[0].prediction.predicted, request)
            self._drop(state)
        if request is not body:
            frame = messages.encode_request(header, request)
        if trio.current_time() < state.paused_until:
            return self.router.relay_fetch(version, frame)
        return Route(frame, transform=self._learn(conn, state, header, request, body.session_epoch))

    def _hit(self, conn, state: ConnectionReadAhead, correlation_id: int) -> Route:
        self._hits.inc()
        state.wasted = 0
        held = state.queue.popleft()
        answer = LocalAnswer()
        if held.frame is None:  # still on its way: its sink answers, and reads on
            held.claim = (answer, correlation_id)
            state.claimed.append(held)
            return Route(None, local=answer)
        answer.set(_answer_frame(held, correlation_id))
        state.release(held)
        follow_up = self._extend(conn, state)
        self._export()
        return Route(None, local=answer, follow_up=follow_up)

    def _drop(self, state: ConnectionReadAhead) -> None:
        """The client asked for something else: every read-ahead not yet asked for goes."""
        count = len(state.queue)
        for held in state.queue:
            state.release(held)
        state.queue.clear()
        state.newest = None
        self._wasted.inc(count)
        state.wasted += 1
        if state.wasted >= WASTED_LIMIT:
            state.wasted = 0
            state.paused_until = trio.current_time() + PAUSE_SECONDS
            log.debug("read-ahead paused: the client's fetches are not the predicted ones")
        self._export()

    # -- responses ------------------------------------------------------------------------
    def _learn(self, conn, state: ConnectionReadAhead, header, request, client_epoch: int):
        """The response to a forwarded request: passed on, and read ahead from."""
        version = header.request_api_version

        async def transform(raw) -> bytes:
            out, response = self._decoded(version, raw)
            if not state.outstanding:
                own = self._start(conn, state, self._predict(header, request, response, client_epoch))
                await self._send(conn, state, own, None)
            return out

        return transform

    def _decoded(self, version: int, raw):
        """``(frame, body)`` of a Fetch response, its leader hints pointing at the proxy."""
        response_header, response = messages.decode_response(ApiKey.FETCH, version, raw)
        if rewrite_node_endpoints(response, self.router.book):
            raw = messages.encode_response(ApiKey.FETCH, version, response_header, response)
        return raw, response

    def _predict(self, header, request, response, client_epoch: int) -> Prediction | None:
        predicted = plan.next_request(request, response)
        if predicted is None:
            return None
        return Prediction(predicted, header, client_epoch, plan.early_request(predicted, self.max_bytes))

    def _extend(self, conn, state: ConnectionReadAhead) -> OwnRequest | None:
        """The next read-ahead, if there is room and the newest one's response is in."""
        newest = state.newest
        if newest is None or newest.frame is None or state.outstanding >= DEPTH:
            return None
        return self._start(conn, state, newest.after)

    def _start(self, conn, state: ConnectionReadAhead, prediction: Prediction | None) -> OwnRequest | None:
        """The request that reads ahead for ``prediction``, now queued in ``state``;
        None when there is none to make or no room for it."""
        if prediction is None or trio.current_time() < state.paused_until:
            return None
        reserve = prediction.upstream_body.max_bytes
        if not self.budget.take(reserve):
            return None
        header = prediction.header
        held = HeldRead(prediction, reserve)
        state.queue.append(held)
        state.newest = held
        # Negative: never one a client uses (clients count up from 0).
        correlation_id = -(next(self._ids) % (1 << 31)) - 1
        own_header = dataclasses.replace(header, correlation_id=correlation_id)
        self._sent.inc()
        self._export()
        return OwnRequest(messages.encode_request(own_header, prediction.upstream_body), ApiKey.FETCH,
                          header.request_api_version, correlation_id, self._sink(conn, state, held))

    async def _send(self, conn, state: ConnectionReadAhead, own: OwnRequest | None, before: HeldRead | None) -> None:
        """Send a read-ahead from the response side. One that cannot go now is taken back;
        ``before`` (the newest until then) stays the newest, so the next hit tries again."""
        if own is None or await conn.send_own(own):
            return
        held = state.queue.pop()  # the one just started
        state.release(held)
        state.newest = before
        self._export()

    def _sink(self, conn, state: ConnectionReadAhead, held: HeldRead):
        async def arrived(raw) -> None:
            if held.claim is None and held not in state.queue:  # dropped while on its way
                return
            prediction = held.prediction
            raw, response = self._decoded(prediction.header.request_api_version, raw)
            held.frame = raw if isinstance(raw, bytearray) else bytearray(raw)
            held.after = self._predict(prediction.header, prediction.predicted, response, prediction.client_epoch)
            self.budget.resize(held.reserved, len(held.frame))  # hold what arrived
            held.reserved = len(held.frame)
            if held.claim is not None:
                answer, correlation_id = held.claim
                state.claimed.remove(held)
                answer.set(_answer_frame(held, correlation_id))
                state.release(held)
            if held is state.newest:
                await self._send(conn, state, self._extend(conn, state), held)
            self._export()

        return arrived

    def _export(self) -> None:
        self._held.set(self.budget.used)
