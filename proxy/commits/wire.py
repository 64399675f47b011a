"""OffsetCommit requests v8+ (flexible) read and rewritten in place, without message objects.

A range commit of 100 partitions with 50 ranges each carries 5,000 ``OffsetRange``
structs; building an object per range dominated the proxy's CPU per commit. This module
reads only what individual commit needs (group, generation, member, per partition its
index, committed offset and ``OffsetRanges``) and records where each partition's bytes
lie, so the standard request forwarded to the broker is assembled from slices of the
client's frame: refused partitions left out, ``CommittedOffset`` replaced by S', the tag
10000 field dropped, every other byte (header, unknown tagged fields) kept as sent.
``tests/unit/test_commit_wire.py`` checks both directions against the schema codec.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass

from proxy.commits.packed import RANGE_SIZE, pack, unpack
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import EXTENSION_TAG
from proxy.protocol.errors import ProtocolError
from proxy.protocol.message_versions import OFFSET_COMMIT_FIRST_FLEXIBLE, OFFSET_COMMIT_FIRST_TOPIC_ID
from proxy.protocol.primitives import (
    check_array_count,
    check_tag_count,
    read_compact_nullable_string,
    read_compact_string,
    read_uvarint,
    uvarint_bytes,
)
from proxy.protocol.tagged import skip_tagged_fields
from proxy.protocol.walks import Walk

# What this module reads and writes, from the first flexible version (8) on; tagged fields
# are stepped over by their lengths, except OffsetRanges and StableOffset (tag 10000).
_FIRST, _BY_ID = OFFSET_COMMIT_FIRST_FLEXIBLE, OFFSET_COMMIT_FIRST_TOPIC_ID
REQUEST = Walk("OffsetCommitRequest", "", _FIRST, None, (
    "GroupId compact string", "GenerationIdOrMemberEpoch int32", "MemberId compact string",
    "GroupInstanceId compact nullable string", "Topics compact []OffsetCommitRequestTopic"))
REQUEST_TOPIC_BY_NAME = Walk("OffsetCommitRequest", "Topics", _FIRST, _BY_ID - 1, (
    "Name compact string", "Partitions compact []OffsetCommitRequestPartition"))
REQUEST_TOPIC_BY_ID = Walk("OffsetCommitRequest", "Topics", _BY_ID, None, (
    "TopicId uuid", "Partitions compact []OffsetCommitRequestPartition"))
REQUEST_PARTITION = Walk("OffsetCommitRequest", "Topics.Partitions", _FIRST, None, (
    "PartitionIndex int32", "CommittedOffset int64", "CommittedLeaderEpoch int32",
    "CommittedMetadata compact nullable string"))
REQUEST_RANGE = Walk("OffsetCommitRequest", "Topics.Partitions.OffsetRanges", _FIRST, None, ("Start int64", "End int64"))
RESPONSE = Walk("OffsetCommitResponse", "", _FIRST, None, (
    "ThrottleTimeMs int32", "Topics compact []OffsetCommitResponseTopic"))
RESPONSE_TOPIC_BY_NAME = Walk("OffsetCommitResponse", "Topics", _FIRST, _BY_ID - 1, (
    "Name compact string", "Partitions compact []OffsetCommitResponsePartition"))
RESPONSE_TOPIC_BY_ID = Walk("OffsetCommitResponse", "Topics", _BY_ID, None, (
    "TopicId uuid", "Partitions compact []OffsetCommitResponsePartition"))
RESPONSE_PARTITION = Walk("OffsetCommitResponse", "Topics.Partitions", _FIRST, None, (
    "PartitionIndex int32", "ErrorCode int16"))
WALKS = (REQUEST, REQUEST_TOPIC_BY_NAME, REQUEST_TOPIC_BY_ID, REQUEST_PARTITION, REQUEST_RANGE, RESPONSE,
         RESPONSE_TOPIC_BY_NAME, RESPONSE_TOPIC_BY_ID, RESPONSE_PARTITION)

_HEAD = struct.Struct(">hhi")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_PARTITION_FIXED = struct.Struct(">iqi")  # PartitionIndex, CommittedOffset, CommittedLeaderEpoch
assert _PARTITION_FIXED.size == REQUEST_PARTITION.size("PartitionIndex", "CommittedOffset", "CommittedLeaderEpoch")
assert RANGE_SIZE == REQUEST_RANGE.size() + 1  # a packed range is an OffsetRange with no tagged fields


@dataclass(slots=True)
class CommitPartition:
    index: int
    committed_offset: int
    packed: bytes | None  # the OffsetRanges packed (proxy.commits.packed); None: absent or null
    start: int  # first byte of the partition
    offset_at: int  # where CommittedOffset lies
    tags_at: int  # the partition's tagged-field section
    end: int  # one past its last byte
    other_tags: list[tuple[int, int]]  # (start, end) of each tagged field other than 10000

    @property
    def ranges(self) -> list[tuple[int, int]] | None:
        return None if self.packed is None else unpack(self.packed)


@dataclass(slots=True)
class CommitTopic:
    name: str | None  # v8-v9
    topic_id: uuid.UUID | None  # v10+
    head: tuple[int, int]  # the bytes before the partition array (name or id)
    partitions: list[CommitPartition]
    tail: tuple[int, int]  # the topic's tagged-field section


@dataclass(slots=True)
class CommitRequest:
    version: int
    correlation_id: int
    group: str
    generation: int
    member: str
    instance_id: str | None
    topics: list[CommitTopic]
    frame: bytes | bytearray
    body_head: int  # end of the header and fixed body fields: where the topic array starts
    body_tail: int  # the body's tagged-field section


def _fail(reason: str, pos: int) -> None:
    raise ProtocolError(f"OffsetCommit: {reason}", api_key=ApiKey.OFFSET_COMMIT, offset=pos)


def _read_ranges(buf, pos: int, end: int) -> bytes | None:
    """An OffsetRanges array, packed. Clients send ranges without tagged fields: then the
    array's elements are the packed layout already, taken as one slice."""
    count_at = pos
    length, pos = read_uvarint(buf, pos, end)
    if length == 0:
        return None
    count = length - 1
    check_array_count(count, count_at)
    if end - pos == count * RANGE_SIZE and buf[pos + 16:end:RANGE_SIZE].tobytes().count(0) == count:
        return buf[pos:end].tobytes()
    ranges = []
    for _ in range(count):
        if end - pos < 17:
            _fail("truncated OffsetRange", pos)
        start, stop = struct.unpack_from(">qq", buf, pos)
        pos += 16
        tags_at = pos
        tags, pos = read_uvarint(buf, pos, end)
        check_tag_count(tags, tags_at)
        for _ in range(tags):
            _, pos = read_uvarint(buf, pos, end)
            size, pos = read_uvarint(buf, pos, end)
            pos += size
        ranges.append((start, stop))
    if pos != end:
        _fail("OffsetRanges longer than its elements", pos)
    return pack(ranges)


