"""The features of a proxy, chained: every request's route, every response's stages.

Built once from the ordered list of features. Per request it costs a dictionary lookup
when no feature reads the API key: the frame goes upstream as the client sent it and the
response comes back as the broker sent it (relayed while it arrives). Only API keys some
feature reads are checked against the versions our schemas decode, and only responses
some stage reads are decoded, once, for all of them.

ApiVersions is the chain's own business, since only the chain knows which keys the
features decode and which extensions they offer: it clamps the versions advertised for
every decoded key to what our schemas know (a newer broker can never make the proxy
decode a version it does not know), and adds the features' SupportedFeatures entries.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.net import native_table
from proxy.net.native_table import NativeClass
from proxy.net.streams import OPAQUE
from proxy.pipeline.context import ConnectionContext
from proxy.pipeline.feature import Feature, NativeGuard, RequestStage, ResponseReads, ResponseStage, ResponseStageSpec
from proxy.pipeline.request import Request, ResponseHook
from proxy.pipeline.route import DecodedResponse, LocalAnswer, Route
from proxy.pipeline.versions import clamp_api_versions
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import ErrorCode
from proxy.protocol.errors import ProtocolError
from proxy.protocol.framing import RequestHeaderPeek
from proxy.protocol.message_types import ApiVersionsResponse
from proxy.protocol.message_versions import API_VERSIONS_FIRST_SUPPORTED_FEATURES
from proxy.protocol.peek import produce_acks

ACKS_NONE = 0  # a Produce with acks=0 gets no response from the broker


class FeatureChain:
    def __init__(self, features: Sequence[Feature]) -> None:
        self.features = list(features)
        self._request_stages: dict[int, list[RequestStage]] = {}
        self._response_stages: dict[int, list[ResponseStageSpec]] = {}
        self.advertised: dict[str, tuple[int, int]] = {}
        unguarded: set[int] = set()  # API keys with a request stage that acts on any request
        guards: dict[int, list[NativeGuard]] = {}
        for feature in self.features:
            guarded_by = feature.native_guards()
            for api_key, stage in feature.request_stages().items():
                self._request_stages.setdefault(api_key, []).append(stage)
                if api_key in guarded_by:
                    guards.setdefault(api_key, []).append(guarded_by[api_key])
                else:
                    unguarded.add(api_key)
            for api_key, declared in feature.response_stages().items():
                spec = declared if isinstance(declared, ResponseStageSpec) else ResponseStageSpec(*declared)
                self._response_stages.setdefault(api_key, []).append(spec)
            for name, versions in feature.advertised().items():
                if name in self.advertised:
                    raise ValueError(f"two features advertise {name!r}")
                self.advertised[name] = versions
        self._decoded_keys = {*self._request_stages, *self._response_stages, ApiKey.API_VERSIONS}
        self._known: dict[int, tuple[int, int]] = {}
        for key in self._decoded_keys:
            supported = messages.supported_versions(key)
            if supported is not None:
                self._known[key] = supported
        for feature in self.features:
            for key, newest in feature.version_limits().items():
                if key not in self._known:
                    raise ValueError(f"{feature.name} limits the versions of {messages.api_name(key)}, "
                                     "which no feature decodes")
                low, high = self._known[key]
                if newest < low:
                    raise ValueError(f"{feature.name} serves {messages.api_name(key)} up to v{newest}, "
                                     f"below the oldest version the proxy decodes (v{low})")
                self._known[key] = (low, min(high, newest))
        self._stages_by_version: dict[tuple[int, int], list[ResponseStage]] = {}
        self._native_classes: bytes | None = None
        # Produce's guard, when its only request stage acts on requests naming a virtual topic
        # alone: the native relay then carries the others (``native_classes``).
        produce_guards = guards.get(ApiKey.PRODUCE, [])
        self.native_guard: NativeGuard | None = (
            produce_guards[0] if len(produce_guards) == 1 and ApiKey.PRODUCE not in unguarded else None)

    # -- what the chain decodes -------------------------------------------------------------
    def reads_requests(self, api_key: int) -> bool:
        """Whether some feature reads requests of ``api_key`` beyond their header (so a
        large one must be received whole rather than spliced on)."""
        return api_key in self._request_stages

    def known_versions(self) -> dict[int, tuple[int, int]]:
        """(min, max) our schemas decode, for every API key the chain decodes."""
        return dict(self._known)

    def response_stages(self, api_key: int, version: int) -> list[ResponseStage]:
        """The response stages that apply to ``api_key`` at ``version``, in order."""
        key = (api_key, version)
        stages = self._stages_by_version.get(key)
        if stages is None:
            stages = [spec.stage for spec in self._response_stages.get(api_key, ()) if version >= spec.first_version]
            self._stages_by_version[key] = stages
        return stages

    # -- requests -------------------------------------------------------------------------------
    async def route(self, ctx: ConnectionContext, peek: RequestHeaderPeek, frame: bytes | bytearray) -> Route:
        """The route of one request: the first feature's that claims it, else the default."""
        api_key = peek.api_key
        if api_key in self._decoded_keys:
            low, high = self._known[api_key]
            if not low <= peek.api_version <= high:
                if api_key == ApiKey.API_VERSIONS:
                    return Route.answer(self._unsupported_api_versions(peek))
                raise ProtocolError(
                    f"{messages.api_name(api_key)} v{peek.api_version} is beyond the versions the proxy "
                    f"advertised ({low}-{high})",
                    api_key=api_key,
                    version=peek.api_version,
                )
        stages = self._request_stages.get(api_key)
        request = None
        if stages:
            request = Request(peek, frame)
            for stage in stages:
                route = await stage(ctx, request)
                if route is not None:
                    return self._complete(ctx, peek, route, request.response_hooks)
            frame = request.frame
        if api_key == ApiKey.PRODUCE and produce_acks(frame, peek) == ACKS_NONE:
            return Route(frame, expect_response=False)
        if api_key == ApiKey.API_VERSIONS:
            return Route(frame, transform=self._api_versions_transform(peek.api_version))
        hooks = request.response_hooks if request is not None else ()
        if hooks or self.response_stages(api_key, peek.api_version):
            return self._complete(ctx, peek, Route(frame), hooks)
        return Route(frame, relay=OPAQUE)

    def _complete(self, ctx: ConnectionContext, peek: RequestHeaderPeek, route: Route,
                  hooks: tuple[ResponseHook, ...] = ()) -> Route:
        """Give ``route`` one transform that decodes the response once for its own
        ``on_response``, every response stage of the API, then the hooks of the stages that
        rewrote the request (``Request.replace``), the last one's first; when any applies."""
        return self._complete_for(ctx, peek.api_key, peek.api_version, route, hooks)

    def _complete_for(self, ctx: ConnectionContext, api_key: int, version: int, route: Route,
                      hooks: tuple[ResponseHook, ...] = ()) -> Route:
        if route.local is not None or route.relay is not None or not route.expect_response:
            return route
        stages = self.response_stages(api_key, version)
        on_response = route.on_response
        if on_response is None and not stages and not hooks:
            return route
        raw_transform = route.transform

        async def transform(raw: bytes) -> bytes:
            if raw_transform is not None:
                raw = await raw_transform(raw)
            header, body = messages.decode_response(api_key, version, raw)
            response = DecodedResponse(api_key, version, header, body)
            if on_response is not None:
                await on_response(response)
            for stage in stages:
                stage(ctx, response)
            for hook in reversed(hooks):
                hook(response)
            if not response.changed:
                return raw
            return messages.encode_response(api_key, version, response.header, response.body)

        route.transform = transform
        route.on_response = None
        return route

    # -- the native relay (proxy/net/native_relay.py) ----------------------------------------
    def native_classes(self) -> bytes:
        """The native relay's table (``proxy.net.native_table``): for every API key and
        version, PYTHON when a feature reads the request (request stages run on every
        request they name) or the chain answers or checks it; OPAQUE when no stage reads
        its response; PRODUCE for Produce when its stages read only top-level tagged
        fields (``ResponseReads.TOP_LEVEL_TAGS``), so the loop relays every response
        without any untouched. A Produce whose one request stage acts only on requests
        naming a virtual topic (``native_guard``) is carried too, flagged GUARDED: the
        loop checks each request's topic names and leaves those that may name one to the
        event loop. Flexible request headers are flagged
        (``messages.request_header_flexible``): the loop leaves a request whose header
        declares more than MAX_TAGGED_FIELDS tagged fields to the event loop, which refuses
        it. Made once: the chain does not change, and every connection asks."""
        if self._native_classes is None:
            self._native_classes = self._make_native_classes()
        return self._native_classes

    def _make_native_classes(self) -> bytes:
        table = native_table.new_table()
        for api_key in range(native_table.KEYS):
            guarded = api_key == ApiKey.PRODUCE and self.native_guard is not None
            if (api_key in self._request_stages and not guarded) or api_key == ApiKey.API_VERSIONS:
                continue
            for version in range(native_table.VERSIONS):
                if api_key in self._decoded_keys:
                    low, high = self._known.get(api_key, (0, -1))
                    if not low <= version <= high:
                        continue
                specs = [spec for spec in self._response_stages.get(api_key, ()) if version >= spec.first_version]
                if not specs:
                    cls = NativeClass.OPAQUE
                elif api_key == ApiKey.PRODUCE and all(s.reads is ResponseReads.TOP_LEVEL_TAGS for s in specs):
                    cls = NativeClass.PRODUCE
                else:
                    continue
                flexible = messages.request_header_flexible(api_key, version)
                native_table.put(table, api_key, version, native_table.entry(cls, flexible, guarded))
        return bytes(table)

    def native_route(self, ctx: ConnectionContext, api_key: int, version: int) -> Route:
        """The route of a request the native relay forwarded and hands back unanswered: its
        response handled as ``route`` would have had it."""
        if not self.response_stages(api_key, version):
            return Route(None, relay=OPAQUE)
        return self._complete_for(ctx, api_key, version, Route(None))

    def decode_own_response(self, ctx: ConnectionContext, api_key: int, version: int,
                            raw: bytes | bytearray) -> tuple[bytes | bytearray, DecodedResponse]:
        """A response to one of the proxy's own requests, through the response stages as a
        client's would go, for a feature that will hand it to a client later; the frame
        (encoded again only if a stage changed it) and its decoded form."""
        header, body = messages.decode_response(api_key, version, raw)
        response = DecodedResponse(api_key, version, header, body)
        for stage in self.response_stages(api_key, version):
            stage(ctx, response)
        if response.changed:
            raw = messages.encode_response(api_key, version, response.header, response.body)
            response.changed = False
        return raw, response

    # -- ApiVersions ------------------------------------------------------------------------------
    def _api_versions_transform(self, version: int):
        async def transform(raw: bytes) -> bytes:
            header, body = messages.decode_response(ApiKey.API_VERSIONS, version, raw)
            if body.error_code != ErrorCode.NONE:
                # The broker answered an older version it chose (v0 layout); pass it on.
                return raw
            features = self.advertised if version >= API_VERSIONS_FIRST_SUPPORTED_FEATURES else {}
            if not clamp_api_versions(body, self._known, features, ApiVersionsResponse.SupportedFeatureKey):
                return raw
            return messages.encode_response(ApiKey.API_VERSIONS, version, header, body)

        return transform

    def _unsupported_api_versions(self, peek: RequestHeaderPeek) -> bytes:
        """Answer as a broker does when a client asks for an ApiVersions version it lacks:
        UNSUPPORTED_VERSION in the v0 layout, listing the ApiVersions versions we do know."""
        low, high = self._known[ApiKey.API_VERSIONS]
        response_class = ApiVersionsResponse
        body = response_class(
            error_code=int(ErrorCode.UNSUPPORTED_VERSION),
            api_keys=[response_class.ApiVersion(api_key=int(ApiKey.API_VERSIONS), min_version=low, max_version=high)],
        )
        header = messages.new_response_header(peek.correlation_id)
        return messages.encode_response(ApiKey.API_VERSIONS, 0, header, body)


__all__ = ["FeatureChain", "LocalAnswer"]
