"""Decide, per request, how it travels and what happens to its response.

Only the API keys some feature needs are decoded; every other frame goes upstream as the
client sent it and its response comes back as the broker sent it. Features plug in here
by registering a request hook for an API key (see ``Router.register``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from proxy.protocol import messages
from proxy.protocol.errors import ProtocolError
from proxy.protocol.framing import RequestHeaderPeek
from proxy.protocol.messages import ApiKey
from proxy.protocol.peek import (
    FETCH_FIRST_FLEXIBLE_VERSION,
    FETCH_NODE_ENDPOINTS_VERSION,
    produce_acks,
    walk_fetch_response,
)
from proxy.server.exchange import LocalAnswer, OwnRequest, ResponseTransform
from proxy.server.rewrite import (
    ADDRESS_REWRITERS,
    FIRST_VERSION_WITH_ADDRESSES,
    clamp_api_versions,
    rewrite_fetch_tail,
)
from proxy.net.streams import OPAQUE, Relay

log = logging.getLogger("proxy.routing")

UNSUPPORTED_VERSION = 35


@dataclass(slots=True)
class Route:
    """What to do with one request.

    ``upstream_frame``: the bytes to send to the broker, or None to send nothing.
    ``expect_response``: whether the broker will answer (False only for acks=0 Produce).
    ``transform``: rewrites the broker's response frame on its way back.
    ``local``: the proxy answers by itself; nothing is expected from the broker.
    ``relay``: instead of a transform, the response may go on to the client while it
    arrives (see ``FrameStream.relay_frame``).
    ``follow_up``: a request of the proxy's own, sent upstream right after this one.
    """

    upstream_frame: bytes | None
    expect_response: bool = True
    transform: ResponseTransform | None = None
    local: LocalAnswer | None = None
    relay: Relay | None = None
    follow_up: OwnRequest | None = None


# A hook gets the client connection (``id``, ``peer``, ``nursery``, ``state``), the header
# peek and the frame; it returns a Route, or None for the default route.
RequestHook = Callable[[Any, RequestHeaderPeek, bytes], Awaitable["Route | None"]]


class Router:
    def __init__(self, book, features: dict[str, tuple[int, int]] | None = None) -> None:
        self.book = book
        self.features: dict[str, tuple[int, int]] = dict(features or {})
        self._hooks: dict[int, list[RequestHook]] = {}
        self.topic_names: dict = {}  # topic id -> name, learned from Metadata responses
        self._decoded_keys: set[int] = set(ADDRESS_REWRITERS) | {ApiKey.API_VERSIONS}

    def register(self, api_key: int, hook: RequestHook) -> None:
        """A feature that decodes ``api_key`` requests. Hooks are asked in the order they
        were registered; one returning None passes the request on to the next, and the
        last to the default route."""
        self._hooks.setdefault(api_key, []).append(hook)
        self._decoded_keys.add(api_key)

    def decodes_whole(self, api_key: int) -> bool:
        """Whether some feature reads requests of ``api_key`` beyond their header."""
        return api_key in self._hooks

    def advertise(self, feature: str, min_version: int = 1, max_version: int = 1) -> None:
        self.features[feature] = (min_version, max_version)

    def known_versions(self) -> dict[int, tuple[int, int]]:
        """(min, max) our schemas decode, for every api key some feature decodes."""
        return {key: messages.supported_versions(key) for key in self._decoded_keys
                if messages.supported_versions(key) is not None}

    async def route(self, conn, peek: RequestHeaderPeek, frame: bytes) -> Route:
        api_key = peek.api_key
        if api_key in self._decoded_keys:
            low, high = messages.supported_versions(api_key)
            if not low <= peek.api_version <= high:
                if api_key == ApiKey.API_VERSIONS:
                    return Route(None, local=self._unsupported_api_versions(peek))
                raise ProtocolError(
                    f"{messages.api_name(api_key)} v{peek.api_version} is beyond the versions the proxy "
                    f"advertised ({low}-{high})",
                    api_key=api_key,
                    version=peek.api_version,
                )
        for hook in self._hooks.get(api_key, ()):
            route = await hook(conn, peek, frame)
            if route is not None:
                return route
        if api_key == ApiKey.PRODUCE and produce_acks(frame, peek) == 0:
            return Route(frame, expect_response=False)
        if api_key == ApiKey.API_VERSIONS:
            return Route(frame, transform=self._api_versions_transform(peek))
        if api_key == ApiKey.FETCH:
            return self.relay_fetch(peek.api_version, frame)
        rewriter = ADDRESS_REWRITERS.get(api_key)
        if rewriter is None or peek.api_version < FIRST_VERSION_WITH_ADDRESSES.get(api_key, 0):
            return Route(frame, relay=OPAQUE)
        return Route(frame, transform=self._address_transform(peek, rewriter))

    def relay_fetch(self, version: int, frame) -> Route:
        """The default route of a Fetch (its response streams through), for ``frame``."""
        if version < FIRST_VERSION_WITH_ADDRESSES[ApiKey.FETCH]:
            return Route(frame, relay=OPAQUE)
        return Route(frame, relay=self._fetch_relay(version))

    # -- response transforms --------------------------------------------------------------
    def _fetch_relay(self, version: int) -> Relay:
        """A Fetch response streams through; only its top-level tagged fields, where the
        leader hints (NodeEndpoints) live, are held back and rewritten in place."""
        assert version >= FETCH_NODE_ENDPOINTS_VERSION >= FETCH_FIRST_FLEXIBLE_VERSION
        book = self.book

        def walk(frame, size, filled):
            return walk_fetch_response(frame, size, version, filled)

        def finish(frame, tail):
            return rewrite_fetch_tail(frame, tail, version, book)

        return Relay(walk, finish)

    def _address_transform(self, peek: RequestHeaderPeek, rewriter) -> ResponseTransform:
        api_key, version, book = peek.api_key, peek.api_version, self.book

        topic_names = self.topic_names

        async def transform(response: bytes) -> bytes:
            header, body = messages.decode_response(api_key, version, response)
            if api_key == ApiKey.METADATA:
                for topic in body.topics or ():
                    topic_id = getattr(topic, "topic_id", None)
                    if topic_id is not None and topic.name and int(topic_id) != 0:
                        topic_names[topic_id] = topic.name
            if not rewriter(body, book):
                return response
            return messages.encode_response(api_key, version, header, body)

        return transform

    def _api_versions_transform(self, peek: RequestHeaderPeek) -> ResponseTransform:
        version = peek.api_version

        async def transform(response: bytes) -> bytes:
            header, body = messages.decode_response(ApiKey.API_VERSIONS, version, response)
            if body.error_code != 0:
                # The broker answered an older version it chose (v0 layout); pass it on.
                return response
            features = self.features if version >= 3 else {}
            new_feature = messages.body_class(ApiKey.API_VERSIONS, "response").SupportedFeatureKey
            if not clamp_api_versions(body, self.known_versions(), features, new_feature):
                return response
            return messages.encode_response(ApiKey.API_VERSIONS, version, header, body)

        return transform

    def _unsupported_api_versions(self, peek: RequestHeaderPeek) -> LocalAnswer:
        """Answer as a broker does when a client asks for an ApiVersions version it lacks:
        UNSUPPORTED_VERSION in the v0 layout, listing the ApiVersions versions we do know."""
        low, high = messages.supported_versions(ApiKey.API_VERSIONS)
        response_class = messages.body_class(ApiKey.API_VERSIONS, "response")
        body = messages.new_body(
            ApiKey.API_VERSIONS, 0, "response",
            error_code=UNSUPPORTED_VERSION,
            api_keys=[response_class.ApiVersion(api_key=int(ApiKey.API_VERSIONS), min_version=low, max_version=high)],
        )
        header = messages.new_response_header(peek.correlation_id)
        answer = LocalAnswer()
        answer.set(messages.encode_response(ApiKey.API_VERSIONS, 0, header, body))
        return answer
