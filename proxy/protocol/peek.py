"""Cheap reads of single fields deep enough in a frame to route it, without a full decode."""

from __future__ import annotations

import struct

from proxy.protocol.api_keys import ApiKey
from proxy.protocol.errors import ProtocolError
from proxy.protocol.framing import RequestHeaderPeek
from proxy.protocol.message_versions import (
    FETCH_FIRST_FLEXIBLE,
    FETCH_FIRST_TOPIC_ID,
    PRODUCE_FIRST_FLEXIBLE,
    PRODUCE_FIRST_TRANSACTIONAL_ID,
)
from proxy.protocol.primitives import check_array_count, check_tag_count, read_uvarint
from proxy.protocol.tagged import read_tag_count, read_tag_header, skip_tagged_fields
from proxy.protocol.walks import Walk

__all__ = [
    "NODE_ENDPOINTS_TAG",
    "WALKS",
    "fetch_response_tail",
    "has_tag",
    "produce_acks",
    "read_uvarint",  # re-exported for callers that import it from here
    "skip_tagged_fields",
    "walk_fetch_response",
]

_INT16 = struct.Struct(">h")

# What produce_acks reads: TransactionalId, then Acks (before v3, Acks comes first).
PRODUCE_HEAD = (
    Walk("ProduceRequest", "", PRODUCE_FIRST_TRANSACTIONAL_ID, PRODUCE_FIRST_FLEXIBLE - 1,
         ("TransactionalId nullable string", "Acks int16"), prefix=True),
    Walk("ProduceRequest", "", PRODUCE_FIRST_FLEXIBLE, None,
         ("TransactionalId compact nullable string", "Acks int16"), prefix=True),
)


def produce_acks(frame, peek: RequestHeaderPeek) -> int:
    """The ``acks`` of a Produce request: acks=0 means the broker sends no response."""
    version = peek.api_version
    pos = peek.header_end_v1
    end = len(frame)
    try:
        if version >= PRODUCE_FIRST_FLEXIBLE:
            pos = skip_tagged_fields(frame, pos, end)
            length_plus_one, pos = read_uvarint(frame, pos, end)
            pos += max(length_plus_one - 1, 0)
        elif version >= PRODUCE_FIRST_TRANSACTIONAL_ID:
            (length,) = _INT16.unpack_from(frame, pos)
            pos += 2 + max(length, 0)
        if pos + 2 > end:
            raise ProtocolError("Produce request ends before acks", offset=pos)
        return _INT16.unpack_from(frame, pos)[0]
    except ProtocolError as exc:
        raise ProtocolError(exc.reason, api_key=ApiKey.PRODUCE, version=version, offset=exc.offset) from None
    except struct.error:
        raise ProtocolError("Produce request truncated", api_key=ApiKey.PRODUCE, version=version, offset=pos) from None


# -- Fetch responses -------------------------------------------------------------------------
#
# A Fetch response is almost all record bytes. The only part the proxy may rewrite is the
# top-level tagged fields at its very end (NodeEndpoints, tag 0, v16+), so instead of
# decoding the response the proxy walks its structure, stepping over record sets by their
# length, to where those tagged fields begin. The walk is a generator so that it can follow
# a frame that is still arriving: it yields ``(need, safe)`` when it needs the frame filled
# up to ``need``, where every byte before ``safe`` is known to lie before the tagged fields;
# resume it with ``send(filled)``. It returns the offset of the top-level tagged fields.
# Once it has yielded, it never reads a byte before ``min(need, safe)`` again: the relay
# may pass such bytes (a record set it steps over) from socket to socket without ever
# putting them in ``buf``.

NODE_ENDPOINTS_TAG = 0  # FetchResponse NodeEndpoints (v16+: message_versions.FETCH_FIRST_NODE_ENDPOINTS)

# What walk_fetch_response steps over (the response header v1 before it: correlation id
# and tagged fields); tagged fields, wherever they are, are skipped by their lengths.
FETCH_RESPONSE = Walk("FetchResponse", "", FETCH_FIRST_FLEXIBLE, None, (
    "ThrottleTimeMs int32", "ErrorCode int16", "SessionId int32", "Responses compact []FetchableTopicResponse"))
FETCH_RESPONSE_TOPIC_BY_NAME = Walk("FetchResponse", "Responses", FETCH_FIRST_FLEXIBLE, FETCH_FIRST_TOPIC_ID - 1, (
    "Topic compact string", "Partitions compact []PartitionData"))
FETCH_RESPONSE_TOPIC_BY_ID = Walk("FetchResponse", "Responses", FETCH_FIRST_TOPIC_ID, None, (
    "TopicId uuid", "Partitions compact []PartitionData"))
FETCH_RESPONSE_PARTITION = Walk("FetchResponse", "Responses.Partitions", FETCH_FIRST_FLEXIBLE, None, (
    "PartitionIndex int32", "ErrorCode int16", "HighWatermark int64", "LastStableOffset int64", "LogStartOffset int64",
    "AbortedTransactions compact nullable []AbortedTransaction", "PreferredReadReplica int32",
    "Records compact nullable records"))
FETCH_RESPONSE_ABORTED = Walk("FetchResponse", "Responses.Partitions.AbortedTransactions", FETCH_FIRST_FLEXIBLE, None,
                              ("ProducerId int64", "FirstOffset int64"))
