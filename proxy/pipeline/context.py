"""What a feature may know and do about the client connection a request came on.

Features never see the connection object itself: they get a ``ConnectionContext`` with the
connection's identity, a nursery for work that must end with the connection, a way to
send requests of the proxy's own on its upstream connection, and a typed place for each
feature's per-connection state (``StateKey``), closed when the connection ends.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import trio

from proxy.pipeline.route import DecodedResponse, OwnRequest

T = TypeVar("T")
log = logging.getLogger("proxy.connection")




# (context, api key, version, raw frame) -> (frame, decoded), see FeatureChain.decode_own_response
OwnResponseDecoder = Callable[["ConnectionContext", int, int, "bytes | bytearray"],
                              "tuple[bytes | bytearray, DecodedResponse]"]


class StateKey(Generic[T]):
    """Names one feature's per-connection state and says how to make it.

    Declared once at module level by the feature that owns the state
    (``RANGES = StateKey("keyrange", ConnectionRanges)``); the type of what
    ``ConnectionContext.state`` returns follows from the key.
    """

    __slots__ = ("name", "factory")

    def __init__(self, name: str, factory: Callable[[], T]) -> None:
        self.name = name
        self.factory = factory

    def __repr__(self) -> str:
        return f"StateKey({self.name!r})"


class ConnectionContext:
    """One client connection, as the features see it."""

    __slots__ = ("id", "peer", "target", "nursery", "_send_own", "_own_responses", "_states")

    def __init__(
        self,
        id: int,
        peer: str,
        target: str,
        send_own: Callable[[OwnRequest], Awaitable[bool]] | None = None,
        own_responses: OwnResponseDecoder | None = None,
    ) -> None:
        self.id = id
        self.peer = peer
        self.target = target  # "bootstrap" or "node-<id>", for logs
        self.nursery: trio.Nursery | None = None  # set once the connection's tasks run
        self._send_own = send_own
        self._own_responses = own_responses
        self._states: dict[StateKey[Any], Any] = {}

    def state(self, key: StateKey[T]) -> T:
        """This connection's state for ``key``, made on first use."""
        try:
            return self._states[key]
        except KeyError:
            value = self._states[key] = key.factory()
            return value

    def existing(self, key: StateKey[T]) -> T | None:
        """This connection's state for ``key`` if some request has made it."""
        return self._states.get(key)

    def start_soon(self, task: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``task`` in the connection's nursery: it ends with the connection. If it
        fails, the failure is logged and ends this connection only."""
        if self.nursery is None:
            raise RuntimeError("the connection's tasks are not running")
        self.nursery.start_soon(self._guarded, task, args, name=getattr(task, "__qualname__", None))

    async def _guarded(self, task: Callable[..., Awaitable[Any]], args: tuple) -> None:
        try:
            await task(*args)
        except Exception:
            log.exception("a feature's task failed; closing the connection conn=%s peer=%s", self.id, self.peer)
            if self.nursery is not None:
                self.nursery.cancel_scope.cancel()

    async def send_own(self, own: OwnRequest) -> bool:
        """Send a request of the proxy's own upstream if that cannot hold anything up;
        False when it was not sent (see ``ClientConnection.send_own``)."""
        if self._send_own is None:
            return False
        return await self._send_own(own)

    def decode_own_response(self, api_key: int, version: int,
                            raw: bytes | bytearray) -> tuple[bytes | bytearray, DecodedResponse]:
        """The response to a request of the proxy's own, through every feature's response
        stages as a client's response would go (its broker addresses rewritten, ...), for a
        feature that will hand it to the client later: the frame and its decoded form."""
        if self._own_responses is None:
            raise RuntimeError("this context cannot decode responses")
        return self._own_responses(self, api_key, version, raw)

    def close(self) -> None:
        """The connection ended: every feature state with a ``close`` releases what it holds."""
        states, self._states = self._states, {}
        for value in states.values():
            close = getattr(value, "close", None)
            if close is not None:
                close()
