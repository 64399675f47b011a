"""Consumers' Fetch on the native relay (proxy/net/_cpump.c): which Fetch requests the loop
carries (against its Python reference, proxy/net/native_checks.py), its walk over Fetch
responses (against proxy/protocol/peek.py's), the loop carrying Fetches over loopback
sockets, and what the chain and the features declare for it."""

from __future__ import annotations

import os
import socket
import struct
import time
import uuid

import pytest

from proxy.features.addresses import AddressRewrite, rewrite_fetch_tail
from proxy.net import native_checks
from proxy.net.native_checks import EVENT_LOOP, PLAIN, UNREADABLE
from proxy.net.native_table import (
    FLEXIBLE_HEADER,
    GUARDED,
    VERSIONS,
    NativeClass,
    guard_blob,
    known_blob,
    only_keys,
)
from proxy.pipeline import Feature
from proxy.pipeline.chain import FeatureChain
from proxy.pipeline.context import ConnectionContext
from proxy.pipeline.feature import NativePass
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import MAX_ARRAY_ELEMENTS, MAX_TAGGED_FIELDS
from proxy.protocol.peek import fetch_response_tail
from proxy.protocol.primitives import uvarint_bytes
from proxy.server.exchange import Exchange, Tail

from .test_native_relay import Relay, _classes, _read_exactly

_cpump = pytest.importorskip("proxy.net._cpump")
native_relay = pytest.importorskip("proxy.net.native_relay")

REQUEST = messages.body_class(ApiKey.FETCH, "request")
RESPONSE = messages.body_class(ApiKey.FETCH, "response")
VERSIONS_ALL = range(4, 19)
KNOWN, OTHER, VIRTUAL = uuid.UUID(int=5), uuid.UUID(int=6), uuid.UUID(int=7)
GUARD = guard_blob([b".kr", b".coop"], [VIRTUAL.bytes])
KNOWN_IDS = known_blob([KNOWN.bytes, uuid.UUID(int=9).bytes])


# -- requests -------------------------------------------------------------------------------------
def fetch_request(version: int, topics=("orders",), *, forgotten=(), partitions: int = 2, correlation_id: int = 7,
                  client_id: str | None = "consumer-1", rack: str = "rack-a", **extended) -> bytes:
    """A Fetch request frame (size prefix first) naming ``topics`` (names before v13, ids
    from it); ``extended``: fields set on the body, its first partition (``partition_*``)
    or its first topic's second partition (``cooperative``)."""
    def named(cls, topic, **fields):
        if version >= 13:
            topic_id = topic if isinstance(topic, uuid.UUID) else uuid.uuid5(uuid.NAMESPACE_DNS, topic)
            return cls(topic_id=topic_id, **fields)
        return cls(topic=str(topic), **fields)

    entries = []
    for topic in topics:
        parts = [REQUEST.FetchPartition(partition=i, fetch_offset=100 + i, partition_max_bytes=1 << 20)
                 for i in range(partitions)]
        entries.append(named(REQUEST.FetchTopic, topic, partitions=parts))
    for name, value in extended.items():
        if name.startswith("partition_"):
            setattr(entries[0].partitions[0], name.removeprefix("partition_"), value)
        elif name == "cooperative":
            entries[0].partitions[-1].cooperative = value
    fields = {"max_wait_ms": 500, "min_bytes": 1, "max_bytes": 50 << 20, "topics": entries}
    if version >= 7:
        fields.update(session_id=0, session_epoch=-1,
                      forgotten_topics_data=[named(REQUEST.ForgottenTopic, t, partitions=[1, 2]) for t in forgotten])
    if version >= 11:
        fields["rack_id"] = rack
    body = messages.new_body(ApiKey.FETCH, version, "request", **fields)
    for name, value in extended.items():
        if not name.startswith("partition_") and name != "cooperative":
            setattr(body, name, value)
    frame = messages.encode_request(messages.new_request_header(ApiKey.FETCH, version, correlation_id, client_id), body)
    return struct.pack(">i", len(frame)) + frame


