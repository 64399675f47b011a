"""The native relay loop (proxy/net/_cpump.c) over loopback sockets and its header reads.

The loop is pure I/O between two sockets, so these tests give it a client socket and an
upstream socket of their own (the test plays both peers) and check the frames, their
order, and where it stops and what it hands back.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import uuid

import pytest

from proxy.net.native_table import FLEXIBLE_HEADER as NATIVE_FLEXIBLE_HEADER
from proxy.net.native_table import GUARDED as NATIVE_GUARDED
from proxy.net.native_table import KEYS as NATIVE_KEYS
from proxy.net.native_table import VERSIONS as NATIVE_VERSIONS
from proxy.net.native_table import guard_blob
from proxy.pipeline.chain import FeatureChain
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import MAX_TAGGED_FIELDS
from proxy.protocol.errors import ProtocolError
from proxy.protocol.framing import check_request_header_tags, peek_request_header
from proxy.protocol.peek import produce_acks
from proxy.protocol.primitives import uvarint_bytes

_cpump = pytest.importorskip("proxy.net._cpump")
native_relay = pytest.importorskip("proxy.net.native_relay")

HEARTBEAT, METADATA = int(ApiKey.HEARTBEAT), int(ApiKey.METADATA)


# -- header reads ----------------------------------------------------------------------------
def _produce_request(version: int, acks: int, transactional_id: str | None, client_id: str | None) -> bytes:
    body_class = messages.body_class(ApiKey.PRODUCE, "request")
    data = body_class.PartitionProduceData(index=0, records=b"x" * 10)
    topic = (body_class.TopicProduceData(topic_id=uuid.uuid4(), partition_data=[data]) if version >= 13
             else body_class.TopicProduceData(name="orders", partition_data=[data]))
    header = messages.new_request_header(ApiKey.PRODUCE, version, 7, client_id)
    body = messages.new_body(ApiKey.PRODUCE, version, "request", transactional_id=transactional_id, acks=acks,
                             timeout_ms=30000, topic_data=[topic])
    frame = messages.encode_request(header, body)
    return struct.pack(">i", len(frame)) + frame


@pytest.mark.parametrize("version", range(3, 14))
@pytest.mark.parametrize("acks", [0, 1, -1])
@pytest.mark.parametrize(("transactional_id", "client_id"), [(None, None), ("tx-1", "producer-1"), ("", "x" * 300)])
def test_produce_acks_agree_with_the_python_peek(version, acks, transactional_id, client_id):
    frame = _produce_request(version, acks, transactional_id, client_id)
    body = frame[4:]
    assert _cpump.produce_acks(frame, version) == produce_acks(body, peek_request_header(body)) == acks
    # cut anywhere before acks: the C read says it cannot tell, never a wrong value
    end_of_acks = len(frame) - len(body) + body.index(struct.pack(">h", acks), 10) + 2
    for cut in range(12, end_of_acks - 1, 7):
        assert _cpump.produce_acks(frame[:cut], version) in (None, acks)


def _produce_response(version: int, *, endpoints: bool, record_errors: bool = False, leader: bool = False) -> bytes:
    c = messages.body_class(ApiKey.PRODUCE, "response")
    errors = [c.BatchIndexAndErrorMessage(batch_index=2, batch_index_error_message="bad")] if record_errors else []
    partition = c.PartitionProduceResponse(index=3, error_code=6 if leader else 0, base_offset=100,
                                           record_errors=errors, error_message="moved" if leader else None)
    if leader:
        partition.current_leader = c.LeaderIdAndEpoch(leader_id=2, leader_epoch=5)
    topic = (c.TopicProduceResponse(topic_id=uuid.uuid4(), partition_responses=[partition, partition])
             if version >= 13 else c.TopicProduceResponse(name="orders", partition_responses=[partition]))
    body = messages.new_body(ApiKey.PRODUCE, version, "response", responses=[topic, topic], throttle_time_ms=0)
    if endpoints:
        body.node_endpoints = [c.NodeEndpoint(node_id=2, host="broker-2", port=9092, rack=None)]
    return messages.encode_response(ApiKey.PRODUCE, version, messages.new_response_header(7), body)


@pytest.mark.parametrize("version", range(9, 14))
@pytest.mark.parametrize("record_errors", [False, True])
@pytest.mark.parametrize("leader", [False, True])
def test_a_produce_response_needs_the_event_loop_only_with_leader_hints(version, record_errors, leader):
    plain = _produce_response(version, endpoints=False, record_errors=record_errors, leader=leader)
    assert _cpump.produce_response_needs_python(plain, version) is False
    if version >= 10:  # leader hints came with v10
        hinted = _produce_response(version, endpoints=True, record_errors=record_errors, leader=leader)
        assert _cpump.produce_response_needs_python(hinted, version) is True
    for cut in range(0, len(plain) - 1, 5):  # truncated: the codec must judge it
        assert _cpump.produce_response_needs_python(plain[:cut], version) is True
    assert _cpump.produce_response_needs_python(plain + b"\0", version) is True


# -- the loop ----------------------------------------------------------------------------------
def _pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        near = socket.create_connection(listener.getsockname())
        far, _ = listener.accept()
    near.setblocking(False)  # the loop's side, as trio leaves it
    return near, far


def _pipe() -> tuple[int, int, int]:
    read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    return read_end, write_end, 65536


def _request(api_key: int, version: int, correlation_id: int, payload: bytes = b"") -> bytes:
    body = struct.pack(">hhih", api_key, version, correlation_id, -1) + payload
    return struct.pack(">i", len(body)) + body


def _response(correlation_id: int, payload: bytes = b"") -> bytes:
    body = struct.pack(">i", correlation_id) + payload
    return struct.pack(">i", len(body)) + body


def _read_exactly(sock: socket.socket, count: int) -> bytes:
    sock.settimeout(10)
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        assert chunk, f"closed after {len(data)} of {count} bytes"
        data += chunk
    return data


class Relay:
    """A client socket pair, an upstream socket pair, and the loop between them on a thread."""

    def __init__(self, classes: bytes, **options) -> None:
        self.client_near, self.client = _pair()
        self.upstream_near, self.broker = _pair()
        self.wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.pipes = (_pipe(), _pipe())
        self.options = {"max_frame": 1 << 24, "max_inflight": 8, "slice_ms": 5000, "idle_ms": 200, **options}
        self.classes = classes
        self.result = None
        self.thread: threading.Thread | None = None

    def start(self, flights=()) -> Relay:
        def run() -> None:
            self.result = _cpump.relay(client=self.client_near.fileno(), upstream=self.upstream_near.fileno(),
                                       wake=self.wake, classes=self.classes, flights=list(flights),
                                       request_pipe=self.pipes[0], response_pipe=self.pipes[1], **self.options)

        self.thread = threading.Thread(target=run)
        self.thread.start()
        return self

    def join(self):
        """The run's result, but for the answers it took from a table (none here:
        tests/unit/test_native_answers.py)."""
        assert self.thread is not None
        self.thread.join(timeout=20)
        assert not self.thread.is_alive(), "the loop did not stop"
        assert self.result is not None and self.result[8] == []
        return self.result[:8]

    def close(self) -> None:
        for sock in (self.client_near, self.client, self.upstream_near, self.broker):
            sock.close()
        os.close(self.wake)
        for read_end, write_end, _ in self.pipes:
            os.close(read_end)
            os.close(write_end)


def _classes(**marked: int) -> bytes:
    table = bytearray(NATIVE_KEYS * NATIVE_VERSIONS)
    for name, cls in marked.items():
        key = int(ApiKey[name.upper()])
        for version in range(NATIVE_VERSIONS):
            table[key * NATIVE_VERSIONS + version] = cls
    return bytes(table)


@pytest.fixture
def relay_factory():
    made = []

    def make(classes: bytes, **options) -> Relay:
        relay = Relay(classes, **options)
        made.append(relay)
        return relay

    yield make
    for relay in made:
        if relay.thread is not None and relay.thread.is_alive():
            os.eventfd_write(relay.wake, 2)
            relay.thread.join(timeout=10)
        relay.close()


def test_pipelined_requests_and_large_responses_pass_in_order(relay_factory):
    relay = relay_factory(_classes(heartbeat=1)).start()
    payloads = [os.urandom(size) for size in (0, 10, 300_000, 5, 1_000_000)]
    requests = [_request(HEARTBEAT, 4, 100 + i, p) for i, p in enumerate(payloads)]
    relay.client.sendall(b"".join(requests))
    for request in requests:  # the broker sees each request whole, in order
        assert _read_exactly(relay.broker, len(request)) == request
    responses = [_response(100 + i, p[::-1]) for i, p in enumerate(payloads)]
    for response in responses:
        relay.broker.sendall(response)
    assert _read_exactly(relay.client, sum(map(len, responses))) == b"".join(responses)
    reason, flights, answered, held, forwarded, spliced, _, _ = relay.join()
    assert reason == native_relay.IDLE and flights == [] and held is None
    assert forwarded == 5 and spliced == 2
    assert [(a[0], a[1], a[2]) for a in answered] == [(HEARTBEAT, len(q), len(r)) for q, r in zip(requests, responses)]


def test_a_request_it_may_not_carry_stays_in_the_socket_and_the_flights_come_back(relay_factory):
    relay = relay_factory(_classes(heartbeat=1)).start()
    carried = _request(HEARTBEAT, 4, 1)
    other = _request(METADATA, 12, 2, b"topics")
    relay.client.sendall(carried + other)
    assert _read_exactly(relay.broker, len(carried)) == carried
    reason, flights, answered, held, forwarded, _, _, _ = relay.join()
    assert reason == native_relay.PYTHON_REQUEST
    assert [(f[0], f[2]) for f in flights] == [(HEARTBEAT, 1)] and answered == [] and forwarded == 1
    relay.client_near.setblocking(True)
    assert _read_exactly(relay.client_near, len(other)) == other  # untouched, for the event loop
    # carried on by the next run: its response is relayed there
    relay.start(flights)
    relay.broker.sendall(_response(1, b"ok"))
    assert _read_exactly(relay.client, len(_response(1, b"ok"))) == _response(1, b"ok")
    reason, flights, answered, *_ = relay.join()
    assert reason == native_relay.IDLE and flights == [] and len(answered) == 1


def test_a_wrong_correlation_id_is_a_protocol_error(relay_factory):
    relay = relay_factory(_classes(heartbeat=1)).start()
    relay.client.sendall(_request(HEARTBEAT, 4, 5))
    _read_exactly(relay.broker, len(_request(HEARTBEAT, 4, 5)))
    relay.broker.sendall(_response(6))
    reason, *_, message = relay.join()
    assert reason == native_relay.PROTOCOL and message == "broker answered correlation id 6, expected 5"


def test_a_produce_response_with_leader_hints_comes_back_whole(relay_factory):
    relay = relay_factory(_classes(produce=2)).start()
    first, second = _produce_request(11, -1, None, "p"), _produce_request(11, 1, None, "p")
    second = second[:8] + struct.pack(">i", 8) + second[12:]  # correlation id 8
    relay.client.sendall(first + second)
    _read_exactly(relay.broker, len(first) + len(second))
    plain = _produce_response(11, endpoints=False)
    hinted = _produce_response(11, endpoints=True)
    hinted = struct.pack(">i", 8) + hinted[4:]
    relay.broker.sendall(struct.pack(">i", len(plain)) + plain + struct.pack(">i", len(hinted)) + hinted)
    assert _read_exactly(relay.client, len(plain) + 4) == struct.pack(">i", len(plain)) + plain
    reason, flights, answered, held, *_ = relay.join()
    assert reason == native_relay.PYTHON_RESPONSE and held == hinted
    assert [(f[0], f[2], f[3]) for f in flights] == [(0, 8, 2)] and len(answered) == 1


def test_acks_zero_is_left_to_the_event_loop(relay_factory):
    relay = relay_factory(_classes(produce=2)).start()
    relay.client.sendall(_produce_request(9, 0, None, None))
    reason, flights, *_ = relay.join()
    assert reason == native_relay.PYTHON_REQUEST and flights == []


def test_a_wake_stops_at_the_boundaries_and_a_second_aborts(relay_factory):
    relay = relay_factory(_classes(heartbeat=1), idle_ms=-1).start()
    relay.client.sendall(_request(HEARTBEAT, 4, 1))
    _read_exactly(relay.broker, len(_request(HEARTBEAT, 4, 1)))
    os.eventfd_write(relay.wake, 1)
    reason, flights, *_ = relay.join()
    assert reason == native_relay.WOKEN and [f[2] for f in flights] == [1]
    # mid-response, a stop waits for the frame's end; an abort does not
    relay.start(flights)
    response = _response(1, b"x" * 100)
    relay.broker.sendall(response[:20])
    os.eventfd_write(relay.wake, 2)
    assert relay.join()[0] == native_relay.ABORTED


def test_the_client_closing_ends_the_run_for_the_event_loop(relay_factory):
    relay = relay_factory(_classes(heartbeat=1)).start()
    relay.client.shutdown(socket.SHUT_WR)
    assert relay.join()[0] == native_relay.PYTHON_REQUEST


def test_the_broker_closing_inside_a_response_breaks_the_run(relay_factory):
    relay = relay_factory(_classes(heartbeat=1)).start()
    relay.client.sendall(_request(HEARTBEAT, 4, 1))
    _read_exactly(relay.broker, len(_request(HEARTBEAT, 4, 1)))
    relay.broker.sendall(_response(1, b"x" * 100)[:50])
    relay.broker.shutdown(socket.SHUT_WR)
    reason, *_, message = relay.join()
    assert reason == native_relay.BROKEN and "inside a response" in message


def test_an_oversized_request_is_left_to_the_event_loop(relay_factory):
    relay = relay_factory(_classes(heartbeat=1), max_frame=1000).start()
    relay.client.sendall(_request(HEARTBEAT, 4, 1, b"x" * 2000))
    assert relay.join()[0] == native_relay.PYTHON_REQUEST


def test_in_flight_requests_are_capped(relay_factory):
    relay = relay_factory(_classes(heartbeat=1), max_inflight=2, idle_ms=-1).start()
    requests = [_request(HEARTBEAT, 4, i) for i in range(4)]
    relay.client.sendall(b"".join(requests))
    assert _read_exactly(relay.broker, 2 * len(requests[0])) == requests[0] + requests[1]
    relay.broker.settimeout(0.3)
    with pytest.raises(TimeoutError):  # the third waits for an answer
        relay.broker.recv(100)
    relay.broker.sendall(_response(0))
    assert _read_exactly(relay.broker, len(requests[2])) == requests[2]
    os.eventfd_write(relay.wake, 1)
    reason, flights, answered, *_ = relay.join()
    assert reason == native_relay.WOKEN and [f[2] for f in flights] == [1, 2] and len(answered) == 1


# -- request headers that declare too many tagged fields ----------------------------------------
FLEXIBLE = NATIVE_FLEXIBLE_HEADER


def _header_tags(count: int) -> bytes:
    """A header's tagged-field section declaring ``count`` fields, their bytes there."""
    return uvarint_bytes(count) + b"".join(uvarint_bytes(tag) + b"\x00" for tag in range(count))


