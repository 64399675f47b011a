"""The limits on declared counts (``constants.MAX_ARRAY_ELEMENTS``, ``MAX_TAGGED_FIELDS``).

Kafka up to 4.3.1 allocates per declared array element and tagged field before it has
authenticated a request; Kafka 4.4.0's readers refuse an array of more than 1,000,000
elements and a tagged-field section of more than 10,000 fields. Every reader of the proxy
refuses the same counts, so no broker behind it sees one. For each family of readers: a
message declaring one element or field over the limit is refused from its first few bytes,
without allocating by the declaration; one declaring exactly the limit passes the count
check (with a short body its element reads then fail on the missing bytes, with every byte
there it decodes).
"""

from __future__ import annotations

import struct
import tracemalloc
import uuid

import pytest

from proxy.client.records import TopicPartition, parse_partition
from proxy.commits.codec import decode_value
from proxy.commits.wire import parse_request, parse_response
from proxy.features.addresses import _tagged_fields
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.compiler import compile_message
from proxy.protocol.constants import MAX_ARRAY_ELEMENTS, MAX_TAGGED_FIELDS
from proxy.protocol.errors import ProtocolError
from proxy.protocol.framing import check_request_header_tags, peek_request_header
from proxy.protocol.peek import fetch_response_tail, has_tag, produce_acks
from proxy.protocol.primitives import uvarint_bytes
from proxy.protocol.schema import registry
from proxy.records.batch import iter_records
from proxy.records.builder import build_batch
from proxy.records.varint import encode_varint
from proxy.virtual.precheck import fetch_topic_ids

OVER_ARRAY = MAX_ARRAY_ELEMENTS + 1
OVER_TAGS = MAX_TAGGED_FIELDS + 1
ARRAY_LIMIT = f"exceeds the limit of {MAX_ARRAY_ELEMENTS}"
TAG_LIMIT = f"exceeds the limit of {MAX_TAGGED_FIELDS}"
MODES = ("compiled", "interpreted")
SMALL = 1 << 20  # what a refusal may allocate at most: a declared count must not size anything


def test_the_limits_are_kafkas():
    assert (MAX_ARRAY_ELEMENTS, MAX_TAGGED_FIELDS) == (1_000_000, 10_000)


def _refused(call, reason: str) -> ProtocolError:
    """``call()`` raises ProtocolError naming ``reason``, having allocated almost nothing
    (measured the second time: the first may compile the codec)."""
    with pytest.raises(ProtocolError):
        call()
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError) as info:
            call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reason in info.value.reason, info.value
    assert peak < SMALL, f"{peak} bytes allocated to refuse it"
    return info.value


def _short(call) -> None:
    """``call()`` passes the count check, then fails on the bytes that follow (not there,
    or not what the next field needs)."""
    with pytest.raises(ProtocolError) as info:
        call()
    assert "exceeds the limit" not in info.value.reason, info.value


def _tags(count: int, first_tag: int = 0) -> bytes:
    """A tagged-field section of ``count`` empty fields with ascending tags, every byte there."""
    return uvarint_bytes(count) + b"".join(uvarint_bytes(first_tag + i) + b"\x00" for i in range(count))


def _header(api_key: int, version: int, tags: bytes | None = b"\x00", client_id: bytes = b"client") -> bytes:
    head = struct.pack(">hhih", api_key, version, 7, len(client_id)) + client_id
    return head if tags is None else head + tags


# -- the schema codecs: arrays ---------------------------------------------------------------------

def _metadata_v12(topics: int) -> bytes:
    """A Metadata v12 body declaring ``topics`` topics (compact array), and 3 bytes more."""
    return uvarint_bytes(topics + 1) + b"\x00\x00\x00"


def _list_offsets_v1(topics: int) -> bytes:
    """A ListOffsets v1 body (int32 array count) declaring ``topics`` topics."""
    return struct.pack(">ii", -1, topics) + b"\x00" * 8


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("name", "body"), [("MetadataRequest", _metadata_v12), ("ListOffsetsRequest", _list_offsets_v1)])
def test_an_array_over_the_limit_is_refused_from_its_count(mode, name, body):
    version = 12 if name == "MetadataRequest" else 1
    codec = compile_message("ours", name, version, mode)
    for declared in (OVER_ARRAY, 2_000_000, 2**31 - 2):
        error = _refused(lambda declared=declared: codec.decode(body(declared)),
                         f"array of {declared} elements {ARRAY_LIMIT}")
        assert error.offset == (0 if name == "MetadataRequest" else 4)
    # exactly the limit passes the count check; the bytes of its elements are missing
    _refused(lambda: codec.decode(body(MAX_ARRAY_ELEMENTS)), f"array of {MAX_ARRAY_ELEMENTS} elements cannot fit")