def _both(frame: bytes, version: int, guarded: bool = False, guard: bytes = b"", known: bytes = b"") -> int:
    """The C read and the Python one, which must agree."""
    c = _cpump.fetch_request_plain(frame, version, guarded, guard, known)
    python = native_checks.fetch_request_plain(frame, version, guarded, guard, known)
    assert c == python, (c, python)
    return c


def _table(version: int, cls: int = NativeClass.OPAQUE, guarded: bool = False) -> bytes:
    flexible = FLEXIBLE_HEADER if messages.request_header_flexible(ApiKey.FETCH, version) else 0
    return _classes(fetch=cls | flexible | (GUARDED if guarded else 0))


@pytest.mark.parametrize("version", VERSIONS_ALL)
@pytest.mark.parametrize("shape", ["one", "several", "forgotten", "no topics", "no client id"])
def test_a_plain_fetch_is_carried_whole_and_both_reads_agree(version, shape):
    topics = {"one": ["orders"], "several": ["orders", "payments", "audit"], "forgotten": ["orders"],
              "no topics": [], "no client id": ["orders"]}[shape]
    frame = fetch_request(version, topics, forgotten=["old"] if shape == "forgotten" else (),
                          client_id=None if shape == "no client id" else "consumer-1")
    assert _both(frame, version) == PLAIN
    table = _table(version)
    assert _cpump.classify(frame, table, 1 << 20) == native_checks.classify_fetch(frame, table, 1 << 20) == 1
    # anything short of the whole request, or past it, is the event loop's
    for cut in range(12, len(frame)):
        assert _both(frame[:cut], version) == UNREADABLE, cut
    grown = struct.pack(">i", len(frame) - 3) + frame[4:] + b"\0"
    assert _both(grown, version) == UNREADABLE
    assert _cpump.classify(frame[:-1], table, 1 << 20) == 0


def _key_ranges():
    return [REQUEST.KeyRange(start=0, end=1 << 40)]


@pytest.mark.parametrize("version", range(12, 19))
@pytest.mark.parametrize("field", ["key_ranges", "partition_key_ranges", "cooperative"])
def test_a_fetch_with_an_extension_goes_to_the_event_loop(version, field):
    value = (REQUEST.CooperativeMember(group_id="g", member_id="m", generation_id=1) if field == "cooperative"
             else _key_ranges())
    frame = fetch_request(version, ["orders", "payments"], **{field: value})
    assert _both(frame, version) == EVENT_LOOP
    assert _cpump.classify(frame, _table(version), 1 << 20) == 0
    assert native_checks.classify_fetch(frame, _table(version), 1 << 20) == 0


@pytest.mark.parametrize(("version", "field", "value"), [
    (12, "cluster_id", "cluster-1"), (15, "replica_state", REQUEST.ReplicaState(replica_id=2, replica_epoch=4)),
    (17, "partition_replica_directory_id", uuid.UUID(int=3)), (18, "partition_high_watermark", 40)])
def test_kafka_s_own_tagged_fields_of_a_replica_go_to_the_event_loop(version, field, value):
    """ClusterId, ReplicaState, ReplicaDirectoryId, HighWatermark: a replica's, never a
    consumer's; the loop leaves every tagged field to the event loop."""
    assert _both(fetch_request(version, ["orders"], **{field: value}), version) == EVENT_LOOP


@pytest.mark.parametrize("version", VERSIONS_ALL)
def test_a_guarded_fetch_naming_a_virtual_topic_goes_to_the_event_loop(version):
    by_id = version >= 13
    plain, virtual = ([KNOWN], [KNOWN, VIRTUAL]) if by_id else (["orders", "a.kr"], ["orders", "orders.kr4"])
    assert _both(fetch_request(version, plain), version, True, GUARD, KNOWN_IDS) == PLAIN
    assert _both(fetch_request(version, virtual), version, True, GUARD, KNOWN_IDS) == EVENT_LOOP
    assert _cpump.classify(fetch_request(version, virtual), _table(version, guarded=True), 1 << 20, GUARD,
                           KNOWN_IDS) == 0
    # in ForgottenTopicsData too (v7+)
    if version >= 7:
        forgets = fetch_request(version, plain, forgotten=[VIRTUAL] if by_id else ["orders.coop2"])
        assert _both(forgets, version, True, GUARD, KNOWN_IDS) == EVENT_LOOP
    # unguarded (virtual topics off), the same requests are plain
    assert _both(fetch_request(version, virtual), version, False, GUARD, KNOWN_IDS) == PLAIN
    # without a guard, a guarded request naming a topic is never carried
    assert _both(fetch_request(version, plain), version, True) == EVENT_LOOP
    assert _both(fetch_request(version, []), version, True) == PLAIN


