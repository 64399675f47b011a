"""The membership state machine and the group protocol codecs, without a broker."""

from __future__ import annotations

import pytest

from proxy.client.errors import KafkaError
from proxy.client.group_protocol import (
    COOPERATIVE_STICKY,
    KEYRANGE,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from proxy.client.membership import Answer, Membership, Phase, difference, union
from proxy.client.records import TopicPartition
from proxy.protocol import messages
from proxy.protocol.constants import ErrorCode
from proxy.protocol.messages import ApiKey
from proxy.ranges import equal_shares

TP = TopicPartition("orders", 0)


def membership(**kw) -> Membership:
    return Membership("g", kw.pop("instance_id", None), 45_000, 300_000, allows_ranges=kw.pop("ranges", True))


def join_response(code=0, member="m1", leader="m1", generation=1, protocol=KEYRANGE, members=()):
    cls = messages.body_class(ApiKey.JOIN_GROUP, "response")
    return messages.new_body(ApiKey.JOIN_GROUP, 9, "response", error_code=code, generation_id=generation,
                             protocol_type="consumer", protocol_name=protocol, leader=leader, member_id=member,
                             members=[cls.JoinGroupResponseMember(member_id=m, group_instance_id=None, metadata=md)
                                      for m, md in members])


def sync_response(code=0, assignment=b""):
    return messages.new_body(ApiKey.SYNC_GROUP, 5, "response", error_code=code, protocol_type="consumer",
                             protocol_name=KEYRANGE, assignment=assignment)


def heartbeat_response(code):
    return messages.new_body(ApiKey.HEARTBEAT, 4, "response", error_code=code)


def test_subscription_and_assignment_round_trip_with_ranges():
    share = equal_shares(3)[1]
    data = encode_subscription(KEYRANGE, ["orders"], {TP: [share], TopicPartition("orders", 1): []},
                               allows_ranges=True, generation=7)
    info = decode_subscription(KEYRANGE, "m", data)
    assert info.owned == {TP: [share], TopicPartition("orders", 1): []}
    assert info.allows_ranges and info.generation == 7 and info.topics == {"orders"}
    # a standard reader sees the partitions
    standard = messages.decode_data("ConsumerProtocolSubscription", data)
    assert sorted(standard.owned_partitions[0].partitions) == [0, 1]
    assigned = {TP: [share], TopicPartition("orders", 1): []}
    assert decode_assignment(KEYRANGE, encode_assignment(KEYRANGE, assigned)) == assigned
    # cooperative-sticky: whole partitions, the generation in the user data as Java writes it
    data = encode_subscription(COOPERATIVE_STICKY, ["orders"], {TP: []}, allows_ranges=True, generation=4)
    info = decode_subscription(COOPERATIVE_STICKY, "m", data)
    assert info.owned == {TP: []} and not info.allows_ranges and info.generation == 4


def test_join_with_member_id_required_then_lead_and_sync():
    m = membership()
    m.subscribe(["orders"])
    assert m.needs_join
    m.join_request(9)
    assert m.phase == Phase.JOINING and not m.needs_join
    assert m.on_join(join_response(ErrorCode.MEMBER_ID_REQUIRED, member="m1", leader="")) == Answer.JOIN
    assert m.member_id == "m1"
    request = m.join_request(9)
    assert request.member_id == "m1" and [p.name for p in request.protocols] == [KEYRANGE, COOPERATIVE_STICKY]
    other = encode_subscription(KEYRANGE, ["orders"], {}, allows_ranges=True, generation=-1)
    mine = request.protocols[0].metadata
    assert m.on_join(join_response(members=[("m1", mine), ("m2", other)])) == Answer.SYNC
    assert m.is_leader and m.subscribed_topics() == ["orders"]
    assignments = m.assignments({"orders": [0]})
    halves = {decode_assignment(KEYRANGE, a)[TP][0] for a in assignments.values()}
    assert halves == set(equal_shares(2))
    answer, change = m.on_sync(sync_response(assignment=assignments["m1"]))
    assert answer == Answer.OK and m.phase == Phase.STABLE
    assert change.added == change.assignment and not change.revoked


def test_revoked_ranges_stay_claimed_until_done_then_rejoin():
    m = membership()
    m.subscribe(["orders"])
    m.join_request(9)
    m.on_join(join_response(leader="other"))
    m.on_sync(sync_response(assignment=encode_assignment(KEYRANGE, {TP: []})))
    m.join_request(9)  # someone joined: rebalance
    m.on_join(join_response(leader="other", generation=2))
    half = equal_shares(2)[0]
    _, change = m.on_sync(sync_response(assignment=encode_assignment(KEYRANGE, {TP: [half]})))
    assert change.revoked == {TP: [equal_shares(2)[1]]}
    assert m.owned == {TP: []}, "the revoking half is still claimed"
    assert not m.needs_join, "the follow-up rebalance waits for the revocation"
    m.revoked(change.revoked)
    assert m.owned == {TP: [half]} and m.needs_join


def _rejoining_owner() -> Membership:
    """A member that owns TP whole from generation 1 and has sent its next JoinGroup."""
    m = membership()
    m.subscribe(["orders"])
    m.join_request(9)
    m.on_join(join_response(leader="other", generation=1))
    m.on_sync(sync_response(assignment=encode_assignment(KEYRANGE, {TP: []})))
    m.join_request(9)
    return m


def test_a_generation_the_coordinator_lost_before_its_sync_keeps_what_the_member_owns():
    """The coordinator's node stops after answering a JoinGroup and before storing the
    generation; the new coordinator answers the SyncGroup with ILLEGAL_GENERATION. The
    member still owns its previous generation's ranges: it rejoins claiming them with that
    generation, loses nothing, and its commits keep that generation."""
    m = _rejoining_owner()
    assert m.on_join(join_response(leader="other", generation=2)) == Answer.SYNC
    assert m.sync_request(5, {}).generation_id == 2
    assert m.generation == 1, "the owned ranges are still generation 1's"
    assert m.on_sync(sync_response(ErrorCode.ILLEGAL_GENERATION)) == (Answer.JOIN, None)
    assert m.owned == {TP: []} and m.take_lost() == {} and m.member_id == "m1"
    claim = decode_subscription(KEYRANGE, "m1", m.join_request(9).protocols[0].metadata)
    assert claim.owned == {TP: []} and claim.generation == 1
    m.on_join(join_response(leader="other", generation=2))
    answer, change = m.on_sync(sync_response(assignment=encode_assignment(KEYRANGE, {TP: [equal_shares(2)[0]]})))
    assert answer == Answer.OK and m.generation == 2 and change.revoked == {TP: [equal_shares(2)[1]]}


def test_a_sync_from_an_unknown_member_loses_what_it_owned():
    m = _rejoining_owner()
    m.on_join(join_response(leader="other", generation=2))
    assert m.on_sync(sync_response(ErrorCode.UNKNOWN_MEMBER_ID)) == (Answer.LOST, None)
    assert m.take_lost() == {TP: []} and m.member_id == "" and m.generation == -1


def test_heartbeat_answers():
    m = membership()
    m.subscribe(["orders"])
    m.join_request(9)
    m.on_join(join_response(leader="other"))
    m.on_sync(sync_response(assignment=encode_assignment(KEYRANGE, {TP: []})))
    assert m.on_heartbeat(heartbeat_response(0)) == Answer.OK
    assert m.on_heartbeat(heartbeat_response(ErrorCode.REBALANCE_IN_PROGRESS)) == Answer.JOIN
    assert m.owned == {TP: []}, "a rebalance keeps what the member owns (cooperative)"
    assert m.on_heartbeat(heartbeat_response(ErrorCode.ILLEGAL_GENERATION)) == Answer.LOST
    assert m.take_lost() == {TP: []} and m.owned == {} and m.generation == -1 and m.needs_join
    with pytest.raises(KafkaError, match="FENCED_INSTANCE_ID"):
        m.on_heartbeat(heartbeat_response(ErrorCode.FENCED_INSTANCE_ID))


def test_static_members_do_not_send_leave_group():
    dynamic, static = membership(), membership(instance_id="host-1")
    for m in (dynamic, static):
        m.subscribe(["orders"])
        m.join_request(9)
        m.on_join(join_response(leader="other"))
    assert dynamic.leave_request(5, "closing").members[0].member_id == "m1"
    assert static.leave_request(5, "closing") is None
    assert static.join_request(9).group_instance_id == "host-1"


def test_range_set_arithmetic():
    a, b = equal_shares(2)
    assert difference({TP: []}, {TP: [a]}) == {TP: [b]}
    assert union({TP: [a]}, {TP: [b]}) == {TP: []}
    assert difference({TP: [a]}, {TP: []}) == {}
