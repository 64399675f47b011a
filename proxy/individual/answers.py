"""The answers of OffsetCommit and OffsetFetch with offset ranges, without I/O: refused
partitions added to a commit's answer, and (S, R) merged into an OffsetFetch answer."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from proxy.commits.state import CommitState, rebase
from proxy.protocol.constants import ErrorCode
from proxy.protocol.message_types import OffsetCommitResponse, OffsetFetchResponse

TopicPartitionKey = tuple[str, int]
# The topics of an OffsetFetch answer: of the response itself (v1-7) or of one of its groups (v8+).
FetchedTopic = OffsetFetchResponse.OffsetFetchResponseTopic | OffsetFetchResponse.OffsetFetchResponseTopics


def add_refused(response: OffsetCommitResponse, refused: dict[TopicPartitionKey, int]) -> None:
    """Add the partitions answered without the broker (``refused``: key -> error) to an
    OffsetCommit answer."""
    if not refused:
        return
    cls = OffsetCommitResponse
    by_topic: dict[str, list[OffsetCommitResponse.OffsetCommitResponsePartition]] = {}
    for (name, partition), error in refused.items():
        by_topic.setdefault(name, []).append(cls.OffsetCommitResponsePartition(partition_index=partition,
                                                                               error_code=error))
    existing = {topic.name: topic for topic in response.topics}
    for name, parts in by_topic.items():
        if name in existing:
            existing[name].partitions.extend(parts)
        else:
            response.topics.append(cls.OffsetCommitResponseTopic(name=name, partitions=parts))


def merge_fetched(topics: Sequence[FetchedTopic], states: dict[TopicPartitionKey, CommitState],
                  name_of: Callable[[FetchedTopic], str]) -> bool:
    """Put each partition's (S, R) into an OffsetFetch answer's ``topics`` (S rebased on
    the coordinator's committed offset); whether anything changed."""
    cls = OffsetFetchResponse
    changed = False
    for topic in topics:
        name = name_of(topic)
        for part in topic.partitions:
            state = states.get((name, part.partition_index))
            if state is None or part.error_code != ErrorCode.NONE:
                continue
            merged = rebase(state, part.committed_offset) if part.committed_offset >= 0 else state
            part.committed_offset = merged.stable
            part.committed_range_offsets = [cls.OffsetRange(start=start, end=end) for start, end in merged.ranges]
            changed = True
    return changed
