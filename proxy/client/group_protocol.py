"""The classic group protocol as the consumer speaks it, sans I/O (docs/wire-contract.md section 8).

JoinGroup, SyncGroup, Heartbeat and LeaveGroup bodies, and the standard consumer-protocol
Subscription and Assignment (Kafka's ``ConsumerProtocolSubscription`` /
``ConsumerProtocolAssignment``) that travel inside them. Our ranges ride in their UserData
(``KeyRangeSubscriptionUserData`` / ``KeyRangeAssignmentUserData`` in ``protocol_schemas/``),
so a standard tool still reads the partitions; for ``cooperative-sticky`` the UserData is
what Java's assignor writes there (the generation as an int32), so a Java leader reads us.
The subscription's tagged ``PartitionSharing`` says whether the member shares partitions by
key range or cooperatively; the assignment's tagged ``CooperativePartitions`` names the
whole partitions it fetches cooperatively (docs/wire-contract.md#37-cooperative-fetch).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence

from proxy.client.group_assignor import Assignment, MemberInfo
from proxy.client.records import TopicPartition
from proxy.protocol import messages
from proxy.protocol.errors import ProtocolError
from proxy.protocol.message_types import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    HeartbeatRequest,
    JoinGroupRequest,
    KeyRangeAssignmentUserData,
    KeyRangeSubscriptionUserData,
    LeaveGroupRequest,
    LeaveGroupResponse,
    SyncGroupRequest,
)
from proxy.protocol.messages import ApiKey
from proxy.ranges import KeyRange, validate_ranges

PROTOCOL_TYPE = "consumer"
KEYRANGE = "keyrange"
COOPERATIVE_STICKY = "cooperative-sticky"
ASSIGNORS = (KEYRANGE, COOPERATIVE_STICKY)  # our preference order
SUBSCRIPTION = "ConsumerProtocolSubscription"
ASSIGNMENT = "ConsumerProtocolAssignment"
SUBSCRIPTION_DATA = "KeyRangeSubscriptionUserData"
ASSIGNMENT_DATA = "KeyRangeAssignmentUserData"
SUBSCRIPTION_VERSION = 3  # OwnedPartitions (v1), GenerationId (v2), RackId (v3)
ASSIGNMENT_VERSION = 3
SHARING_KEYRANGE = "keyrange"
SHARING_COOPERATIVE = "cooperative"
_INT32 = struct.Struct(">i")

# the versions of docs/wire-contract.md section 8: JoinGroup v9+, SyncGroup v5+, Heartbeat v4+, LeaveGroup v5+
GROUP_VERSIONS: Mapping[int, tuple[int, int]] = {
    ApiKey.JOIN_GROUP: (9, 9), ApiKey.SYNC_GROUP: (5, 5), ApiKey.HEARTBEAT: (4, 4), ApiKey.LEAVE_GROUP: (5, 5),
}


def _by_topic(assignment: Mapping[TopicPartition, Sequence[KeyRange]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for tp in sorted(assignment):
        out.setdefault(tp.topic, []).append(tp.partition)
    return out


def _partial(assignment: Mapping[TopicPartition, Sequence[KeyRange]]) -> dict[str, dict[int, Sequence[KeyRange]]]:
    """The partitions assigned only in part, with their ranges, by topic."""
    topics: dict[str, dict[int, Sequence[KeyRange]]] = {}
    for tp in sorted(assignment):
        ranges = assignment[tp]
        if ranges:
            topics.setdefault(tp.topic, {})[tp.partition] = ranges
    return topics


def _owned_ranges(owned: Mapping[TopicPartition, Sequence[KeyRange]]) -> list[KeyRangeSubscriptionUserData.OwnedTopic]:
    """Subscription UserData: the partitions owned only in part, with their ranges."""
    data = KeyRangeSubscriptionUserData
    return [data.OwnedTopic(topic=name, partitions=[
        data.OwnedPartition(partition=partition, ranges=[data.OwnedRange(start=r.start, end=r.end) for r in ranges])
        for partition, ranges in parts.items()]) for name, parts in _partial(owned).items()]


def _assigned_ranges(
        assignment: Mapping[TopicPartition, Sequence[KeyRange]]) -> list[KeyRangeAssignmentUserData.AssignedTopic]:
    """Assignment UserData: the partitions assigned only in part, with their ranges."""
    data = KeyRangeAssignmentUserData
    return [data.AssignedTopic(topic=name, partitions=[
        data.AssignedPartition(partition=partition, ranges=[data.AssignedRange(start=r.start, end=r.end) for r in ranges])
        for partition, ranges in parts.items()]) for name, parts in _partial(assignment).items()]


def _ranges_of(data_topics: Sequence[KeyRangeSubscriptionUserData.OwnedTopic]
               | Sequence[KeyRangeAssignmentUserData.AssignedTopic], where: str) -> dict[TopicPartition, list[KeyRange]]:
    out: dict[TopicPartition, list[KeyRange]] = {}
    for topic in data_topics:
        for part in topic.partitions:
            ranges = [KeyRange(r.start, r.end) for r in part.ranges]
            reason = validate_ranges(ranges)
            if reason or not ranges:
                raise ProtocolError(f"{where}: {topic.topic}-{part.partition}: {reason or 'no ranges'}")
            out[TopicPartition(topic.topic, part.partition)] = ranges
    return out


# -- subscription -------------------------------------------------------------------------
def encode_subscription(protocol: str, topics: Sequence[str], owned: Mapping[TopicPartition, Sequence[KeyRange]],
                        *, allows_ranges: bool, generation: int, sharing: str = SHARING_KEYRANGE) -> bytes:
    """A member's JoinGroup metadata for ``protocol``: the topics, the partitions it owns,
    and (keyrange) its ranges, whether it allows individual commit and how it shares a
    partition (``sharing``: "keyrange" or "cooperative")."""
    cls = ConsumerProtocolSubscription
    if protocol == KEYRANGE:
        user_data = messages.encode_data(SUBSCRIPTION_DATA, KeyRangeSubscriptionUserData(
            allow_individual_commit=allows_ranges, owned_ranges=_owned_ranges(owned), partition_sharing=sharing))
    else:
        user_data = _INT32.pack(generation)  # what Java's CooperativeStickyAssignor writes
    value = cls(
        topics=sorted(topics), user_data=user_data, generation_id=generation, rack_id=None,
        owned_partitions=[cls.TopicPartition(topic=t, partitions=p) for t, p in _by_topic(owned).items()])
    return messages.encode_data(SUBSCRIPTION, value, SUBSCRIPTION_VERSION)


def decode_subscription(protocol: str, member_id: str, metadata: bytes) -> MemberInfo:
    """A member's subscription as the leader's assignor needs it. A member without our
    UserData (a standard client) owns whole partitions and does not share by range."""
    value = messages.decode_data_as(ConsumerProtocolSubscription, metadata)
    owned: dict[TopicPartition, list[KeyRange]] = {
        TopicPartition(t.topic, p): [] for t in value.owned_partitions or () for p in t.partitions}
    allows_ranges = cooperative = False
    generation = value.generation_id if value.generation_id is not None else -1
    user_data = bytes(value.user_data) if value.user_data is not None else b""
    if protocol == KEYRANGE and user_data:
        data = messages.decode_data_as(KeyRangeSubscriptionUserData, user_data)
        allows_ranges = bool(data.allow_individual_commit)
        cooperative = data.partition_sharing == SHARING_COOPERATIVE  # anything else (a newer mode): by key range
        for tp, ranges in _ranges_of(data.owned_ranges, f"subscription of {member_id}").items():
            if tp in owned:
                owned[tp] = ranges
    elif generation < 0 and len(user_data) == 4:
        generation = _INT32.unpack(user_data)[0]
    return MemberInfo(member_id, frozenset(value.topics), owned, allows_ranges, generation, cooperative)


# -- assignment ---------------------------------------------------------------------------
def encode_assignment(protocol: str, assignment: Mapping[TopicPartition, Sequence[KeyRange]],
                      cooperative: Iterable[TopicPartition] = ()) -> bytes:
    """A member's SyncGroup assignment; ``cooperative``: the (whole) partitions of it the
    member fetches cooperatively (keyrange only)."""
    cls = ConsumerProtocolAssignment
    user_data = None
    if protocol == KEYRANGE:
        data = KeyRangeAssignmentUserData
        shared = _by_topic({TopicPartition(*tp): [] for tp in cooperative})
        user_data = messages.encode_data(ASSIGNMENT_DATA, data(
            assigned_ranges=_assigned_ranges(assignment),
            cooperative_partitions=[data.CooperativeTopic(topic=t, partitions=p) for t, p in shared.items()]))
    value = cls(
        user_data=user_data,
        assigned_partitions=[cls.TopicPartition(topic=t, partitions=p) for t, p in _by_topic(assignment).items()])
    return messages.encode_data(ASSIGNMENT, value, ASSIGNMENT_VERSION)


def decode_assignment(protocol: str, data: bytes) -> Assignment:
    """What SyncGroup gave this member: each partition's ranges, [] for a whole one. An
    empty answer (a member the leader left out) is an empty assignment."""
    return decode_assignment_sharing(protocol, data)[0]


def decode_assignment_sharing(protocol: str, data: bytes) -> tuple[Assignment, frozenset[TopicPartition]]:
    """``decode_assignment``, and the partitions of it to fetch cooperatively (each
    assigned whole)."""
    if not data:
        return {}, frozenset()
    value = messages.decode_data_as(ConsumerProtocolAssignment, data)
    out: Assignment = {TopicPartition(t.topic, p): [] for t in value.assigned_partitions for p in t.partitions}
    shared: set[TopicPartition] = set()
    if protocol == KEYRANGE and value.user_data:
        user_data = messages.decode_data_as(KeyRangeAssignmentUserData, bytes(value.user_data))
        for tp, rs in _ranges_of(user_data.assigned_ranges, "assignment").items():
            if tp not in out:
                raise ProtocolError(f"assignment: ranges for {tp.topic}-{tp.partition}, which is not assigned")
            out[tp] = rs
        for topic in user_data.cooperative_partitions or ():
            for partition in topic.partitions:
                tp = TopicPartition(topic.topic, partition)
                if tp not in out or out[tp]:
                    raise ProtocolError(f"assignment: {tp.topic}-{tp.partition} is to be fetched cooperatively, "
                                        f"but it is {'assigned key ranges' if tp in out else 'not assigned'}")
                shared.add(tp)
    return out, frozenset(shared)


# -- requests -----------------------------------------------------------------------------
def join_group_request(version: int, group: str, member_id: str, instance_id: str | None, *,
                       session_timeout_ms: int, rebalance_timeout_ms: int, protocols: Sequence[tuple[str, bytes]],
                       reason: str | None = None) -> JoinGroupRequest:
    cls = JoinGroupRequest
    return cls(
        group_id=group, session_timeout_ms=session_timeout_ms,
        rebalance_timeout_ms=rebalance_timeout_ms, member_id=member_id, group_instance_id=instance_id,
        protocol_type=PROTOCOL_TYPE, reason=reason,
        protocols=[cls.JoinGroupRequestProtocol(name=name, metadata=metadata) for name, metadata in protocols])


def sync_group_request(version: int, group: str, generation: int, member_id: str, instance_id: str | None,
                       protocol: str, assignments: Mapping[str, bytes]) -> SyncGroupRequest:
    cls = SyncGroupRequest
    return cls(
        group_id=group, generation_id=generation, member_id=member_id,
        group_instance_id=instance_id, protocol_type=PROTOCOL_TYPE, protocol_name=protocol,
        assignments=[cls.SyncGroupRequestAssignment(member_id=m, assignment=a) for m, a in sorted(assignments.items())])


def heartbeat_request(version: int, group: str, generation: int, member_id: str,
                      instance_id: str | None) -> HeartbeatRequest:
    return HeartbeatRequest(group_id=group, generation_id=generation, member_id=member_id,
                            group_instance_id=instance_id)


def leave_group_request(version: int, group: str, member_id: str, instance_id: str | None,
                        reason: str) -> LeaveGroupRequest:
    cls = LeaveGroupRequest
    return cls(group_id=group, members=[
        cls.MemberIdentity(member_id=member_id, group_instance_id=instance_id, reason=reason)])


def leave_error(response: LeaveGroupResponse) -> int:
    """The first error of a LeaveGroup response (the group's, else the member's)."""
    if response.error_code:
        return int(response.error_code)
    return next((int(m.error_code) for m in response.members or () if m.error_code), 0)
