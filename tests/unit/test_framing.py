"""Sans-IO framing: frames split at any chunking, hostile sizes refused before buffering."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.protocol.errors import ProtocolError
from proxy.protocol.framing import FrameSplitter, frame_bytes, peek_correlation_id, peek_request_header
from proxy.protocol.peek import produce_acks


def _request(api_key, version, correlation_id, client_id, rest=b""):
    cid = b"\xff\xff" if client_id is None else struct.pack(">h", len(client_id)) + client_id.encode()
    return struct.pack(">hhi", api_key, version, correlation_id) + cid + rest


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=8), st.integers(1, 50))
def test_frames_survive_any_chunking(bodies, chunk):
    stream = b"".join(frame_bytes(body) for body in bodies)
    splitter = FrameSplitter(max_frame_bytes=1024)
    out = []
    for start in range(0, len(stream), chunk):
        splitter.feed(stream[start : start + chunk])
        out.extend(splitter.frames())
    assert out == bodies
    assert splitter.buffered == 0


def test_oversized_frame_refused_from_its_size_alone():
    splitter = FrameSplitter(max_frame_bytes=1024)
    splitter.feed(struct.pack(">i", 2**31 - 1))
    with pytest.raises(ProtocolError, match="exceeds the 1024-byte limit"):
        splitter.next_frame()


def test_negative_frame_size_refused():
    splitter = FrameSplitter()
    splitter.feed(struct.pack(">i", -5))
    with pytest.raises(ProtocolError, match="negative frame size"):
        splitter.next_frame()


def test_peek_request_header():
    peek = peek_request_header(_request(18, 3, 77, "my-client", b"rest"))
    assert (peek.api_key, peek.api_version, peek.correlation_id, peek.client_id) == (18, 3, 77, "my-client")
    assert peek.header_end_v1 == 8 + 2 + len("my-client")
    assert peek_request_header(_request(3, 12, 1, None)).client_id is None


@pytest.mark.parametrize("frame", [b"", b"\x00\x12\x00", _request(1, 1, 1, "abc")[:-1], b"\x00\x01\x00\x01\x00\x00\x00\x01\xff\x00"])
def test_peek_request_header_bad_bytes_raise_protocol_error(frame):
    with pytest.raises(ProtocolError):
        peek_request_header(frame)


def test_peek_correlation_id():
    assert peek_correlation_id(struct.pack(">i", 1234) + b"x") == 1234
    with pytest.raises(ProtocolError):
        peek_correlation_id(b"\x00\x01")


def test_produce_acks_flexible_and_not():
    # v9+ (flexible): header tagged fields, compact nullable transactional id, acks
    flexible = _request(0, 9, 5, "c", b"\x00" + b"\x00" + struct.pack(">h", 0) + b"rest")
    assert produce_acks(flexible, peek_request_header(flexible)) == 0
    with_txn = _request(0, 11, 5, "c", b"\x00" + b"\x04txn" + struct.pack(">h", -1))
    assert produce_acks(with_txn, peek_request_header(with_txn)) == -1
    legacy = _request(0, 8, 5, "c", struct.pack(">h", 3) + b"txn" + struct.pack(">h", 1))
    assert produce_acks(legacy, peek_request_header(legacy)) == 1
    truncated = _request(0, 8, 5, "c", struct.pack(">h", 3) + b"txn")
    with pytest.raises(ProtocolError, match="acks"):
        produce_acks(truncated, peek_request_header(truncated))