def _topic_head(buf, pos: int, end: int, version: int):
    """A topic entry's name (v8-9) or id (v10+): (name, topic_id, (start, end) of the
    head in the frame, position after it). A frame ending inside the id is ProtocolError,
    like every other truncation here: a slice past the end is short, not an error, and
    would reach ``uuid.UUID`` as fewer than 16 bytes."""
    start = pos
    name = topic_id = None
    if version >= OFFSET_COMMIT_FIRST_TOPIC_ID:
        if end - pos < 16:
            _fail("truncated TopicId", pos)
        topic_id = uuid.UUID(bytes=bytes(buf[pos:pos + 16]))
        pos += 16
    else:
        name, pos = read_compact_string(buf, pos, end)
    return name, topic_id, (start, pos), pos


_skip_tags = skip_tagged_fields


def parse_request(frame: bytes | bytearray) -> CommitRequest:
    """An OffsetCommit request frame, version 8 or later."""
    buf = memoryview(frame)
    end = len(buf)
    try:
        api_key, version, correlation_id = _HEAD.unpack_from(buf, 0)
        if api_key != ApiKey.OFFSET_COMMIT or version < OFFSET_COMMIT_FIRST_FLEXIBLE:
            _fail(f"api {api_key} v{version} is not OffsetCommit v8+", 0)
        (client_len,) = _INT16.unpack_from(buf, 8)
        pos = 10 + max(client_len, 0)
        pos = _skip_tags(buf, pos, end)  # header v2
        group, pos = read_compact_string(buf, pos, end)
        (generation,) = _INT32.unpack_from(buf, pos)
        member, pos = read_compact_string(buf, pos + 4, end)
        instance_id, pos = read_compact_nullable_string(buf, pos, end)
        body_head = pos
        count, pos = read_uvarint(buf, pos, end)
        if count == 0:
            _fail("null Topics", pos)
        check_array_count(count - 1, body_head)
        topics = []
        for _ in range(count - 1):
            name, topic_id, head, pos = _topic_head(buf, pos, end, version)
            parts_at = pos
            parts_count, pos = read_uvarint(buf, pos, end)
            if parts_count == 0:
                _fail("null Partitions", pos)
            check_array_count(parts_count - 1, parts_at)
            partitions = []
            for _ in range(parts_count - 1):
                start = pos
                index, committed, _epoch = _PARTITION_FIXED.unpack_from(buf, pos)
                pos += 16
                _, pos = read_compact_nullable_string(buf, pos, end)
                tags_at = pos
                tags, pos = read_uvarint(buf, pos, end)
                check_tag_count(tags, tags_at)
                ranges = None
                other = []
                for _ in range(tags):
                    tag_start = pos
                    tag, pos = read_uvarint(buf, pos, end)
                    size, pos = read_uvarint(buf, pos, end)
                    if pos + size > end:
                        _fail("truncated tagged field", pos)
                    if tag == EXTENSION_TAG:
                        ranges = _read_ranges(buf, pos, pos + size)
                    else:
                        other.append((tag_start, pos + size))
                    pos += size
                partitions.append(CommitPartition(index, committed, ranges, start, start + 4, tags_at, pos, other))
            tail_start = pos
            pos = _skip_tags(buf, pos, end)
            topics.append(CommitTopic(name, topic_id, head, partitions, (tail_start, pos)))
        body_tail = pos
        pos = _skip_tags(buf, pos, end)
        if pos != end:
            _fail(f"{end - pos} bytes after the body", pos)
    except struct.error as exc:
        raise ProtocolError(f"OffsetCommit: truncated ({exc})", api_key=ApiKey.OFFSET_COMMIT) from None
    return CommitRequest(version, correlation_id, group, generation, member, instance_id, topics, frame,
                         body_head, body_tail)


