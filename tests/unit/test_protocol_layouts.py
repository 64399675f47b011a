"""The codec against byte layouts assembled by hand from the Kafka protocol spec, and
against kafka-python's independent encoder, so it is not only checked against itself."""

from __future__ import annotations

import struct
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import message_strategies
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.compiler import compile_message
from proxy.protocol.primitives import read_uvarint, uvarint_bytes


def i16(v: int) -> bytes:
    return struct.pack(">h", v)


def i32(v: int) -> bytes:
    return struct.pack(">i", v)


def i64(v: int) -> bytes:
    return struct.pack(">q", v)


def compact_str(s: str) -> bytes:
    data = s.encode()
    return uvarint_bytes(len(data) + 1) + data


def str16(s: str) -> bytes:
    data = s.encode()
    return i16(len(data)) + data


def test_api_versions_v3_request_frame():
    frame = (
        i16(18) + i16(3) + i32(7)  # api key, version, correlation id
        + str16("abc")  # client id: int16-length string even in header v2
        + b"\x00"  # header tagged fields
        + compact_str("kpy") + compact_str("1.0")  # client software name, version
        + b"\x00"  # body tagged fields
    )
    header, body = messages.decode_request(frame)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
        18, 3, 7, "abc",
    )
    assert (body.client_software_name, body.client_software_version) == ("kpy", "1.0")
    assert messages.encode_request(header, body) == frame
    built = messages.new_body(18, 3, "request", client_software_name="kpy", client_software_version="1.0")
    assert messages.encode_request(messages.new_request_header(18, 3, 7, "abc"), built) == frame


def test_api_versions_v3_response_uses_header_v0_and_carries_supported_features():
    feature = compact_str("keyrange.fetch") + i16(1) + i16(1) + b"\x00"
    features = b"\x02" + feature  # compact array of one
    frame = (
        i32(7)  # response header v0: correlation id only, no tagged fields
        + i16(0)  # error code
        + b"\x02" + i16(1) + i16(4) + i16(17) + b"\x00"  # api keys: Fetch 4..17
        + i32(0)  # throttle time
        + b"\x01" + b"\x00" + uvarint_bytes(len(features)) + features  # tag 0
    )
    header, body = messages.decode_response(ApiKey.API_VERSIONS, 3, frame)
    assert header.correlation_id == 7
    assert body.api_keys[0].max_version == 17
    assert body.supported_features[0].name == "keyrange.fetch"
    assert messages.encode_response(ApiKey.API_VERSIONS, 3, header, body) == frame


def test_metadata_v1_request_non_flexible():
    frame = i16(3) + i16(1) + i32(9) + i16(-1) + i32(1) + str16("t")
    header, body = messages.decode_request(frame)
    assert header.client_id is None
    assert [t.name for t in body.topics] == ["t"]
    assert messages.encode_request(header, body) == frame
    all_topics = i16(3) + i16(1) + i32(9) + i16(-1) + i32(-1)
    assert messages.decode_request(all_topics)[1].topics is None


def test_fetch_v4_response_records_are_zero_copy_views():
    records = b"RECORDBATCHBYTES"
    body = (
        i32(0)  # throttle time
        + i32(1) + str16("t")  # one topic
        + i32(1) + i32(0) + i16(0) + i64(100) + i64(90)  # partition 0, no error, hw, lso
        + i32(-1)  # aborted transactions: null
        + i32(len(records)) + records
    )
    frame = i32(5) + body
    _, decoded = messages.decode_response(ApiKey.FETCH, 4, frame)
    partition = decoded.responses[0].partitions[0]
    assert partition.high_watermark == 100 and partition.aborted_transactions is None
    assert isinstance(partition.records, memoryview)
    assert partition.records == records
    assert partition.records.obj is frame  # a view of the frame, not a copy


def test_nullable_struct_marker():
    null_cursor = b"\x01" + i32(10) + b"\xff" + b"\x00"
    body = messages.decode_body(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, "request", null_cursor)
    assert body.cursor is None
    cursor = b"\x01" + i32(10) + b"\x01" + compact_str("t") + i32(3) + b"\x00" + b"\x00"
    body = messages.decode_body(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, "request", cursor)
    assert (body.cursor.topic_name, body.cursor.partition_index) == ("t", 3)
    assert messages.encode_body(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, "request", body) == cursor


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, b"\x00"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (10000, b"\x90\x4e"),
        (2**32 - 1, b"\xff\xff\xff\xff\x0f"),
    ],
)
def test_unsigned_varint_layout(value, encoded):
    assert uvarint_bytes(value) == encoded
    assert read_uvarint(encoded, 0, len(encoded)) == (value, len(encoded))


def test_consumer_protocol_subscription_v0():
    data = i16(0) + i32(2) + str16("a") + str16("b") + i32(3) + b"xyz"
    value = messages.decode_data("ConsumerProtocolSubscription", data)
    assert value.topics == ["a", "b"] and value.user_data == b"xyz"
    assert messages.encode_data("ConsumerProtocolSubscription", value, version=0) == data
    assert messages.data_version(data) == 0


