"""The keyrange assignor's cooperative sharing (docs/wire-contract.md section 3.7): when every
subscriber of a topic shares cooperatively and they outnumber its partitions, each member gets
one whole partition, each partition floor(M/P) or ceil(M/P) members; otherwise the topic is
assigned exactly as before. Property tests over plain values."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.client.group_assignor import MemberInfo, assign, cooperative_topics, withhold_moving
from proxy.client.records import TopicPartition

TOPIC = "t"


def members(n: int, *, cooperative=True, keyrange: int = 0, owned=None, generation: int = 1,
            topics=frozenset({TOPIC})) -> list[MemberInfo]:
    """``n`` members m00.., the first ``keyrange`` of them sharing by key range."""
    owned = owned or {}
    return [MemberInfo(f"m{i:02d}", topics, owned.get(f"m{i:02d}", {}), True, generation,
                       cooperative=cooperative and i >= keyrange) for i in range(n)]


def as_keyrange(infos: list[MemberInfo]) -> list[MemberInfo]:
    return [MemberInfo(m.member_id, m.topics, m.owned, m.allows_ranges, m.generation) for m in infos]


def partition_of(result) -> dict[str, int]:
    out = {}
    for member_id, assignment in result.items():
        (tp,) = assignment
        assert assignment[tp] == [], "a cooperative partition is assigned whole"
        out[member_id] = tp.partition
    return out


def rejoin(result, infos: list[MemberInfo]) -> list[MemberInfo]:
    return [MemberInfo(m.member_id, m.topics, result.get(m.member_id, {}), m.allows_ranges, m.generation + 1,
                       m.cooperative) for m in infos]


def check_balanced(result, partitions: int, count: int) -> None:
    held = Counter(partition_of(result).values())
    assert set(held) == set(range(partitions)), "every partition has members"
    assert {held[p] for p in range(partitions)} <= {count // partitions, -(-count // partitions)}


def test_with_nothing_owned_member_i_gets_partition_i_mod_p():
    result = assign(members(5), {TOPIC: [0, 1]})
    assert partition_of(result) == {"m00": 0, "m01": 1, "m02": 0, "m03": 1, "m04": 0}
    assert cooperative_topics(members(5), {TOPIC: [0, 1]}) == {TOPIC}
    result = assign(members(7), {TOPIC: [0, 1, 2]})
    assert partition_of(result) == {f"m{i:02d}": i % 3 for i in range(7)}


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 14))
def test_every_member_gets_one_partition_and_every_partition_its_share(partitions, extra):
    count = partitions + extra  # M > P
    result = assign(members(count), {TOPIC: list(range(partitions))})
    check_balanced(result, partitions, count)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8), st.integers(1, 8), st.integers(0, 3), st.booleans())
def test_otherwise_the_topic_is_assigned_exactly_as_before(partitions, count, keyrange, many):
    """M <= P, or a member sharing by key range: the same assignment as a group where
    nobody shares cooperatively."""
    count = count + partitions if many else min(count, partitions)
    keyrange = min(keyrange, count) if many else 0
    if many and keyrange == 0:
        return  # M > P, all cooperative: the case above
    infos = members(count, keyrange=keyrange)
    parts = {TOPIC: list(range(partitions))}
    assert cooperative_topics(infos, parts) == set()
    assert assign(infos, parts) == assign(as_keyrange(infos), parts)


def test_a_member_without_individual_commit_or_a_standard_assignor_means_no_cooperative_sharing():
    infos = members(3)
    infos[0] = MemberInfo("m00", frozenset({TOPIC}), {}, False, 1, cooperative=True)
    assert cooperative_topics(infos, {TOPIC: [0]}) == set()
    assert cooperative_topics(members(3), {TOPIC: [0]}, ranges=False) == set()
    # cooperative-sticky: whole partitions, one member each, as before
    assert assign(members(3), {TOPIC: [0]}, ranges=False) == assign(as_keyrange(members(3)), {TOPIC: [0]},
                                                                       ranges=False)


def test_topics_are_decided_one_by_one():
    both = frozenset({"a", "b"})
    infos = [MemberInfo(f"m{i}", both, {}, True, 1, cooperative=True) for i in range(3)]
    result = assign(infos, {"a": [0, 1], "b": [0, 1, 2, 3]})
    assert cooperative_topics(infos, {"a": [0, 1], "b": [0, 1, 2, 3]}) == {"a"}  # M > P on "a" only
    a = [tp for assignment in result.values() for tp in assignment if tp.topic == "a"]
    b = [tp for assignment in result.values() for tp in assignment if tp.topic == "b"]
    assert len(a) == 3 and sorted(tp.partition for tp in b) == [0, 1, 2, 3]  # "b" whole, once each


def test_members_keep_the_partition_they_hold_while_it_has_room():
    first = assign(members(5), {TOPIC: [0, 1]})
    infos = rejoin(first, members(5))
    # a sixth joins: nobody moves, it takes the partition with room
    joined = infos + [MemberInfo("new", frozenset({TOPIC}), {}, True, -1, cooperative=True)]
    second = assign(joined, {TOPIC: [0, 1]})
    before, after = partition_of(first), partition_of(second)
    assert {m: after[m] for m in before} == before and after["new"] == 1
    check_balanced(second, 2, 6)
    # one of partition 1 leaves: three and two are balanced, so nobody moves
    left = [m for m in rejoin(second, joined) if m.member_id != "m01"]
    third = partition_of(assign(left, {TOPIC: [0, 1]}))
    assert all(third[m] == after[m] for m in third) and Counter(third.values()) == {0: 3, 1: 2}
    # then another of partition 1: three and one are not, so one of partition 0 moves over
    assert third["m03"] == 1
    fewer = [m for m in rejoin({m: {TopicPartition(TOPIC, p): []} for m, p in third.items()}, left)
             if m.member_id != "m03"]
    fourth = partition_of(assign(fewer, {TOPIC: [0, 1]}))
    assert sum(fourth[m] != third[m] for m in fourth) == 1 and Counter(fourth.values()) == {0: 2, 1: 2}


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(2, 12), st.integers(0, 2**32 - 1))
def test_a_join_moves_nobody_else_and_a_leave_moves_at_most_one(partitions, count, seed):
    import random

    rng = random.Random(seed)
    count = max(count, partitions + 1)
    parts = {TOPIC: list(range(partitions))}
    infos = rejoin(assign(members(count), parts), members(count))
    before = partition_of({m.member_id: m.owned for m in infos})
    joined = infos + [MemberInfo("zz-new", frozenset({TOPIC}), {}, True, -1, cooperative=True)]
    after = partition_of(assign(joined, parts))
    assert all(after[m] == p for m, p in before.items())
    gone = rng.choice(infos).member_id
    rest = [m for m in infos if m.member_id != gone]
    if len(rest) > partitions:
        result = assign(rest, parts)
        check_balanced(result, partitions, len(rest))
        now = partition_of(result)
        assert sum(now[m] != before[m] for m in now) <= 1


def test_a_member_that_held_several_whole_partitions_keeps_one():
    owned = {"m00": {TopicPartition(TOPIC, 0): [], TopicPartition(TOPIC, 1): []}}
    infos = members(3, owned=owned)
    result = partition_of(assign(infos, {TOPIC: [0, 1]}))
    assert result["m00"] in (0, 1) and Counter(result.values()) in (Counter({0: 2, 1: 1}), Counter({0: 1, 1: 2}))


def test_cooperative_partitions_are_never_withheld():
    """A member joining a partition others hold gets it at once; a partition that stops
    being shared (M <= P) is withheld from its new sole owner until the others revoke it."""
    tp = TopicPartition(TOPIC, 0)
    infos = members(3, owned={"m00": {tp: []}, "m01": {tp: []}})
    target = assign(infos, {TOPIC: [0]})
    shared = cooperative_topics(infos, {TOPIC: [0]})
    assert withhold_moving(target, infos, shared) == {m: {tp: []} for m in ("m00", "m01", "m02")}
    # back to whole partitions: two members and two partitions, m01 keeps 0 once m00 let it go
    two = members(2, owned={"m00": {tp: []}, "m01": {tp: []}})
    target = assign(two, {TOPIC: [0, 1]})
    assert cooperative_topics(two, {TOPIC: [0, 1]}) == set()
    first = withhold_moving(target, two, ())
    holder = next(m for m, a in target.items() if tp in a)
    assert tp not in first[holder]


@pytest.mark.parametrize("count, partitions", [(3, 1), (4, 3), (9, 4)])
def test_assignments_name_every_partition_whole(count, partitions):
    result = assign(members(count), {TOPIC: list(range(partitions))})
    assert all(ranges == [] for a in result.values() for ranges in a.values())
    assert sorted({tp.partition for a in result.values() for tp in a}) == list(range(partitions))
