"""One fetched partition blob into the columns of the ``keyrange`` source's rows (sans-IO).

A task reads one share of one partition between two offsets. Each Fetch answer is turned
into column lists here, straight from the project's record layer (no per-record objects
beyond what it yields), then into an Arrow record batch by ``proxy.spark.arrow``. The rules
are a Kafka consumer's: control batches are never rows; under read_committed the batches
of aborted transactions are dropped (the AbortedTransactions list of the same answer says
which); records outside ``[start, end)`` are dropped (a batch may start before the fetch
offset or run past the end). Every record's key hash is checked against the share even when
the proxy filtered (``KeyRangesApplied``), so a task can never emit another share's record.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from proxy.protocol.errors import ProtocolError
from proxy.ranges import HASH_MAX, KeyRange
from proxy.records.batch import LegacyBatch, PartialBatch, iter_batches
from proxy.records.keyhash import key_hash
from proxy.records.transactions import TransactionFilter, Verdict


@dataclass
class Columns:
    """Rows of one share, in offset order, as parallel lists."""

    keys: list = field(default_factory=list)
    values: list = field(default_factory=list)
    offsets: list = field(default_factory=list)
    timestamps: list = field(default_factory=list)  # milliseconds since the epoch
    timestamp_types: list = field(default_factory=list)
    headers: list | None = None  # per row: list of (key, value) when headers are wanted

    def __len__(self) -> int:
        return len(self.offsets)


@dataclass
class Decoded:
    columns: Columns
    next_offset: int  # where this share's next fetch starts
    truncated: bool  # the answer ended inside a batch (the partition fetch size cut it)


def decode_partition(
    blob,
    *,
    fetch_offset: int,
    end_offset: int,
    share: KeyRange,
    read_committed: bool = False,
    aborted_transactions: Iterable[tuple[int, int]] = (),
    include_headers: bool = False,
) -> Decoded:
    """Rows of ``share`` at offsets in [fetch_offset, end_offset) from one Records blob.

    ``aborted_transactions`` are the answer's ``(producer_id, first_offset)`` pairs; each
    producer's batches are dropped from its first offset until its ABORT marker.
    """
    columns = Columns(headers=[] if include_headers else None)
    out = Decoded(columns, fetch_offset, False)
    if not blob:
        return out
    whole = share.start == 0 and share.end == HASH_MAX
    transactions = TransactionFilter(aborted_transactions, read_committed)
    for entry in iter_batches(blob):
        if isinstance(entry, PartialBatch):
            out.truncated = True
            break
        if isinstance(entry, LegacyBatch):
            raise ProtocolError(f"a magic v{entry.magic} message set at offset {entry.base_offset}: the keyrange "
                                "source reads record batches (magic 2) only", offset=entry.position)
        header = entry.header
        if header.next_offset <= fetch_offset:
            continue
        if header.base_offset >= end_offset:
            break
        out.next_offset = max(out.next_offset, header.next_offset)
        if transactions.verdict(entry) is not Verdict.DELIVER:
            continue
        timestamp_type = header.timestamp_type
        for record in entry.records():
            offset = record.offset
            if offset < fetch_offset:
                continue
            if offset >= end_offset:
                break
            key = record.key
            if not whole and not share.start <= key_hash(key, offset) <= share.end:
                continue
            columns.keys.append(None if key is None else bytes(key))
            columns.values.append(None if record.value is None else bytes(record.value))
            columns.offsets.append(offset)
            columns.timestamps.append(record.timestamp)
            columns.timestamp_types.append(timestamp_type)
            if columns.headers is not None:
                columns.headers.append([(bytes(h.key).decode("utf-8", "replace"),
                                         None if h.value is None else bytes(h.value)) for h in record.headers])
    out.next_offset = min(out.next_offset, max(end_offset, fetch_offset))
    return out
