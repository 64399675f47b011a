"""One client request as the request stages see it: the header peek, the frame, and its
decoded form, made at most once however many stages read it; and what the stages that
rewrote it ask of its response (``replace(..., on_response=...)``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic

from proxy.pipeline.route import DecodedResponse
from proxy.protocol import messages
from proxy.protocol.framing import RequestHeaderPeek
from proxy.protocol.message_types import RequestHeader

if TYPE_CHECKING:
    from typing_extensions import TypeVar

    # The body's class (``message_types.FetchRequest``): a bare ``Request`` is ``Request[Any]``.
    B = TypeVar("B", default=Any)
else:
    from typing import TypeVar

    B = TypeVar("B")

# A stage's hook on the response to the request it rewrote: it reads or rewrites the
# decoded response (setting ``changed`` when it changes it), like a response stage of
# that one request.
ResponseHook = Callable[[DecodedResponse], None]


class Request(Generic[B]):
    """A stage of API key K takes a ``Request[<K's request class>]``: the chain hands it
    requests of that key only, so ``decoded()`` is typed as the stage declares."""

    __slots__ = ("peek", "frame", "_decoded", "response_hooks")

    def __init__(self, peek: RequestHeaderPeek, frame: bytes | bytearray) -> None:
        self.peek = peek
        self.frame = frame
        self._decoded: tuple[RequestHeader, B] | None = None
        self.response_hooks: tuple[ResponseHook, ...] = ()

    @property
    def api_key(self) -> int:
        return self.peek.api_key

    @property
    def version(self) -> int:
        return self.peek.api_version

    @property
    def correlation_id(self) -> int:
        return self.peek.correlation_id

    def decoded(self) -> tuple[RequestHeader, B]:
        """``(header, body)`` of the request, decoded on first use. Bytes after the body are
        ignored, as the broker ignores them (some clients pad requests)."""
        if self._decoded is None:
            self._decoded = messages.decode_request(self.frame, strict=False)
        return self._decoded

    def replace(self, frame: bytes | bytearray, decoded: tuple[RequestHeader, B] | None = None, *,
                on_response: ResponseHook | None = None) -> None:
        """Stages after this one, and the default route, see ``frame`` instead (a feature
        that rewrites a request but leaves its routing to others).

        ``on_response``: the rewriting stage asks for the response to what it sent on. The
        hook gets the decoded response, whichever feature claims the request, after the
        claimant's own ``Route.on_response`` and every response stage of the API (they
        see the response to the request as it went upstream); the hooks of several stages
        run the last stage's first, so each one turns the response back into the answer to
        the request as that stage got it. A hook runs only on a decoded response: not on
        an answer a later feature makes itself (``Route.answer``), nor on one it relays
        undecoded (``Route.relay``)."""
        self.frame = frame
        self._decoded = decoded
        if on_response is not None:
            self.response_hooks = (*self.response_hooks, on_response)
