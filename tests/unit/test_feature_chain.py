"""The feature contract: request stages in declared order, response stages over one decode,
the default routes, ApiVersions, and per-connection state."""

from __future__ import annotations

import uuid

import pytest

from proxy.features.addresses import AddressRewrite
from proxy.features.cluster_feed import ClusterFeed
from proxy.net.streams import OPAQUE
from proxy.pipeline import (
    ClusterView,
    ConnectionContext,
    DecodedResponse,
    Feature,
    FeatureChain,
    Request,
    Route,
    StateKey,
)
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import ErrorCode
from proxy.protocol.errors import ProtocolError
from proxy.protocol.framing import peek_request_header


class _Book:
    """Advertises every node as proxy:9000+id and remembers what it learned."""

    def __init__(self) -> None:
        self.learned: dict[int, tuple[str, int]] = {}

    def learn(self, node_id: int, host: str, port: int) -> None:
        self.learned[node_id] = (host, port)

    def advertised(self, node_id: int) -> tuple[str, int]:
        return ("proxy", 9000 + node_id)


class _Recorder(Feature):
    """A feature whose stages record their calls in a shared journal."""

    def __init__(self, name: str, journal: list, *, claim: bool = False, keys=(ApiKey.FETCH,),
                 response_keys=(), advertise=None) -> None:
        self.name = name
        self.journal = journal
        self.claim = claim
        self.keys = keys
        self.response_keys = response_keys
        self.advertise = advertise or {}

    def request_stages(self):
        return {key: self.on_request for key in self.keys}

    def response_stages(self):
        return {key: (0, self.on_response) for key in self.response_keys}

    def advertised(self):
        return self.advertise

    async def on_request(self, ctx, request: Request):
        self.journal.append(("request", self.name, bytes(request.frame)))
        return Route(b"from-" + self.name.encode()) if self.claim else None

    def on_response(self, ctx, response: DecodedResponse):
        self.journal.append(("response", self.name, response.body.throttle_time_ms))


def _context() -> ConnectionContext:
    return ConnectionContext(1, "127.0.0.1:1", "bootstrap")


def _request(api_key: int, version: int, correlation_id: int = 3, **fields) -> bytes:
    header = messages.new_request_header(api_key, version, correlation_id, "test")
    return messages.encode_request(header, messages.new_body(api_key, version, "request", **fields))


def _response(api_key: int, version: int, correlation_id: int = 3, **fields) -> bytes:
    header = messages.new_response_header(correlation_id)
    return messages.encode_response(api_key, version, header, messages.new_body(api_key, version, "response", **fields))


async def _route(chain: FeatureChain, frame: bytes, ctx: ConnectionContext | None = None) -> Route:
    return await chain.route(ctx or _context(), peek_request_header(frame), frame)


async def test_request_stages_run_in_declared_order_until_one_claims():
    journal: list = []
    chain = FeatureChain([_Recorder("a", journal), _Recorder("b", journal, claim=True),
                          _Recorder("c", journal, claim=True)])
    frame = _request(ApiKey.FETCH, 12)
    route = await _route(chain, frame)
    assert route.upstream_frame == b"from-b"
    assert [(kind, name) for kind, name, _ in journal] == [("request", "a"), ("request", "b")]


async def test_every_stage_passing_gives_the_default_route_with_the_frame_untouched():
    journal: list = []
    chain = FeatureChain([_Recorder("a", journal), _Recorder("b", journal)])
    frame = _request(ApiKey.FETCH, 12)
    route = await _route(chain, frame)
    assert route.upstream_frame is frame
    assert route.relay is OPAQUE and route.transform is None and route.local is None
    assert len(journal) == 2


async def test_a_replaced_request_is_what_later_stages_and_the_default_route_see():
    journal: list = []

    class Rewriter(Feature):
        def request_stages(self):
            async def stage(ctx, request: Request):
                request.replace(b"rewritten")
                return None

            return {ApiKey.FETCH: stage}

    chain = FeatureChain([Rewriter(), _Recorder("after", journal)])
    route = await _route(chain, _request(ApiKey.FETCH, 12))
    assert journal == [("request", "after", b"rewritten")]
    assert route.upstream_frame == b"rewritten"


