"""One request on its way through the proxy, and how its response will be produced.

A client connection keeps its exchanges in request order. Each one says where its
response comes from (``response``, one of five kinds): the next frame of the upstream
connection passed on while it arrives (``Relayed``) or received whole and perhaps
rewritten (``Received``), an answer the proxy computes itself (``Local``), for a request
of the proxy's own, the next upstream frame handed to a sink in the proxy and never to the
client (``ToSink``), or the end of a response the native relay passed on up to its
rewritable tail (``Tail``). The writer side takes exchanges in order, so responses
leave in request order whatever their source, as Kafka requires.

``InflightLedger`` counts what a connection has in flight, in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import trio

from proxy.net.streams import Relay
from proxy.pipeline.route import LocalAnswer, OwnRequest, ResponseSink, ResponseTransform, Route
from proxy.server.metrics import ProxyMetrics


@dataclass(slots=True)
class Relayed:
    """The broker's response goes on to the client while it arrives."""

    relay: Relay


@dataclass(slots=True)
class Received:
    """The broker's response is received whole, through ``transform`` if any.
    ``prefetched``: read already (by the native relay, which handed it back)."""

    transform: ResponseTransform | None
    prefetched: bytes | None = None


@dataclass(slots=True)
class Local:
    """The proxy answers by itself; nothing comes from the broker."""

    answer: LocalAnswer


@dataclass(slots=True)
class ToSink:
    """A request of the proxy's own: the broker's response goes to ``sink``."""

    sink: ResponseSink


@dataclass(slots=True)
class Tail:
    """The native relay passed the response on up to its top-level tagged fields, and read
    them: ``held`` is the response's size prefix, correlation id, then those fields. They go
    on through ``relay.finish``, in as many bytes, as ``Relayed`` would have sent them."""

    relay: Relay
    held: bytes

    @property
    def size(self) -> int:
        """The whole response's size (its size prefix's)."""
        return int.from_bytes(self.held[:4], "big", signed=True)

    def rest(self) -> bytes:
        """What is left to send: the tail as ``relay.finish`` rewrites it (given the frame's
        correlation id and its tail, the tail starting at 4)."""
        assert self.relay.finish is not None, "a tail is handed back only to a relay that rewrites it"
        end = self.relay.finish(self.held[4:], 4)
        if len(end) != len(self.held) - 8:
            raise AssertionError("a relayed tail must keep its length")
        return end


ResponseSource = Relayed | Received | Local | ToSink | Tail


@dataclass(slots=True, eq=False)
class Exchange:
    api_key: int
    api_version: int
    correlation_id: int
    received_at: float
    request_bytes: int
    response: ResponseSource
    settle: Callable[[], None] | None = None  # the route's, run once when the exchange is over

    @property
    def for_client(self) -> bool:
        """Whether its response goes to the client (not a request of the proxy's own)."""
        return not isinstance(self.response, ToSink)

    @property
    def from_broker(self) -> bool:
        """Whether its response is the upstream connection's next frame."""
        return not isinstance(self.response, Local)

    @classmethod
    def of_route(cls, route: Route, *, api_key: int, api_version: int, correlation_id: int, received_at: float,
                 request_bytes: int, prefetched: bytes | None = None, tail: bytes | None = None) -> Exchange:
        """A client's request as ``route`` has it answered. ``prefetched``: its response, read
        whole already; ``tail``: the end of it (``Tail.held``), the rest sent already (both by
        the native relay, which handed them back)."""
        response: ResponseSource
        if route.local is not None:
            response = Local(route.local)
        elif route.relay is not None and tail is not None:
            response = Tail(route.relay, tail)
        elif route.relay is not None:
            assert prefetched is None, "a response read already cannot be relayed as it arrives"
            response = Relayed(route.relay)
        else:
            response = Received(route.transform, prefetched)
        return cls(api_key, api_version, correlation_id, received_at, request_bytes, response, route.settle)

    @classmethod
    def own(cls, own: OwnRequest, now: float) -> Exchange:
        return cls(own.api_key, own.api_version, own.correlation_id, now, len(own.frame) + 4, ToSink(own.sink),
                   own.settle)


class InflightLedger:
    """What one connection has in flight, counted where exchanges are queued and answered.

    - ``client_requests``: the client's requests awaiting their response (the proxy-wide
      ``inflight_requests`` figure moves with it);
    - ``arriving``: 1 while a request is passed on upstream as its bytes arrive (not in
      flight for the idle clock: a client trickling a body is idle);
    - ``from_broker``: queued exchanges whose response is the upstream connection's next
      frame (while any is, the proxy sends nothing of its own upstream);
    - ``unanswered``: queued exchanges the writer has not finished with (the native relay
      starts only when there are none).
    """

    __slots__ = ("client_requests", "arriving", "from_broker", "unanswered", "_all_answered", "_metrics")

    def __init__(self, metrics: ProxyMetrics) -> None:
        self.client_requests = 0
        self.arriving = 0
        self.from_broker = 0
        self.unanswered = 0
        self._all_answered: trio.Event | None = None
        self._metrics = metrics  # its ``inflight_requests`` counts every connection's client requests

    @property
    def idle(self) -> bool:
        """Nothing in flight that the idle clock should wait for."""
        return self.client_requests - self.arriving == 0

    def queued(self, exchange: Exchange) -> None:
        self.unanswered += 1
        if exchange.from_broker:
            self.from_broker += 1
        if exchange.for_client:
            self.client_requests += 1
            self._metrics.inflight_requests += 1

    def taken(self, exchange: Exchange) -> None:
        """The writer took ``exchange``: its response is being produced."""
        if exchange.from_broker:
            self.from_broker -= 1

    def answered(self, exchange: Exchange) -> None:
        """The writer is done with ``exchange`` (its response left, or went to its sink)."""
        if exchange.for_client:
            self.client_requests -= 1
            self._metrics.inflight_requests -= 1
        self.unanswered -= 1
        if not self.unanswered and self._all_answered is not None:
            self._all_answered.set()
            self._all_answered = None

    async def all_answered(self) -> None:
        """Wait until every queued exchange is answered."""
        while self.unanswered:
            self._all_answered = trio.Event()
            await self._all_answered.wait()

    def close(self) -> None:
        """The connection is over: what it had in flight leaves the proxy-wide figure."""
        self._metrics.inflight_requests -= self.client_requests
        self.client_requests = 0
