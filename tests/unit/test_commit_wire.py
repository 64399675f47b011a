"""The OffsetCommit reader/rewriter of individual commit against the schema codec."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings, strategies as st

from proxy.commits.wire import forward_frame, parse_request
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
