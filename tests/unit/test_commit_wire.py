"""The OffsetCommit reader/rewriter of individual commit against the schema codec."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.commits.wire import forward_frame, parse_request, parse_response, rewrite_response
from proxy.protocol import messages
from proxy.protocol.errors import ProtocolError
from proxy.protocol.messages import ApiKey
from proxy.protocol.values import strip_extensions

_C = messages.body_class(ApiKey.OFFSET_COMMIT, "request")

_offsets = st.integers(0, (1 << 63) - 1)
_ranges = st.one_of(st.none(), st.lists(st.tuples(_offsets, _offsets), max_size=60))
_partition = st.tuples(st.integers(0, 1 << 20), st.integers(-1, 1 << 40), st.integers(-1, 50),
                       st.one_of(st.none(), st.text(max_size=5)), _ranges)
_topic = st.tuples(st.text(min_size=1, max_size=12), st.lists(_partition, max_size=6))


def _frame(version, group, generation, member, instance, topics, client_id="c"):
    body = messages.new_body(
        ApiKey.OFFSET_COMMIT, version, "request", group_id=group, generation_id_or_member_epoch=generation,
        member_id=member, group_instance_id=instance,
        topics=[_C.OffsetCommitRequestTopic(
            name=name if version < 10 else "", topic_id=uuid.UUID(int=hash(name) & ((1 << 128) - 1))
            if version >= 10 else uuid.UUID(int=0),
            partitions=[_C.OffsetCommitRequestPartition(
                partition_index=index, committed_offset=offset, committed_leader_epoch=epoch,
                committed_metadata=metadata,
                offset_ranges=None if ranges is None else [_C.OffsetRange(start=s, end=e) for s, e in ranges])
                for index, offset, epoch, metadata, ranges in parts])
            for name, parts in topics])
    header = messages.new_request_header(ApiKey.OFFSET_COMMIT, version, 7, client_id)
    return messages.encode_request(header, body)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([8, 9, 10]), st.text(max_size=20), st.integers(-1, 1 << 30), st.text(max_size=20),
       st.one_of(st.none(), st.text(max_size=8)), st.lists(_topic, max_size=4), st.data())
def test_reads_and_rewrites_exactly_what_the_schema_codec_does(version, group, generation, member, instance,
                                                                topics, data):
    frame = _frame(version, group, generation, member, instance, topics)
    request = parse_request(frame)
    header, body = messages.decode_request(frame)
    assert (request.version, request.correlation_id) == (version, 7)
    assert (request.group, request.generation, request.member, request.instance_id) == \
        (body.group_id, body.generation_id_or_member_epoch, body.member_id, body.group_instance_id)
    assert len(request.topics) == len(body.topics)
    for ours, theirs in zip(request.topics, body.topics):
        assert (ours.name, ours.topic_id) == ((theirs.name, None) if version < 10 else (None, theirs.topic_id))
        assert [(p.index, p.committed_offset, p.ranges) for p in ours.partitions] == \
            [(p.partition_index, p.committed_offset,
              None if p.offset_ranges is None else [(r.start, r.end) for r in p.offset_ranges])
             for p in theirs.partitions]
    # Rewrite: drop some partitions, replace some offsets, strip the extension.
    drop = data.draw(st.sets(st.tuples(st.integers(0, 3), st.integers(0, 5))))
    new = data.draw(st.dictionaries(st.tuples(st.integers(0, 3), st.integers(0, 5)), _offsets))
    offsets, kept_topics = {}, []
    for number, topic in enumerate(body.topics):
        kept = []
        for position, part in enumerate(topic.partitions):
            if (number, position) in drop:
                continue
            if (number, position) in new:
                part.committed_offset = offsets[(number, part.partition_index)] = new[(number, position)]
            kept.append(part)
        if kept:
            topic.partitions = kept
            kept_topics.append(topic)
    body.topics = kept_topics
    strip_extensions(body)
    positions = {(number, id(part)): position for number, topic in enumerate(request.topics)
                 for position, part in enumerate(topic.partitions)}
    # Duplicate partition indexes in one topic: an offset then applies to each of them.
    if any(len({p.index for p in t.partitions}) != len(t.partitions) for t in request.topics):
        return
    forwarded = forward_frame(request, lambda number, part: (number, positions[(number, id(part))]) not in drop,
                              offsets)
    assert forwarded == messages.encode_request(header, body)


def test_ranges_and_metadata_are_read_and_truncated_or_trailing_bytes_refused():
    frame = _frame(9, "g", 3, "m", None, [("t", [(0, -1, -1, None, [(1, 2), (4, 4)]), (1, 5, -1, "x", None)])])
    request = parse_request(frame)
    assert [p.ranges for p in request.topics[0].partitions] == [[(1, 2), (4, 4)], None]
    with pytest.raises(ProtocolError):
        parse_request(frame[:-3])
    with pytest.raises(ProtocolError):
        parse_request(frame + b"\x00")


_R = messages.body_class(ApiKey.OFFSET_COMMIT, "response")


def test_a_frame_ending_inside_a_topic_id_is_refused():
    topic_id = uuid.UUID(int=hash("t") & ((1 << 128) - 1)).bytes  # as _frame derives it
    frame = _frame(10, "g", 3, "m", None, [("t", [(0, 5, -1, None, None)])])
    start = frame.index(topic_id)
    for cut in range(start, start + 16):
        with pytest.raises(ProtocolError):
            parse_request(frame[:cut])
    body = messages.new_body(ApiKey.OFFSET_COMMIT, 10, "response", topics=[_R.OffsetCommitResponseTopic(
        name="", topic_id=uuid.UUID(bytes=topic_id),
        partitions=[_R.OffsetCommitResponsePartition(partition_index=0, error_code=0)])])
    response = messages.encode_response(ApiKey.OFFSET_COMMIT, 10, messages.new_response_header(1), body)
    assert parse_response(response, 10) is not None
    start = response.index(topic_id)
    for cut in range(start, start + 16):
        assert parse_response(response[:cut], 10) is None  # the caller falls back to the codec


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([8, 9, 10]), st.integers(0, 1000),
       st.lists(st.tuples(st.text(min_size=1, max_size=10), st.lists(st.tuples(st.integers(0, 1 << 20),
                                                                             st.integers(0, 120)), max_size=6)),
                max_size=4, unique_by=lambda t: t[0]),
       st.data())
def test_response_rewrite_matches_the_schema_codec(version, throttle, topics, data):
    ids = {name: uuid.UUID(int=abs(hash(name)) + 1) for name, _ in topics}
    body = messages.new_body(ApiKey.OFFSET_COMMIT, version, "response", throttle_time_ms=throttle, topics=[
        _R.OffsetCommitResponseTopic(name=name if version < 10 else "",
                                     topic_id=ids[name] if version >= 10 else uuid.UUID(int=0),
                                     partitions=[_R.OffsetCommitResponsePartition(partition_index=i, error_code=e)
                                                 for i, e in parts])
        for name, parts in topics])
    frame = messages.encode_response(ApiKey.OFFSET_COMMIT, version, messages.new_response_header(11), body)
    parsed = parse_response(frame, version)
    assert parsed is not None
    assert [[(p.index, p.error_code) for p in t.partitions] for t in parsed.topics] == [parts for _, parts in topics]
    keys = [(name, i) for name, parts in topics for i, _ in parts]
    errors = data.draw(st.dictionaries(st.sampled_from(keys), st.integers(0, 120))) if keys else {}
    stable = data.draw(st.dictionaries(st.sampled_from(keys), _offsets)) if keys else {}
    for (name, _), topic in zip(topics, body.topics):
        for part in topic.partitions:
            key = (name, part.partition_index)
            if key in errors:
                part.error_code = errors[key]
            if key in stable:
                part.stable_offset = stable[key]
    expected = messages.encode_response(ApiKey.OFFSET_COMMIT, version, messages.new_response_header(11), body)
    assert rewrite_response(parsed, [name for name, _ in topics], errors, stable) == expected


def test_a_response_with_partition_tagged_fields_is_left_to_the_codec():
    body = messages.new_body(ApiKey.OFFSET_COMMIT, 9, "response", topics=[_R.OffsetCommitResponseTopic(
        name="t", partitions=[_R.OffsetCommitResponsePartition(partition_index=0, error_code=0, stable_offset=5)])])
    frame = messages.encode_response(ApiKey.OFFSET_COMMIT, 9, messages.new_response_header(1), body)
    assert parse_response(frame, 9) is None
    assert parse_response(frame[:-2], 9) is None


def test_a_range_with_its_own_tagged_fields_is_read_on_the_slow_path():
    import struct

    frame = _frame(9, "g", 3, "m", None, [("t", [(0, -1, -1, None, [(1, 2), (4, 4)])])])
    element = lambda s, e: struct.pack(">qq", s, e)  # noqa: E731
    plain = b"\x90\x4e" + bytes([1 + 2 * 17]) + b"\x03" + element(1, 2) + b"\x00" + element(4, 4) + b"\x00"
    assert plain in frame
    tagged = b"\x90\x4e" + bytes([1 + 2 * 17 + 3]) + b"\x03" + element(1, 2) + b"\x01\x05\x01\x07" + element(4, 4) \
        + b"\x00"
    request = parse_request(frame.replace(plain, tagged))
    assert request.topics[0].partitions[0].ranges == [(1, 2), (4, 4)]
