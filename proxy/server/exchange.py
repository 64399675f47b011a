"""One request on its way through the proxy, and how its response will be produced.

A client connection keeps its exchanges in request order. Each one says where its
response comes from: the next frame of the upstream connection (possibly rewritten on the
way back), or an answer the proxy computes itself. The writer side takes exchanges in
order, so responses leave in request order whatever their source, as Kafka requires.

The proxy may also send requests of its own on a client's upstream connection (a Fetch
read ahead). Their exchanges sit in the same queue, in the order their frames went
upstream; their responses go to a sink in the proxy, never to the client.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from proxy.net.streams import Relay
from proxy.pipeline.route import LocalAnswer, OwnRequest, ResponseSink, ResponseTransform


@dataclass(slots=True, eq=False)
class Exchange:
    api_key: int
    api_version: int
    correlation_id: int
    received_at: float
    request_bytes: int
    transform: ResponseTransform | None = None
    local: LocalAnswer | None = None
    relay: Relay | None = None  # the response goes on while it arrives
    sink: ResponseSink | None = None  # the proxy's own request: its response goes here
    settle: Callable[[], None] | None = None  # the route's, run once when the exchange is over
    prefetched: bytes | None = None  # its response, read already (by the native relay)

    @classmethod
    def own(cls, own: OwnRequest, now: float) -> Exchange:
        return cls(api_key=own.api_key, api_version=own.api_version, correlation_id=own.correlation_id,
                   received_at=now, request_bytes=len(own.frame) + 4, sink=own.sink)