WALKS = (*PRODUCE_HEAD, FETCH_RESPONSE, FETCH_RESPONSE_TOPIC_BY_NAME, FETCH_RESPONSE_TOPIC_BY_ID,
         FETCH_RESPONSE_PARTITION, FETCH_RESPONSE_ABORTED)

_HEAD_FIXED = FETCH_RESPONSE.size("ThrottleTimeMs", "ErrorCode", "SessionId")
_TOPIC_ID = FETCH_RESPONSE_TOPIC_BY_ID.size("TopicId")
_PARTITION_FIXED = FETCH_RESPONSE_PARTITION.size(
    "PartitionIndex", "ErrorCode", "HighWatermark", "LastStableOffset", "LogStartOffset")
_PREFERRED_READ_REPLICA = FETCH_RESPONSE_PARTITION.size("PreferredReadReplica")
_ABORTED_TRANSACTION_FIXED = FETCH_RESPONSE_ABORTED.size()


def _fill(state: list, size: int, need: int, safe: int):
    if need > size:
        raise ProtocolError("Fetch response ends inside a field", api_key=ApiKey.FETCH, offset=size)
    while state[0] < need:
        state[0] = yield (need, safe)


def _walk_uvarint(buf, state: list, size: int, pos: int):
    yield from _fill(state, size, min(pos + 5, size), pos)
    return read_uvarint(buf, pos, size)


def _walk_tagged_fields(buf, state: list, size: int, pos: int):
    start = pos
    count, pos = yield from _walk_uvarint(buf, state, size, pos)
    check_tag_count(count, start)
    for _ in range(count):
        _tag, pos = yield from _walk_uvarint(buf, state, size, pos)
        length, pos = yield from _walk_uvarint(buf, state, size, pos)
        pos += length
        yield from _fill(state, size, pos, pos - length)
    return pos


def _walk_array_count(buf, state: list, size: int, pos: int):
    """A compact array's element count (0 for null), refused above MAX_ARRAY_ELEMENTS."""
    start = pos
    length, pos = yield from _walk_uvarint(buf, state, size, pos)
    count = max(length - 1, 0)
    check_array_count(count, start)
    return count, pos


def walk_fetch_response(buf, size: int, version: int, filled: int):
    """Generator: the offset of the top-level tagged fields of a Fetch response frame
    (response header included) of ``size`` bytes, of which ``filled`` are in ``buf``.
    Counts above the limits (``constants.MAX_ARRAY_ELEMENTS``, ``MAX_TAGGED_FIELDS``) are
    refused as the codec refuses them."""
    if version < FETCH_FIRST_FLEXIBLE:
        raise ValueError("only flexible Fetch responses (v12+) end with tagged fields")
    state = [filled]
    pos = 4  # correlation id
    yield from _fill(state, size, pos, 0)
    pos = yield from _walk_tagged_fields(buf, state, size, pos)  # response header v1
    pos += _HEAD_FIXED  # throttle time, error code, session id
    yield from _fill(state, size, pos, pos)
    topics, pos = yield from _walk_array_count(buf, state, size, pos)
    for _ in range(topics):
        if version >= FETCH_FIRST_TOPIC_ID:
            pos += _TOPIC_ID
        else:
            length, pos = yield from _walk_uvarint(buf, state, size, pos)
            pos += max(length - 1, 0)
        yield from _fill(state, size, pos, pos)
        partitions, pos = yield from _walk_array_count(buf, state, size, pos)
        for _ in range(partitions):
            pos += _PARTITION_FIXED
            yield from _fill(state, size, pos, pos)
            aborted, pos = yield from _walk_array_count(buf, state, size, pos)
            for _ in range(aborted):
                pos += _ABORTED_TRANSACTION_FIXED
                yield from _fill(state, size, pos, pos)
                pos = yield from _walk_tagged_fields(buf, state, size, pos)
            pos += _PREFERRED_READ_REPLICA
            yield from _fill(state, size, pos, pos)
            length, pos = yield from _walk_uvarint(buf, state, size, pos)
            pos += max(length - 1, 0)  # the record set: stepped over, all of it safe
            yield from _fill(state, size, pos, pos)
            pos = yield from _walk_tagged_fields(buf, state, size, pos)
        pos = yield from _walk_tagged_fields(buf, state, size, pos)
    return pos


def fetch_response_tail(frame, version: int) -> int:
    """Offset of the top-level tagged fields of a complete Fetch response frame (v12+)."""
    walk = walk_fetch_response(frame, len(frame), version, len(frame))
    try:
        next(walk)
    except StopIteration as done:
        return done.value
    raise ProtocolError(
        "Fetch response ends inside a field", api_key=ApiKey.FETCH, version=version, offset=len(frame)
    )


def has_tag(frame, pos: int, tag: int) -> bool:
    """Whether the tagged fields at ``pos`` (which end the frame) carry ``tag``; checks that
    they end exactly at the end of the frame."""
    end = len(frame)
    count, pos = read_tag_count(frame, pos, end)
    found = False
    this_tag = -1
    for _ in range(count):
        this_tag, _, pos = read_tag_header(frame, pos, end, this_tag)
        found |= this_tag == tag
    if pos != end:
        raise ProtocolError(f"Fetch response has {end - pos} bytes after its last field", offset=pos)
    return found
