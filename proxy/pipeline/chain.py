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
from proxy.net.native_relay import NativeAnswers
from proxy.net.native_table import NativeClass
from proxy.net.streams import OPAQUE, Relay
from proxy.pipeline.context import ConnectionContext
from proxy.pipeline.feature import (
    Feature,
    NativeGuard,
    NativePass,
    RequestStage,
    ResponseReads,
    ResponseStage,
    ResponseStageSpec,
)
from proxy.pipeline.request import Request, ResponseHook
from proxy.pipeline.route import DecodedResponse, LocalAnswer, Route
from proxy.pipeline.versions import clamp_api_versions
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import ErrorCode
from proxy.protocol.errors import ProtocolError
from proxy.protocol.framing import GatheredFrame, OutgoingFrame, RequestHeaderPeek
from proxy.protocol.message_types import ApiVersionsResponse
from proxy.protocol.message_versions import API_VERSIONS_FIRST_SUPPORTED_FEATURES, FETCH_FIRST_FLEXIBLE
from proxy.protocol.peek import produce_acks

ACKS_NONE = 0  # a Produce with acks=0 gets no response from the broker
# What the native loop checks of a request, by API key (proxy/net/_cpump.c): a stage's
# NativePass may declare these, and ``held``, which the connection answers.
_LOOP_CHECKS: dict[int, frozenset[str]] = {
    ApiKey.PRODUCE: frozenset({"guard"}),
    ApiKey.FETCH: frozenset({"untagged", "guard", "known", "relay"}),
}


class _NativeTerms:
    """The native relay's terms for one API key whose requests some feature reads: what
    every stage of the key declared it passes on (``Feature.native_passes``), merged."""

    __slots__ = ("guard", "known", "held", "relay")

    def __init__(self, passes: Sequence[NativePass]) -> None:
        guards = {p.guard for p in passes if p.guard is not None}
        knowns = {p.known for p in passes if p.known is not None}
        relays = [p.relay for p in passes if p.relay is not None]
        if len(guards) > 1 or len(knowns) > 1 or len(relays) > 1:
            raise ValueError("the native relay takes one guard, one list of known ids and one relay per API key")
        self.guard: NativeGuard | None = next(iter(guards), None)
        self.known: NativeGuard | None = next(iter(knowns), None)
        self.held = tuple(p.held for p in passes if p.held is not None)
        self.relay = relays[0] if relays else None

    @staticmethod
    def checked(api_key: int, passes: Sequence[NativePass]) -> bool:
        """Whether the loop checks of ``api_key`` everything ``passes`` declare."""
        checks = _LOOP_CHECKS.get(api_key, frozenset())
        for declared in passes:
            asked = {name for name in ("untagged", "guard", "known", "relay") if getattr(declared, name)}
            if not asked <= checks:
                return False
        return True


