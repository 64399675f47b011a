"""The output of a transactional consume-transform-produce run, judged against the input the
broker acknowledged: exactly once means every acknowledged input record appears once in the
committed output, none missing, none twice, nothing else.

The relays (``TxnRelay`` of ``benchmarks/java/streams``, ``harness.rdkafka_txn_member``)
write one output record per input record, with the input key and the value

    <input topic>:<input partition>:<input offset> TAB <writer> TAB <input value>

where ``<writer>`` is ``<transactional id>/<pid>/<transaction>`` and the input value is
escaped as the Java programs escape fields. An input partition of a virtual range topic
``T.krK`` is named by its real partition here (virtual partition v is share v mod K of real
partition v div K, at the same offsets), as the producer's acknowledgements are.

- :func:`check_output` is pure: acknowledgements and output records in, a :class:`TxnVerdict`
  out (lost, duplicated, stray, mismatched, and output of transactions that were aborted).
- :func:`read_output` reads an output topic straight from the broker, from the start to the
  last stable offset of every partition when the read began (``read_committed``), or to the
  high watermark (``read_uncommitted``, aborted records included).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from harness.streams_app import read_to_end, real_partition, unescape

RecordId = tuple[str, int, int]  # (real topic, partition, offset)


class Acknowledged(Protocol):
    """What the checker needs of an acknowledgement (``harness.history.Ack``)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


@dataclass(frozen=True, slots=True)
class OutputRecord:
    """A record of the output topic as read from the broker."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True, slots=True)
class Relayed:
    """An output record's value taken apart: which input record it came from (its real
    partition), which transaction wrote it, and the input value it carried."""

    source: RecordId
    seen: RecordId  # the input record as the relay read it (a virtual topic's partition)
    writer: str
    input_value: str | None
    record: OutputRecord


def parse(record: OutputRecord) -> Relayed | None:
    """The input record an output record names, or None if its value is not a relay's."""
    if record.value is None:
        return None
    try:
        text = record.value.decode()
    except UnicodeDecodeError:
        return None
    parts = text.split("\t", 2)
    if len(parts) != 3:
        return None
    where, writer, value = parts
    try:
        topic, partition, offset = where.rsplit(":", 2)
        seen = (topic, int(partition), int(offset))
    except ValueError:
        return None
    return Relayed((*real_partition(topic, seen[1]), seen[2]), seen, writer, unescape(value), record)


@dataclass
class TxnVerdict:
    acknowledged: int
    output: int  # committed output records read
    lost: list[RecordId] = field(default_factory=list)  # acknowledged, not in the output
    duplicated: dict[RecordId, list[Relayed]] = field(default_factory=dict)  # in the output more than once
    stray: list[OutputRecord] = field(default_factory=list)  # not a relay's value, or an input never acknowledged
    mismatched: list[Relayed] = field(default_factory=list)  # key or value not the acknowledged input's
    from_aborted: list[Relayed] = field(default_factory=list)  # written by a transaction that aborted
    redone: int = 0  # acknowledged records of aborted transactions, found once in the output

    @property
    def delivered(self) -> int:
        """Acknowledged input records found in the output (once or more)."""
        return self.acknowledged - len(self.lost)

    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.stray or self.mismatched or self.from_aborted)

    def summary(self, limit: int = 5) -> str:
        """The counts, then a few examples of each fault: for an assertion message."""
        extra = sum(len(copies) - 1 for copies in self.duplicated.values())
        parts = [f"{self.acknowledged} input records acknowledged, {self.output} output records committed, "
                 f"{self.delivered} acknowledged records in the output, {len(self.lost)} lost, "
                 f"{len(self.duplicated)} duplicated ({extra} extra copies), {len(self.stray)} stray, "
                 f"{len(self.mismatched)} with another key or value, {len(self.from_aborted)} from aborted "
                 f"transactions; {self.redone} records of aborted transactions redone"]
        if self.lost:
            parts.append("lost: " + ", ".join(f"{t}:{p}@{o}" for t, p, o in self.lost[:limit]))
        if self.duplicated:
            parts.append("duplicated: " + "; ".join(
                f"{t}:{p}@{o} by " + ", ".join(c.writer for c in copies)
                for (t, p, o), copies in list(self.duplicated.items())[:limit]))
        if self.stray:
            parts.append("stray: " + ", ".join(f"output {r.partition}@{r.offset} {r.value!r:.80}"
                                               for r in self.stray[:limit]))
        if self.mismatched:
            parts.append("mismatched: " + ", ".join(f"{r.source} {r.record.key!r} {r.input_value!r}"
                                                    for r in self.mismatched[:limit]))
        if self.from_aborted:
            parts.append("from aborted transactions: " + ", ".join(f"{r.source} by {r.writer}"
                                                                   for r in self.from_aborted[:limit]))
        return "; ".join(parts)


def check_output(acks: Iterable[Acknowledged], output: Iterable[OutputRecord], *,
                 aborted_writers: Collection[str] = (),
                 aborted_ranges: Iterable[tuple[str, int, int, int]] = ()) -> TxnVerdict:
    """Judge ``output`` (committed output records) against ``acks`` (acknowledged input).

    ``aborted_writers``: the writers of transactions that aborted; an output record of one of
    them is reported (an abort must discard everything the transaction wrote).
    ``aborted_ranges``: ``(topic, partition, first, last)`` spans of input offsets of
    aborted transactions, as the relays read them (virtual partitions named as such): an
    acknowledged record read from one of those spans and found exactly once counts as
    redone."""
    expected: dict[RecordId, Acknowledged] = {}
    for ack in acks:
        expected[(ack.topic, ack.partition, ack.offset)] = ack
    copies: dict[RecordId, list[Relayed]] = defaultdict(list)
    verdict = TxnVerdict(acknowledged=len(expected), output=0)
    aborted = set(aborted_writers)
    for record in output:
        verdict.output += 1
        relayed = parse(record)
        if relayed is None or relayed.source not in expected:
            verdict.stray.append(record)
            continue
        copies[relayed.source].append(relayed)
        ack = expected[relayed.source]
        value = None if ack.value is None else ack.value.decode("utf-8", "replace")
        if record.key != ack.key or relayed.input_value != value:
            verdict.mismatched.append(relayed)
        if relayed.writer in aborted:
            verdict.from_aborted.append(relayed)
    verdict.lost = [rid for rid in expected if rid not in copies]
    verdict.duplicated = {rid: found for rid, found in copies.items() if len(found) > 1}
    spans: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for topic, partition, first, last in aborted_ranges:
        spans[topic, partition].append((first, last))
    for found in copies.values():
        if len(found) == 1:
            topic, partition, offset = found[0].seen
            if any(first <= offset <= last for first, last in spans.get((topic, partition), ())):
                verdict.redone += 1
    return verdict


def read_output(bootstrap: str, topic: str, *, isolation: str = "read_committed",
                timeout: float = 30.0) -> list[OutputRecord]:
    """Every record of ``topic`` from the start to the end each partition had when the read
    began (``streams_app.read_to_end``): call it with ``read_committed`` once the
    transactions of interest have ended. Raises TimeoutError past ``timeout``."""
    return [OutputRecord(partition, offset, key, value)
            for partition, offset, key, value in read_to_end(bootstrap, topic, isolation=isolation, timeout=timeout)]