def test_consumer_protocol_from_a_newer_version_is_read_with_our_newest_layout():
    newest = compile_message("ours", "ConsumerProtocolAssignment", 3)
    value = newest.root_class(assigned_partitions=[], user_data=None)
    future = i16(99) + newest.encode(value) + b"future fields"
    assert messages.decode_data("ConsumerProtocolAssignment", future) == value


def test_individual_commit_key_and_value_layout():
    key = messages.new_data("IndividualCommitKey", group="g", topic="t", partition=5)
    key_bytes = messages.encode_data("IndividualCommitKey", key)
    assert key_bytes == i16(0) + str16("g") + str16("t") + i32(5)
    value = messages.new_data(
        "IndividualCommitValue",
        stable_offset=100,
        ranges=[messages.data_class("IndividualCommitValue").OffsetRange(start=102, end=110)],
    )
    value_bytes = messages.encode_data("IndividualCommitValue", value, version=0)
    assert value_bytes == i16(0) + i64(100) + b"\x02" + i64(102) + i64(110) + b"\x00" + b"\x00"
    assert messages.decode_data("IndividualCommitValue", value_bytes) == value
    # Version 1 (what the proxy writes for a state without share watermarks): R as varint
    # deltas from S, in a compact bytes field.
    compact = messages.new_data("IndividualCommitValue", stable_offset=100, range_deltas=b"\x02\x08", reset_epoch=3)
    compact_bytes = messages.encode_data("IndividualCommitValue", compact, version=1)
    assert compact_bytes == i16(1) + i64(100) + b"\x03" + b"\x02\x08" + i64(3) + b"\x00"
    assert messages.decode_data("IndividualCommitValue", compact_bytes) == compact
    assert messages.decode_data("IndividualCommitKey", key_bytes) == key


# --------------------------------------------------------------------------- kafka-python

_KAFKA_PYTHON_CASES = [
    ("kafka.protocol.metadata", "MetadataRequest"),
    ("kafka.protocol.metadata", "MetadataResponse"),
    ("kafka.protocol.metadata", "FindCoordinatorRequest"),
    ("kafka.protocol.metadata", "FindCoordinatorResponse"),
    ("kafka.protocol.metadata", "ApiVersionsRequest"),
    ("kafka.protocol.consumer", "FetchRequest"),
    ("kafka.protocol.consumer", "FetchResponse"),
    ("kafka.protocol.consumer", "OffsetCommitRequest"),
    ("kafka.protocol.consumer", "OffsetCommitResponse"),
    ("kafka.protocol.consumer", "OffsetFetchRequest"),
    ("kafka.protocol.consumer", "OffsetFetchResponse"),
    ("kafka.protocol.producer", "ProduceRequest"),
    ("kafka.protocol.producer", "ProduceResponse"),
]


@pytest.fixture(scope="module")
def no_unknown_tags():
    """kafka-python drops tagged fields it does not know, so generate none for it."""
    original = message_strategies._unknown_tags
    message_strategies._unknown_tags = lambda known: st.just(())
    message_strategies.message_values.cache_clear()
    yield
    message_strategies._unknown_tags = original
    message_strategies.message_values.cache_clear()


@pytest.mark.parametrize(("module", "name"), _KAFKA_PYTHON_CASES)
def test_kafka_python_reads_and_rewrites_our_bytes_identically(module, name, no_unknown_tags):
    import importlib

    kp_class = getattr(importlib.import_module(module), name)
    versions = sorted({_oldest(name), _newest(name)})
    for version in versions:
        _kafka_python_roundtrip(kp_class, name, version)()


def _kafka_python_roundtrip(kp_class, name: str, version: int):
    """A property test: kafka-python decodes what our codec writes and writes it back unchanged."""
    codec = compile_message("standard", name, version)

    @settings(max_examples=8, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(message_strategies.message_values("standard", name, version))
    def check(value):
        data = codec.encode(value)
        theirs = kp_class.decode(data, version=version)
        theirs._header = None
        assert bytes(theirs.encode(version=version)) == data

    return check


def _newest(name: str) -> int:
    from proxy.protocol.schema import registry

    return registry("standard").by_name[name].valid_versions.hi


def _oldest(name: str) -> int:
    from proxy.protocol.schema import registry

    return registry("standard").by_name[name].valid_versions.lo


def test_hand_built_fetch_request_matches_kafka_python():
    from kafka.protocol.consumer import FetchRequest as KpFetchRequest

    ours = messages.new_body(
        ApiKey.FETCH,
        13,
        "request",
        max_wait_ms=100,
        min_bytes=1,
        topics=[
            messages.body_class(ApiKey.FETCH, "request").FetchTopic(
                topic_id=uuid.UUID(int=5),
                partitions=[
                    messages.body_class(ApiKey.FETCH, "request").FetchPartition(
                        partition=2, fetch_offset=77, partition_max_bytes=1024
                    )
                ],
            )
        ],
    )
    data = messages.encode_body(ApiKey.FETCH, 13, "request", ours)
    theirs = KpFetchRequest.decode(data, version=13)
    assert theirs.topics[0].partitions[0].fetch_offset == 77
    assert theirs.max_wait_ms == 100
