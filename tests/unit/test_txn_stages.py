"""Offset ranges committed inside transactions, without I/O: the stage's metadata, what a
stage holds next, S for the carrier (proxy.commits.txn_stages), and the salted names of
stage groups (proxy.protocol.groups)."""

from __future__ import annotations

import random

import pytest

from proxy.commits.state import CommitState
from proxy.commits.txn_stages import (
    StageTooLarge,
    carrier_offset,
    decode_stage,
    encode_stage,
    next_stage,
    uncovered,
)
from proxy.protocol.groups import group_partition, parse_salted, salted_group, stage_prefix


def test_a_stage_reads_back_as_written():
    ranges = [(100, 100), (102, 110), (5000, 5001), (2**62, 2**62 + 3)]
    text = encode_stage(3, ranges)
    assert text.startswith("keyrange.txnranges/1:3:")
    assert decode_stage(text) == (3, ranges)


def test_a_stage_is_written_sorted_and_merged():
    assert decode_stage(encode_stage(0, [(9, 9), (1, 3), (4, 5), (2, 2)])) == (0, [(1, 5), (9, 9)])


def test_random_stages_round_trip():
    generator = random.Random(5)
    for _ in range(200):
        starts = sorted(generator.sample(range(10_000), 20))
        ranges = [(s, s + generator.randrange(3)) for s in starts]
        epoch, back = decode_stage(encode_stage(7, ranges))  # type: ignore[misc]
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


def test_a_stage_too_long_for_the_metadata_is_refused():
    with pytest.raises(StageTooLarge, match="offset.metadata.max.bytes is 60"):
        encode_stage(0, [(i * 1000, i * 1000) for i in range(20)], limit=60)


@pytest.mark.parametrize("metadata", [None, "", "other", "keyrange.txnranges/1:", "keyrange.txnranges/1:x:0.0",
                                      "keyrange.txnranges/1:0:0", "keyrange.txnranges/1:0:0.0,zzzzzzzzzzzzzz.0",
                                      "keyrange.txnranges/1:0:-1.0", "keyrange.txnranges/1:0:00.0",
                                      "keyrange.txnranges/2:0:0.0"])
def test_metadata_that_is_not_a_stage_reads_as_none(metadata):
    assert decode_stage(metadata) is None


def test_what_the_log_holds_is_left_out():
    state = CommitState(50, [(101, 101), (105, 106)])
    assert uncovered(state, [(40, 60), (100, 110)]) == [(50, 60), (100, 100), (102, 104), (107, 110)]
    assert uncovered(CommitState(-1), [(0, 3)]) == [(0, 3)]


def test_the_next_stage_keeps_the_committed_one_of_the_same_epoch_only():
    state = CommitState(10, [(20, 20)], epoch=2)
    assert next_stage(state, (2, [(5, 12), (30, 31)]), [(21, 22)]) == [(10, 12), (21, 22), (30, 31)]
    assert next_stage(state, (1, [(30, 31)]), [(21, 22)]) == [(21, 22)]  # reset since: the old stage is void
    assert next_stage(state, None, [(20, 20)]) == []


def test_the_carrier_commits_s_as_if_the_stage_were_processed():
    state = CommitState(10, [(12, 15)])
    assert carrier_offset(state, [(10, 11)]) == 16
    assert carrier_offset(state, [(20, 21)]) == 10
    assert carrier_offset(state, []) == 10


@pytest.mark.parametrize("partitions", [1, 31, 50, 62, 93, 200, 1000])
def test_stage_groups_land_on_their_groups_partition_and_parse_back(partitions):
    for group in ("orders", "billing-app", "ünïcode-grp", "g" * 100):
        for txn in ("tx-1", "app-3f2a9c-1", ""):
            name = salted_group(stage_prefix(group, txn), group, partitions)
            assert group_partition(name, partitions) == group_partition(group, partitions)
            assert parse_salted(name, group, partitions) == stage_prefix(group, txn)


def test_names_that_are_not_what_salted_group_writes_do_not_parse():
    name = salted_group(stage_prefix("orders", "tx"), "orders", 50)
    prefix, _, salt = name.rpartition("#")
    assert parse_salted(prefix, "orders", 50) is None  # no salt
    assert parse_salted(f"{prefix}#{salt}{salt}{salt}{salt}", "orders", 50) is None  # too long
    assert parse_salted(f"{prefix}#~", "orders", 50) is None  # outside the alphabet
    other = next(c for c in "0123456789" if c != salt)
    assert parse_salted(f"{prefix}#{other}", "orders", 50) is None  # not the first salt that lands