def _flexible_request(api_key: int, version: int, correlation_id: int, tags: bytes, client_id: bytes = b"c",
                      body: bytes = b"\x00") -> bytes:
    frame = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id + tags + body
    return struct.pack(">i", len(frame)) + frame


def test_the_table_flags_flexible_headers_from_the_schemas():
    from fuzz.surface import production_chain

    assert NATIVE_FLEXIBLE_HEADER == _cpump.CLASS_FLEXIBLE_HEADER and NATIVE_GUARDED == _cpump.CLASS_GUARDED
    for chain in (FeatureChain([]), production_chain()):
        table = chain.native_classes()
        assert any(entry & FLEXIBLE for entry in table) and any(entry and not entry & FLEXIBLE for entry in table)
        for index, entry in enumerate(table):
            api_key, version = divmod(index, NATIVE_VERSIONS)
            cls = entry & ~FLEXIBLE & ~NATIVE_GUARDED
            assert cls in (0, _cpump.CLASS_OPAQUE, _cpump.CLASS_PRODUCE)
            if cls == 0:
                assert entry == 0, (api_key, version)
            else:
                assert bool(entry & FLEXIBLE) == messages.request_header_flexible(api_key, version), (api_key, version)
                # only Produce is guarded, and only where virtual topics are on
                assert bool(entry & NATIVE_GUARDED) == (api_key == 0 and chain.native_guard is not None)