def forward_frame(request: CommitRequest, keep, offsets: dict[tuple[int, int], int]) -> bytes:
    """The standard request for the broker: the client's frame with only the partitions
    ``keep(topic_number, partition)`` accepts, ``CommittedOffset`` replaced where
    ``offsets[(topic_number, partition_index)]`` says, and every tag 10000 field dropped."""
    frame = request.frame
    out = [frame[:request.body_head]]
    topics = []
    for number, topic in enumerate(request.topics):
        kept = [part for part in topic.partitions if keep(number, part)]
        if not kept:
            continue
        pieces = [frame[topic.head[0]:topic.head[1]], uvarint_bytes(len(kept) + 1)]
        for part in kept:
            offset = offsets.get((number, part.index))
            if offset is None:
                pieces.append(frame[part.start:part.tags_at])
            else:
                pieces.append(frame[part.start:part.offset_at])
                pieces.append(_INT64.pack(offset))
                pieces.append(frame[part.offset_at + 8:part.tags_at])
            if not part.other_tags:
                pieces.append(b"\x00")  # no tagged fields left
            else:
                pieces.append(uvarint_bytes(len(part.other_tags)))
                pieces.extend(frame[a:b] for a, b in part.other_tags)
        pieces.append(frame[topic.tail[0]:topic.tail[1]])
        topics.append(b"".join(pieces))
    out.append(uvarint_bytes(len(topics) + 1))
    out.extend(topics)
    out.append(frame[request.body_tail:])
    return b"".join(out)


