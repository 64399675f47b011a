"""Stripes of whole batches: how a striped virtual topic (``orders.coop4``) cuts a
partition into K shares for consumers that need no per-key order, without I/O.

A data batch belongs to one stripe, chosen by a hash of its base offset. So the choice
is the same on every proxy, for every read position and after any restart (a read that
starts in the middle of the log sees each batch where every other read saw it), and it
balances by batches whatever the keys are: one key holding half the records still spreads
over every stripe. Batches are moved as they are, never opened: no decompression, no CRC,
no record rebuilt, which is what makes this cheaper than a key-range split.

Control batches (transaction markers) go to every stripe: a read_committed client drops a
transaction's records until it meets that transaction's marker, so a stripe without the
marker would also drop the producer's next, committed, transaction.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.records.batch import LegacyBatch, PartialBatch, iter_batches

_MASK64 = (1 << 64) - 1

# The watermarks of a striped virtual topic (``<topic>.coop<K>``) are kept under K plus
# this, apart from those of the key shares of ``<topic>.kr<K>``: stripe i and key share i
# hold different records, and reading one's watermark as the other's would move S past
# records nobody processed. Releases before striped topics read such a K as none written
# by a proxy (the record is skipped: records re-delivered, never lost).
STRIPED_MARKS = 1000


def share_count(mark_k: int, max_shares: int) -> int:
    """How many shares the watermarks kept under ``mark_k`` are of (K of a key-range
    topic, or ``STRIPED_MARKS`` + K of a striped one, K at most ``max_shares``); 0 for a
    K no proxy writes."""
    if 0 < mark_k <= max_shares:
        return mark_k
    if STRIPED_MARKS < mark_k <= STRIPED_MARKS + max_shares:
        return mark_k - STRIPED_MARKS
    return 0


@dataclass(frozen=True, slots=True)
class Stripe:
    """Stripe ``index`` of ``count``: the share a virtual partition of a striped topic reads."""

    count: int
    index: int

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"stripe {self.index} of {self.count}")


def stripe_of(base_offset: int, count: int) -> int:
    """The stripe of the batch starting at ``base_offset``: a 64-bit mix of the offset
    (SplitMix64's finaliser), so that batch sizes in step with K (a producer writing 100
    records a batch, K = 4) do not all land in one stripe."""
    z = (base_offset + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) % count


@dataclass(slots=True)
class StripedRead:
    outputs: list[bytes]  # per stripe, the batches of that stripe (and every control batch)
    next_offset: int | None  # the offset after the read's last complete batch; None: none
    records: list[int]  # per stripe, how many data records it holds


def split_stripes(blob, count: int) -> StripedRead:
    """Cut a Records blob into ``count`` stripes. A batch the broker cut short at its size
    limit ends the read (the client reads it whole next time)."""
    parts: list[list[memoryview]] = [[] for _ in range(count)]
    records = [0] * count
    next_offset: int | None = None
    for entry in iter_batches(blob) if blob else ():
        if isinstance(entry, PartialBatch):
            break
        if isinstance(entry, LegacyBatch):
            stripe = stripe_of(entry.base_offset, count)
            parts[stripe].append(entry.data)
            records[stripe] += 1
            next_offset = entry.base_offset + 1
            continue
        header = entry.header
        if header.is_control:
            for share in parts:
                share.append(entry.data)
        else:
            stripe = stripe_of(header.base_offset, count)
            parts[stripe].append(entry.data)
            records[stripe] += header.record_count
        next_offset = header.last_offset + 1
    return StripedRead([b"".join(share) for share in parts], next_offset, records)