@pytest.mark.parametrize("count", [0, 1, MAX_TAGGED_FIELDS - 1, MAX_TAGGED_FIELDS, MAX_TAGGED_FIELDS + 1, 5_000_000])
def test_a_flexible_header_over_the_limit_is_left_to_the_event_loop(count):
    tags = uvarint_bytes(count) + b"\x00" * 4  # the count is all the loop reads of them
    frame = _flexible_request(HEARTBEAT, 4, 1, tags)
    within = count <= MAX_TAGGED_FIELDS
    assert _cpump.classify(frame, _classes(heartbeat=1 | FLEXIBLE), 1 << 20) == (1 if within else 0)
    assert _cpump.classify(frame, _classes(heartbeat=1), 1 << 20) == 1  # a v1 header: no tags to read
    if not within:  # and the event loop refuses it
        with pytest.raises(ProtocolError, match="exceeds the limit"):
            check_request_header_tags(frame[4:], True)
    # a Produce's acks come after the header's tagged fields: those the loop steps over
    if count <= 1 or not within:
        tags = _header_tags(count) if within else tags
        produce = _flexible_request(0, 9, 1, tags, body=b"\x00" + struct.pack(">hi", -1, 1000) + b"\x01\x00")
        assert _cpump.classify(produce, _classes(produce=2 | FLEXIBLE), 1 << 20) == (2 if within else 0)


