"""Which batches of a Fetch answer a consumer delivers, as Kafka's read_committed defines it.

A read_committed Fetch answer lists, per partition, the aborted transactions that overlap
it: ``(producer id, first offset)``. A data batch of a listed producer is aborted from that
first offset until the producer's ABORT marker; control batches (the markers themselves)
are never delivered. Every consumer of ours (the trio ``Consumer``, the Spark source) asks
this one place, batch by batch in offset order.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from proxy.records.batch import ControlType, RecordBatch


class Verdict(enum.Enum):
    DELIVER = "deliver"  # a data batch the application sees
    CONTROL = "control"  # a transaction marker: skipped, its offsets are processed
    ABORTED = "aborted"  # data of an aborted transaction: skipped, its offsets are processed


class TransactionFilter:
    """The verdict on each batch of one partition's answer, fed in offset order."""

    __slots__ = ("_pending", "_next", "_aborting", "_read_committed")

    def __init__(self, aborted_transactions: Iterable[tuple[int, int]], read_committed: bool) -> None:
        # (first offset, producer id), by first offset: a producer starts aborting there
        self._pending = sorted((first, pid) for pid, first in aborted_transactions) if read_committed else []
        self._next = 0
        self._aborting: set[int] = set()
        self._read_committed = read_committed

    def verdict(self, batch: RecordBatch) -> Verdict:
        header = batch.header
        pending = self._pending
        while self._next < len(pending) and pending[self._next][0] <= header.last_offset:
            self._aborting.add(pending[self._next][1])
            self._next += 1
        if header.is_control:
            if header.producer_id in self._aborting:
                for control in batch.control_records():
                    if control.type == ControlType.ABORT:
                        self._aborting.discard(header.producer_id)
            return Verdict.CONTROL
        if self._read_committed and header.is_transactional and header.producer_id in self._aborting:
            return Verdict.ABORTED
        return Verdict.DELIVER
