"""Pure-Python kernels over packed offset ranges (see ``proxy.commits.packed``).

The reference for ``_cpacked``: both give identical results (tests check this). The C
module exists because a range commit of 100 partitions with 50 ranges each carries 5,000
ranges, and a Python object per range was most of the proxy's time per commit.
"""

from __future__ import annotations

import struct
from functools import lru_cache
from itertools import chain

RANGE_SIZE = 17  # int64 Start, int64 End (big-endian), an empty tagged-field section
MAX_OFFSET = (1 << 63) - 1

OffsetRange = tuple[int, int]


@lru_cache(maxsize=256)
def _layout(count: int) -> struct.Struct:
    return struct.Struct(">" + "qqx" * count)


def unpack(packed) -> list[OffsetRange]:
    if len(packed) % RANGE_SIZE:
        raise ValueError(f"packed ranges of {len(packed)} bytes: not a multiple of {RANGE_SIZE}")
    values = iter(_layout(len(packed) // RANGE_SIZE).unpack(packed))
    return list(zip(values, values))


def pack(ranges) -> bytes:
    ranges = list(ranges)
    return _layout(len(ranges)).pack(*chain.from_iterable(ranges))


def invalid(ordered: list[OffsetRange]) -> str | None:
    """Why sorted ranges are not a valid commit (negative, inverted, overlapping, or past
    the largest offset), or None. Starts ascend, so one pass checks every end too."""
    if ordered[0][0] < 0:
        start, end = ordered[0]
        return f"negative offset in range [{start}, {end}]"
    previous = -1
    for start, end in ordered:
        if end < 0:
            return f"negative offset in range [{start}, {end}]"
        if start > end:
            return f"range start {start} is above its end {end}"
        if start <= previous:
            return f"ranges overlap at offset {start}"
        previous = end
    if previous >= MAX_OFFSET:
        return f"range end {previous} is beyond the largest offset"
    return None


def sort_checked(packed) -> tuple[str | None, bytes]:
    """The ranges sorted, and why they are invalid (None when valid)."""
    ordered = sorted(unpack(packed))
    if not ordered:
        return "no ranges", b""
    return invalid(ordered), pack(ordered)


def _after(end: int) -> int:
    if end >= MAX_OFFSET:
        raise OverflowError("stable offset beyond the largest int64")
    return end + 1


def merge(stable: int, held, commit) -> tuple[int, bytes]:
    """The merge rule of docs/wire-contract.md#33-offsetcommit: union of ``held`` (R) and ``commit``, with
    everything below S dropped and S advanced over a range starting at it."""
    merged = sorted((*unpack(held), *unpack(commit)))
    count = len(merged)
    index = 0
    # Starts ascend: S absorbs a prefix of the union (what starts at or below it) ...
    while index < count:
        start, end = merged[index]
        if start > stable:
            break
        if end >= stable:
            stable = _after(end)
        index += 1
    if index == count:
        return stable, b""
    # ... and the rest, all above S, coalesces in one pass.
    kept: list[OffsetRange] = []
    cur_start, cur_end = merged[index]
    for start, end in merged[index + 1:]:
        if start > cur_end + 1:
            kept.append((cur_start, cur_end))
            cur_start, cur_end = start, end
        elif end > cur_end:
            cur_end = end
    kept.append((cur_start, cur_end))
    return stable, pack(kept)


def stable_after(stable: int, held, commit) -> int:
    """``merge(stable, held, commit)[0]`` without building R'."""
    merged = sorted((*unpack(held), *unpack(commit)))
    for start, end in merged:
        if start > stable:
            break
        if end >= stable:
            stable = _after(end)
    return stable


def _put_uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _get_uvarint(data, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("range deltas end inside a varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if value >= 1 << 64:
                raise ValueError("range delta beyond 64 bits")
            return value, pos
        shift += 7
        if shift >= 70:
            raise ValueError("range delta varint longer than 10 bytes")


def to_deltas(stable: int, packed) -> bytes:
    """R as varints, two per range: Start minus the cursor, then End minus Start; the
    cursor starts at S and moves to End + 1. R must be a state's: sorted, disjoint,
    non-adjacent, each range starting above S (every first delta is then at least 1)."""
    out = bytearray()
    cursor = stable
    for start, end in unpack(packed):
        if start <= cursor or end < start:
            raise ValueError(f"range [{start}, {end}] does not follow {cursor - 1} in a state above S={stable}")
        _put_uvarint(out, start - cursor)
        _put_uvarint(out, end - start)
        cursor = end + 1
    return bytes(out)


def from_deltas(stable: int, data) -> bytes:
    """The packed ranges ``to_deltas`` wrote; ValueError for anything it cannot have."""
    ranges = []
    cursor = stable
    pos = 0
    while pos < len(data):
        gap, pos = _get_uvarint(data, pos)
        length, pos = _get_uvarint(data, pos)
        start = cursor + gap
        end = start + length
        if stable < 0 or gap == 0 or end >= MAX_OFFSET:
            raise ValueError(f"range deltas ({gap}, {length}) after {cursor} are not a state's")
        ranges.append((start, end))
        cursor = end + 1
    return pack(ranges)