def test_a_flexible_header_whose_count_is_past_the_peek_is_left_to_the_event_loop():
    frame = _flexible_request(HEARTBEAT, 4, 1, b"\x00", client_id=b"c" * 1100)
    assert _cpump.classify(frame, _classes(heartbeat=1 | FLEXIBLE), 1 << 20) == 0
    assert _cpump.classify(frame, _classes(heartbeat=1), 1 << 20) == 1
    assert check_request_header_tags(frame[4:1024], True) is None  # neither can tell from the first KiB
    for count_bytes in (b"\x80\x00", b"\xff\xff\xff\xff\x7f"):  # what the codecs call malformed
        frame = _flexible_request(HEARTBEAT, 4, 1, count_bytes)
        assert _cpump.classify(frame, _classes(heartbeat=1 | FLEXIBLE), 1 << 20) == 0


def test_the_loop_stops_at_a_header_over_the_limit_and_leaves_it_in_the_socket(relay_factory):
    relay = relay_factory(_classes(heartbeat=1 | FLEXIBLE)).start()
    carried = _flexible_request(HEARTBEAT, 4, 1, _header_tags(MAX_TAGGED_FIELDS))
    refused = _flexible_request(HEARTBEAT, 4, 2, uvarint_bytes(MAX_TAGGED_FIELDS + 1))
    relay.client.sendall(carried + refused)
    assert _read_exactly(relay.broker, len(carried)) == carried
    reason, flights, _, _, forwarded, *_ = relay.join()
    assert reason == native_relay.PYTHON_REQUEST and forwarded == 1
    assert [(f[0], f[2], f[3]) for f in flights] == [(HEARTBEAT, 1, 1)]  # its class without the flag
    relay.client_near.setblocking(True)
    assert _read_exactly(relay.client_near, len(refused)) == refused  # for the event loop, which refuses it


