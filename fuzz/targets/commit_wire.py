"""OffsetCommit v8+ read and rewritten from slices (``proxy/commits/wire.py``).

Individual commit never builds message objects for a range commit: ``parse_request``
reads the client's frame, ``forward_frame`` assembles the broker's request from its
slices, ``parse_response`` and ``rewrite_response`` do the same for the answer. The
request reader promises ``ProtocolError`` for bad bytes; the response reader returns None
for anything it does not handle (the caller then uses the codec). Both are meant to read
exactly what the schema codec reads, so where the codec accepts a frame they must too,
with the same values, and the rewrites must equal what the codec would encode.

Input: a mode byte (bit 0: request or response; the next bits pick the response version
and which partitions get an error or a stable offset), then the frame.
"""

from __future__ import annotations

from typing import Any

from fuzz.common import Choices, InvariantBroken, check_not_internal
from proxy.commits.state import check_packed
from proxy.commits.wire import forward_frame, parse_request, parse_response, rewrite_response
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.errors import ProtocolError
from proxy.protocol.values import strip_extensions

FIRST_VERSION = 8
VERSIONS = 3  # 8..10
MAX_RANGES = 1000  # max.individual.commit.ranges' default


def _codec_request(frame: bytes) -> Any:
    try:
        header, body = messages.decode_request(frame)
    except ProtocolError as exc:
        check_not_internal(exc)
        return None
    if header.request_api_key != ApiKey.OFFSET_COMMIT or header.request_api_version < FIRST_VERSION:
        return None
    return header, body


def _request(frame: bytes, control: int) -> None:
    decoded = _codec_request(frame)
    try:
        request = parse_request(frame)
    except ProtocolError:
        if decoded is not None:
            raise InvariantBroken("parse_request refused an OffsetCommit the codec decodes") from None
        return
    for topic in request.topics:
        for part in topic.partitions:
            if part.packed:  # as individual commit checks each partition's ranges
                check_packed(part.committed_offset, part.packed, MAX_RANGES)
    # Drop every other partition when asked, and give every partition a new offset.
    dropped = bool(control & 2)
    offsets = {(number, part.index): part.index * 7 for number, topic in enumerate(request.topics)
               for part in topic.partitions}
    forwarded = forward_frame(request, lambda number, part: not dropped or part.index % 2 == 0, offsets)
    if decoded is None:
        return
    header, body = decoded
    theirs = [(topic.name if request.version < 10 else topic.topic_id,
               [(p.partition_index, p.committed_offset,
                 None if p.offset_ranges is None else [(r.start, r.end) for r in p.offset_ranges])
                for p in topic.partitions]) for topic in body.topics]
    ours = [(topic.name if request.version < 10 else topic.topic_id,
             [(p.index, p.committed_offset, p.ranges) for p in topic.partitions]) for topic in request.topics]
    if ours != theirs or (request.group, request.generation, request.member, request.instance_id) != \
            (body.group_id, body.generation_id_or_member_epoch, body.member_id, body.group_instance_id):
        raise InvariantBroken("parse_request reads other values than the codec")
    if any(len({p.index for p in t.partitions}) != len(t.partitions) for t in request.topics):
        return  # an offset by (topic, index) then applies to each duplicate
    kept = []
    for number, topic in enumerate(body.topics):
        parts = [p for p in topic.partitions if not dropped or p.partition_index % 2 == 0]
        for p in parts:
            p.committed_offset = offsets[(number, p.partition_index)]
        if parts:
            topic.partitions = parts
            kept.append(topic)
    body.topics = kept
    strip_extensions(body)
    if forwarded != messages.encode_request(header, body):
        raise InvariantBroken("forward_frame differs from the codec's encoding of the same request")


def _response(frame: bytes, version: int, control: int) -> None:
    parsed = parse_response(frame, version)
    try:
        header, body = messages.decode_response(ApiKey.OFFSET_COMMIT, version, frame)
    except ProtocolError as exc:
        check_not_internal(exc)
        body = None
    if parsed is None:
        return
    if body is None:
        names = [topic.name or "" for topic in parsed.topics]
        rewrite_response(parsed, names, {}, {})
        return
    names = [topic.name or str(topic.topic_id) for topic in parsed.topics]
    if [[(p.index, p.error_code) for p in t.partitions] for t in parsed.topics] != \
            [[(p.partition_index, p.error_code) for p in t.partitions] for t in body.topics]:
        raise InvariantBroken("parse_response reads other values than the codec")
    if len(set(names)) != len(names):
        return
    keys = [(name, part.partition_index) for name, topic in zip(names, body.topics) for part in topic.partitions]
    if len(set(keys)) != len(keys):
        return  # duplicate partitions: answers go by (topic, partition), so one applies to each
    errors: dict[tuple[str, int], int] = {}
    stable: dict[tuple[str, int], int] = {}
    for name, topic in zip(names, body.topics):
        for number, part in enumerate(topic.partitions):
            key = (name, part.partition_index)
            if (control >> (3 + number % 4)) & 1:
                errors[key] = part.partition_index % 120
                part.error_code = errors[key]
            if (control >> (4 + number % 3)) & 1:
                stable[key] = part.partition_index * 11
                part.stable_offset = stable[key]
    rewritten = rewrite_response(parsed, names, errors, stable)
    if rewritten != messages.encode_response(ApiKey.OFFSET_COMMIT, version, header, body):
        raise InvariantBroken("rewrite_response differs from the codec's encoding of the same answer")


def one_input(data: bytes) -> None:
    choices = Choices(data)
    control = choices.byte()
    frame = choices.rest()
    if control & 1 == 0:
        _request(frame, control)
    else:
        _response(frame, FIRST_VERSION + (control >> 1) % VERSIONS, control)
