"""What one read of a real partition proves about each share of a virtual topic, without
I/O (docs/virtual-topics.md#lag).

A committed offset is lifted over stretches holding no record of its share
(``proxy.commits.gaps``). The instance whose Fetch served a share learns them as its
control batch passes them; an instance that only sees the group's commits (the
coordinator's sidecar, or another replica behind a load balancer) learns nothing that
way. It reads the partition's tail instead, once the group's commits have gone quiet, and
this module turns that read into the same stretches.

Whatever might be handed to a share's consumer counts as its record: a record of an
aborted transaction (a read_uncommitted consumer gets it) and every record of a legacy
(magic 0/1) entry, which reaches every share unfiltered. A read proves nothing past its
last complete batch.
"""

from __future__ import annotations

from proxy.commits.gaps import Gaps, add_gap
from proxy.ranges import equal_shares
from proxy.records.batch import LegacyBatch, PartialBatch, RecordBatch, iter_batches
from proxy.records.compression import DEFAULT_MAX_DECOMPRESSED_BYTES
from proxy.records.plan import RangePlan
from proxy.records.split import match_offsets
from proxy.records.stripes import STRIPED_MARKS, stripe_of

__all__ = ["ReadGaps", "read_gaps"]

ReadGaps = tuple[dict[int, Gaps], int | None]  # share -> its stretches; the offset the read proves up to


def read_gaps(blob: bytes | bytearray | memoryview, start: int, mark_k: int, keep: int, *,
              max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES) -> ReadGaps:
    """The stretches of [start, end) holding no record of each share of ``mark_k`` (K of
    ``.kr<K>``, or ``STRIPED_MARKS`` + K of ``.coop<K>``), from a Records ``blob`` read at
    ``start``; ``end`` is the offset after its last complete batch (None: no complete
    batch, nothing proven). At most ``keep`` stretches per share, the highest.

    Raises what decoding a corrupt batch raises (``ProtocolError``, ``ValueError``)."""
    data = bytes(blob)
    striped = mark_k > STRIPED_MARKS
    count = mark_k - STRIPED_MARKS if striped else mark_k
    if count < 1:
        return {}, None
    end: int | None = None
    batches: list[tuple[int, int]] = []  # [base offset, next offset) of each data batch
    for entry in iter_batches(data):
        if isinstance(entry, (PartialBatch, LegacyBatch)):
            break  # cut short, or a legacy entry reaching every share: nothing proven from it on
        assert isinstance(entry, RecordBatch)
        header = entry.header
        if not header.is_control:
            batches.append((header.base_offset, header.next_offset))
        end = header.next_offset
    if end is None or end <= start:
        return {}, None
    held: list[list[tuple[int, int]]]  # per share, the [low, high) its records may lie in, ascending
    if striped:
        held = [[] for _ in range(count)]
        for base, after in batches:  # a stripe takes whole batches
            held[stripe_of(base, count)].append((base, after))
    else:
        plan = RangePlan([[share] for share in equal_shares(count)])
        matched = match_offsets(data, plan, max_decompressed_bytes=max_decompressed_bytes).offsets
        held = [[(offset, offset + 1) for offset in offsets] for offsets in matched]
    out: dict[int, Gaps] = {}
    for share, spans in enumerate(held):
        gaps: Gaps = ()
        low = start
        for span_low, span_high in spans:
            if span_low >= end:
                break
            gaps = add_gap(gaps, low, span_low, keep)
            low = max(low, span_high)
        gaps = add_gap(gaps, low, end, keep)
        if gaps:
            out[share] = gaps
    return out, end
