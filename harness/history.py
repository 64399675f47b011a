"""A recorded history of one consumption run, and the checker that judges it.

Producers record every acknowledged record; consumers record every record handed out
(and, where they know it, when its processing ended). ``check`` then says what a user of a
Kafka tool cares about, in plain counts:

- lost: acknowledged and never handed out;
- duplicates: handed out more than once (re-delivery after a member's loss or a fault is
  legal at-least-once behaviour, so a caller that injected one may allow them);
- order violations: a record of a key handed out before an earlier record of the same key
  had finished its first processing (for consumers that keep per-key order);
- strays: handed out but never acknowledged (a record from another run, or corrupted);
- committed offsets behind the log end, when the caller passes both.

Events are numbered by one counter shared by every thread that records, so "before" means
the order the events were recorded in, with no clock resolution to blur it. Recording is
an append under the GIL: producer callbacks, consumer threads and trio tasks may all
record into one ``History``.
"""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

TopicPartition = tuple[str, int]
RecordId = tuple[str, int, int]  # (topic, partition, offset)


@dataclass(frozen=True, slots=True)
class Ack:
    """A record the broker acknowledged."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(slots=True)
class Delivery:
    """A record handed out to ``member``; ``started`` and ``finished`` are event numbers."""

    member: str
    topic: str
    partition: int
    offset: int
    key: bytes | None
    started: int
    finished: int | None = None

    @property
    def record(self) -> RecordId:
        return (self.topic, self.partition, self.offset)


class History:
    """Thread-safe record of acks and deliveries for one run."""

    def __init__(self) -> None:
        self.acks: list[Ack] = []
        self.deliveries: list[Delivery] = []
        self._events = itertools.count()
        self._lock = threading.Lock()

    def ack(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None) -> None:
        self.acks.append(Ack(topic, partition, offset, key, value))

    def deliver(self, member: str, topic: str, partition: int, offset: int, key: bytes | None,
                *, finished: bool = True) -> Delivery:
        """Record a record handed out to ``member``. With ``finished`` (the default) its
        processing counts as done at once; otherwise call ``finish`` when it is."""
        with self._lock:
            started = next(self._events)
            delivery = Delivery(member, topic, partition, offset,
                                None if key is None else bytes(key), started, started if finished else None)
            self.deliveries.append(delivery)
        return delivery

    def finish(self, delivery: Delivery) -> None:
        with self._lock:
            delivery.finished = next(self._events)

    def delivered_count(self) -> int:
        return len({d.record for d in self.deliveries})

    def missing(self) -> int:
        """How many acknowledged records have not been handed out yet (to wait on)."""
        delivered = {d.record for d in self.deliveries}
        return sum((a.topic, a.partition, a.offset) not in delivered for a in self.acks)


@dataclass
class Verdict:
    acknowledged: int
    delivered: int
    lost: list[Ack] = field(default_factory=list)
    duplicates: dict[RecordId, int] = field(default_factory=dict)  # record -> times handed out
    order_violations: list[tuple[bytes | None, Delivery, Delivery]] = field(default_factory=list)
    strays: list[RecordId] = field(default_factory=list)
    committed_behind: dict[TopicPartition, tuple[int, int]] = field(default_factory=dict)

    @property
    def redelivered(self) -> int:
        return sum(count - 1 for count in self.duplicates.values())

    def ok(self, *, allow_duplicates: bool = False) -> bool:
        return not (self.lost or self.order_violations or self.strays or self.committed_behind
                    or (self.duplicates and not allow_duplicates))

    def summary(self, limit: int = 5) -> str:
        """One paragraph for an assertion message: the counts, then a few examples of each fault."""
        parts = [f"{self.acknowledged} acknowledged, {self.delivered} handed out, {len(self.lost)} lost, "
                 f"{self.redelivered} re-delivered, {len(self.order_violations)} order violations, "
                 f"{len(self.strays)} never acknowledged, {len(self.committed_behind)} partitions committed "
                 f"behind the log end"]
        if self.lost:
            by_partition: dict[TopicPartition, list[int]] = defaultdict(list)
            for ack in self.lost:
                by_partition[ack.topic, ack.partition].append(ack.offset)
            parts.append("lost: " + "; ".join(f"{t}-{p} offsets {_spans(sorted(o))}"
                                              for (t, p), o in sorted(by_partition.items())))
        if self.duplicates:
            parts.append("re-delivered: " + ", ".join(f"{t}-{p}@{o} x{n}" for (t, p, o), n
                                                      in list(self.duplicates.items())[:limit]))
        for key, earlier, later in self.order_violations[:limit]:
            parts.append(f"order: key {key!r} offset {later.offset} handed to {later.member} (event "
                         f"{later.started}) before offset {earlier.offset} at {earlier.member} had finished "
                         f"(event {earlier.finished})")
        if self.strays:
            parts.append(f"never acknowledged: {self.strays[:limit]}")
        for (t, p), (committed, end) in sorted(self.committed_behind.items()):
            parts.append(f"{t}-{p} committed {committed}, log end {end}")
        return "\n".join(parts)


def check(history: History, *, keyed_order: bool = True,
          committed: Mapping[TopicPartition, int] | None = None,
          log_end: Mapping[TopicPartition, int] | None = None) -> Verdict:
    """Judge ``history``. ``keyed_order``: check per-key order (off for consumers that do
    not promise it). ``committed`` and ``log_end``: offsets per partition; every partition
    of ``log_end`` must be committed at its end."""
    acked = {(a.topic, a.partition, a.offset): a for a in history.acks}
    first: dict[RecordId, Delivery] = {}
    counts: dict[RecordId, int] = defaultdict(int)
    for delivery in history.deliveries:
        counts[delivery.record] += 1
        first.setdefault(delivery.record, delivery)
    verdict = Verdict(acknowledged=len(acked), delivered=len(first))
    verdict.lost = sorted((a for rid, a in acked.items() if rid not in first),
                          key=lambda a: (a.topic, a.partition, a.offset))
    verdict.duplicates = {rid: n for rid, n in counts.items() if n > 1}
    verdict.strays = sorted(rid for rid in first if rid not in acked)
    if keyed_order:
        verdict.order_violations = order_violations(first.values())
    if log_end is not None:
        given = committed or {}
        for tp, end in log_end.items():
            at = given.get(tp, -1)
            if at < end:
                verdict.committed_behind[tp] = (at, end)
    return verdict


def order_violations(deliveries: Iterable[Delivery]) -> list[tuple[bytes | None, Delivery, Delivery]]:
    """Pairs (key, earlier, later) of consecutive records of a key, by offset, where the later
    one was handed out before the earlier one's processing had finished. Null keys carry no
    order and are skipped. Checking consecutive pairs suffices: the relation chains."""
    by_key: dict[tuple[str, int, bytes], list[Delivery]] = defaultdict(list)
    for delivery in deliveries:
        if delivery.key is not None:
            by_key[delivery.topic, delivery.partition, delivery.key].append(delivery)
    out: list[tuple[bytes | None, Delivery, Delivery]] = []
    for (_, _, key), records in by_key.items():
        records.sort(key=lambda d: d.offset)
        for earlier, later in itertools.pairwise(records):
            done = earlier.finished if earlier.finished is not None else earlier.started
            if later.started < done:
                out.append((key, earlier, later))
    return out


def _spans(offsets: list[int], limit: int = 8) -> str:
    """'3-5, 9, 12-14' for [3, 4, 5, 9, 12, 13, 14], at most ``limit`` spans."""
    spans: list[list[int]] = []
    for offset in offsets:
        if spans and offset == spans[-1][1] + 1:
            spans[-1][1] = offset
        else:
            spans.append([offset, offset])
    text = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in spans[:limit])
    return text + (f" and {len(spans) - limit} more spans" if len(spans) > limit else "")
