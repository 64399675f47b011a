"""Virtual range topics, sans-IO: names, partition mapping, ids, the no-stall answer
composition, and share watermarks."""

from __future__ import annotations

import uuid

from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import ErrorCode
from proxy.ranges import equal_shares
from proxy.records.batch import RecordBatch, iter_batches
from proxy.records.builder import build_batch, encode_record
from proxy.virtual import commits, rewrite
from proxy.virtual.fetch import compose
from proxy.virtual.names import VirtualNames, virtual_topic_id


def test_names_parse_and_bounds():
    names = VirtualNames(".kr", 64)
    vt = names.parse("orders.kr4")
    assert (vt.real, vt.shares) == ("orders", 4)
    assert names.parse("orders.kr1") is None and names.parse("orders.kr65") is None
    assert names.parse("orders.kr04") is None and names.parse(".kr4") is None and names.parse("orders") is None
    assert names.parse("a.kr2.kr8").real == "a.kr2"
    assert "64" in names.out_of_bounds("orders.kr100")


def test_partition_mapping_and_shares():
    vt = VirtualNames().parse("t.kr4")
    assert [(vt.real_partition(v), vt.share(v)) for v in (0, 3, 4, 7)] == [(0, 0), (0, 3), (1, 0), (1, 3)]
    assert vt.virtual_partition(1, 2) == 6
    assert vt.share_range(5) == equal_shares(4)[1]


def test_topic_ids_are_deterministic_and_distinct():
    real = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert virtual_topic_id(real, 4) == virtual_topic_id(uuid.UUID(str(real)), 4)
    assert len({virtual_topic_id(real, k) for k in range(2, 65)}) == 63
    assert virtual_topic_id(real, 4) != real


def _batch(base: int, offsets: list[int], last_delta: int) -> bytes:
    records = [encode_record(offset_delta=o - base, key=b"k", value=b"v") for o in offsets]
    return build_batch(base_offset=base, last_offset_delta=last_delta, records=records, record_count=len(records),
                       base_timestamp=1, max_timestamp=1)


def _entries(blob: bytes):
    return [(e.header.base_offset, e.header.last_offset, e.header.is_control, [r.offset for r in e.records()])
            for e in iter_batches(blob) if isinstance(e, RecordBatch)]


def test_compose_never_answers_only_empty_batches():
    empty = _batch(10, [], 9)
    composed = compose(empty, 10, 20, 0)
    entries = _entries(composed.records)
    assert entries == [(10, 19, True, [19])]  # one control record at the end of the read
    assert composed.next_offset == 20 and composed.records_kept == 0


def test_compose_ends_with_a_control_record_past_the_last_record():
    blob = _batch(0, [3], 9) + _batch(10, [], 9)
    composed = compose(blob, 0, 20, 0)
    entries = _entries(composed.records)
    assert entries[0] == (0, 9, False, [3])
    assert entries[1] == (4, 19, True, [19])
    assert composed.next_offset == 20 and composed.records_kept == 1


def test_compose_drops_a_batch_whose_records_are_behind_the_position():
    blob = _batch(0, [2], 9) + _batch(10, [12], 9)
    entries = _entries(compose(blob, 5, 20, 0).records)
    assert [e[3] for e in entries] == [[12], [19]]


def test_compose_at_the_end_of_the_log_adds_nothing():
    assert compose(b"", 20, None, 0).records == b""
    blob = _batch(0, [9], 9)
    composed = compose(blob, 0, 10, 0)
    assert not composed.control_added and composed.next_offset == 10


class _Resolver:
    names = VirtualNames()

    def virtual(self, name):
        return self.names.parse(name) if name != "real.kr2" else None

    def refusal(self, name):
        return self.names.out_of_bounds(name)

    def by_id(self, topic_id):
        return None

    def real_id(self, real):
        return None


def test_commit_rewrites_shares_into_the_real_partition():
    cls = messages.body_class(ApiKey.OFFSET_COMMIT, "request")
    body = messages.new_body(ApiKey.OFFSET_COMMIT, 8, "request", group_id="g", topics=[
        cls.OffsetCommitRequestTopic(name="t.kr2", partitions=[
            cls.OffsetCommitRequestPartition(partition_index=0, committed_offset=40),
            cls.OffsetCommitRequestPartition(partition_index=1, committed_offset=25),
            cls.OffsetCommitRequestPartition(partition_index=3, committed_offset=9)]),
        cls.OffsetCommitRequestTopic(name="u", partitions=[
            cls.OffsetCommitRequestPartition(partition_index=0, committed_offset=5),
            cls.OffsetCommitRequestPartition(partition_index=1, committed_offset=6,
                                             offset_ranges=[cls.OffsetRange(start=1, end=2)])])])
    plan = commits.commit_plan(body, _Resolver())
    assert plan.edits == {("t", 0): {2: {0: 40, 1: 25}}, ("t", 1): {2: {1: 9}}}
    assert plan.plain == {("u", 0): 5}
    assert plan.refused == {("u", 1): ErrorCode.INVALID_REQUEST}  # ranges beside virtual partitions
    # What the commit log service planned: S and the metadata per real partition.
    offsets = {("t", 0): (25, "m0"), ("t", 1): (-1, "m1")}
    assert commits.commit_request(body, plan, offsets, plan.refused)
    sent = {(t.name, p.partition_index): (p.committed_offset, p.committed_metadata)
            for t in body.topics for p in t.partitions}
    assert sent == {("u", 0): (5, ""), ("t", 0): (25, "m0"), ("t", 1): (-1, "m1")}
    response_cls = messages.body_class(ApiKey.OFFSET_COMMIT, "response")
    response = messages.new_body(ApiKey.OFFSET_COMMIT, 8, "response", topics=[
        response_cls.OffsetCommitResponseTopic(name="t", partitions=[
            response_cls.OffsetCommitResponsePartition(partition_index=0, error_code=0),
            response_cls.OffsetCommitResponsePartition(partition_index=1, error_code=0)]),
        response_cls.OffsetCommitResponseTopic(name="u", partitions=[
            response_cls.OffsetCommitResponsePartition(partition_index=0, error_code=0)])])
    # The log write of real partition 1 failed: its share is answered retriable.
    commits.commit_response(response, plan, {("t", 1): ErrorCode.COORDINATOR_NOT_AVAILABLE}, plan.refused)
    answered = [(t.name, [(p.partition_index, p.error_code) for p in t.partitions]) for t in response.topics]
    assert answered == [("t.kr2", [(0, 0), (1, 0), (3, ErrorCode.COORDINATOR_NOT_AVAILABLE)]),
                        ("u", [(0, 0), (1, ErrorCode.INVALID_REQUEST)])]