def test_a_metadata_request_of_two_million_topics_is_refused_whole():
    frame = _header(ApiKey.METADATA, 12) + _metadata_v12(2_000_000)
    _refused(lambda: messages.decode_request(frame), f"array of 2000000 elements {ARRAY_LIMIT}")
    frame = _header(ApiKey.LIST_OFFSETS, 1, tags=None) + _list_offsets_v1(2_000_000)
    _refused(lambda: messages.decode_request(frame), f"array of 2000000 elements {ARRAY_LIMIT}")


@pytest.mark.parametrize("mode", MODES)
def test_an_array_of_exactly_the_limit_decodes_and_one_more_is_refused(mode):
    """ElectLeaders v2: a topic's Partitions is a compact int32 array, every byte there."""
    codec = compile_message("ours", "ElectLeadersRequest", 2, mode)
    request = messages.body_class(ApiKey.ELECT_LEADERS, "request")
    body = messages.new_body(ApiKey.ELECT_LEADERS, 2, "request", election_type=0, timeout_ms=100, topic_partitions=[
        request.TopicPartitions(topic="orders", partitions=list(range(MAX_ARRAY_ELEMENTS)))])
    data = codec.encode(body)
    assert len(codec.decode(data).topic_partitions[0].partitions) == MAX_ARRAY_ELEMENTS
    body.topic_partitions[0].partitions.append(7)
    data = codec.encode(body)
    with pytest.raises(ProtocolError, match=f"array of {OVER_ARRAY} elements {ARRAY_LIMIT}"):
        codec.decode(data)


# -- the schema codecs: tagged fields --------------------------------------------------------------

def _api_versions_v3(tags: bytes) -> bytes:
    """An ApiVersions v3 body (two compact strings) ending with ``tags``."""
    return b"\x02a\x02b" + tags


@pytest.mark.parametrize("mode", MODES)
def test_a_tagged_section_over_the_limit_is_refused_from_its_count(mode):
    codec = compile_message("ours", "ApiVersionsRequest", 3, mode)
    for declared in (OVER_TAGS, 5_000_000, 2**32 - 1):
        _refused(lambda declared=declared: codec.decode(_api_versions_v3(uvarint_bytes(declared) + b"\x00\x00")),
                 f"tagged-field section of {declared} fields {TAG_LIMIT}")
    _refused(lambda: codec.decode(_api_versions_v3(uvarint_bytes(MAX_TAGGED_FIELDS) + b"\x00\x00")),
             f"{MAX_TAGGED_FIELDS} tagged fields cannot fit")


@pytest.mark.parametrize("mode", MODES)
def test_a_tagged_section_of_exactly_the_limit_decodes_and_one_more_is_refused(mode):
    codec = compile_message("ours", "ApiVersionsRequest", 3, mode)
    body = codec.decode(_api_versions_v3(_tags(MAX_TAGGED_FIELDS)))
    assert len(body._unknown_tagged) == MAX_TAGGED_FIELDS
    with pytest.raises(ProtocolError, match=TAG_LIMIT):
        codec.decode(_api_versions_v3(_tags(OVER_TAGS)))


@pytest.mark.parametrize("mode", MODES)
def test_a_nested_tagged_section_is_held_to_the_limit_too(mode):
    """Metadata v12: one topic (id, null name), whose own tagged fields are over the limit."""
    codec = compile_message("ours", "MetadataRequest", 12, mode)
    topic = uuid.uuid4().bytes + b"\x00"
    ok = codec.decode(b"\x02" + topic + _tags(MAX_TAGGED_FIELDS) + b"\x00\x00\x00")
    assert len(ok.topics[0]._unknown_tagged) == MAX_TAGGED_FIELDS
    _refused(lambda: codec.decode(b"\x02" + topic + uvarint_bytes(OVER_TAGS) + b"\x00" * 8), TAG_LIMIT)


# -- the request header ----------------------------------------------------------------------------

def test_api_versions_whose_header_declares_five_million_tagged_fields_is_refused():
    frame = _header(ApiKey.API_VERSIONS, 3, tags=uvarint_bytes(5_000_000)) + _api_versions_v3(b"\x00")
    flexible = messages.request_header_flexible(ApiKey.API_VERSIONS, 3)
    assert flexible
    error = _refused(lambda: check_request_header_tags(frame, flexible), f"5000000 fields {TAG_LIMIT}")
    assert (error.api_key, error.version, error.offset) == (ApiKey.API_VERSIONS, 3, 16)
    _refused(lambda: messages.decode_request(frame), f"5000000 fields {TAG_LIMIT}")


