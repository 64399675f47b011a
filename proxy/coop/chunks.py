"""Cutting a broker's Fetch answer down to one chunk (docs/wire-contract.md#37-cooperative-fetch).
Sans I/O.

Chunks that start at the marker begin where the previous chunk's last batch ended, so
the common case is a run of whole batches passed on as they are: a slice of the broker's
answer, no copy. Only a batch reaching below the chunk's start (the first chunk after a restart
begins at the committed offset, which may sit inside a batch) or above its end (offsets
handed out again stop where the group's commits begin) is rebuilt with the chunk's records.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

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


def _reaching(blob, start: int, end: int | None) -> tuple[list[tuple[Any, int, int]], bool]:
    """The complete batches of ``blob`` reaching ``[start, end]`` (None: no end), each with
    its base and last offset (a legacy entry's offset is the last it holds), up to the first
    that reaches ``end``; and whether a batch beginning past ``end`` came first."""
    reaching: list[tuple[Any, int, int]] = []
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
            return reaching, True
        reaching.append((entry, base, top))
        if end is not None and top >= end:
            break
    return reaching, False


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
    whole = True  # every part an unchanged batch, one after another: a slice of ``blob``
    first_at = end_at = 0
    reaching, beyond = _reaching(blob, start, end)
    for entry, base, top in reaching:
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
    if beyond and end is not None:
        last = end  # a batch past ``end``: [..., end] holds no more records
    elif last is None:
        return None
    records = b"" if not parts else as_byte_view(blob)[first_at:end_at] if whole else b"".join(parts)
    return Chunk(records, start, last)


def batch_bounds(blob, start: int, end: int | None = None) -> tuple[list[tuple[int, int]], int] | None:
    """What an ask names of ``blob`` from ``start`` (to ``end`` inclusive; None: as far as
    the complete batches go): the (last offset, bytes) of each complete batch reaching
    ``start``, and the last offset a chunk cut from it may reach. None when ``cut_chunk``
    would find no chunk there (the same rules: a batch beginning past ``end`` proves that
    ``[..., end]`` holds no more records)."""
    if not blob:
        return None
    reaching, beyond = _reaching(blob, start, end)
    batches = [(top if end is None else min(top, end), len(entry.data)) for entry, _base, top in reaching]
    if end is not None and beyond:
        return batches, end
    if not batches:
        return None
    return batches, batches[-1][0]


_BATCH_HEAD = struct.Struct(">qi")  # a batch's base offset and length (the bytes after these 12)


def first_batch_bytes(blob) -> int:
    """The size of the first batch of ``blob`` (a Records field: the batch the read began
    in), 0 when it holds none: what a chunk starting inside that batch reads beyond its
    own bytes."""
    if blob is None or len(blob) < _BATCH_HEAD.size:
        return 0
    _base, length = _BATCH_HEAD.unpack_from(blob, 0)
    return max(0, length) + _BATCH_HEAD.size