async def test_the_claimant_sees_the_response_first_then_every_stage_in_order_over_one_decode():
    journal: list = []

    class Claimant(Feature):
        def request_stages(self):
            async def stage(ctx, request):
                async def on_response(response: DecodedResponse):
                    journal.append(("claimant", response.body.throttle_time_ms))
                    response.body.throttle_time_ms = 77
                    response.changed = True

                return Route(request.frame, on_response=on_response)

            return {ApiKey.METADATA: stage}

    chain = FeatureChain([Claimant(), _Recorder("one", journal, keys=(), response_keys=(ApiKey.METADATA,)),
                          _Recorder("two", journal, keys=(), response_keys=(ApiKey.METADATA,))])
    route = await _route(chain, _request(ApiKey.METADATA, 12, topics=None))
    assert route.transform is not None and route.on_response is None
    out = await route.transform(_response(ApiKey.METADATA, 12, throttle_time_ms=5))
    assert journal == [("claimant", 5), ("response", "one", 77), ("response", "two", 77)]
    _, body = messages.decode_response(ApiKey.METADATA, 12, out)
    assert body.throttle_time_ms == 77


class _Renamer(Feature):
    """Rewrites a Metadata request's topic ``asked`` into ``sent``, and asks for the response
    to turn ``sent`` back into ``asked``: the hook's journal entry shows what it saw."""

    def __init__(self, asked: str, sent: str, journal: list) -> None:
        self.asked, self.sent, self.journal = asked, sent, journal

    def request_stages(self):
        return {ApiKey.METADATA: self.on_metadata}

    async def on_metadata(self, ctx, request: Request):
        header, body = request.decoded()
        for topic in body.topics:
            if topic.name == self.asked:
                topic.name = self.sent

        def back(response: DecodedResponse) -> None:
            self.journal.append(("hook", self.asked, [t.name for t in response.body.topics]))
            for topic in response.body.topics:
                if topic.name == self.sent:
                    topic.name = self.asked
                    response.changed = True

        request.replace(messages.encode_request(header, body), (header, body), on_response=back)
        return None


class _TopicsRecorder(Feature):
    """Records the topic names of every Metadata request and response it sees."""

    def __init__(self, journal: list, *, claim: bool = False) -> None:
        self.journal, self.claim = journal, claim

    def request_stages(self):
        async def stage(ctx, request: Request):
            self.journal.append(("request", [t.name for t in request.decoded()[1].topics]))
            if not self.claim:
                return None

            async def on_response(response: DecodedResponse) -> None:
                self.journal.append(("claimant", [t.name for t in response.body.topics]))

            return Route(request.frame, on_response=on_response)

        return {ApiKey.METADATA: stage}

    def response_stages(self):
        def stage(ctx, response: DecodedResponse) -> None:
            self.journal.append(("stage", [t.name for t in response.body.topics]))

        return {ApiKey.METADATA: (0, stage)}


def _metadata_answer(*names: str) -> bytes:
    cls = messages.body_class(ApiKey.METADATA, "response")
    return _response(ApiKey.METADATA, 12, brokers=[], topics=[
        cls.MetadataResponseTopic(name=name, partitions=[]) for name in names])


def _metadata_asking(*names: str) -> bytes:
    cls = messages.body_class(ApiKey.METADATA, "request")
    return _request(ApiKey.METADATA, 12, topics=[cls.MetadataRequestTopic(name=name) for name in names])


async def test_a_stage_that_rewrote_a_request_gets_its_response_after_every_response_stage():
    journal: list = []
    chain = FeatureChain([_Renamer("virtual", "real", journal), _TopicsRecorder(journal)])
    route = await _route(chain, _metadata_asking("virtual"))
    _, sent = messages.decode_request(route.upstream_frame)
    assert [t.name for t in sent.topics] == ["real"]
    out = await route.transform(_metadata_answer("real"))
    # Later features saw the request as it went upstream, and so see its response; the
    # hook then turns it back into the answer to what the client asked.
    assert journal == [("request", ["real"]), ("stage", ["real"]), ("hook", "virtual", ["real"])]
    _, body = messages.decode_response(ApiKey.METADATA, 12, out)
    assert [t.name for t in body.topics] == ["virtual"]