def test_the_header_check_takes_exactly_the_limit_and_refuses_one_more():
    at_limit = _header(ApiKey.API_VERSIONS, 3, tags=_tags(MAX_TAGGED_FIELDS)) + _api_versions_v3(b"\x00")
    assert check_request_header_tags(at_limit, True) == MAX_TAGGED_FIELDS
    header, _ = messages.decode_request(at_limit)
    assert len(header._unknown_tagged) == MAX_TAGGED_FIELDS
    over = _header(ApiKey.API_VERSIONS, 3, tags=_tags(OVER_TAGS)) + _api_versions_v3(b"\x00")
    for check in (lambda: check_request_header_tags(over, True), lambda: messages.decode_request(over)):
        with pytest.raises(ProtocolError, match=TAG_LIMIT):
            check()


def test_the_header_check_reads_only_the_count():
    frame = _header(ApiKey.HEARTBEAT, 4, tags=uvarint_bytes(3) + b"\x01") + b"\x00"  # its fields are not there
    assert check_request_header_tags(frame, True) == 3
    assert check_request_header_tags(_header(ApiKey.HEARTBEAT, 4, client_id=b""), True) == 0
    null_client_id = struct.pack(">hhih", ApiKey.HEARTBEAT, 4, 7, -1) + uvarint_bytes(OVER_TAGS)
    with pytest.raises(ProtocolError, match=TAG_LIMIT):
        check_request_header_tags(null_client_id, True)


def test_a_header_v1_has_no_tagged_fields_whatever_follows():
    frame = _header(ApiKey.API_VERSIONS, 2, tags=uvarint_bytes(5_000_000))  # body bytes, to a v1 header
    assert not messages.request_header_flexible(ApiKey.API_VERSIONS, 2)
    assert check_request_header_tags(frame, False) == 0


@pytest.mark.parametrize(("tail", "reason"), [
    (b"\x80\x00", "redundant zero"),
    (b"\xff\xff\xff\xff\x7f", "longer than 32 bits"),
])
def test_a_malformed_header_count_is_refused_as_the_codecs_refuse_it(tail, reason):
    frame = _header(ApiKey.METADATA, 12, tags=tail) + _metadata_v12(0)
    with pytest.raises(ProtocolError, match=reason):
        check_request_header_tags(frame, True)
    with pytest.raises(ProtocolError, match=reason):
        messages.decode_request(frame)


def test_a_header_cut_before_its_count_cannot_be_told():
    whole = _header(ApiKey.METADATA, 12, tags=uvarint_bytes(OVER_TAGS))
    for cut in range(len(whole)):  # the count is the last 2 bytes
        assert check_request_header_tags(whole[:cut], True) is None
    with pytest.raises(ProtocolError, match="negative client id length"):
        check_request_header_tags(struct.pack(">hhih", 3, 12, 7, -2) + b"\x00", True)


def test_the_flexible_header_lookup_follows_the_schemas():
    """Every request our schemas define, at every version up to Kafka's int16 limit of
    interest, and keys they lack: delegation tokens (flexible from v2), a key added after
    KIP-482 (flexible from v0), the inter-broker ones."""
    for (api_key, kind), message in registry().by_api.items():
        if kind != "request":
            continue
        for version in range(0, 40):
            assert messages.request_header_flexible(api_key, version) == message.is_flexible(version), (api_key, version)
            if version in message.valid_versions:
                assert messages.request_header_version(api_key, version) == (
                    2 if messages.request_header_flexible(api_key, version) else 1)
    assert [messages.request_header_flexible(38, v) for v in range(4)] == [False, False, True, True]
    assert [messages.request_header_flexible(7, v) for v in range(4)] == [False, False, False, True]
    assert messages.request_header_flexible(69, 0) and messages.request_header_flexible(120, 0)
    assert not messages.request_header_flexible(-1, 3)
    assert not messages.request_header_flexible(ApiKey.SASL_HANDSHAKE, 1)


# -- the hand-written peeks and walks ----------------------------------------------------------------

def _fetch_response_v12(tail: bytes, header_tags: bytes = b"\x00") -> bytes:
    """A Fetch v12 response frame: correlation id, header tags, throttle, error, session."""
    return struct.pack(">i", 7) + header_tags + struct.pack(">ihi", 0, 0, 0) + tail


