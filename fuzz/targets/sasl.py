"""What a client sends before it has authenticated: SaslHandshake and SaslAuthenticate.

The proxy has no SASL code of its own (docs/proxy.md: SASL passes through untouched, each
client authenticates with the broker). Before authentication a client's frames therefore
take the path every frame takes (split from the stream, header peeked, routed by the
feature chain) and must come out byte for byte as they went in: no feature decodes these
keys, so the chain must relay them opaquely and never wait on anything while routing.
This target feeds that path the pre-authentication conversation, as one client stream,
through the chain of a proxy with every optional feature on. The SASL messages' own
codecs are run on the same frames under the codec's usual rules, so that the day a
feature reads them, their decoders have already met hostile bytes.

Input: the client's byte stream of size-prefixed frames.
"""

from __future__ import annotations

from typing import Any

from fuzz.common import InvariantBroken, check_not_internal
from fuzz.surface import production_chain
from proxy.net.streams import OPAQUE
from proxy.pipeline.context import ConnectionContext
from proxy.pipeline.route import Route
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.errors import ProtocolError
from proxy.protocol.framing import DEFAULT_MAX_FRAME_BYTES, FrameSplitter, peek_request_header

SASL_KEYS = (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE)
MAX_FRAMES = 8


# No way to send anything of its own: routing a SASL frame has no business doing so.
_CONTEXT = ConnectionContext(1, "fuzz", "bootstrap")


def _route(peek: Any, frame: bytes) -> Route:
    """Run the chain's routing coroutine to its end without an event loop: for keys no
    feature reads it must finish without suspending."""
    routing = production_chain().route(_CONTEXT, peek, frame)
    try:
        routing.send(None)
    except StopIteration as done:
        return done.value
    routing.close()
    raise InvariantBroken(f"routing api key {peek.api_key} suspended")


def _decode(frame: bytes) -> None:
    try:
        header, body = messages.decode_request(frame)
    except ProtocolError as exc:
        check_not_internal(exc)
        return
    if messages.encode_request(header, body) != frame:
        raise InvariantBroken("a SASL request does not encode back to its bytes")


def one_input(data: bytes) -> None:
    splitter = FrameSplitter(DEFAULT_MAX_FRAME_BYTES)
    splitter.feed(data)
    try:
        frames = splitter.frames()
    except ProtocolError:
        return
    for frame in frames[:MAX_FRAMES]:
        try:
            peek = peek_request_header(frame)
        except ProtocolError:
            continue  # the connection is closed: nothing is routed
        if peek.api_key not in SASL_KEYS:
            continue
        route = _route(peek, frame)
        if route.relay is not OPAQUE or route.upstream_frame is not frame or not route.expect_response \
                or route.transform is not None or route.local is not None:
            raise InvariantBroken(f"a SASL frame was not passed through untouched: {route}")
        _decode(frame)