# -- Produce naming a virtual topic, with virtual topics on ------------------------------------
GUARD = guard_blob([b".kr", b".coop"], [uuid.UUID(int=7).bytes, uuid.UUID(int=3).bytes])


def _produce_to(version: int, topics: list[str | uuid.UUID], *, records: bytes = b"x" * 10, acks: int = -1) -> bytes:
    """A Produce request naming ``topics`` (names before v13, ids from it), two partitions each."""
    c = messages.body_class(ApiKey.PRODUCE, "request")
    data = [c.PartitionProduceData(index=i, records=records) for i in range(2)]
    topic_data = [c.TopicProduceData(topic_id=t, partition_data=data) if isinstance(t, uuid.UUID)
                  else c.TopicProduceData(name=t, partition_data=data) for t in topics]
    header = messages.new_request_header(ApiKey.PRODUCE, version, 7, "producer-1")
    body = messages.new_body(ApiKey.PRODUCE, version, "request", transactional_id="tx" if version >= 3 else None,
                             acks=acks, timeout_ms=30000, topic_data=topic_data)
    frame = messages.encode_request(header, body)
    return struct.pack(">i", len(frame)) + frame


def _guarded(version: int) -> bytes:
    flexible = FLEXIBLE if messages.request_header_flexible(ApiKey.PRODUCE, version) else 0
    return _classes(produce=_cpump.CLASS_PRODUCE | NATIVE_GUARDED | flexible)


@pytest.mark.parametrize("version", range(3, 13))
@pytest.mark.parametrize(("topics", "carried"), [
    (["orders"], True), (["orders.kr4"], False), (["orders.coop2"], False), (["orders.kr0", "a.kr"], True),
    (["orders.kr"], True), (["a", "b", "c"], True), (["a", "b.kr12"], False), (["kr4.x.kr9z"], False), ([], True)])
def test_a_guarded_produce_is_carried_when_no_name_may_be_virtual(version, topics, carried):
    frame = _produce_to(version, topics)
    expected = _cpump.CLASS_PRODUCE if carried else 0
    assert _cpump.classify(frame, _guarded(version), 1 << 20, GUARD) == expected
    # the Python pre-check says yes to every request the loop leaves to the event loop
    from proxy.virtual.precheck import Precheck

    assert Precheck((".kr", ".coop")).may_name_virtual(frame) or carried
    # without a guard, a guarded request naming a topic is never carried
    assert _cpump.classify(frame, _guarded(version), 1 << 20) == (expected if not topics else 0)
    assert _cpump.classify(frame, _guarded(version), 1 << 20, b"") == (expected if not topics else 0)


