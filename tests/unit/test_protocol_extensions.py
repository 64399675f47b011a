"""Our tag-10000 extensions (docs/wire-contract.md#3-wire-extensions): they round-trip through our codec, a
stock Kafka decoder (the "standard" schema view) skips them as unknown tagged fields and
re-encodes them untouched, and non-flexible versions never carry them."""

from __future__ import annotations

import struct
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.message_strategies import message_values
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.compiler import compile_message
from proxy.protocol.primitives import INT64, uvarint_bytes
from proxy.protocol.schema import registry

EXTENSION_TAG = 10000

# (message, path of struct names from the root, attribute) for every extension field
EXTENSIONS = [
    ("FetchRequest", (), "key_ranges"),
    ("FetchRequest", ("topics", "partitions"), "key_ranges"),
    ("FetchResponse", ("responses", "partitions"), "key_ranges_applied"),
    ("OffsetCommitRequest", ("topics", "partitions"), "offset_ranges"),
    ("OffsetCommitResponse", ("topics", "partitions"), "stable_offset"),
    ("OffsetFetchResponse", ("topics", "partitions"), "committed_range_offsets"),
    ("OffsetFetchResponse", ("groups", "topics", "partitions"), "committed_range_offsets"),
]


def _field(message_name: str, path: tuple[str, ...], attr: str):
    fields = registry("ours").by_name[message_name].fields
    for step in path:
        fields = next(f for f in fields if f.attr == step).fields
    return next(f for f in fields if f.attr == attr)


@pytest.mark.parametrize(("message", "path", "attr"), EXTENSIONS)
def test_extension_fields_are_ours_and_tagged_only_in_flexible_versions(message, path, attr):
    field = _field(message, path, attr)
    definition = registry("ours").by_name[message]
    assert field.ours and field.tag == EXTENSION_TAG
    parent_versions = definition.valid_versions
    fields = definition.fields
    for step in path:
        parent = next(f for f in fields if f.attr == step)
        parent_versions = parent_versions.intersect(parent.versions)
        fields = parent.fields
    expected = definition.flexible_versions.intersect(parent_versions)
    assert field.tagged_versions.intersect(definition.valid_versions) == expected
    with pytest.raises(StopIteration):
        _field_standard = registry("standard").by_name[message].fields
        for step in path:
            _field_standard = next(f for f in _field_standard if f.attr == step).fields
        next(f for f in _field_standard if f.attr == attr)


def _fetch_request_with_ranges():
    F = messages.body_class(ApiKey.FETCH, "request")
    return messages.new_body(
        ApiKey.FETCH,
        18,
        "request",
        max_wait_ms=500,
        min_bytes=1,
        key_ranges=[F.KeyRange(start=0, end=2**62 - 1)],
        topics=[
            F.FetchTopic(
                topic_id=uuid.UUID(int=7),
                partitions=[
                    F.FetchPartition(
                        partition=0,
                        fetch_offset=42,
                        key_ranges=[F.KeyRange(start=10, end=20), F.KeyRange(start=30, end=40)],
                    ),
                    F.FetchPartition(partition=1, fetch_offset=43),
                ],
            )
        ],
    )


def test_fetch_key_ranges_roundtrip_and_wire_layout():
    body = _fetch_request_with_ranges()
    data = messages.encode_body(ApiKey.FETCH, 18, "request", body)
    decoded = messages.decode_body(ApiKey.FETCH, 18, "request", data)
    assert decoded == body
    assert decoded.topics[0].partitions[0].key_ranges[1].end == 40
    assert decoded.topics[0].partitions[1].key_ranges is None
    # the top-level tagged section is the last thing in the body: 1 field, tag 10000,
    # size, compact array of one KeyRange (start, end, empty tagged section)
    payload = b"\x02" + INT64.pack(0) + INT64.pack(2**62 - 1) + b"\x00"
    section = b"\x01" + uvarint_bytes(EXTENSION_TAG) + uvarint_bytes(len(payload)) + payload
    assert data.endswith(section)


def test_standard_decoder_skips_extensions_as_unknown_tags():
    body = _fetch_request_with_ranges()
    data = messages.encode_body(ApiKey.FETCH, 18, "request", body)
    standard = messages.decode_body(ApiKey.FETCH, 18, "request", data, view="standard")
    assert not hasattr(standard, "key_ranges")
    assert [tag for tag, _ in standard._unknown_tagged] == [EXTENSION_TAG]
    partition = standard.topics[0].partitions[0]
    assert [tag for tag, _ in partition._unknown_tagged] == [EXTENSION_TAG]
    assert standard.topics[0].partitions[1]._unknown_tagged == ()
    # a standard peer that re-encodes what it decoded keeps our fields byte for byte
    assert messages.encode_body(ApiKey.FETCH, 18, "request", standard, view="standard") == data
    # the standard fields agree
    assert partition.fetch_offset == 42 and standard.max_wait_ms == 500


