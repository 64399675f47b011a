"""Bad bytes: only ProtocolError ever escapes, nothing hangs or allocates by a hostile
length, and whatever decodes re-encodes to exactly the bytes it came from."""

from __future__ import annotations

import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.message_strategies import message_values
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.compiler import compile_message
from proxy.protocol.errors import ProtocolError, UnsupportedVersionError
from proxy.protocol.primitives import uvarint_bytes

# (api key, version, kind): the messages the proxy decodes on its hot paths
TARGETS = [
    (ApiKey.FETCH, 18, "request"),
    (ApiKey.FETCH, 12, "response"),
    (ApiKey.FETCH, 18, "response"),
    (ApiKey.FETCH, 4, "request"),
    (ApiKey.METADATA, 13, "response"),
    (ApiKey.METADATA, 1, "response"),
    (ApiKey.OFFSET_COMMIT, 10, "request"),
    (ApiKey.OFFSET_COMMIT, 10, "response"),
    (ApiKey.OFFSET_FETCH, 7, "response"),
    (ApiKey.OFFSET_FETCH, 10, "response"),
    (ApiKey.API_VERSIONS, 4, "response"),
    (ApiKey.API_VERSIONS, 3, "request"),
    (ApiKey.FIND_COORDINATOR, 6, "response"),
    (ApiKey.PRODUCE, 12, "response"),
    (ApiKey.SHARE_FETCH, 2, "response"),
    (ApiKey.DESCRIBE_CLUSTER, 2, "response"),
    (ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, "request"),
]


def _name(api_key: int, kind: str) -> str:
    return messages.body_class(api_key, kind).__name__


def _frame(api_key: int, version: int, kind: str, body) -> bytes:
    if kind == "request":
        header = messages.new_request_header(api_key, version, 1234, "fuzz")
        return messages.encode_request(header, body)
    return messages.encode_response(api_key, version, messages.new_response_header(1234), body)


def _decode_frame(api_key: int, version: int, kind: str, frame: bytes):
    """``(header, body, layout version)``: ApiVersions responses may fall back to v0."""
    if kind == "request":
        return (*messages.decode_request(frame), version)
    if api_key == ApiKey.API_VERSIONS:
        return messages.decode_api_versions_response(version, frame)
    return (*messages.decode_response(api_key, version, frame), version)


def _reencode(api_key: int, version: int, kind: str, header, body) -> bytes:
    if kind == "request":
        return messages.encode_request(header, body)
    return messages.encode_response(api_key, version, header, body)


def _mutations(size: int) -> st.SearchStrategy:
    index = st.integers(0, max(size - 1, 0))
    return st.one_of(
        st.tuples(st.just("flip"), index, st.integers(0, 7)),
        st.tuples(st.just("truncate"), st.integers(0, size), st.just(0)),
        st.tuples(st.just("inflate"), index, st.sampled_from([0x7FFFFFFF, -2, 0x10000, 2**31 - 2])),
        st.tuples(st.just("byte"), index, st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF])),
        st.tuples(st.just("insert"), index, st.integers(0, 255)),
        st.tuples(st.just("append"), st.just(0), st.integers(0, 255)),
    )


def _mutate(frame: bytes, mutation) -> bytes:
    kind, index, arg = mutation
    data = bytearray(frame)
    if not data and kind not in ("append", "insert", "truncate"):
        return bytes(data)
    if data:
        index %= len(data)  # an earlier mutation may have shortened the frame
    if kind == "flip":
        data[index] ^= 1 << arg
    elif kind == "truncate":
        del data[index:]
    elif kind == "inflate":
        data[index : index + 4] = struct.pack(">i", arg)
    elif kind == "byte":
        data[index] = arg
    elif kind == "insert":
        data.insert(index, arg)
    elif kind == "append":
        data.append(arg)
    return bytes(data)


