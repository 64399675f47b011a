"""Key ranges: inclusive intervals of the 63-bit key-hash space (docs/wire-contract.md#2-key-hash-and-ranges).

A list of ranges means their union; an absent or empty list means the whole partition.
Requests carrying ranges that are unsorted, overlapping or out of bounds are refused
(INVALID_REQUEST), so ``validate_ranges`` returns a reason rather than raising: the caller
decides which error code the partition gets.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

HASH_MIN = 0
HASH_MAX = (1 << 63) - 1
HASH_SPACE = 1 << 63


@dataclass(frozen=True, slots=True, order=True)
class KeyRange:
    """``start`` and ``end`` are both inclusive hash values."""

    start: int
    end: int

    def __contains__(self, key_hash: int) -> bool:
        return self.start <= key_hash <= self.end

    @property
    def size(self) -> int:
        """How many hash values the range holds."""
        return self.end - self.start + 1


FULL_RANGE = KeyRange(HASH_MIN, HASH_MAX)


def validate_ranges(ranges: Sequence[KeyRange]) -> str | None:
    """``None`` if the list is acceptable on the wire, else why it is not.

    Acceptable: each range within [0, 2^63 - 1] with start <= end, sorted by start and
    pairwise disjoint. Adjacent ranges are allowed (they are still disjoint).
    """
    previous_end = -1
    for i, r in enumerate(ranges):
        if not (HASH_MIN <= r.start <= HASH_MAX and HASH_MIN <= r.end <= HASH_MAX):
            return f"range {i} [{r.start}, {r.end}] is outside [0, 2^63-1]"
        if r.start > r.end:
            return f"range {i} has start {r.start} after end {r.end}"
        if r.start <= previous_end:
            return f"range {i} [{r.start}, {r.end}] is unsorted or overlaps the previous one"
        previous_end = r.end
    return None


def equal_shares(n: int) -> list[KeyRange]:
    """The n equal shares: share i is [floor(i*2^63/n), floor((i+1)*2^63/n) - 1]."""
    if n < 1:
        raise ValueError(f"share count must be positive, got {n}")
    return [KeyRange(i * HASH_SPACE // n, (i + 1) * HASH_SPACE // n - 1) for i in range(n)]


def equal_share(i: int, n: int) -> KeyRange:
    """Share ``i`` of ``n`` equal shares."""
    if not 0 <= i < n:
        raise ValueError(f"share {i} out of 0..{n - 1}")
    return KeyRange(i * HASH_SPACE // n, (i + 1) * HASH_SPACE // n - 1)


def contains(ranges: Sequence[KeyRange] | None, key_hash: int) -> bool:
    """Whether a hash falls in the union of ``ranges``; no ranges means everything."""
    if not ranges:
        return HASH_MIN <= key_hash <= HASH_MAX
    return any(r.start <= key_hash <= r.end for r in ranges)


def normalize(ranges: Iterable[KeyRange]) -> list[KeyRange]:
    """The union as a sorted list of disjoint, non-adjacent ranges.

    Inputs may be unsorted and overlapping (for example several requesters' ranges), but
    each must itself be well formed (start <= end).
    """
    out: list[KeyRange] = []
    for r in sorted(ranges):
        if r.start > r.end:
            raise ValueError(f"malformed range [{r.start}, {r.end}]")
        if out and r.start <= out[-1].end + 1:
            if r.end > out[-1].end:
                out[-1] = KeyRange(out[-1].start, r.end)
        else:
            out.append(r)
    return out


def effective_ranges(ranges: Sequence[KeyRange] | None) -> list[KeyRange]:
    """What a possibly empty range list means: the whole space when empty."""
    return normalize(ranges) if ranges else [FULL_RANGE]


def subtract(ranges: Iterable[KeyRange], minus: Iterable[KeyRange]) -> list[KeyRange]:
    """The hashes of ``ranges`` not in ``minus``, normalized (both may be unsorted and
    overlapping)."""
    out: list[KeyRange] = []
    taken = normalize(minus)
    for r in normalize(ranges):
        start = r.start
        for m in taken:
            if m.end < start or m.start > r.end:
                continue
            if m.start > start:
                out.append(KeyRange(start, m.start - 1))
            start = m.end + 1
            if start > r.end:
                break
        if start <= r.end:
            out.append(KeyRange(start, r.end))
    return out


def covers(wide: Iterable[KeyRange], narrow: Iterable[KeyRange]) -> bool:
    """Whether every hash of ``narrow`` is in ``wide`` (no ranges: nothing, here)."""
    return not subtract(narrow, wide)