def test_stripping_extensions_gives_the_standard_encoding():
    """What the proxy sends downstream: the same request without tag-10000 fields."""
    body = _fetch_request_with_ranges()
    body.key_ranges = None
    for topic in body.topics:
        for partition in topic.partitions:
            partition.key_ranges = None
    data = messages.encode_body(ApiKey.FETCH, 18, "request", body)
    standard = messages.decode_body(ApiKey.FETCH, 18, "request", data, view="standard")
    assert standard._unknown_tagged == ()
    assert all(p._unknown_tagged == () for p in standard.topics[0].partitions)


def test_non_flexible_versions_never_carry_extensions():
    body = _fetch_request_with_ranges()
    with_ranges = messages.encode_body(ApiKey.FETCH, 11, "request", body)
    body.key_ranges = None
    for partition in body.topics[0].partitions:
        partition.key_ranges = None
    assert messages.encode_body(ApiKey.FETCH, 11, "request", body) == with_ranges
    assert messages.decode_body(ApiKey.FETCH, 11, "request", with_ranges).key_ranges is None


def test_stable_offset_defaults_to_minus_one_and_is_sent_only_when_set():
    R = messages.body_class(ApiKey.OFFSET_COMMIT, "response")
    partition = R.OffsetCommitResponsePartition(partition_index=3, error_code=0)
    assert partition.stable_offset == -1
    body = messages.new_body(
        ApiKey.OFFSET_COMMIT,
        10,
        "response",
        topics=[R.OffsetCommitResponseTopic(topic_id=uuid.UUID(int=1), partitions=[partition])],
    )
    plain = messages.encode_body(ApiKey.OFFSET_COMMIT, 10, "response", body)
    partition.stable_offset = 1234
    extended = messages.encode_body(ApiKey.OFFSET_COMMIT, 10, "response", body)
    assert len(extended) == len(plain) + 2 + 1 + 8  # tag 10000 (2 bytes), size, int64
    decoded = messages.decode_body(ApiKey.OFFSET_COMMIT, 10, "response", extended)
    assert decoded.topics[0].partitions[0].stable_offset == 1234
    standard = messages.decode_body(ApiKey.OFFSET_COMMIT, 10, "response", extended, view="standard")
    assert standard.topics[0].partitions[0]._unknown_tagged == (
        (EXTENSION_TAG, INT64.pack(1234)),
    )


def test_offset_commit_ranges_and_offset_fetch_both_forms():
    Q = messages.body_class(ApiKey.OFFSET_COMMIT, "request")
    commit = messages.new_body(
        ApiKey.OFFSET_COMMIT,
        9,
        "request",
        group_id="g",
        topics=[
            Q.OffsetCommitRequestTopic(
                name="t",
                partitions=[
                    Q.OffsetCommitRequestPartition(
                        partition_index=0,
                        committed_offset=-1,
                        offset_ranges=[Q.OffsetRange(start=5, end=9)],
                    )
                ],
            )
        ],
    )
    data = messages.encode_body(ApiKey.OFFSET_COMMIT, 9, "request", commit)
    again = messages.decode_body(ApiKey.OFFSET_COMMIT, 9, "request", data)
    assert again.topics[0].partitions[0].offset_ranges == [Q.OffsetRange(start=5, end=9)]

    R = messages.body_class(ApiKey.OFFSET_FETCH, "response")
    topic_form = messages.new_body(
        ApiKey.OFFSET_FETCH,
        7,
        "response",
        topics=[
            R.OffsetFetchResponseTopic(
                name="t",
                partitions=[
                    R.OffsetFetchResponsePartition(
                        partition_index=0,
                        committed_offset=5,
                        committed_range_offsets=[R.OffsetRange(start=7, end=8)],
                    )
                ],
            )
        ],
    )
    grouped = messages.new_body(
        ApiKey.OFFSET_FETCH,
        10,
        "response",
        groups=[
            R.OffsetFetchResponseGroup(
                group_id="g",
                topics=[
                    R.OffsetFetchResponseTopics(
                        topic_id=uuid.UUID(int=3),
                        partitions=[
                            R.OffsetFetchResponsePartitions(
                                partition_index=0,
                                committed_offset=5,
                                committed_range_offsets=[R.OffsetRange(start=7, end=8)],
                            )
                        ],
                    )
                ],
            )
        ],
    )
    for version, body in ((7, topic_form), (10, grouped)):
        data = messages.encode_body(ApiKey.OFFSET_FETCH, version, "response", body)
        assert messages.decode_body(ApiKey.OFFSET_FETCH, version, "response", data) == body
        standard = messages.decode_body(
            ApiKey.OFFSET_FETCH, version, "response", data, view="standard"
        )
        partitions = (
            standard.topics[0].partitions
            if version == 7
            else standard.groups[0].topics[0].partitions
        )
        assert [tag for tag, _ in partitions[0]._unknown_tagged] == [EXTENSION_TAG]


