"""Cutting a broker's Fetch answer down to one chunk (docs/wire-contract.md#37-cooperative-fetch).
Sans I/O.

Chunks that start at the marker begin where the previous chunk's last batch ended, so
the common case is a run of whole batches passed on as they are: a slice of the broker's
answer, no copy. Only a batch reaching below the chunk's start (the first chunk after a restart
begins at the committed offset, which may sit inside a batch) or above its end (offsets
handed out again stop where the group's commits begin) is rebuilt with the chunk's records.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.records.batch import LegacyBatch, PartialBatch, as_byte_view, iter_batches
from proxy.records.split import filter_by_offsets


@dataclass(frozen=True)
class Chunk:
    """The records of offsets [start, end] the fetch hands out (``records`` may be empty:
    offsets with no record left, compacted or deleted, are a chunk too, so that they are
    committed and S can pass them)."""

    records: bytes | memoryview  # a slice of the broker's answer when no batch was rebuilt
    start: int
    end: int


def cut_chunk(blob, start: int, end: int | None = None) -> Chunk | None:
    """The chunk of ``blob`` (a Records field) from ``start`` to ``end`` (inclusive; None:
    as far as the complete batches go). None when ``blob`` tells nothing of the offsets
    from ``start`` on (no complete batch reaches it: the log end, or a byte limit that cut
    the first batch).

    A batch beginning past ``end`` proves that ``[..., end]`` holds no more records: the
    chunk then ends at ``end`` even if its last records end earlier."""
    if not blob:
        return None
    parts: list = []
    last: int | None = None
    beyond = False
    whole = True  # every part an unchanged batch, one after another: a slice of ``blob``
    first_at = end_at = 0
    for entry in iter_batches(blob):
        if isinstance(entry, PartialBatch):
            break
        if isinstance(entry, LegacyBatch):
            # magic 0/1: its offset is the (last) offset it holds; passed on whole
            base = top = entry.base_offset
        else:
            base, top = entry.header.base_offset, entry.header.last_offset
        if top < start:
            continue
        if end is not None and base > end:
            beyond = True
            break
        low = max(base, start)
        high = top if end is None else min(top, end)
        if (low > base or high < top) and not isinstance(entry, LegacyBatch) and not entry.header.is_control:
            parts.append(filter_by_offsets(entry.data, range(low, high + 1)).records)
            whole = False
        else:
            if not parts:
                first_at = entry.position
            parts.append(entry.data)
            end_at = entry.position + len(entry.data)
        last = high
        if end is not None and high >= end:
            break
    if last is None:
        if beyond and end is not None:
            return Chunk(b"", start, end)
        return None
    if beyond and end is not None:
        last = end
    records = as_byte_view(blob)[first_at:end_at] if whole else b"".join(parts)
    return Chunk(records, start, last)


def batch_bounds(blob, start: int, end: int | None = None) -> tuple[list[tuple[int, int]], int] | None:
    """What an ask names of ``blob`` from ``start`` (to ``end`` inclusive; None: as far as
    the complete batches go): the (last offset, bytes) of each complete batch reaching
    ``start``, and the last offset a chunk cut from it may reach. None when ``cut_chunk``
    would find no chunk there (the same rules: a batch beginning past ``end`` proves that
    ``[..., end]`` holds no more records)."""
    if not blob:
        return None
    batches: list[tuple[int, int]] = []
    last: int | None = None
    beyond = False
    for entry in iter_batches(blob):
        if isinstance(entry, PartialBatch):
            break
        if isinstance(entry, LegacyBatch):
            base = top = entry.base_offset
        else:
            base, top = entry.header.base_offset, entry.header.last_offset
        if top < start:
            continue
        if end is not None and base > end:
            beyond = True
            break
        high = top if end is None else min(top, end)
        batches.append((high, len(entry.data)))
        last = high
        if end is not None and high >= end:
            break
    if beyond and end is not None:
        return batches, end
    if last is None:
        return None
    return batches, last