def test_offset_fetch_answers_each_share_its_watermark_or_s():
    req_cls = messages.body_class(ApiKey.OFFSET_FETCH, "request")
    body = messages.new_body(ApiKey.OFFSET_FETCH, 8, "request", groups=[
        req_cls.OffsetFetchRequestGroup(group_id="g", topics=[
            req_cls.OffsetFetchRequestTopics(name="t.kr2", partition_indexes=[0, 1])])])
    plan = commits.offset_fetch_request(body, 8, _Resolver())
    assert [(t.name, t.partition_indexes) for t in body.groups[0].topics] == [("t", [0])]
    cls = messages.body_class(ApiKey.OFFSET_FETCH, "response")
    response = messages.new_body(ApiKey.OFFSET_FETCH, 8, "response", groups=[
        cls.OffsetFetchResponseGroup(group_id="g", topics=[cls.OffsetFetchResponseTopics(name="t", partitions=[
            cls.OffsetFetchResponsePartitions(partition_index=0, committed_offset=20, metadata="x")])])])
    asked = []

    def marks_of(group, real, partition, committed, metadata):
        asked.append((group, real, partition, committed, metadata))
        return 20, {2: [30, -1]}

    commits.offset_fetch_response(response, 8, plan, marks_of, lambda real, k: f"{real}.kr{k}")
    assert asked == [("g", "t", 0, 20, "x")]
    parts = response.groups[0].topics[0].partitions
    assert response.groups[0].topics[0].name == "t.kr2"
    assert [(p.partition_index, p.committed_offset) for p in parts] == [(0, 30), (1, 20)]


def test_metadata_never_sends_a_virtual_name_and_expands_partitions():
    req_cls = messages.body_class(ApiKey.METADATA, "request")
    body = messages.new_body(ApiKey.METADATA, 12, "request", allow_auto_topic_creation=True,
                             topics=[req_cls.MetadataRequestTopic(name="t.kr3"),
                                     req_cls.MetadataRequestTopic(name="t.kr999")])
    plan = rewrite.metadata_request(body, 12, _Resolver())
    assert [t.name for t in body.topics] == ["t"] and body.allow_auto_topic_creation is False
    cls = messages.body_class(ApiKey.METADATA, "response")
    real_id = uuid.uuid4()
    response = messages.new_body(ApiKey.METADATA, 12, "response", topics=[cls.MetadataResponseTopic(
        error_code=0, name="t", topic_id=real_id, partitions=[
            cls.MetadataResponsePartition(partition_index=i, leader_id=i + 1) for i in range(2)])])
    rewrite.metadata_response(response, 12, plan, _Resolver())
    virtual, refused = response.topics
    assert virtual.name == "t.kr3" and virtual.topic_id == virtual_topic_id(real_id, 3)
    assert [(p.partition_index, p.leader_id) for p in virtual.partitions] == [(0, 1), (1, 1), (2, 1), (3, 2), (4, 2),
                                                                              (5, 2)]
    assert refused.name == "t.kr999" and refused.error_code == 17


def test_produce_by_topic_id_to_a_virtual_topic_is_refused_with_its_name():
    from proxy.virtual import refusals

    names = VirtualNames(".kr", 64)
    vt = names.parse("orders.kr4")
    real_id = uuid.uuid4()
    virtual_id = vt.topic_id(real_id)
    cls = messages.body_class(ApiKey.PRODUCE, "request")
    body = messages.new_body(ApiKey.PRODUCE, 13, "request", acks=-1, timeout_ms=1000, topic_data=[
        cls.TopicProduceData(name="", topic_id=virtual_id, partition_data=[cls.PartitionProduceData(index=2)])])
    by_id = {virtual_id: vt}.get
    assert refusals.refuse(ApiKey.PRODUCE, 13, body, names.parse) is None  # the id unknown: no name to refuse
    response = refusals.refuse(ApiKey.PRODUCE, 13, body, names.parse, by_id)
    [topic] = response.responses
    assert topic.topic_id == virtual_id
    [part] = topic.partition_responses
    assert part.index == 2 and part.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert "orders.kr4" in part.error_message and "orders" in part.error_message
    decoded = messages.decode_body(ApiKey.PRODUCE, 13, "response", messages.encode_body(ApiKey.PRODUCE, 13, "response",
                                                                                          response))
    assert decoded.responses[0].topic_id == virtual_id