def test_present_but_empty_extension_is_preserved():
    """An explicitly sent empty list differs from an absent one and survives re-encoding."""
    body = _fetch_request_with_ranges()
    body.key_ranges = []
    data = messages.encode_body(ApiKey.FETCH, 18, "request", body)
    decoded = messages.decode_body(ApiKey.FETCH, 18, "request", data)
    assert decoded.key_ranges == []
    assert messages.encode_body(ApiKey.FETCH, 18, "request", decoded) == data


@pytest.mark.parametrize(
    ("name", "version"),
    [
        ("FetchRequest", 18),
        ("FetchResponse", 18),
        ("OffsetCommitRequest", 10),
        ("OffsetCommitResponse", 10),
        ("OffsetFetchResponse", 7),
        ("OffsetFetchResponse", 10),
    ],
)
def test_random_extended_messages_reencode_identically_through_the_standard_view(name, version):
    ours = compile_message("ours", name, version)
    standard = compile_message("standard", name, version)

    @settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(message_values("ours", name, version))
    def check(value):
        data = ours.encode(value)
        assert standard.encode(standard.decode(data)) == data

    check()


@given(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1))
@settings(max_examples=30, deadline=None, database=None)
def test_key_range_extremes(start, end):
    F = messages.body_class(ApiKey.FETCH, "request")
    body = messages.new_body(ApiKey.FETCH, 13, "request", key_ranges=[F.KeyRange(start=start, end=end)])
    data = messages.encode_body(ApiKey.FETCH, 13, "request", body)
    assert messages.decode_body(ApiKey.FETCH, 13, "request", data).key_ranges[0].end == end


def test_setting_an_extension_to_none_strips_it_even_if_it_was_sent():
    body = _fetch_request_with_ranges()
    data = messages.encode_body(ApiKey.FETCH, 18, "request", body)
    decoded = messages.decode_body(ApiKey.FETCH, 18, "request", data)
    decoded.key_ranges = None
    decoded.topics[0].partitions[0].key_ranges = None
    stripped = messages.encode_body(ApiKey.FETCH, 18, "request", decoded)
    standard = messages.decode_body(ApiKey.FETCH, 18, "request", stripped, view="standard")
    assert standard._unknown_tagged == () and standard.topics[0].partitions[0]._unknown_tagged == ()


def test_strip_extensions_resets_every_extension():
    body = _fetch_request_with_ranges()
    data = messages.encode_body(ApiKey.FETCH, 18, "request", body)
    decoded = messages.decode_body(ApiKey.FETCH, 18, "request", data)
    assert messages.strip_extensions(decoded) is decoded
    assert decoded.key_ranges is None
    assert all(p.key_ranges is None for p in decoded.topics[0].partitions)
    stripped = messages.encode_body(ApiKey.FETCH, 18, "request", decoded)
    standard = messages.decode_body(ApiKey.FETCH, 18, "request", stripped, view="standard")
    assert messages.encode_body(ApiKey.FETCH, 18, "request", standard, view="standard") == stripped
    assert standard._unknown_tagged == ()
    # OffsetCommitResponse.StableOffset goes back to -1 and off the wire
    R = messages.body_class(ApiKey.OFFSET_COMMIT, "response")
    response = messages.new_body(
        ApiKey.OFFSET_COMMIT, 10, "response",
        topics=[R.OffsetCommitResponseTopic(partitions=[R.OffsetCommitResponsePartition(stable_offset=5)])],
    )
    messages.strip_extensions(response)
    assert response.topics[0].partitions[0].stable_offset == -1


def test_explicit_null_for_a_null_default_tagged_field_is_normalized():
    """The one non-identity re-encode: FetchRequest ClusterId (tag 0, default null) sent as
    an explicit null is dropped, as Java peers never send it."""
    prefix = struct.pack(">iiibii", 500, 1, 1024, 0, 0, -1) + b"\x01\x01\x01"
    explicit_null = prefix + b"\x01\x00\x01\x00"
    decoded = messages.decode_body(ApiKey.FETCH, 18, "request", explicit_null)
    assert decoded.cluster_id is None
    assert messages.encode_body(ApiKey.FETCH, 18, "request", decoded) == prefix + b"\x00"
