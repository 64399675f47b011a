"""What a feature decides about one request: where it goes and where its answer comes from.

A feature's request stage returns a ``Route`` to claim a request, or None to let the next
feature (and finally the default route) have it. The connection then sends
``upstream_frame`` to the broker and produces the client's response from one of:

- the broker's response relayed while it arrives (``relay``), rewritten at most in its tail;
- the broker's response decoded once, passed to the route's own ``on_response`` and to every
  feature's response stage for that API, and encoded again only if one of them changed it;
- the broker's response as raw bytes through ``transform`` (a feature that works on the
  wire layout itself, such as the individual-commit rewrite of OffsetCommit);
- an answer the proxy computes itself (``local``): nothing is expected from the broker.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic

import trio

from proxy.net.streams import Relay
from proxy.protocol.framing import OutgoingFrame
from proxy.protocol.message_types import ResponseHeader

if TYPE_CHECKING:
    from typing_extensions import TypeVar

    # The body's class (``message_types.FetchResponse``): a bare ``DecodedResponse`` is ``DecodedResponse[Any]``.
    B = TypeVar("B", default=Any)
else:
    from typing import TypeVar

    B = TypeVar("B")

# A transform's result goes to the client as it is: one buffer, or several (GatheredFrame).
ResponseTransform = Callable[[bytes], Awaitable[OutgoingFrame]]
ResponseSink = Callable[[bytes], Awaitable[None]]


class DecodedResponse(Generic[B]):
    """A broker response decoded once for every stage that reads or rewrites it.

    A stage that changes ``body`` (in place, or by assigning a new one) sets ``changed``,
    so that the response is encoded again; otherwise the broker's bytes go on untouched.
    A stage of API key K takes a ``DecodedResponse[<K's response class>]``.
    """

    __slots__ = ("api_key", "version", "header", "body", "changed")

    def __init__(self, api_key: int, version: int, header: ResponseHeader, body: B) -> None:
        self.api_key = api_key
        self.version = version
        self.header = header
        self.body = body
        self.changed = False


DecodedStage = Callable[[DecodedResponse], Awaitable[None]]


class LocalAnswer:
    """A response frame the proxy produces itself, possibly after asynchronous work."""

    __slots__ = ("_event", "_frame", "_error")

    def __init__(self) -> None:
        self._event = trio.Event()
        self._frame: OutgoingFrame | None = None
        self._error: BaseException | None = None

    @classmethod
    def ready(cls, frame: OutgoingFrame) -> LocalAnswer:
        answer = cls()
        answer.set(frame)
        return answer

    def set(self, frame: OutgoingFrame) -> None:
        self._frame = frame
        self._event.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._event.set()

    async def wait(self) -> OutgoingFrame:
        await self._event.wait()
        if self._error is not None:
            raise self._error
        assert self._frame is not None
        return self._frame


_own_ids = itertools.count(1)


def own_correlation_id() -> int:
    """A correlation id for a request of the proxy's own on a client's connection:
    negative, never one a client uses (clients count up from 0)."""
    return -(next(_own_ids) % (1 << 31)) - 1


@dataclass(slots=True)
class OwnRequest:
    """A request the proxy sends upstream on a client's connection, and where its
    response goes. ``frame`` carries ``correlation_id`` (the broker echoes it; the proxy
    checks it like any other). ``settle``: run once when the exchange is over, answered or
    not (the connection ended first), like a route's."""

    frame: bytes
    api_key: int
    api_version: int
    correlation_id: int
    sink: ResponseSink
    settle: Callable[[], None] | None = None


@dataclass(slots=True)
class Route:
    """How one request travels, and what happens to its response.

    ``upstream_frame``: the bytes to send to the broker, or None to send nothing.
    ``expect_response``: whether the broker will answer (False only for acks=0 Produce).
    ``transform``: rewrites the broker's raw response frame.
    ``on_response``: the claiming feature's stage over the decoded response; it runs
    before the response stages of the other features.
    ``local``: the proxy answers by itself; nothing is expected from the broker.
    ``relay``: the response goes on to the client while it arrives.
    ``follow_up``: a request of the proxy's own, sent upstream right after this one.
    ``before``: requests of the proxy's own, sent upstream right before this one, in
    order: the broker answers in order, so their sinks have their responses before this
    request's response is handled (a question a broker cannot take twice in one request
    is asked in several, and answered as one).
    ``settle``: runs exactly once when the exchange is over, answered or not (the
    connection may end first); a feature releases what the request holds here.
    """

    upstream_frame: bytes | bytearray | None
    expect_response: bool = True
    transform: ResponseTransform | None = None
    on_response: DecodedStage | None = None
    local: LocalAnswer | None = None
    relay: Relay | None = None
    follow_up: OwnRequest | None = None
    before: tuple[OwnRequest, ...] = ()
    settle: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        """A route has one source for its response: the broker's relayed (``relay``),
        decoded (``on_response``) or rewritten raw (``transform``), or as the broker sent
        it (none of them), or the proxy's own (``local``); and none when nothing answers
        (``expect_response`` False). Two at once is a feature's bug, refused here."""
        sources = [name for name in ("local", "relay", "transform", "on_response") if getattr(self, name) is not None]
        if len(sources) > 1:
            raise ValueError(f"a route's response comes from one source, not {' and '.join(sources)}")
        if sources and not self.expect_response:
            raise ValueError(f"a route that expects no response has no {sources[0]}")

    @classmethod
    def answer(cls, frame: OutgoingFrame) -> Route:
        """The proxy answers with ``frame``; nothing goes to the broker."""
        return cls(None, local=LocalAnswer.ready(frame))
