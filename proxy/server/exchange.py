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

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import trio

ResponseTransform = Callable[[bytes], Awaitable[bytes]]
ResponseSink = Callable[[bytes], Awaitable[None]]


class LocalAnswer:
    """A response body the proxy produces itself, possibly after asynchronous work."""

    __slots__ = ("_event", "_frame", "_error")

    def __init__(self) -> None:
        self._event = trio.Event()
        self._frame: bytes | None = None
        self._error: BaseException | None = None

    def set(self, frame: bytes) -> None:
        self._frame = frame
        self._event.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._event.set()

    async def wait(self) -> bytes:
        await self._event.wait()
        if self._error is not None:
            raise self._error
        assert self._frame is not None
        return self._frame


@dataclass(slots=True)
class Exchange:
    api_key: int
    api_version: int
    correlation_id: int
    received_at: float
    request_bytes: int
    transform: ResponseTransform | None = None
    local: LocalAnswer | None = None
    relay: Any = None  # a streams.Relay: the response goes on while it arrives
    sink: ResponseSink | None = None  # the proxy's own request: its response goes here
    notes: dict = field(default_factory=dict)


@dataclass(slots=True)
class OwnRequest:
    """A request the proxy sends upstream on a client's connection, and where its
    response goes. ``frame`` carries ``correlation_id`` (the broker echoes it; the proxy
    checks it like any other)."""

    frame: bytes
    api_key: int
    api_version: int
    correlation_id: int
    sink: ResponseSink

    def exchange(self, now: float) -> Exchange:
        return Exchange(api_key=self.api_key, api_version=self.api_version, correlation_id=self.correlation_id,
                        received_at=now, request_bytes=len(self.frame) + 4, sink=self.sink)