def test_the_fetch_response_walk_holds_arrays_and_tags_to_the_limits():
    _refused(lambda: fetch_response_tail(_fetch_response_v12(uvarint_bytes(OVER_ARRAY + 1) + b"\x00"), 12),
             f"array of {OVER_ARRAY} elements {ARRAY_LIMIT}")
    _refused(lambda: fetch_response_tail(_fetch_response_v12(b"\x01\x00", uvarint_bytes(OVER_TAGS)), 12), TAG_LIMIT)
    one_topic = b"\x02\x02t"  # one topic named "t"
    _refused(lambda: fetch_response_tail(_fetch_response_v12(one_topic + uvarint_bytes(OVER_ARRAY + 1)), 12),
             ARRAY_LIMIT)
    partition = struct.pack(">ihqqq", 0, 0, 1, 1, 0)
    aborted = one_topic + b"\x02" + partition + uvarint_bytes(OVER_ARRAY + 1)
    _refused(lambda: fetch_response_tail(_fetch_response_v12(aborted), 12), ARRAY_LIMIT)
    # exactly the limit: the walk goes on, and finds the frame too short
    _short(lambda: fetch_response_tail(_fetch_response_v12(uvarint_bytes(MAX_ARRAY_ELEMENTS + 1)), 12))
    _short(lambda: fetch_response_tail(_fetch_response_v12(b"\x01\x00", uvarint_bytes(MAX_TAGGED_FIELDS)), 12))
    frame = _fetch_response_v12(b"\x01" + uvarint_bytes(OVER_TAGS))
    _refused(lambda: has_tag(frame, len(frame) - 2, 0), TAG_LIMIT)


def _produce_v9(header_tags: bytes) -> bytes:
    return _header(ApiKey.PRODUCE, 9, tags=header_tags) + b"\x00" + struct.pack(">hi", -1, 1000) + b"\x01\x00"


def test_produce_acks_are_not_read_past_a_header_over_the_limit():
    frame = _produce_v9(uvarint_bytes(OVER_TAGS))
    _refused(lambda: produce_acks(frame, peek_request_header(frame)), TAG_LIMIT)
    frame = _produce_v9(_tags(MAX_TAGGED_FIELDS))
    assert produce_acks(frame, peek_request_header(frame)) == -1


def _offset_commit_v9(topics: bytes) -> bytes:
    """An OffsetCommit v9 frame: group "g", generation 1, member "m", no instance id."""
    return _header(ApiKey.OFFSET_COMMIT, 9) + b"\x02g" + struct.pack(">i", 1) + b"\x02m\x00" + topics


def _partition(tags: bytes) -> bytes:
    return struct.pack(">iqi", 0, 5, -1) + b"\x00" + tags  # index, offset, epoch, null metadata


def test_the_offset_commit_reader_holds_arrays_and_tags_to_the_limits():
    topic = b"\x02t"
    cases = {
        "topics": uvarint_bytes(OVER_ARRAY + 1),
        "partitions": b"\x02" + topic + uvarint_bytes(OVER_ARRAY + 1),
        "partition tags": b"\x02" + topic + b"\x02" + _partition(uvarint_bytes(OVER_TAGS)),
        "ranges": b"\x02" + topic + b"\x02" + _partition(b"\x01" + uvarint_bytes(10000) + b"\x03"
                                                         + uvarint_bytes(OVER_ARRAY + 1)),
        "range tags": b"\x02" + topic + b"\x02" + _partition(b"\x01" + uvarint_bytes(10000) + b"\x14\x02"
                                                             + struct.pack(">qq", 1, 2) + uvarint_bytes(OVER_TAGS)),
        "header tags": None,
    }
    for what, topics in cases.items():
        if topics is None:
            frame = _header(ApiKey.OFFSET_COMMIT, 9, tags=uvarint_bytes(OVER_TAGS)) + b"\x02g"
        else:
            frame = _offset_commit_v9(topics + b"\x00" * 4)
        reason = TAG_LIMIT if "tags" in what else ARRAY_LIMIT
        _refused(lambda frame=frame: parse_request(frame), reason)
        _refused(lambda frame=frame: messages.decode_request(frame), reason)
    # exactly the limit: the reader goes on to the missing bytes
    _short(lambda: parse_request(_offset_commit_v9(uvarint_bytes(MAX_ARRAY_ELEMENTS + 1) + b"\x00" * 4)))


def test_an_offset_commit_response_over_the_limit_is_left_to_the_codec():
    frame = struct.pack(">i", 7) + b"\x00" + struct.pack(">i", 0) + uvarint_bytes(OVER_ARRAY + 1) + b"\x00"
    assert parse_response(frame, 9) is None
    _refused(lambda: messages.decode_response(ApiKey.OFFSET_COMMIT, 9, frame), ARRAY_LIMIT)