@settings(
    max_examples=200,
    deadline=500,  # milliseconds per example: a hostile length must never make us loop
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(st.data())
def test_mutated_frames_raise_only_protocol_error(data):
    api_key, version, kind = data.draw(st.sampled_from(TARGETS))
    body = data.draw(message_values("ours", _name(api_key, kind), version))
    frame = _frame(api_key, version, kind, body)
    mutations = data.draw(st.lists(_mutations(len(frame)), min_size=1, max_size=3))
    for mutation in mutations:
        frame = _mutate(frame, mutation)
    try:
        header, decoded, layout = _decode_frame(api_key, version, kind, frame)
    except UnsupportedVersionError:
        return  # a flipped api key or version in a request header
    except ProtocolError as exc:
        assert not exc.reason.startswith("internal"), exc
        assert exc.offset is None or 0 <= exc.offset <= len(frame)
        return
    # strict decoding: anything accepted is canonical and re-encodes identically, except
    # that an explicit null for a tagged field whose default is null is normalized away
    again = _reencode(api_key, layout, kind, header, decoded)
    if again != frame:
        assert len(again) < len(frame)
        _, redecoded, _ = _decode_frame(api_key, layout, kind, again)
        assert redecoded == decoded
        assert _reencode(api_key, layout, kind, header, redecoded) == again


@settings(max_examples=150, deadline=500, database=None)
@given(st.binary(max_size=64), st.sampled_from(TARGETS))
def test_random_bytes_raise_only_protocol_error(blob, target):
    api_key, version, kind = target
    try:
        messages.decode_body(api_key, version, kind, blob)
    except ProtocolError as exc:
        assert not exc.reason.startswith("internal"), exc


def _fetch_v18_prefix() -> bytes:
    # max wait, min bytes, max bytes, isolation, session id, session epoch
    return struct.pack(">iiibii", 500, 1, 1024, 0, 0, -1)


@pytest.mark.parametrize(("count", "reason"), [
    (2**31 - 1, "array of 2147483647 elements exceeds the limit of 1000000"),  # over MAX_ARRAY_ELEMENTS
    (5000, "cannot fit"),  # under it, but more than the bytes left can hold
])
def test_huge_array_count_fails_fast_without_allocating(count, reason):
    # Fetch v4 topics array with a huge count and ten bytes left
    body = struct.pack(">iiiib", -1, 500, 1, 1024, 0) + struct.pack(">i", count) + b"\x00" * 10
    started = time.perf_counter()
    with pytest.raises(ProtocolError) as info:
        messages.decode_body(ApiKey.FETCH, 4, "request", body)
    assert time.perf_counter() - started < 0.05
    assert reason in info.value.reason
    assert (info.value.api_key, info.value.version, info.value.offset) == (1, 4, 17)


@pytest.mark.parametrize(("count", "reason"), [(2**32 - 2, "exceeds the limit"), (5000, "cannot fit")])
def test_huge_compact_array_count_fails_fast(count, reason):
    body = _fetch_v18_prefix() + uvarint_bytes(count + 1) + b"\x00" * 10
    with pytest.raises(ProtocolError, match=reason):
        messages.decode_body(ApiKey.FETCH, 18, "request", body)


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        (uvarint_bytes(1) + uvarint_bytes(1) + uvarint_bytes(1) + b"\x80\x00", "redundant zero"),
        (b"\x01\x01" + b"\x80\x80\x80\x80\x80\x01", "longer than 32 bits"),
        (b"\x01\x01" + uvarint_bytes(1000) + b"abc", "exceeds"),
        (b"\x01\x01\x03\xff\xfe\x00", "not valid UTF-8"),
        (b"\x01\x01\x01\x00" + b"extra", "trailing bytes"),
    ],
)
def test_hostile_fetch_request_tails(tail, reason):
    """Each tail follows a valid Fetch v18 fixed part: topics and forgotten topics
    (compact arrays), then a rack id compact string and the tagged-fields section."""
    body = _fetch_v18_prefix() + tail
    with pytest.raises(ProtocolError) as info:
        messages.decode_body(ApiKey.FETCH, 18, "request", body)
    assert info.value.api_key == 1 and info.value.version == 18
    assert info.value.offset is not None
    assert reason in info.value.reason


def test_tagged_field_rules():
    def decode(tail: bytes):
        return messages.decode_body(ApiKey.FETCH, 18, "request", _fetch_v18_prefix() + b"\x01\x01\x01" + tail)

    ok = decode(b"\x01" + uvarint_bytes(99) + b"\x02ab")
    assert ok._unknown_tagged == ((99, b"ab"),)
    with pytest.raises(ProtocolError, match="must ascend"):
        decode(b"\x02" + uvarint_bytes(99) + b"\x00" + uvarint_bytes(98) + b"\x00")
    with pytest.raises(ProtocolError, match="must ascend"):
        decode(b"\x02" + uvarint_bytes(99) + b"\x00" + uvarint_bytes(99) + b"\x00")
    with pytest.raises(ProtocolError, match="exceeds"):
        decode(b"\x01" + uvarint_bytes(99) + b"\x05ab")
    # known tag 0 (ClusterId, compact nullable string) with one byte too many
    with pytest.raises(ProtocolError, match="unread bytes"):
        decode(b"\x01\x00\x03\x02a!")
    with pytest.raises(ProtocolError, match="cannot fit"):
        decode(uvarint_bytes(1000) + b"\x00\x00")


def test_bool_and_nullable_struct_bytes_must_be_canonical():
    with pytest.raises(ProtocolError, match="neither 0 nor 1"):
        # Metadata v4 request: topics null, allow auto topic creation = 2
        messages.decode_body(ApiKey.METADATA, 4, "request", b"\xff\xff\xff\xff\x02")
    with pytest.raises(ProtocolError, match="nullable struct marker"):
        body = b"\x01" + struct.pack(">i", 10) + b"\x00" + b"\x00"
        messages.decode_body(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, "request", body)


def test_negative_lengths():
    with pytest.raises(ProtocolError, match="invalid string length -2"):
        messages.decode_body(ApiKey.METADATA, 1, "request", b"\x00\x00\x00\x01\xff\xfe")
    with pytest.raises(ProtocolError, match="invalid string length -1"):
        messages.decode_body(ApiKey.METADATA, 1, "request", b"\x00\x00\x00\x01\xff\xff")
    with pytest.raises(ProtocolError, match="invalid array length -2"):
        messages.decode_body(ApiKey.METADATA, 1, "request", b"\xff\xff\xff\xfe")


def test_unknown_api_keys_and_versions():
    frame = struct.pack(">hhih", 999, 0, 1, -1)
    with pytest.raises(UnsupportedVersionError):
        messages.decode_request(frame)
    with pytest.raises(UnsupportedVersionError):
        messages.decode_request(struct.pack(">hhih", 1, 99, 1, -1))
    with pytest.raises(ProtocolError, match="truncated"):
        messages.decode_request(b"\x00")


def test_interpreted_path_reports_the_same_errors():
    body = _fetch_v18_prefix() + b"\x01\x01\x03\xff\xfe\x00"
    compiled = compile_message("ours", "FetchRequest", 18)
    interpreted = compile_message("ours", "FetchRequest", 18, "interpreted")
    errors = []
    for codec in (compiled, interpreted):
        with pytest.raises(ProtocolError) as info:
            codec.decode(body)
        errors.append((info.value.reason, info.value.offset))
    assert errors[0] == errors[1]
