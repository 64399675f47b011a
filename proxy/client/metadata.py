"""The cluster as the consumer needs it: node addresses, each assigned partition's leader
and leader epoch, and topic ids (Fetch v13+ names topics by id).

``ClusterMetadata`` is sans I/O: ``metadata_request`` builds the request and ``update``
reads the response. ``refresh_metadata`` is the one network step. ``stale`` asks for a
refresh before the next fetch; anything that learns a leader moved sets it.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from proxy.client.connection import Connections
from proxy.client.errors import METADATA_REFRESH_CODES, KafkaError
from proxy.client.records import TopicPartition
from proxy.protocol.constants import ErrorCode
from proxy.protocol.message_types import MetadataRequest, MetadataResponse
from proxy.protocol.messages import ApiKey

NO_LEADER = -1


@dataclass(frozen=True)
class PartitionLeader:
    leader: int
    leader_epoch: int


@dataclass
class TopicMeta:
    topic_id: uuid.UUID
    partitions: dict[int, PartitionLeader] = field(default_factory=dict)


class ClusterMetadata:
    """The latest Metadata answer for the assigned topics."""

    def __init__(self) -> None:
        self.nodes: dict[int, tuple[str, int]] = {}
        self.topics: dict[str, TopicMeta] = {}
        self.stale = True

    def leader(self, tp: TopicPartition) -> PartitionLeader | None:
        """The partition's leader, or None while it has none this consumer can reach."""
        topic = self.topics.get(tp.topic)
        meta = topic.partitions.get(tp.partition) if topic else None
        return meta if meta is not None and meta.leader >= 0 and meta.leader in self.nodes else None

    def knows(self, topic: str) -> bool:
        return topic in self.topics

    def topic_id(self, topic: str) -> uuid.UUID:
        return self.topics[topic].topic_id

    def topic_names(self) -> dict[uuid.UUID, str]:
        """Topic id to name, for Fetch responses that name topics by id."""
        return {meta.topic_id: name for name, meta in self.topics.items()}

    def update(self, response: MetadataResponse, assigned: Iterable[TopicPartition]) -> bool:
        """Take a Metadata response in. True while an assigned partition has no reachable
        leader yet (the caller backs off and refreshes again). Raises ``KafkaError`` for a
        topic error that cannot be retried, or a partition its topic does not have."""
        assigned = list(assigned)
        self.nodes = {b.node_id: (b.host, b.port) for b in response.brokers}
        missing = False
        for entry in response.topics:
            if entry.error_code != ErrorCode.NONE:
                if entry.error_code in METADATA_REFRESH_CODES:
                    missing = True
                    continue
                raise KafkaError.for_code(entry.error_code, f"metadata for topic {entry.name!r}")
            if entry.name is None:
                continue  # null only for a topic asked by id, which this consumer never does
            self.topics[entry.name] = TopicMeta(
                entry.topic_id,
                {p.partition_index: PartitionLeader(p.leader_id if p.error_code == ErrorCode.NONE else NO_LEADER,
                                                    p.leader_epoch)
                 for p in entry.partitions},
            )
        for tp in assigned:
            topic = self.topics.get(tp.topic)
            if topic is not None and tp.partition not in topic.partitions and not missing:
                raise KafkaError.for_code(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                          f"{tp.topic} has no partition {tp.partition}")
        missing = missing or any(self.leader(tp) is None for tp in assigned)
        self.stale = missing
        return missing


def metadata_request(version: int, topics: Iterable[str]) -> MetadataRequest:
    """Metadata of ``topics`` only, never creating one that does not exist."""
    cls = MetadataRequest
    return cls(topics=[cls.MetadataRequestTopic(name=name) for name in topics], allow_auto_topic_creation=False)


async def refresh_metadata(metadata: ClusterMetadata, connections: Connections,
                           assigned: Iterable[TopicPartition], metrics: Counter[str]) -> bool:
    """Ask any node for the assigned topics' metadata; drop connections of nodes gone. True
    while a leader is still missing."""
    assigned = list(assigned)
    topics = sorted({tp.topic for tp in assigned})
    if not topics:
        metadata.stale = False
        return False
    connection = await connections.any()
    version = connection.versions[ApiKey.METADATA]
    response: MetadataResponse = await connections.request(connection, ApiKey.METADATA, version,
                                                           metadata_request(version, topics))
    metrics["metadata_refreshes"] += 1
    metadata.nodes = {b.node_id: (b.host, b.port) for b in response.brokers}
    await connections.retain(metadata.nodes)
    return metadata.update(response, assigned)