def test_a_commit_log_value_over_the_limit_is_refused():
    value = struct.pack(">hq", 0, 5) + uvarint_bytes(OVER_ARRAY + 1) + b"\x00"  # v0, its Ranges array
    _refused(lambda: decode_value(value), ARRAY_LIMIT)


def test_fetch_topic_ids_leave_counts_over_the_limit_to_the_decoder():
    body = struct.pack(">iiiibii", -1, 500, 1, 1024, 0, 0, -1)  # replica id ... session epoch (v13)
    over_topics = _header(ApiKey.FETCH, 13) + body + uvarint_bytes(OVER_ARRAY + 1) + b"\x00" * 8
    over_tags = _header(ApiKey.FETCH, 13, tags=uvarint_bytes(OVER_TAGS)) + body + b"\x01\x01\x01\x00"
    for frame in (over_topics, over_tags):
        assert fetch_topic_ids(frame, 13) is None
        _refused(lambda frame=frame: messages.decode_request(frame), "exceeds the limit")
    assert fetch_topic_ids(_header(ApiKey.FETCH, 13) + body + b"\x01\x01\x01\x00", 13) == []


def test_the_leader_hint_rewrite_reads_tags_within_the_limit():
    _refused(lambda: _tagged_fields(uvarint_bytes(OVER_TAGS) + b"\x00\x00"), TAG_LIMIT)
    assert len(_tagged_fields(_tags(MAX_TAGGED_FIELDS))) == MAX_TAGGED_FIELDS


# -- record headers ---------------------------------------------------------------------------------

def _record(header_count: int, headers: bytes = b"") -> bytes:
    body = b"\x00" + encode_varint(0) + encode_varint(0) + encode_varint(-1) + encode_varint(-1)
    body += encode_varint(header_count) + headers
    return encode_varint(len(body)) + body


def test_a_record_header_array_over_the_limit_is_refused():
    _refused(lambda: list(iter_records(_record(OVER_ARRAY), base_offset=0, base_timestamp=0)),
             f"record header array of {OVER_ARRAY} elements {ARRAY_LIMIT}")
    _refused(lambda: list(iter_records(_record(MAX_ARRAY_ELEMENTS), base_offset=0, base_timestamp=0)),
             "runs past the end")
    headers = encode_varint(1) + b"k" + encode_varint(-1)
    records = list(iter_records(_record(1, headers), base_offset=0, base_timestamp=0))
    assert [(bytes(h.key), h.value) for h in records[0].headers] == [(b"k", None)]


def test_the_consumer_refuses_a_record_header_array_over_the_limit():
    batch = build_batch(base_offset=0, last_offset_delta=0, records=[_record(OVER_ARRAY)], record_count=1,
                        base_timestamp=1, max_timestamp=1)
    _refused(lambda: parse_partition(TopicPartition("orders", 0), batch, 0), ARRAY_LIMIT)


# -- the C readers ------------------------------------------------------------------------------------

def test_the_c_readers_share_the_limits():
    cpump = pytest.importorskip("proxy.net._cpump")
    assert (cpump.MAX_ARRAY_ELEMENTS, cpump.MAX_TAGGED_FIELDS) == (MAX_ARRAY_ELEMENTS, MAX_TAGGED_FIELDS)
    for tags, acks in ((uvarint_bytes(OVER_TAGS), None), (uvarint_bytes(5_000_000), None), (b"\x00", -1)):
        frame = _produce_v9(tags)
        assert cpump.produce_acks(struct.pack(">i", len(frame)) + frame, 9) == acks


@pytest.mark.parametrize("where", ["topics", "partitions", "record errors", "header tags", "partition tags"])
def test_the_c_produce_response_read_hands_counts_over_the_limit_to_the_codec(where):
    cpump = pytest.importorskip("proxy.net._cpump")
    partition = struct.pack(">ihqqq", 0, 0, 5, -1, 0)
    responses = {
        "topics": b"\x00" + uvarint_bytes(OVER_ARRAY + 1),
        "partitions": b"\x00\x02\x02t" + uvarint_bytes(OVER_ARRAY + 1),
        "record errors": b"\x00\x02\x02t\x02" + partition + uvarint_bytes(OVER_ARRAY + 1),
        "header tags": uvarint_bytes(OVER_TAGS) + b"\x01",
        "partition tags": b"\x00\x02\x02t\x02" + partition + b"\x01\x00" + uvarint_bytes(OVER_TAGS),
    }
    frame = struct.pack(">i", 7) + responses[where] + b"\x00" * 8
    assert cpump.produce_response_needs_python(frame, 11) is True
    _refused(lambda: messages.decode_response(ApiKey.PRODUCE, 11, frame), "exceeds the limit")
