"""Streaming offsets of the ``keyrange`` source: one offset per (topic, partition, share).

The K shares of a partition read the same offsets at their own pace (each task filters its
share of every batch), so a partition's progress is K offsets, not one: share s has
processed every record of its share below ``offsets[(topic, partition, s)]``. Spark stores
these in the checkpoint as JSON; a restarted query plans its next micro-batch from exactly
those numbers. Everything here is pure, so the planning rules are unit-tested without Spark.

JSON shape (recursive dicts of primitives, as Spark's Python sources need)::

    {"orders": {"0": {"0": 120, "1": 97, "2": 130, "3": 88}, "1": {...}}}
"""

from __future__ import annotations

from collections.abc import Mapping

from proxy.spark.options import KeyRangeSourceError

Unit = tuple[str, int, int]  # topic, partition, share
TopicPartitionKey = tuple[str, int]
# A unit that first appears in a micro-batch's end (a partition added while the query
# runs) starts at the partition's log start offset, resolved by the task that reads it.
EARLIEST = -2


def units(partitions: Mapping[TopicPartitionKey, object], splits: int) -> list[Unit]:
    return [(topic, partition, share) for topic, partition in sorted(partitions) for share in range(splits)]


def spread(partition_offsets: Mapping[TopicPartitionKey, int], splits: int) -> dict[Unit, int]:
    """Every share of a partition at the partition's offset."""
    return {unit: partition_offsets[unit[:2]] for unit in units(partition_offsets, splits)}


def to_json(offsets: Mapping[Unit, int]) -> dict:
    doc: dict[str, dict[str, dict[str, int]]] = {}
    for (topic, partition, share), offset in sorted(offsets.items()):
        doc.setdefault(topic, {}).setdefault(str(partition), {})[str(share)] = int(offset)
    return doc


def from_json(doc: Mapping, splits: int) -> dict[Unit, int]:
    """Parse a checkpointed offset; a checkpoint written with another K is refused (its
    shares are other hash ranges, so no offset of it means anything for the new ones)."""
    out: dict[Unit, int] = {}
    try:
        for topic, partitions in doc.items():
            for partition, shares in partitions.items():
                if len(shares) != splits or sorted(int(s) for s in shares) != list(range(splits)):
                    raise KeyRangeSourceError(
                        f"the checkpoint holds shares {sorted(int(s) for s in shares)} for {topic}-{partition}, "
                        f"but splits.per.partition is {splits}: a query keeps its splits.per.partition for "
                        f"life (use a new checkpoint location to change it)")
                for share, offset in shares.items():
                    if isinstance(offset, bool) or not isinstance(offset, int):
                        raise KeyRangeSourceError(f"checkpoint offset of {topic}-{partition} share {share} is "
                                                  f"{offset!r}, not an integer")
                    out[(str(topic), int(partition), int(share))] = offset
    except (AttributeError, TypeError, ValueError) as exc:
        if isinstance(exc, KeyRangeSourceError):
            raise
        raise KeyRangeSourceError(f"not an offset of the keyrange source: {doc!r} ({exc})") from None
    return out


def advance(
    start: Mapping[Unit, int],
    latest: Mapping[TopicPartitionKey, int],
    splits: int,
    limit: int | None,
    earliest: Mapping[TopicPartitionKey, int] | None = None,
) -> dict[Unit, int]:
    """The end offsets of the next micro-batch.

    Without ``limit`` every share goes to its partition's latest offset. With a limit
    (``maxOffsetsPerTrigger``, counted in records as Spark's Kafka source counts them),
    the limit is shared out in proportion to what each share has left, a share's records
    being estimated as 1/K of the offsets it still has to pass; a share owed less than
    one offset still moves by one, so the query always progresses. A share never moves
    back, and never past its partition's latest offset. Partitions that are new since
    ``start`` begin at ``earliest`` (their log start).
    """
    earliest = earliest or {}
    begin: dict[Unit, int] = {}
    for tp in sorted(latest):
        for share in range(splits):
            unit = (tp[0], tp[1], share)
            if unit in start:
                begin[unit] = start[unit]
            elif tp in earliest:
                begin[unit] = earliest[tp]
    available = {unit: max(0, latest[unit[:2]] - offset) for unit, offset in begin.items()}
    total = sum(available.values())
    if limit is None or total <= limit * splits:
        return {unit: max(begin[unit], latest[unit[:2]]) for unit in begin}
    out = {}
    for unit, offset in begin.items():
        room = available[unit]
        step = room * limit * splits // total  # room / (total / K) * limit, in offsets
        if step < 1 and room > 0:
            step = 1
        out[unit] = offset + min(step, room)
    return out


def partition_minimums(offsets: Mapping[Unit, int]) -> dict[TopicPartitionKey, int]:
    """Per partition, the lowest of its shares' offsets: below it every share is done."""
    out: dict[TopicPartitionKey, int] = {}
    for (topic, partition, _share), offset in offsets.items():
        key = (topic, partition)
        out[key] = min(offset, out.get(key, offset))
    return out
