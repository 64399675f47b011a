"""Fetch prediction, the I/O edge: a Fetch hook, the held responses, and their metrics.

An early fetch is the Fetch the consumer is predicted to send next (``plan.next_request``),
sent upstream on the client's own connection (so it carries the client's authentication,
and the broker answers in order), and its response held until the client asks. A request
equal to the oldest prediction is answered from it; any other request drops every held
one and goes to the broker as usual.

Bounded: ``DEPTH`` early fetches per connection, each at most ``fetch.prediction.max.bytes``,
all together at most ``fetch.prediction.buffer.bytes`` (reserved before sending, so the cap
holds while responses are on their way). A connection whose early fetches go unused three
times running stops predicting for a minute: a consumer whose next request cannot be
predicted costs the broker nothing extra for long.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping

import trio

from proxy.pipeline import ConnectionContext, DecodedResponse, Feature, LocalAnswer, OwnRequest, Request, Route
from proxy.pipeline.context import StateKey
from proxy.pipeline.feature import RequestStage
from proxy.prediction import plan
from proxy.prediction.held import ByteBudget, ConnectionPredictions, HeldRead, Prediction
from proxy.prediction.metrics import FetchPredictionMetrics
from proxy.prediction.settings import FetchPredictionSettings
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.message_types import FetchRequest, FetchResponse, RequestHeader
from proxy.protocol.message_versions import FETCH_FIRST_ISOLATION_LEVEL

log = logging.getLogger("proxy.prediction")

# Fetch v4 brought isolation levels and the last stable offset; older consumers are rare
# enough not to be worth a prediction path of their own.
FIRST_VERSION = FETCH_FIRST_ISOLATION_LEVEL
# Early fetches per connection: with two, the next response is on its way from the broker
# while the one after the client's current one waits, so a client that asks before the
# broker's answer is in (the broker shares the machine) still rarely waits.
DEPTH = 2
WASTED_LIMIT = 3  # unused early fetches in a row before a connection pauses
PAUSE_SECONDS = 60.0


def _answer_frame(held: HeldRead, correlation_id: int) -> bytearray:
    frame = held.frame
    assert frame is not None
    frame[0:4] = correlation_id.to_bytes(4, "big", signed=True)
    return frame


class FetchPredictionFeature(Feature):
    name = "prediction"

    def __init__(self, settings: FetchPredictionSettings, metrics: FetchPredictionMetrics | None = None) -> None:
        self.max_bytes = settings.max_bytes
        self.max_partitions = settings.max_partitions
        self.budget = ByteBudget(settings.buffer_bytes)
        budget = self.budget
        self.state_key = StateKey("prediction", lambda: ConnectionPredictions(budget))
        self._ids = itertools.count(1)
        self.metrics = metrics or FetchPredictionMetrics()

    def request_stages(self) -> Mapping[int, RequestStage]:
        return {ApiKey.FETCH: self.on_fetch}

    # -- requests --------------------------------------------------------------------------
    async def on_fetch(self, conn: ConnectionContext, fetch: Request[FetchRequest]) -> Route | None:
        frame = fetch.frame
        state = conn.existing(self.state_key)
        if state is not None and state.queue and state.queue[0].prediction.matches(frame):
            return self._hit(conn, state, fetch.correlation_id)
        version = fetch.version
        if version < FIRST_VERSION:
            return None
        header, body = fetch.decoded()
        request = None
        if sum(len(topic.partitions) for topic in body.topics) <= self.max_partitions:
            request = plan.without_session(body, version)
        if request is None or not plan.is_plain_consumer_fetch(request, version):
            if state is not None and state.queue:
                self._drop(state)
            return None
        if state is None:
            state = conn.state(self.state_key)
        if state.queue:
            if log.isEnabledFor(logging.DEBUG):
                log.debug("early fetch unused conn=%s predicted=%r asked=%r", conn.id,
                          state.queue[0].prediction.predicted, request)
            self._drop(state)
        if request is not body:
            frame = messages.encode_request(header, request)
        if trio.current_time() < state.paused_until:
            fetch.replace(frame, (header, request))  # sessionless, as it would be predicted
            return None
        return Route(frame, on_response=self._learn(conn, state, header, request, body.session_epoch))

    def _hit(self, conn: ConnectionContext, state: ConnectionPredictions, correlation_id: int) -> Route:
        self.metrics.hits.inc()
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

    def _drop(self, state: ConnectionPredictions) -> None:
        """The client asked for something else: every early fetch not yet asked for goes."""
        count = len(state.queue)
        for held in state.queue:
            state.release(held)
        state.queue.clear()
        state.newest = None
        self.metrics.wasted.inc(count)
        state.wasted += 1
        if state.wasted >= WASTED_LIMIT:
            state.wasted = 0
            state.paused_until = trio.current_time() + PAUSE_SECONDS
            log.debug("fetch prediction paused: the client's fetches are not the predicted ones")
        self._export()

    # -- responses ------------------------------------------------------------------------
    def _learn(self, conn: ConnectionContext, state: ConnectionPredictions, header: RequestHeader,
               request: FetchRequest, client_epoch: int) -> Callable[[DecodedResponse[FetchResponse]], Awaitable[None]]:
        """The response to a forwarded request: passed on, and predicted from."""

        async def on_response(response: DecodedResponse[FetchResponse]) -> None:
            if not state.outstanding:
                own = self._start(conn, state, self._predict(header, request, response.body, client_epoch))
                await self._send(conn, state, own, None)

        return on_response

    def _predict(self, header: RequestHeader, request: FetchRequest, response: FetchResponse,
                 client_epoch: int) -> Prediction | None:
        predicted = plan.next_request(request, response)
        if predicted is None:
            return None
        return Prediction(predicted, header, client_epoch, plan.early_request(predicted, self.max_bytes))

    def _extend(self, conn: ConnectionContext, state: ConnectionPredictions) -> OwnRequest | None:
        """The next early fetch, if there is room and the newest one's response is in."""
        newest = state.newest
        if newest is None or newest.frame is None or state.outstanding >= DEPTH:
            return None
        return self._start(conn, state, newest.after)

    def _start(self, conn: ConnectionContext, state: ConnectionPredictions,
               prediction: Prediction | None) -> OwnRequest | None:
        """The early fetch for ``prediction``, now queued in ``state``;
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
        self.metrics.sent.inc()
        self._export()
        return OwnRequest(messages.encode_request(own_header, prediction.upstream_body), ApiKey.FETCH,
                          header.request_api_version, correlation_id, self._sink(conn, state, held))

    async def _send(self, conn: ConnectionContext, state: ConnectionPredictions, own: OwnRequest | None,
                    before: HeldRead | None) -> None:
        """Send an early fetch from the response side. One that cannot go now is taken back;
        ``before`` (the newest until then) stays the newest, so the next hit tries again."""
        if own is None or await conn.send_own(own):
            return
        held = state.queue.pop()  # the one just started
        state.release(held)
        state.newest = before
        self._export()

    def _sink(self, conn: ConnectionContext, state: ConnectionPredictions,
              held: HeldRead) -> Callable[[bytes | bytearray], Awaitable[None]]:
        async def arrived(raw: bytes | bytearray) -> None:
            if held.claim is None and held not in state.queue:  # dropped while on its way
                return
            prediction = held.prediction
            # Through every response stage, as a client's response: it goes to the client later.
            raw, decoded = conn.decode_own_response(ApiKey.FETCH, prediction.header.request_api_version, raw)
            response: FetchResponse = decoded.body
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
        self.metrics.held_bytes.set(self.budget.used)