async def test_the_hooks_of_several_rewrites_unwind_the_last_first_after_the_claimant():
    journal: list = []
    chain = FeatureChain([_Renamer("a", "b", journal), _Renamer("b", "c", journal),
                          _TopicsRecorder(journal, claim=True)])
    route = await _route(chain, _metadata_asking("a"))
    assert route.on_response is None  # folded into the one transform
    out = await route.transform(_metadata_answer("c"))
    assert journal == [("request", ["c"]), ("claimant", ["c"]), ("stage", ["c"]),
                       ("hook", "b", ["c"]), ("hook", "a", ["b"])]
    _, body = messages.decode_response(ApiKey.METADATA, 12, out)
    assert [t.name for t in body.topics] == ["a"]


async def test_a_hook_makes_the_default_route_decode_and_never_runs_on_a_local_answer():
    journal: list = []
    # No feature has a response stage for Metadata: without the hook the response would be
    # relayed undecoded.
    route = await _route(FeatureChain([_Renamer("x", "y", journal)]), _metadata_asking("x"))
    assert route.relay is None and route.transform is not None
    _, body = messages.decode_response(ApiKey.METADATA, 12, await route.transform(_metadata_answer("y")))
    assert [t.name for t in body.topics] == ["x"]

    class Answers(Feature):
        def request_stages(self):
            async def stage(ctx, request: Request):
                return Route.answer(_metadata_answer("local"))

            return {ApiKey.METADATA: stage}

    journal.clear()
    route = await _route(FeatureChain([_Renamer("x", "y", journal), Answers()]), _metadata_asking("x"))
    assert route.transform is None and route.local is not None
    _, body = messages.decode_response(ApiKey.METADATA, 12, await route.local.wait())
    assert [t.name for t in body.topics] == ["local"] and journal == []


async def test_an_unchanged_response_goes_on_as_the_broker_sent_it():
    journal: list = []
    chain = FeatureChain([_Recorder("reader", journal, keys=(), response_keys=(ApiKey.METADATA,))])
    route = await _route(chain, _request(ApiKey.METADATA, 12, topics=None))
    raw = _response(ApiKey.METADATA, 12, throttle_time_ms=9)
    assert await route.transform(raw) is raw
    assert journal == [("response", "reader", 9)]


async def test_metadata_feeds_the_cluster_view_before_addresses_are_rewritten():
    view, book = ClusterView(), _Book()
    chain = FeatureChain([ClusterFeed(view), AddressRewrite(book)])
    response_class = messages.body_class(ApiKey.METADATA, "response")
    topic_id = uuid.uuid4()
    raw = _response(
        ApiKey.METADATA, 12,
        brokers=[response_class.MetadataResponseBroker(node_id=2, host="broker-2", port=9092)],
        topics=[response_class.MetadataResponseTopic(
            name="orders", topic_id=topic_id,
            partitions=[response_class.MetadataResponsePartition(partition_index=0, leader_id=2)])],
    )
    route = await _route(chain, _request(ApiKey.METADATA, 12, topics=None))
    out = await route.transform(raw)
    _, body = messages.decode_response(ApiKey.METADATA, 12, out)
    assert [(b.host, b.port) for b in body.brokers] == [("proxy", 9002)]
    assert view.nodes == {2: ("broker-2", 9092)}
    assert view.name_of(topic_id) == "orders" and view.partitions("orders") == 1 and view.leader("orders", 0) == 2
    assert view.answered.is_set()


async def test_fetch_streams_through_and_only_v16_and_later_rewrite_their_tail():
    chain = FeatureChain([AddressRewrite(_Book())])
    older = await _route(chain, _request(ApiKey.FETCH, 15))
    assert older.relay is OPAQUE
    newer = await _route(chain, _request(ApiKey.FETCH, 16))
    assert newer.relay is not OPAQUE and newer.relay.walk is not None and newer.relay.finish is not None
    assert newer.transform is None  # streamed, never decoded whole


