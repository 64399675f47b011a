"""Cooperative sharing in a group (docs/wire-contract.md section 3.7), without a broker: the
subscription's PartitionSharing and the assignment's CooperativePartitions, the leader's
assignments, the member's state as assignments change, and fencing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from proxy.client import Consumer, TopicPartition, equal_shares
from proxy.client.assignment import AssignmentState
from proxy.client.group_protocol import (
    KEYRANGE,
    decode_assignment,
    decode_assignment_sharing,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from proxy.client.membership import Answer, Change, Membership, Phase
from proxy.client.progress import PartitionProgress
from proxy.protocol import messages
from proxy.protocol.errors import ProtocolError
from tests.unit.test_group_membership import join_response, sync_response
from tests.unit.test_group_rebalance import _member, _no_pattern, _records

TP = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


def test_the_subscription_says_how_the_member_shares():
    data = encode_subscription(KEYRANGE, ["t"], {TP: []}, allows_ranges=True, generation=3, sharing="cooperative")
    info = decode_subscription(KEYRANGE, "m", data)
    assert info.cooperative and info.allows_ranges and info.owned == {TP: []} and info.generation == 3
    plain = encode_subscription(KEYRANGE, ["t"], {TP: []}, allows_ranges=True, generation=3)
    assert not decode_subscription(KEYRANGE, "m", plain).cooperative
    # the default is not written: a member that shares by key range sends the bytes it always did
    standard = messages.decode_data("ConsumerProtocolSubscription", plain)
    assert bytes(standard.user_data) == bytes.fromhex("0000010100")
    # a mode this member does not know counts as key ranges
    cls = messages.data_class("KeyRangeSubscriptionUserData")
    unknown = messages.encode_data("KeyRangeSubscriptionUserData", cls(allow_individual_commit=True, owned_ranges=[],
                                                                        partition_sharing="newer"))
    value = messages.decode_data("ConsumerProtocolSubscription", plain)
    value.user_data = unknown
    assert not decode_subscription(KEYRANGE, "m", messages.encode_data("ConsumerProtocolSubscription", value, 3)
                                   ).cooperative


def test_the_assignment_names_the_cooperative_partitions():
    share = equal_shares(2)[0]
    assignment = {TP: [], TP1: [share], TopicPartition("u", 2): []}
    data = encode_assignment(KEYRANGE, assignment, [TP])
    assert decode_assignment_sharing(KEYRANGE, data) == (assignment, frozenset({TP}))
    assert decode_assignment(KEYRANGE, data) == assignment
    assert decode_assignment_sharing(KEYRANGE, encode_assignment(KEYRANGE, assignment)) == (assignment, frozenset())
    assert decode_assignment_sharing(KEYRANGE, b"") == ({}, frozenset())
    # a standard reader still sees every partition
    standard = messages.decode_data("ConsumerProtocolAssignment", data)
    assert sorted((t.topic, sorted(t.partitions)) for t in standard.assigned_partitions) == [("t", [0, 1]), ("u", [2])]
    with pytest.raises(ProtocolError, match="t-1 is to be fetched cooperatively, but it is assigned key ranges"):
        decode_assignment_sharing(KEYRANGE, encode_assignment(KEYRANGE, assignment, [TP1]))
    with pytest.raises(ProtocolError, match="t-5 is to be fetched cooperatively, but it is not assigned"):
        decode_assignment_sharing(KEYRANGE, encode_assignment(KEYRANGE, assignment, [TopicPartition("t", 5)]))


def _membership(sharing: str = "cooperative") -> Membership:
    return Membership("g", None, 45_000, 300_000, allows_ranges=True, partition_sharing=sharing)


def test_the_leader_shares_a_partition_cooperatively_when_everyone_asks_and_members_outnumber_it():
    m = _membership()
    m.subscribe(["t"])
    mine = m.join_request(9).protocols[0].metadata
    assert decode_subscription(KEYRANGE, "m1", mine).cooperative
    others = [(f"m{i}", encode_subscription(KEYRANGE, ["t"], {}, allows_ranges=True, generation=-1,
                                            sharing="cooperative")) for i in (2, 3)]
    m.on_join(join_response(members=[("m1", mine), *others]))
    assignments = m.assignments({"t": [0]})
    for member_id in ("m1", "m2", "m3"):
        assert decode_assignment_sharing(KEYRANGE, assignments[member_id]) == ({TP: []}, frozenset({TP}))
    answer, change = m.on_sync(sync_response(assignment=assignments["m1"]))
    assert answer == Answer.OK and change.cooperative == {TP} and m.cooperative == {TP}
    # a member that shares by key range joins: the partition is cut into ranges as before,
    # each withheld while the cooperative members still hold the partition whole
    keyrange = encode_subscription(KEYRANGE, ["t"], {}, allows_ranges=True, generation=-1)
    mine = m.join_request(9).protocols[0].metadata
    holder = encode_subscription(KEYRANGE, ["t"], {TP: []}, allows_ranges=True, generation=1, sharing="cooperative")
    m.on_join(join_response(members=[("m1", mine), ("m2", holder), ("m9", keyrange)], generation=2))
    infos = {info.member_id: info for info in (decode_subscription(KEYRANGE, mid, md) for mid, md in
                                                 [("m1", mine), ("m2", holder), ("m9", keyrange)])}
    assert infos["m1"].owned == {TP: []} and infos["m1"].cooperative and not infos["m9"].cooperative
    again = {member_id: decode_assignment_sharing(KEYRANGE, a) for member_id, a in m.assignments({"t": [0]}).items()}
    assert again == {member_id: ({}, frozenset()) for member_id in ("m1", "m2", "m9")}
    answer, change = m.on_sync(sync_response(assignment=m.assignments({"t": [0]})["m1"]))
    assert change.revoked == {TP: []} and change.cooperative == frozenset() and m.cooperative == frozenset()
    m.revoked(change.revoked)
    m.join_request(9)  # the follow-up: nobody holds the partition, so the ranges go out
    m.on_join(join_response(members=[("m1", m.join_request(9).protocols[0].metadata),
                                      ("m2", others[0][1]), ("m9", keyrange)], generation=3))
    ranges = [decode_assignment_sharing(KEYRANGE, a)[0][TP] for a in m.assignments({"t": [0]}).values()]
    assert sorted(r for rs in ranges for r in rs) == equal_shares(3)
    m.left()
    assert m.cooperative == frozenset()


async def test_a_member_fetches_a_cooperative_partition_at_once_and_keeps_its_mode_while_revoking():
    state = AssignmentState(read_committed=False, tracking=True)
    member, _ = _member(state)
    m = member.membership
    m.owned = {TP: []}
    member._changes.append(Change({TP: []}, {TP: []}, {}, frozenset({TP})))
    await member.before_poll(_no_pattern)
    assert state.cooperative == {TP} and state.ranges == {TP: []} and not state.paused
    # chunks came; the partition then moves to another member while records are out
    state.positions[TP] = 30
    state.progress[TP] = PartitionProgress(0)
    state.chunks_reached[TP] = 60
    state.buffers.add(TP, _records(50, 10), 30)
    out = state.drain(4, ())
    member.handed.handed(out)
    m.owned, m.revoking = {TP1: [], TP: []}, {TP: []}
    member._changes.append(Change({TP1: []}, {TP1: []}, {TP: []}, frozenset({TP1})))
    await member.before_poll(_no_pattern)
    assert state.cooperative == {TP, TP1}, "the revoked partition keeps its mode until its revocation completes"
    assert TP in state.paused and member._revoke_bounds[TP] == 59, "bound: the highest chunk, not the token"
    for r in out:
        state.progress[TP].mark(r.offset)
        member.marked(TP, r.offset)
    await member.before_poll(_no_pattern)
    await member._step()  # the background task commits the marks
    await member.before_poll(_no_pattern)
    assert member.to_be_revoked() == set() and state.cooperative == {TP1} and TP not in state


async def test_a_partition_that_turns_cooperative_starts_again_from_the_group():
    state = AssignmentState(read_committed=False, tracking=True)
    member, _ = _member(state)
    member.membership.owned = {TP: []}
    member._changes.append(Change({TP: []}, {TP: []}, {}))
    await member.before_poll(_no_pattern)
    state.positions[TP] = 40
    state.buffers.add(TP, _records(40, 5), 45)
    member._changes.append(Change({TP: []}, {}, {}, frozenset({TP})))  # a member more than partitions now
    await member.before_poll(_no_pattern)
    assert state.cooperative == {TP} and state.positions[TP] is None and not state.buffers.has_buffered(TP)


def test_a_fenced_cooperative_fetch_makes_the_member_rejoin_once():
    state = AssignmentState(read_committed=False, tracking=True)
    member, _ = _member(state)
    m = member.membership
    m.phase, m.generation, m.member_id = Phase.STABLE, 4, "m1"
    member.fetch_fenced(3)  # an answer to an older generation's fetch
    assert not m.rejoin_needed
    member.fetch_fenced(4)
    assert m.rejoin_needed
    m.rejoin_needed = False
    m.phase = Phase.JOINING
    member.fetch_fenced(4)  # already rejoining
    assert not m.rejoin_needed


def test_a_group_member_fetches_with_its_id_and_generation_and_not_between_generations():
    consumer = Consumer("127.0.0.1:1", group_id="g", allow_individual_commit=True, partition_sharing="cooperative")
    consumer._started = True
    consumer._connections.bootstrap = SimpleNamespace(filters_ranges=True, commits_ranges=True,  # type: ignore
                                                      fetches_cooperatively=True)
    consumer.subscribe(["t"])
    assert consumer._cooperative_member() is None  # not in the group yet
    assert consumer._group is not None
    m = consumer._group.membership
    m.phase, m.generation, m.member_id = Phase.STABLE, 7, "m1"
    member = consumer._cooperative_member()
    assert member is not None and (member.group_id, member.member_id, member.generation_id) == ("g", "m1", 7)
    m.left()
    assert consumer._cooperative_member() is None
