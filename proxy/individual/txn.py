"""A TxnOffsetCommit with offset ranges (individual.commit version 2), without I/O: the
member's range shadow request, the client's request rewritten into the carrier, and the
client's answer from both (docs/individual-commit.md, "Offset ranges of extension clients").
"""

from __future__ import annotations

import copy

from proxy.commits.shadows import CARRIER_MARKER
from proxy.protocol.constants import ErrorCode
from proxy.protocol.message_types import TxnOffsetCommitRequest, TxnOffsetCommitResponse

TopicPartitionKey = tuple[str, int]
Asked = list[tuple[str, list[int]]]  # (topic, partitions) as the client asked


def shadow_request(body: TxnOffsetCommitRequest, shadow: str,
                   offsets: dict[TopicPartitionKey, tuple[int, str]]) -> TxnOffsetCommitRequest:
    """The range shadow's TxnOffsetCommit: the client's transaction, no member, every key
    of ``offsets`` at (S_c, the shadow's metadata)."""
    cls = TxnOffsetCommitRequest
    out = copy.copy(body)
    out.group_id, out.generation_id, out.member_id, out.group_instance_id = shadow, -1, "", None
    by_topic: dict[str, list[TxnOffsetCommitRequest.TxnOffsetCommitRequestPartition]] = {}
    for (name, partition), (stable, text) in offsets.items():
        by_topic.setdefault(name, []).append(cls.TxnOffsetCommitRequestPartition(
            partition_index=partition, committed_offset=stable, committed_leader_epoch=-1, committed_metadata=text))
    out.topics = [cls.TxnOffsetCommitRequestTopic(name=name, partitions=parts) for name, parts in by_topic.items()]
    return out


def carrier_request(body: TxnOffsetCommitRequest, offsets: dict[TopicPartitionKey, tuple[int, str]], refused: dict[TopicPartitionKey, int]) -> Asked:
    """Rewrite ``body`` into the carrier: a key of ``offsets`` at S_c with the carrier's
    marker and no ranges, ``refused`` keys left out, the others as sent. Returns what the
    client asked, for its answer."""
    asked = [(topic.name, [p.partition_index for p in topic.partitions]) for topic in body.topics]
    kept = []
    for topic in body.topics:
        parts = []
        for part in topic.partitions:
            key = (topic.name, part.partition_index)
            if key in refused:
                continue
            if key in offsets:
                part.committed_offset, part.committed_metadata = offsets[key][0], CARRIER_MARKER
                part.offset_ranges = None
            parts.append(part)
        if parts:
            topic.partitions = parts
            kept.append(topic)
    body.topics = kept
    return asked


def errors_of(response: TxnOffsetCommitResponse) -> dict[TopicPartitionKey, int]:
    return {(t.name, p.partition_index): p.error_code for t in response.topics or () for p in t.partitions}


def client_answer(asked: Asked, carrier: dict[TopicPartitionKey, int], shadowed: dict[TopicPartitionKey, int], refused: dict[TopicPartitionKey, int],
                  version: int) -> TxnOffsetCommitResponse:
    """The client's TxnOffsetCommit answer: per partition asked, ``refused`` first, then the
    carrier's error, then (range partitions) the range shadow's."""
    cls = TxnOffsetCommitResponse
    body = cls()

    def error_of(key: TopicPartitionKey) -> int:
        if key in refused:
            return refused[key]
        code = carrier.get(key, int(ErrorCode.UNKNOWN_SERVER_ERROR))
        if code == ErrorCode.NONE and key in shadowed:
            return shadowed[key]
        return code

    body.topics = [cls.TxnOffsetCommitResponseTopic(name=name, partitions=[
        cls.TxnOffsetCommitResponsePartition(partition_index=index, error_code=error_of((name, index)))
        for index in parts]) for name, parts in asked]
    return body