async def test_leader_hints_of_a_relayed_fetch_point_at_the_proxy_in_as_many_bytes():
    book = _Book()
    route = await _route(FeatureChain([AddressRewrite(book)]), _request(ApiKey.FETCH, 16))
    response_class = messages.body_class(ApiKey.FETCH, "response")
    from proxy.protocol.peek import fetch_response_tail

    def relayed(host: str):
        raw = _response(ApiKey.FETCH, 16, node_endpoints=[response_class.NodeEndpoint(node_id=1, host=host, port=1)])
        tail = fetch_response_tail(raw, 16)
        rewritten = raw[:tail] + route.relay.finish(raw, tail)
        assert len(rewritten) == len(raw)  # the size already went to the client
        return messages.decode_response(ApiKey.FETCH, 16, rewritten)[1].node_endpoints

    hints = relayed("broker-1.example.internal")
    assert [(e.node_id, e.host, e.port) for e in hints] == [(1, "proxy", 9001)]
    assert book.learned == {1: ("broker-1.example.internal", 1)}
    assert relayed("b") == []  # the proxy's address does not fit: dropped, never the broker's


async def test_acks_zero_produce_expects_no_response():
    chain = FeatureChain([])
    produce = _request(ApiKey.PRODUCE, 9, acks=0, timeout_ms=100, topic_data=[])
    route = await _route(chain, produce)
    assert route.expect_response is False and route.upstream_frame is produce
    acked = await _route(chain, _request(ApiKey.PRODUCE, 9, acks=-1, timeout_ms=100, topic_data=[]))
    assert acked.expect_response is True


async def test_api_versions_are_clamped_to_what_the_chain_decodes_and_list_its_features():
    chain = FeatureChain([_Recorder("ext", [], advertise={"keyrange.fetch": (1, 1)})])
    low, high = messages.supported_versions(ApiKey.FETCH)
    response_class = messages.body_class(ApiKey.API_VERSIONS, "response")
    raw = _response(ApiKey.API_VERSIONS, 3, api_keys=[
        response_class.ApiVersion(api_key=int(ApiKey.FETCH), min_version=0, max_version=high + 5),
        response_class.ApiVersion(api_key=int(ApiKey.DESCRIBE_ACLS), min_version=0, max_version=99),
    ])
    route = await _route(chain, _request(ApiKey.API_VERSIONS, 3, client_software_name="t",
                                         client_software_version="1"))
    _, body = messages.decode_response(ApiKey.API_VERSIONS, 3, await route.transform(raw))
    versions = {entry.api_key: (entry.min_version, entry.max_version) for entry in body.api_keys}
    assert versions[ApiKey.FETCH] == (low, high)
    assert versions[ApiKey.DESCRIBE_ACLS] == (0, 99)  # not decoded by anyone: as the broker says
    assert [(f.name, f.min_version, f.max_version) for f in body.supported_features] == [("keyrange.fetch", 1, 1)]


async def test_an_api_versions_version_the_proxy_lacks_is_answered_as_a_broker_would():
    chain = FeatureChain([])
    low, high = messages.supported_versions(ApiKey.API_VERSIONS)
    header = messages.new_request_header(ApiKey.API_VERSIONS, 0, 8, "t")
    frame = bytearray(messages.encode_request(header, messages.new_body(ApiKey.API_VERSIONS, 0, "request")))
    frame[2:4] = (high + 1).to_bytes(2, "big")
    route = await _route(chain, bytes(frame))
    assert route.upstream_frame is None
    _, body = messages.decode_response(ApiKey.API_VERSIONS, 0, await route.local.wait())
    assert body.error_code == ErrorCode.UNSUPPORTED_VERSION
    assert [(k.api_key, k.min_version, k.max_version) for k in body.api_keys] == [(ApiKey.API_VERSIONS, low, high)]


async def test_a_version_beyond_our_schemas_of_a_decoded_key_is_a_protocol_error():
    chain = FeatureChain([_Recorder("fetch", [])])
    _, high = messages.supported_versions(ApiKey.FETCH)
    frame = bytearray(_request(ApiKey.FETCH, 12))
    frame[2:4] = (high + 1).to_bytes(2, "big")
    with pytest.raises(ProtocolError, match="beyond the versions the proxy advertised"):
        await _route(chain, bytes(frame))


