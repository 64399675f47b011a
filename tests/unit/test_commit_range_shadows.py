"""Offset ranges committed inside transactions, without I/O (proxy.commits.shadows): the
range shadow's metadata, what a range shadow holds next, S for the carrier, and the salted
names of range shadows."""

from __future__ import annotations

import random

import pytest

from proxy.commits.shadows import (
    RangesTooLarge,
    carrier_offset,
    decode_ranges,
    encode_ranges,
    is_range_shadow,
    next_ranges,
    range_shadow,
    range_shadow_prefix,
    uncovered,
)
from proxy.commits.state import CommitState
from proxy.protocol.groups import group_partition, parse_salted


def test_a_range_shadow_reads_back_as_written():
    ranges = [(100, 100), (102, 110), (5000, 5001), (2**62, 2**62 + 3)]
    text = encode_ranges(3, ranges)
    assert text.startswith("keyrange.txnranges/1:3:")
    assert decode_ranges(text) == (3, ranges)


def test_a_range_shadow_is_written_sorted_and_merged():
    assert decode_ranges(encode_ranges(0, [(9, 9), (1, 3), (4, 5), (2, 2)])) == (0, [(1, 5), (9, 9)])


def test_random_range_shadows_round_trip():
    generator = random.Random(5)
    for _ in range(200):
        starts = sorted(generator.sample(range(10_000), 20))
        ranges = [(s, s + generator.randrange(3)) for s in starts]
        epoch, back = decode_ranges(encode_ranges(7, ranges))  # type: ignore[misc]
        assert epoch == 7
        assert back == sorted({(a, b) for a, b in _merged(ranges)})


def _merged(ranges):
    out: list[list[int]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [tuple(r) for r in out]


def test_a_range_shadow_too_long_for_the_metadata_is_refused():
    with pytest.raises(RangesTooLarge, match="offset.metadata.max.bytes is 60"):
        encode_ranges(0, [(i * 1000, i * 1000) for i in range(20)], limit=60)


@pytest.mark.parametrize("metadata", [None, "", "other", "keyrange.txnranges/1:", "keyrange.txnranges/1:x:0.0",
                                      "keyrange.txnranges/1:0:0", "keyrange.txnranges/1:0:0.0,zzzzzzzzzzzzzz.0",
                                      "keyrange.txnranges/1:0:-1.0", "keyrange.txnranges/1:0:00.0",
                                      "keyrange.txnranges/2:0:0.0"])
def test_metadata_that_is_not_a_range_shadow_reads_as_none(metadata):
    assert decode_ranges(metadata) is None


def test_what_the_log_holds_is_left_out():
    state = CommitState(50, [(101, 101), (105, 106)])
    assert uncovered(state, [(40, 60), (100, 110)]) == [(50, 60), (100, 100), (102, 104), (107, 110)]
    assert uncovered(CommitState(-1), [(0, 3)]) == [(0, 3)]


def test_the_next_ranges_keep_the_committed_ones_of_the_same_epoch_only():
    state = CommitState(10, [(20, 20)], epoch=2)
    assert next_ranges(state, (2, [(5, 12), (30, 31)]), [(21, 22)]) == [(10, 12), (21, 22), (30, 31)]
    assert next_ranges(state, (1, [(30, 31)]), [(21, 22)]) == [(21, 22)]  # reset since: the old ranges are void
    assert next_ranges(state, None, [(20, 20)]) == []


def test_the_carrier_commits_s_as_if_the_shadow_were_processed():
    state = CommitState(10, [(12, 15)])
    assert carrier_offset(state, [(10, 11)]) == 16
    assert carrier_offset(state, [(20, 21)]) == 10
    assert carrier_offset(state, []) == 10


@pytest.mark.parametrize("partitions", [1, 31, 50, 62, 93, 200, 1000])
def test_range_shadows_land_on_their_groups_partition_and_parse_back(partitions):
    for group in ("orders", "billing-app", "ünïcode-grp", "g" * 100):
        for txn in ("tx-1", "app-3f2a9c-1", ""):
            name = range_shadow(group, txn, partitions)
            assert name.startswith(range_shadow_prefix(group, txn) + "#")
            assert group_partition(name, partitions) == group_partition(group, partitions)
            assert parse_salted(name, group, partitions) == range_shadow_prefix(group, txn)
            assert is_range_shadow(name, group, partitions)
            assert not is_range_shadow(name, group + "x", partitions)


def test_names_that_are_not_what_range_shadow_writes_do_not_parse():
    name = range_shadow("orders", "tx", 50)
    prefix, _, salt = name.rpartition("#")
    assert parse_salted(prefix, "orders", 50) is None  # no salt
    assert parse_salted(f"{prefix}#{salt}{salt}{salt}{salt}", "orders", 50) is None  # too long
    assert parse_salted(f"{prefix}#~", "orders", 50) is None  # outside the alphabet
    other = next(c for c in "0123456789" if c != salt)
    assert parse_salted(f"{prefix}#{other}", "orders", 50) is None  # not the first salt that lands
