"""Where Kafka places a consumer group: its ``__consumer_offsets`` partition, without I/O.

The group coordinator of group G is the leader of partition
``Utils.abs(G.hashCode()) % offsets.topic.num.partitions`` of ``__consumer_offsets``, so
that partition holds G's offsets, its transactional offset commits and, beside them, the
individual-commit log's records of G. Both the commit log (``proxy.commits``) and the
shadow groups of virtual topics (``proxy.virtual.shadows``) need this arithmetic, and it is
a fact of the Kafka protocol rather than of either feature, hence this layer.
"""

from __future__ import annotations

__all__ = ["group_partition", "java_string_hash"]


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: over UTF-16 code units, 32-bit signed arithmetic."""
    value = 0
    data = text.encode("utf-16-be", "surrogatepass")
    for index in range(0, len(data), 2):
        value = (31 * value + ((data[index] << 8) | data[index + 1])) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def group_partition(group: str, partitions: int) -> int:
    """``Utils.abs(group.hashCode()) % partitions``; Utils.abs(Integer.MIN_VALUE) is 0."""
    value = java_string_hash(group)
    value = 0 if value == -(1 << 31) else abs(value)
    return value % partitions
