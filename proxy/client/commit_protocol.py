"""OffsetCommit and OffsetFetch requests and responses, sans I/O.

A commit entry is either an offset (a plain commit: every record below it is processed)
or a list of inclusive offset ranges (docs/wire-contract.md#33-offsetcommit: OffsetRanges, CommittedOffset
-1). A consumer with ``assign`` commits as a simple group (generation -1, no member id); a
member of its group (``subscribe``) passes its generation and member id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from proxy.client.errors import KafkaError
from proxy.client.records import TopicPartition
from proxy.protocol.constants import ErrorCode
from proxy.protocol.message_types import (
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)

OffsetRange = tuple[int, int]
CommitEntry = int | Sequence[OffsetRange]
NO_OFFSET = -1
NO_EPOCH = -1


@dataclass(frozen=True)
class MemberIdentity:
    """Who commits: a simple group by default."""

    generation: int = -1
    member_id: str = ""
    instance_id: str | None = None


SIMPLE_GROUP = MemberIdentity()


def offset_commit_request(version: int, group: str, entries: Mapping[TopicPartition, CommitEntry],
                          leader_epochs: Mapping[TopicPartition, int],
                          member: MemberIdentity = SIMPLE_GROUP) -> OffsetCommitRequest:
    """One OffsetCommit: an int entry commits that offset (with the partition's leader
    epoch where known), a range list commits its ranges as OffsetRanges."""
    cls = OffsetCommitRequest
    topics: dict[str, list[OffsetCommitRequest.OffsetCommitRequestPartition]] = {}
    for tp, what in entries.items():
        if isinstance(what, int):
            part = cls.OffsetCommitRequestPartition(
                partition_index=tp.partition, committed_offset=what,
                committed_leader_epoch=leader_epochs.get(tp, NO_EPOCH), committed_metadata="")
        else:
            part = cls.OffsetCommitRequestPartition(
                partition_index=tp.partition, committed_offset=NO_OFFSET, committed_leader_epoch=NO_EPOCH,
                committed_metadata="", offset_ranges=[cls.OffsetRange(start=a, end=b) for a, b in what])
        topics.setdefault(tp.topic, []).append(part)
    return cls(
        group_id=group, generation_id_or_member_epoch=member.generation,
        member_id=member.member_id, group_instance_id=member.instance_id,
        topics=[cls.OffsetCommitRequestTopic(name=name, partitions=parts) for name, parts in topics.items()])


def accepted_partitions(response: OffsetCommitResponse, entries: Mapping[TopicPartition, object]
                        ) -> dict[TopicPartition, OffsetCommitResponse.OffsetCommitResponsePartition]:
    """The response partitions of ``entries`` that the commit stored."""
    accepted = {}
    for topic in response.topics:
        for part in topic.partitions:
            tp = TopicPartition(topic.name, part.partition_index)
            if part.error_code == ErrorCode.NONE and tp in entries:
                accepted[tp] = part
    return accepted


def commit_errors(response: OffsetCommitResponse) -> dict[TopicPartition, int]:
    """The error code of each partition an OffsetCommit response refused."""
    return {TopicPartition(topic.name, part.partition_index): part.error_code
            for topic in response.topics for part in topic.partitions if part.error_code != ErrorCode.NONE}


def first_commit_error(response: OffsetCommitResponse, group: str, ignore: frozenset[int] = frozenset()) -> KafkaError | None:
    """The first partition error of an OffsetCommit response, as a typed error (codes in
    ``ignore`` left out)."""
    for topic in response.topics:
        for part in topic.partitions:
            if part.error_code != ErrorCode.NONE and part.error_code not in ignore:
                return KafkaError.for_code(part.error_code,
                                           f"OffsetCommit {topic.name}-{part.partition_index} for group {group!r}")
    return None


def offset_fetch_request(version: int, group: str, partitions: Iterable[TopicPartition]) -> OffsetFetchRequest:
    """One OffsetFetch (grouped form) of ``partitions``, asking for stable offsets only."""
    cls = OffsetFetchRequest
    topics: dict[str, list[int]] = {}
    for tp in partitions:
        topics.setdefault(tp.topic, []).append(tp.partition)
    return cls(require_stable=True, groups=[
        cls.OffsetFetchRequestGroup(group_id=group, topics=[
            cls.OffsetFetchRequestTopics(name=name, partition_indexes=indexes) for name, indexes in topics.items()])])


def committed_state(response: OffsetFetchResponse, partitions: Sequence[TopicPartition], group: str
                    ) -> dict[TopicPartition, tuple[int | None, list[OffsetRange]]]:
    """Each partition's (S, R) from an OffsetFetch response: S None where nothing is
    committed, R the CommittedRangeOffsets (empty unless the proxy holds individual
    commits). Raises the first group or partition error."""
    out: dict[TopicPartition, tuple[int | None, list[OffsetRange]]] = {tp: (None, []) for tp in partitions}
    for entry in response.groups:
        if entry.error_code != ErrorCode.NONE:
            raise KafkaError.for_code(entry.error_code, f"OffsetFetch for group {group!r}")
        for topic in entry.topics:
            for part in topic.partitions:
                if part.error_code != ErrorCode.NONE:
                    raise KafkaError.for_code(part.error_code, f"OffsetFetch {topic.name}-{part.partition_index}")
                tp = TopicPartition(topic.name, part.partition_index)
                if tp in out:
                    ranges = [(r.start, r.end) for r in part.committed_range_offsets or ()]
                    out[tp] = (part.committed_offset if part.committed_offset >= 0 else None, ranges)
    return out