class FeatureChain:
    def __init__(self, features: Sequence[Feature]) -> None:
        self.features = list(features)
        self._request_stages: dict[int, list[RequestStage]] = {}
        self._response_stages: dict[int, list[ResponseStageSpec]] = {}
        self.advertised: dict[str, tuple[int, int]] = {}
        undeclared: set[int] = set()  # API keys with a request stage that acts on any request
        passes: dict[int, list[NativePass]] = {}
        for feature in self.features:
            passing = {**{key: NativePass(guard=guard) for key, guard in feature.native_guards().items()},
                       **feature.native_passes()}
            for api_key, stage in feature.request_stages().items():
                self._request_stages.setdefault(api_key, []).append(stage)
                if api_key in passing:
                    passes.setdefault(api_key, []).append(passing[api_key])
                else:
                    undeclared.add(api_key)
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
        self._native_held: dict[frozenset[int], bytes] = {}
        # The keys some feature reads whose every stage passes on what the loop can tell
        # apart (``native_classes``): the native relay carries those requests.
        self._native_terms = {key: _NativeTerms(declared) for key, declared in passes.items()
                              if key not in undeclared and _NativeTerms.checked(key, declared)}
        guards = {terms.guard for terms in self._native_terms.values() if terms.guard is not None}
        if len(guards) > 1:  # one guard a run: a key guarded by another is the event loop's
            self._native_terms = {key: terms for key, terms in self._native_terms.items() if terms.guard is None}
        # The guard of the runs (virtual topics' names and ids), and the ids of the topics the
        # proxy knows (a guarded Fetch names only those): None when nothing is guarded.
        self.native_guard: NativeGuard | None = next(iter(guards)) if len(guards) == 1 else None
        fetch_terms = self._native_terms.get(ApiKey.FETCH)
        self.native_known: NativeGuard | None = fetch_terms.known if fetch_terms is not None else None
        self.native_answers: NativeAnswers | None = self._native_answers(passes.get(ApiKey.FETCH, []))

    def _native_answers(self, fetch_passes: Sequence[NativePass]) -> NativeAnswers | None:
        """The answers the native relay may send itself (``Feature.native_answers``): the one
        feature's that offers them, when the loop carries Fetches at all and every Fetch stage
        passes on a request whose only tagged fields are key ranges (``NativePass.key_ranges``,
        a relay that reads nothing of it, or a guard the loop checks); the loop still answers
        only requests the run's table carries (``native_classes_for``: none on a connection
        holding a feature's fetch session)."""
        offered = [answers for feature in self.features if (answers := feature.native_answers()) is not None]
        stages = len(self._request_stages.get(ApiKey.FETCH, ()))
        if len(offered) != 1 or ApiKey.FETCH not in self._native_terms or len(fetch_passes) != stages:
            return None
        if all(p.key_ranges or p.relay is not None or p.guard is not None for p in fetch_passes):
            return offered[0]
        return None

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

        async def transform(received: bytes) -> OutgoingFrame:
            raw: bytes | bytearray = received
            if raw_transform is not None:
                rewritten = await raw_transform(received)
                raw = bytes(rewritten) if isinstance(rewritten, GatheredFrame) else rewritten
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
            return messages.encode_response_gathered(api_key, version, response.header, response.body)

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
        without any untouched. A key whose every request stage declares which requests it
        passes on (``Feature.native_passes``), in terms the loop checks for that key, is
        carried too, the loop carrying only the requests that pass: a guard flags it
        GUARDED (the loop checks each request's topic names against ``native_guard``, a
        Fetch's topic ids against ``native_known`` too), and a Fetch whose stage relays its
        response (``NativePass.relay``: the leader hints' rewrite) is FETCH (the loop walks
        the response and hands back its top-level tagged fields when it has any). Flexible
        request headers are flagged (``messages.request_header_flexible``): the loop leaves
        a request whose header declares more than MAX_TAGGED_FIELDS tagged fields to the
        event loop, which refuses it. Made once: the chain does not change, and every
        connection asks."""
        if self._native_classes is None:
            self._native_classes = self._make_native_classes()
        return self._native_classes

    def native_classes_for(self, ctx: ConnectionContext) -> bytes:
        """The table for a run on this connection now: ``native_classes`` without the keys
        whose stages hold every request of this connection (``NativePass.held``: its state,
        such as a key-range fetch session, makes even a plain Fetch a feature's business)."""
        table = self.native_classes()
        held = frozenset(key for key, terms in self._native_terms.items() if any(h(ctx) for h in terms.held))
        if not held:
            return table
        without = self._native_held.get(held)
        if without is None:
            without = table
            for key in held:
                without = native_table.without_key(without, key)
            self._native_held[held] = without
        return without

    def _make_native_classes(self) -> bytes:
        table = native_table.new_table()
        for api_key in range(native_table.KEYS):
            terms = self._native_terms.get(api_key)
            if (api_key in self._request_stages and terms is None) or api_key == ApiKey.API_VERSIONS:
                continue
            guarded = terms is not None and terms.guard is not None
            for version in range(native_table.VERSIONS):
                if api_key in self._decoded_keys:
                    low, high = self._known.get(api_key, (0, -1))
                    if not low <= version <= high:
                        continue
                specs = [spec for spec in self._response_stages.get(api_key, ()) if version >= spec.first_version]
                if self.native_relay(api_key, version) is not None:
                    # the stage's relay takes the response, as on the event loop (its route
                    # has a relay: no response stage runs); the loop knows Fetch's walk only
                    if api_key != ApiKey.FETCH or version < FETCH_FIRST_FLEXIBLE:
                        continue
                    cls = NativeClass.FETCH
                elif not specs:
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
        relay = self.native_relay(api_key, version)
        if relay is not None:
            return Route(None, relay=relay)
        if not self.response_stages(api_key, version):
            return Route(None, relay=OPAQUE)
        return self._complete_for(ctx, api_key, version, Route(None))

    def native_relay(self, api_key: int, version: int) -> Relay | None:
        """The relay a stage declared for the responses of the requests the native relay
        carries (``NativePass.relay``), whose ``finish`` rewrites a tail the loop hands back;
        None when none did."""
        terms = self._native_terms.get(api_key)
        return terms.relay(version) if terms is not None and terms.relay is not None else None

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