class _Limited(_Recorder):
    def __init__(self, name: str, limits: dict[int, int], keys=(ApiKey.OFFSET_COMMIT,)) -> None:
        super().__init__(name, [], keys=keys)
        self.limits = limits

    def version_limits(self):
        return self.limits


async def test_a_feature_limits_the_versions_advertised_and_accepted():
    chain = FeatureChain([_Limited("commits-by-name", {ApiKey.OFFSET_COMMIT: 9})])
    low, high = messages.supported_versions(ApiKey.OFFSET_COMMIT)
    assert high > 9
    response_class = messages.body_class(ApiKey.API_VERSIONS, "response")
    raw = _response(ApiKey.API_VERSIONS, 3, api_keys=[
        response_class.ApiVersion(api_key=int(ApiKey.OFFSET_COMMIT), min_version=0, max_version=high)])
    route = await _route(chain, _request(ApiKey.API_VERSIONS, 3, client_software_name="t",
                                         client_software_version="1"))
    _, body = messages.decode_response(ApiKey.API_VERSIONS, 3, await route.transform(raw))
    assert [(e.api_key, e.min_version, e.max_version) for e in body.api_keys] == [(ApiKey.OFFSET_COMMIT, low, 9)]
    frame = bytearray(_request(ApiKey.OFFSET_COMMIT, 9, group_id="g", topics=[]))
    frame[2:4] = (10).to_bytes(2, "big")
    with pytest.raises(ProtocolError, match="beyond the versions the proxy advertised"):
        await _route(chain, bytes(frame))


def test_a_version_limit_needs_a_decoded_key_and_a_version_the_proxy_decodes():
    with pytest.raises(ValueError, match="which no feature decodes"):
        FeatureChain([_Limited("a", {ApiKey.OFFSET_FETCH: 9})])
    with pytest.raises(ValueError, match="below the oldest version"):
        FeatureChain([_Limited("b", {ApiKey.OFFSET_COMMIT: 0})])


def test_two_features_cannot_advertise_one_extension():
    with pytest.raises(ValueError, match="keyrange.fetch"):
        FeatureChain([_Recorder("a", [], advertise={"keyrange.fetch": (1, 1)}),
                      _Recorder("b", [], advertise={"keyrange.fetch": (1, 1)})])


def test_connection_state_is_made_once_per_key_and_closed_with_the_connection():
    closed = []

    class Held:
        def close(self) -> None:
            closed.append(self)

    key = StateKey("held", Held)
    other = StateKey("plain", dict)
    ctx = _context()
    assert ctx.existing(key) is None
    first = ctx.state(key)
    assert ctx.state(key) is first and ctx.existing(key) is first
    assert isinstance(ctx.state(other), dict)
    ctx.close()
    assert closed == [first]
    assert ctx.existing(key) is None


async def test_a_padded_request_is_read_as_the_broker_reads_it():
    """librdkafka pads its all-topics Metadata request; the broker ignores the padding, so a
    feature reading the request must too (strict decoding stays the default elsewhere)."""
    seen = []

    class Reader(Feature):
        def request_stages(self):
            async def stage(ctx, request: Request):
                seen.append(request.decoded()[1].topics)
                return None

            return {ApiKey.METADATA: stage}

    padded = _request(ApiKey.METADATA, 12, topics=None) + b"\x00\x00\x00"
    with pytest.raises(ProtocolError, match="3 trailing bytes"):
        messages.decode_request(padded)
    route = await _route(FeatureChain([Reader()]), padded)
    assert seen == [None] and route.upstream_frame == padded


def test_a_route_has_one_source_for_its_response():
    from proxy.net.streams import OPAQUE
    from proxy.pipeline.route import LocalAnswer, Route

    async def transform(raw: bytes) -> bytes:
        return raw

    Route(b"x", relay=OPAQUE)
    Route(b"x", transform=transform)
    Route(None, local=LocalAnswer.ready(b"y"))
    with pytest.raises(ValueError, match="relay and transform"):
        Route(b"x", relay=OPAQUE, transform=transform)
    with pytest.raises(ValueError, match="local and relay"):
        Route(None, local=LocalAnswer.ready(b"y"), relay=OPAQUE)
    with pytest.raises(ValueError, match="expects no response"):
        Route(b"x", expect_response=False, relay=OPAQUE)