@pytest.mark.parametrize("version", range(13, 19))
def test_a_guarded_fetch_by_an_id_the_proxy_does_not_know_goes_to_the_event_loop(version):
    """An id the proxy does not know may be a virtual topic's, handed out by another proxy
    instance: the event loop looks it up."""
    assert _both(fetch_request(version, [KNOWN, OTHER]), version, True, GUARD, KNOWN_IDS) == EVENT_LOOP
    assert _both(fetch_request(version, [KNOWN]), version, True, GUARD, b"") == EVENT_LOOP
    assert _both(fetch_request(version, [KNOWN]), version, True, GUARD, KNOWN_IDS + b"x") == EVENT_LOOP


def _fetch_with_count(version: int, topics: int) -> bytes:
    """A Fetch v12 whose Topics declares ``topics`` entries and holds none."""
    head = fetch_request(version, [])
    body = bytearray(head[4:])
    at = body.rindex(b"\x01", 0, len(body) - 3 - len("rack-a"))  # the empty Topics (a compact 0 + 1)
    body[at:at + 1] = uvarint_bytes(topics + 1)
    return struct.pack(">i", len(body)) + bytes(body)


def test_counts_over_the_limits_are_the_event_loop_s():
    assert _both(_fetch_with_count(12, 1), 12) == UNREADABLE  # declares one, holds none
    assert _both(_fetch_with_count(12, MAX_ARRAY_ELEMENTS + 1), 12) == UNREADABLE
    frame = fetch_request(12, ["orders"])
    tagged = frame[:-1] + uvarint_bytes(MAX_TAGGED_FIELDS + 1)  # the top-level section's count
    tagged = struct.pack(">i", len(tagged) - 4) + tagged[4:]
    assert _both(tagged, 12) == UNREADABLE
    redundant = frame[:-1] + b"\x80\x00"  # a varint with a redundant zero byte
    redundant = struct.pack(">i", len(redundant) - 4) + redundant[4:]
    assert _both(redundant, 12) == UNREADABLE


def test_a_fetch_is_read_whole_up_to_16_kib():
    table = _table(16, NativeClass.FETCH)
    large = fetch_request(16, [KNOWN], partitions=300)  # 300 partitions: about 10 KB
    assert 1024 < len(large) <= 16384
    assert _cpump.classify(large, table, 1 << 20) == native_checks.classify_fetch(large, table, 1 << 20) == 3
    larger = fetch_request(16, [KNOWN], partitions=600)
    assert len(larger) > 16384
    assert _cpump.classify(larger, table, 1 << 20) == native_checks.classify_fetch(larger, table, 1 << 20) == 0


def test_a_fetch_class_below_v12_is_never_carried():
    """Its walk reads flexible responses only (a chain never marks them so)."""
    frame = fetch_request(11, ["orders"])
    assert _cpump.classify(frame, _table(11, NativeClass.FETCH), 1 << 20) == 0
    assert native_checks.classify_fetch(frame, _table(11, NativeClass.FETCH), 1 << 20) == 0