@pytest.mark.parametrize(("topics", "carried"), [
    ([uuid.UUID(int=5)], True), ([uuid.UUID(int=7)], False), ([uuid.UUID(int=3)], False),
    ([uuid.UUID(int=1), uuid.UUID(int=2)], True), ([uuid.UUID(int=1), uuid.UUID(int=3)], False)])
def test_a_guarded_produce_by_topic_id_is_carried_unless_the_id_was_handed_out_for_a_virtual_topic(topics, carried):
    frame = _produce_to(13, topics)
    assert _cpump.classify(frame, _guarded(13), 1 << 20, GUARD) == (_cpump.CLASS_PRODUCE if carried else 0)


@pytest.mark.parametrize("version", [8, 11, 13])
def test_a_produce_whose_names_are_not_all_in_the_peek_is_left_to_the_event_loop(version):
    topics: list = [uuid.UUID(int=1), uuid.UUID(int=2)] if version >= 13 else ["orders", "payments"]
    large = _produce_to(version, topics, records=b"x" * 2000)  # the second name is past the first KiB
    assert _cpump.classify(large, _guarded(version), 1 << 20, GUARD) == 0
    one = _produce_to(version, topics[:1], records=b"x" * 2000)  # one topic: its name is all there is to read
    assert _cpump.classify(one, _guarded(version), 1 << 20, GUARD) == _cpump.CLASS_PRODUCE
    name_end = one.index(topics[0].bytes if version >= 13 else b"orders") + (16 if version >= 13 else 6)
    for cut in range(12, name_end + 8):  # carried once the name is there, the rest spliced as it comes
        expected = _cpump.CLASS_PRODUCE if cut >= name_end else 0
        assert _cpump.classify(one[:cut], _guarded(version), 1 << 20, GUARD) == expected, cut


def test_the_loop_carries_clean_produces_and_stops_at_one_naming_a_virtual_topic(relay_factory):
    relay = relay_factory(_guarded(11), guard=GUARD).start()
    carried = _produce_to(11, ["orders"])
    refused = _produce_to(11, ["orders.kr4"])
    relay.client.sendall(carried + refused)
    assert _read_exactly(relay.broker, len(carried)) == carried
    reason, flights, _, _, forwarded, *_ = relay.join()
    assert reason == native_relay.PYTHON_REQUEST and forwarded == 1 and [f[2] for f in flights] == [7]
    relay.client_near.setblocking(True)
    assert _read_exactly(relay.client_near, len(refused)) == refused  # for the event loop, which refuses it


def test_the_guard_lists_suffixes_then_sorted_ids():
    assert guard_blob([b".kr"], [b"\x02" * 16, b"\x01" * 16]) == b"\x01\x03.kr" + b"\x01" * 16 + b"\x02" * 16
    with pytest.raises(ValueError):
        guard_blob([b""], [])
    with pytest.raises(ValueError):
        guard_blob([b".kr"], [b"short"])


def test_produce_is_guarded_only_while_every_stage_reading_it_declares_the_guard():
    from fuzz.surface import production_chain
    from proxy.pipeline import Feature

    async def stage(ctx, request):
        return None

    class Guarded(Feature):
        def request_stages(self):
            return {ApiKey.PRODUCE: stage}

        def native_guards(self):
            return {ApiKey.PRODUCE: lambda: GUARD}

    class Reading(Feature):
        def request_stages(self):
            return {ApiKey.PRODUCE: stage}

    produce = [entry for index, entry in enumerate(production_chain().native_classes())
               if index // NATIVE_VERSIONS == 0 and entry]
    assert production_chain().native_guard is not None and produce and all(e & NATIVE_GUARDED for e in produce)
    assert FeatureChain([Guarded()]).native_guard is not None
    for chain in (FeatureChain([Guarded(), Reading()]), FeatureChain([Reading()]), FeatureChain([])):
        assert chain.native_guard is None
        assert not any(entry & NATIVE_GUARDED for entry in chain.native_classes())
    assert not any(FeatureChain([Reading()]).native_classes()[:NATIVE_VERSIONS])  # Produce: the event loop's