# -- OffsetCommit responses v8+ ---------------------------------------------------------------

_STABLE_TAG = b"\x01" + uvarint_bytes(EXTENSION_TAG) + b"\x08"  # one tagged field: 10000, 8 bytes
_PARTITION_HEAD = struct.Struct(">ih")
assert _PARTITION_HEAD.size == RESPONSE_PARTITION.size()


@dataclass(slots=True)
class ResponsePartition:
    index: int
    error_code: int
    start: int
    end: int


@dataclass(slots=True)
class ResponseTopic:
    name: str | None
    topic_id: uuid.UUID | None
    head: tuple[int, int]
    partitions: list[ResponsePartition]
    tail: tuple[int, int]


@dataclass(slots=True)
class CommitResponse:
    topics: list[ResponseTopic]
    frame: bytes
    body_head: int  # where the topic array starts
    body_tail: int  # the body's tagged-field section


def parse_response(frame: bytes, version: int) -> CommitResponse | None:
    """An OffsetCommit response v8+ as brokers send it, or None when it has anything this
    reader does not rewrite (tagged fields in a partition): the caller then uses the codec."""
    buf = memoryview(frame)
    end = len(buf)
    try:
        pos = _skip_tags(buf, 4, end)  # header v1: correlation id, tagged fields
        pos += 4  # ThrottleTimeMs
        body_head = pos
        count, pos = read_uvarint(buf, pos, end)
        if count == 0:
            return None
        check_array_count(count - 1, body_head)
        topics = []
        for _ in range(count - 1):
            name, topic_id, head, pos = _topic_head(buf, pos, end, version)
            parts_at = pos
            parts_count, pos = read_uvarint(buf, pos, end)
            if parts_count == 0:
                return None
            check_array_count(parts_count - 1, parts_at)
            partitions = []
            for _ in range(parts_count - 1):
                index, error = _PARTITION_HEAD.unpack_from(buf, pos)
                if buf[pos + 6] != 0:
                    return None
                partitions.append(ResponsePartition(index, error, pos, pos + 7))
                pos += 7
            tail_start = pos
            pos = _skip_tags(buf, pos, end)
            topics.append(ResponseTopic(name, topic_id, head, partitions, (tail_start, pos)))
        body_tail = pos
        if _skip_tags(buf, pos, end) != end:
            return None
    except (struct.error, ProtocolError, IndexError):
        return None
    return CommitResponse(topics, frame, body_head, body_tail)


def rewrite_response(response: CommitResponse, names: list[str], errors: dict[tuple[str, int], int],
                     stable: dict[tuple[str, int], int]) -> bytes:
    """The response with ``errors`` set and ``StableOffset`` (tag 10000) added, by (topic
    name, partition); ``names`` holds each topic's name in order."""
    frame = response.frame
    # Up to the first topic (or the body's tagged fields): header, throttle time, topic count.
    out = [frame[:response.topics[0].head[0] if response.topics else response.body_tail]]
    for name, topic in zip(names, response.topics):
        out.append(frame[topic.head[0]:topic.partitions[0].start] if topic.partitions
                   else frame[topic.head[0]:topic.tail[0]])
        for part in topic.partitions:
            key = (name, part.index)
            error = errors.get(key)
            offset = stable.get(key)
            if error is None and offset is None:
                out.append(frame[part.start:part.end])
                continue
            out.append(_PARTITION_HEAD.pack(part.index, part.error_code if error is None else error))
            out.append(b"\x00" if offset is None else _STABLE_TAG + _INT64.pack(offset))
        out.append(frame[topic.tail[0]:topic.tail[1]])
    out.append(frame[response.body_tail:])
    return b"".join(out)
