"""Request hooks on the router: several features may decode the same API key."""

from __future__ import annotations

import trio

from proxy.protocol import messages
from proxy.protocol.framing import peek_request_header
from proxy.protocol.messages import ApiKey
from proxy.server.routing import Route, Router
from proxy.net.streams import OPAQUE


def _fetch_frame(version: int) -> bytes:
    header = messages.new_request_header(ApiKey.FETCH, version, 3, "c")
    return messages.encode_request(header, messages.new_body(ApiKey.FETCH, version, "request"))


def _route(router: Router, frame: bytes) -> Route:
    return trio.run(router.route, None, peek_request_header(frame), frame)


def test_hooks_are_asked_in_order_until_one_routes():
    router = Router(book=None)
    asked = []

    async def declines(conn, peek, frame):
        asked.append("first")
        return None

    async def routes(conn, peek, frame):
        asked.append("second")
        return Route(b"mine")

    async def never(conn, peek, frame):
        asked.append("third")
        return Route(b"not mine")

    for hook in (declines, routes, never):
        router.register(ApiKey.FETCH, hook)
    assert _route(router, _fetch_frame(12)).upstream_frame == b"mine"
    assert asked == ["first", "second"]


def test_every_hook_declining_gives_the_default_route():
    router = Router(book=None)

    async def declines(conn, peek, frame):
        return None

    router.register(ApiKey.FETCH, declines)
    router.register(ApiKey.FETCH, declines)
    frame = _fetch_frame(12)
    route = _route(router, frame)
    assert route.upstream_frame == frame and route.relay is OPAQUE


def test_relay_fetch_streams_with_the_tail_rewrite_from_v16():
    router = Router(book=None)
    assert router.relay_fetch(15, b"x").relay is OPAQUE
    newer = router.relay_fetch(16, b"x")
    assert newer.upstream_frame == b"x" and newer.relay is not OPAQUE