# -- responses ------------------------------------------------------------------------------------
def fetch_response(version: int, *, correlation_id: int = 7, topics: int = 2, partitions: int = 3,
                   records: bytes | None = b"r" * 3000, aborted: int = 0, endpoints: bool = False,
                   partition_tags: bool = False) -> bytes:
    """A Fetch response body (no size prefix)."""
    entries = []
    for t in range(topics):
        parts = []
        for i in range(partitions):
            part = RESPONSE.PartitionData(partition_index=i, high_watermark=1000, records=records if i != 1 else None)
            part.aborted_transactions = [RESPONSE.AbortedTransaction(producer_id=i, first_offset=9)] * aborted
            if partition_tags:
                part.current_leader = RESPONSE.LeaderIdAndEpoch(leader_id=2, leader_epoch=3)
                part.diverging_epoch = RESPONSE.EpochEndOffset(epoch=1, end_offset=50)
            parts.append(part)
        entries.append(RESPONSE.FetchableTopicResponse(topic_id=uuid.UUID(int=t + 1), partitions=parts)
                       if version >= 13 else RESPONSE.FetchableTopicResponse(topic=f"topic-{t}", partitions=parts))
    body = messages.new_body(ApiKey.FETCH, version, "response", responses=entries, session_id=3)
    if endpoints:
        body.node_endpoints = [RESPONSE.NodeEndpoint(node_id=2, host="broker-2.internal", port=9092, rack=None)]
    return messages.encode_response(ApiKey.FETCH, version, messages.new_response_header(correlation_id), body)


SHAPES = [{}, {"aborted": 2}, {"partition_tags": True}, {"topics": 0}, {"partitions": 0}, {"records": b""},
          {"records": None}, {"records": os.urandom(70_000)}]


