"""OffsetSet against a plain set of offsets: marks in order (the appending fast path),
out of order and as ranges, with removals, always give the same offsets as disjoint,
non-adjacent sorted ranges."""

from __future__ import annotations

import random

import pytest

from proxy.client.progress import OffsetSet


def _offsets(ranges) -> set[int]:
    return {o for start, end in ranges for o in range(start, end + 1)}


@pytest.mark.parametrize("seed", range(20))
def test_offset_set_matches_a_set(seed):
    rng = random.Random(seed)
    ours, model = OffsetSet(), set()
    cursor = 0
    for _ in range(300):
        kind = rng.random()
        if kind < 0.6:  # ascending, mostly right after the last or a little above it
            cursor += rng.choice((0, 1, 1, 2, 5))
            end = cursor + rng.choice((0, 0, 3))
            ours.add(cursor, end)
            model |= set(range(cursor, end + 1))
            cursor = end + 1
        elif kind < 0.85:
            start = rng.randrange(0, cursor + 10)
            end = start + rng.randrange(0, 6)
            ours.add(start, end)
            model |= set(range(start, end + 1))
        else:
            start = rng.randrange(0, cursor + 10)
            end = start + rng.randrange(0, 6)
            ours.remove(start, end)
            model -= set(range(start, end + 1))
        ranges = list(ours)
        assert _offsets(ranges) == model
        assert all(a[1] + 1 < b[0] for a, b in zip(ranges, ranges[1:]))
        assert all(start <= end for start, end in ranges)


@pytest.mark.parametrize("seed", range(20))
def test_remove_all_matches_removing_one_by_one(seed):
    rng = random.Random(seed)
    ours = OffsetSet((o, o + rng.randrange(3)) for o in range(0, 400, 5))
    model = set(_offsets(ours))
    for _ in range(10):
        ranges = list(ours)
        if rng.random() < 0.5:  # the lowest ranges, as an acknowledged commit sends them back
            sent = ranges[:rng.randrange(len(ranges) + 1)]
        else:  # a commit whose ranges grew meanwhile, or any other sorted disjoint ranges
            sent = sorted({(s, s + rng.randrange(4)) for s in rng.sample(range(0, 400, 7), 8)})
            sent = [r for i, r in enumerate(sent) if i == 0 or r[0] > sent[i - 1][1]]
        ours.remove_all(sent)
        model -= _offsets(sent)
        assert _offsets(list(ours)) == model
        for start in range(400, 420, 3):
            ours.add(start)
            model.add(start)