@pytest.mark.parametrize("version", range(12, 19))
@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_the_walk_finds_the_tail_where_the_python_walk_does(version, shape):
    body = fetch_response(version, **SHAPES[shape], endpoints=version >= 16 and shape % 2 == 0)
    tail = fetch_response_tail(body, version)
    for arriving in (1, 2, 5, 64, 4096, 1 << 20):
        assert _cpump.fetch_response_tail(body, version, arriving) == tail
    for cut in range(0, tail, max(1, tail // 97)):
        assert _cpump.fetch_response_tail(body[:cut], version, 7) is None


@pytest.mark.parametrize("bad", ["topics over the limit", "tags over the limit", "redundant zero byte", "past the end"])
def test_a_malformed_response_is_refused_by_both_walks(bad):
    body = bytearray(fetch_response(16, topics=1, partitions=1, records=b"r" * 10))
    head = 4 + 1 + 10  # correlation id, header tags, throttle, error, session id: the topics' count is next
    if bad == "topics over the limit":
        body[head:head + 1] = uvarint_bytes(MAX_ARRAY_ELEMENTS + 2)
    elif bad == "tags over the limit":
        body[4:5] = uvarint_bytes(MAX_TAGGED_FIELDS + 1)
    elif bad == "redundant zero byte":
        body[head:head + 1] = b"\x82\x00"
    else:
        body = body[:-3]
    with pytest.raises(Exception):  # noqa: B017 - ProtocolError, which both refuse alike
        fetch_response_tail(bytes(body), 16)
    assert _cpump.fetch_response_tail(bytes(body), 16, 3) is None


# -- the loop -------------------------------------------------------------------------------------
def _frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


@pytest.fixture
def fetch_loop():
    """``fetch_loop()``: a native loop between two socket pairs, carrying Fetch v17 (FETCH)."""
    made: list[Relay] = []

    def start() -> Relay:
        relay = Relay(_table(17, NativeClass.FETCH))
        made.append(relay)
        return relay.start()

    yield start
    for relay in made:
        if relay.thread is not None and relay.thread.is_alive():
            os.eventfd_write(relay.wake, 2)
            relay.thread.join(timeout=10)
        relay.close()


def test_fetch_responses_are_walked_and_spliced_in_order(fetch_loop):
    relay = fetch_loop()
    requests = [fetch_request(17, [KNOWN], correlation_id=20 + i) for i in range(3)]
    relay.client.sendall(b"".join(requests))
    assert _read_exactly(relay.broker, sum(map(len, requests))) == b"".join(requests)
    responses = [_frame(fetch_response(17, correlation_id=20 + i, records=os.urandom(size), aborted=i))
                 for i, size in enumerate((300_000, 0, 1_200_000))]
    relay.broker.sendall(b"".join(responses))
    assert _read_exactly(relay.client, sum(map(len, responses))) == b"".join(responses)
    reason, flights, answered, held, forwarded, *_ = relay.join()
    assert reason == native_relay.IDLE and flights == [] and held is None and forwarded == 3
    assert [(a[0], a[2]) for a in answered] == [(1, len(r)) for r in responses]


def test_a_response_arriving_a_few_bytes_at_a_time_goes_through(fetch_loop):
    """The walk waits for a count cut between two arrivals without spinning (the socket
    wakes the loop only once more has come)."""
    relay = fetch_loop()
    request = fetch_request(17, [KNOWN], correlation_id=5)
    relay.client.sendall(request)
    _read_exactly(relay.broker, len(request))
    response = _frame(fetch_response(17, correlation_id=5, records=b"z" * 50, aborted=1, partition_tags=True))
    started = time.process_time()
    for at in range(0, len(response), 3):
        relay.broker.sendall(response[at:at + 3])
        time.sleep(0.002)
    assert _read_exactly(relay.client, len(response)) == response
    assert relay.join()[0] == native_relay.IDLE
    assert time.process_time() - started < 2  # this process's CPU, the loop's thread included: no spin


def test_leader_hints_are_handed_back_after_everything_before_them(fetch_loop):
    relay = fetch_loop()
    requests = [fetch_request(17, [KNOWN], correlation_id=i) for i in (1, 2, 3)]
    relay.client.sendall(b"".join(requests))
    _read_exactly(relay.broker, sum(map(len, requests)))
    plain = _frame(fetch_response(17, correlation_id=1))
    hinted_body = fetch_response(17, correlation_id=2, records=os.urandom(200_000), endpoints=True)
    relay.broker.sendall(plain + _frame(hinted_body))
    tail = fetch_response_tail(hinted_body, 17)
    assert _read_exactly(relay.client, len(plain) + 4 + tail) == plain + _frame(hinted_body)[:4 + tail]
    reason, flights, answered, held, *_ = relay.join()
    assert reason == native_relay.PYTHON_RESPONSE and len(answered) == 1
    assert [(f[0], f[2], f[3]) for f in flights] == [(1, 2, NativeClass.FETCH), (1, 3, NativeClass.FETCH)]
    assert held == _frame(hinted_body)[:8] + hinted_body[tail:]  # size, correlation id, the tail
    relay.client.settimeout(0.2)
    with pytest.raises(TimeoutError):  # nothing of the tail went to the client
        relay.client.recv(1)


def test_a_malformed_fetch_response_is_a_protocol_error(fetch_loop):
    relay = fetch_loop()
    request = fetch_request(17, [KNOWN], correlation_id=4)
    relay.client.sendall(request)
    _read_exactly(relay.broker, len(request))
    body = bytearray(fetch_response(17, correlation_id=4, topics=1))
    body[15:16] = uvarint_bytes(MAX_ARRAY_ELEMENTS + 2)  # the topics' count
    relay.broker.sendall(_frame(bytes(body)))
    reason, *_, message = relay.join()
    assert reason == native_relay.PROTOCOL and message == "malformed Fetch response"


def test_the_broker_closing_inside_a_count_breaks_the_run(fetch_loop):
    relay = fetch_loop()
    request = fetch_request(17, [KNOWN], correlation_id=4)
    relay.client.sendall(request)
    _read_exactly(relay.broker, len(request))
    response = _frame(fetch_response(17, correlation_id=4, topics=1))
    relay.broker.sendall(response[:4 + 15] + b"\x82")  # the topics' count, cut after its first byte
    time.sleep(0.05)
    relay.broker.shutdown(socket.SHUT_WR)
    reason, *_, message = relay.join()
    assert reason == native_relay.BROKEN and "inside a response" in message


def test_a_run_starts_on_a_produce_or_a_fetch():
    """A consumer never produces: its Fetches start runs too (a heartbeat does not)."""
    table = _classes(fetch=1, produce=2, heartbeat=1)
    assert only_keys(table, native_relay.STARTERS) == _classes(fetch=1, produce=2)


# -- the chain and the features ---------------------------------------------------------------------
def _chain(**settings) -> FeatureChain:
    from proxy.server.app import ProxyServer
    from proxy.server.config import build_config

    config = build_config({"bootstrap.servers": "127.0.0.1:9", "listen.port": "0", **settings})
    server = ProxyServer(config)
    server._main_socket.close()  # only its chain is wanted
    return server.chain


def _context() -> ConnectionContext:
    return ConnectionContext(1, "127.0.0.1:1", "bootstrap")


def _fetch_entries(table: bytes) -> list[int]:
    return list(table[1 * VERSIONS:2 * VERSIONS])


@pytest.mark.parametrize("virtual", [False, True])
def test_the_chain_carries_plain_fetches_and_walks_responses_with_leader_hints(virtual):
    chain = _chain(**{"virtual.topics.enabled": str(virtual).lower()})
    entries = _fetch_entries(chain.native_classes())
    guarded = GUARDED if virtual else 0
    for version in range(VERSIONS):
        expected = 0
        if 4 <= version <= 18:
            cls = NativeClass.FETCH if version >= 16 else NativeClass.OPAQUE
            expected = cls | guarded | (FLEXIBLE_HEADER if version >= 12 else 0)
        assert entries[version] == expected, version
    assert (chain.native_guard is not None, chain.native_known is not None) == (virtual, virtual)
    assert chain.native_relay(ApiKey.FETCH, 15) is None and chain.native_relay(ApiKey.FETCH, 16) is not None
    assert chain.native_route(_context(), ApiKey.FETCH, 17).relay is chain.native_relay(ApiKey.FETCH, 17)


def test_with_fetch_prediction_every_fetch_stays_on_the_event_loop():
    assert not any(_fetch_entries(_chain(**{"fetch.prediction.enabled": "true"}).native_classes()))


def test_a_connection_holding_a_key_range_session_reads_its_every_fetch():
    from proxy.keyrange.feature import RANGES

    chain = _chain()
    ctx = _context()
    assert chain.native_classes_for(ctx) == chain.native_classes()
    ctx.state(RANGES)  # state, but no session: plain Fetches still native
    assert chain.native_classes_for(ctx) == chain.native_classes()
    ctx.state(RANGES).sessions.sessions[12] = {}
    held = chain.native_classes_for(ctx)
    assert not any(_fetch_entries(held)) and held[:VERSIONS] == chain.native_classes()[:VERSIONS]


async def _stage(ctx, request):
    return None


class _Reads(Feature):
    def request_stages(self):
        return {ApiKey.FETCH: _stage, ApiKey.PRODUCE: _stage}

    def native_passes(self):
        return {ApiKey.FETCH: NativePass(untagged=True), ApiKey.PRODUCE: NativePass(untagged=True)}


class _ReadsAll(Feature):
    def request_stages(self):
        return {ApiKey.FETCH: _stage}


def test_only_what_the_loop_checks_lets_a_stage_s_key_be_carried():
    entries = FeatureChain([_Reads()]).native_classes()
    assert all(entries[1 * VERSIONS + v] & 0x3F == NativeClass.OPAQUE for v in range(4, 19))
    assert not any(entries[:VERSIONS])  # the loop reads no Produce's tagged fields
    assert not any(_fetch_entries(FeatureChain([_Reads(), _ReadsAll()]).native_classes()))


# -- the tail handed back ---------------------------------------------------------------------------
class _Book:
    def learn(self, node_id, host, port):
        pass

    def advertised(self, node_id):
        return "proxy.example", 19092


def test_a_tail_handed_back_is_sent_as_the_event_loop_relays_it():
    """Byte for byte what the event loop's relay would have sent for the same response."""
    body = fetch_response(17, endpoints=True)
    tail = fetch_response_tail(body, 17)
    relay = AddressRewrite(_Book()).fetch_relay(17)
    held = _frame(body)[:8] + body[tail:]
    route = FeatureChain([AddressRewrite(_Book())]).native_route(_context(), ApiKey.FETCH, 17)
    exchange = Exchange.of_route(route, api_key=1, api_version=17, correlation_id=7, received_at=0.0,
                                 request_bytes=10, tail=held)
    assert isinstance(exchange.response, Tail) and exchange.response.size == len(body)
    rest = exchange.response.rest()
    assert rest == rewrite_fetch_tail(body, tail, 17, _Book()) == relay.finish(body, tail)
    assert len(rest) == len(body) - tail and b"proxy.example" in rest and b"broker-2.internal" not in rest
