"""Group membership as a state machine without I/O (docs/wire-contract.md section 8).

Events in (a JoinGroup, SyncGroup or Heartbeat answer, a revocation completed, the poll
interval expired), requests and outcomes out. The trio edge (``group``) sends what this
builds and feeds the answers back; every rule (which error means rejoin, which means the
partitions are lost, what the subscription claims, when the follow-up rebalance starts)
lives here and is unit-tested with plain values.

Ownership follows the cooperative protocol (KIP-429): a member keeps what it owns through a
rebalance, and keeps claiming ranges it is revoking until the application has finished
them; only then does it drop them and rejoin, so that the leader hands them on in the
follow-up rebalance.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from proxy.client.errors import KafkaError
from proxy.client.group_assignor import (
    Assignment,
    MemberInfo,
    assign,
    cooperative_topics,
    subtract,
    to_intervals,
    to_ranges,
    withhold_moving,
)
from proxy.client.group_protocol import (
    ASSIGNORS,
    KEYRANGE,
    SHARING_KEYRANGE,
    decode_assignment_sharing,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    heartbeat_request,
    join_group_request,
    leave_group_request,
    sync_group_request,
)
from proxy.client.records import TopicPartition
from proxy.protocol.constants import ErrorCode
from proxy.protocol.message_types import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    SyncGroupRequest,
    SyncGroupResponse,
)
from proxy.ranges import KeyRange

MEMBER_ID_REQUIRED = 79
FENCED_INSTANCE_ID = 82


class Phase(enum.Enum):
    UNJOINED = "unjoined"  # not in the group (never joined, left, or lost)
    JOINING = "joining"  # a JoinGroup is out
    SYNCING = "syncing"  # joined, a SyncGroup is out
    STABLE = "stable"  # has an assignment of the current generation


class Answer(enum.Enum):
    """What the edge does after an answer."""

    OK = "ok"
    JOIN = "join"  # send JoinGroup (again)
    SYNC = "sync"  # send SyncGroup (as leader: compute the assignment first)
    LOST = "lost"  # the owned partitions are lost: the application runs on_lost, then join


@dataclass
class Change:
    """A new assignment: what to start fetching and what to revoke."""

    assignment: Assignment
    added: Assignment
    revoked: Assignment
    cooperative: frozenset[TopicPartition] = frozenset()  # of ``assignment``: fetched cooperatively


@dataclass
class Membership:
    group: str
    instance_id: str | None
    session_timeout_ms: int
    rebalance_timeout_ms: int
    allows_ranges: bool
    partition_sharing: str = SHARING_KEYRANGE  # what the subscription says: "keyrange" or "cooperative"
    topics: list[str] = field(default_factory=list)
    member_id: str = ""
    # The generation whose assignment ``owned`` holds: what the subscription claims with,
    # what heartbeats and commits carry. It becomes the JoinGroup's generation only once
    # that generation's SyncGroup hands out its assignment.
    generation: int = -1
    joined_generation: int = -1  # the last JoinGroup's, for its SyncGroup
    protocol: str | None = None
    leader_id: str = ""
    phase: Phase = Phase.UNJOINED
    owned: Assignment = field(default_factory=dict)  # held now, revocations not finished included
    revoking: Assignment = field(default_factory=dict)
    rejoin_needed: bool = False
    members: list[JoinGroupResponse.JoinGroupResponseMember] = field(default_factory=list)  # the leader's JoinGroup members
    lost_owned: Assignment = field(default_factory=dict)
    cooperative: frozenset[TopicPartition] = frozenset()  # of the last assignment: fetched cooperatively

    # -- subscription ----------------------------------------------------------------------
    def subscribe(self, topics: Sequence[str]) -> None:
        if sorted(topics) != self.topics:
            self.topics = sorted(topics)
            self.rejoin_needed = True

    @property
    def needs_join(self) -> bool:
        """Whether the edge should send a JoinGroup now: subscribed, and either not in the
        group or asked to rejoin, and no revocation still running (the follow-up rebalance
        waits for it)."""
        if not self.topics or self.phase in (Phase.JOINING, Phase.SYNCING) or self.revoking:
            return False
        return self.phase == Phase.UNJOINED or self.rejoin_needed

    @property
    def is_leader(self) -> bool:
        return bool(self.member_id) and self.member_id == self.leader_id

    # -- JoinGroup -------------------------------------------------------------------------
    def join_request(self, version: int, reason: str | None = None) -> JoinGroupRequest:
        self.phase = Phase.JOINING
        self.rejoin_needed = False
        protocols = [(name, encode_subscription(name, self.topics, self.owned, allows_ranges=self.allows_ranges,
                                                generation=self.generation, sharing=self.partition_sharing))
                     for name in ASSIGNORS]
        return join_group_request(version, self.group, self.member_id, self.instance_id,
                                  session_timeout_ms=self.session_timeout_ms,
                                  rebalance_timeout_ms=self.rebalance_timeout_ms, protocols=protocols, reason=reason)

    def on_join(self, response: JoinGroupResponse) -> Answer:
        code = response.error_code
        if code == ErrorCode.NONE:
            self.member_id = response.member_id
            self.joined_generation = response.generation_id
            self.protocol = response.protocol_name
            self.leader_id = response.leader
            self.members = list(response.members) if self.is_leader else []
            self.phase = Phase.SYNCING
            return Answer.SYNC
        self.phase = Phase.UNJOINED
        if code == MEMBER_ID_REQUIRED:  # KIP-394: join again with the id the coordinator gave
            self.member_id = response.member_id
            return Answer.JOIN
        if code == ErrorCode.REBALANCE_IN_PROGRESS:
            return Answer.JOIN
        if code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION):
            return self._lose(code)
        raise KafkaError.for_code(code, f"JoinGroup of group {self.group!r}")

    # -- the leader's assignment -----------------------------------------------------------
    def subscribed_topics(self) -> list[str]:
        """Every topic some member subscribes to (what the leader needs metadata of)."""
        topics: set[str] = set(self.topics)
        for member in self.members:
            topics |= self._subscription(member).topics
        return sorted(topics)

    def _subscription(self, member: JoinGroupResponse.JoinGroupResponseMember) -> MemberInfo:
        return decode_subscription(self.protocol or KEYRANGE, member.member_id, bytes(member.metadata))

    def assignments(self, partitions: Mapping[str, Sequence[int]]) -> dict[str, bytes]:
        """The leader's SyncGroup assignments: the target balance, minus the hash space
        another member still owns (the first of the two cooperative rebalances); the
        partitions of topics shared cooperatively are named as such and never withheld."""
        infos = [self._subscription(member) for member in self.members]
        ranges = self.protocol == KEYRANGE
        target = assign(infos, partitions, ranges=ranges)
        shared = cooperative_topics(infos, partitions, ranges=ranges)
        first = withhold_moving(target, infos, shared)
        return {member_id: encode_assignment(self.protocol or KEYRANGE, a, [tp for tp in a if tp.topic in shared])
                for member_id, a in first.items()}

    # -- SyncGroup -------------------------------------------------------------------------
    def sync_request(self, version: int, assignments: Mapping[str, bytes]) -> SyncGroupRequest:
        return sync_group_request(version, self.group, self.joined_generation, self.member_id, self.instance_id,
                                  self.protocol or KEYRANGE, assignments if self.is_leader else {})

    def on_sync(self, response: SyncGroupResponse) -> tuple[Answer, Change | None]:
        code = response.error_code
        if code == ErrorCode.NONE:
            new, shared = decode_assignment_sharing(self.protocol or KEYRANGE, bytes(response.assignment or b""))
            revoked = difference(self.owned, new)
            added = difference(new, self.owned)
            # what is being revoked stays owned (and claimed) until the application is done
            self.revoking = union(self.revoking, revoked)
            self.owned = union(new, self.revoking)
            self.cooperative = shared
            self.generation = self.joined_generation
            self.phase = Phase.STABLE
            self.members = []
            return Answer.OK, Change(new, added, revoked, shared)
        self.phase = Phase.UNJOINED
        if code in (ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION):
            # The generation just joined is gone (a newer rebalance began, or a new
            # coordinator never learned of it: the old one stopped before storing it), but
            # what this member owns is still that of ``self.generation``: it joins again
            # claiming it, and the assignor weighs the claim by that generation. Treating
            # it as lost would hand the ranges to others from a commit behind this
            # member's position.
            return Answer.JOIN, None
        if code == ErrorCode.UNKNOWN_MEMBER_ID:
            return self._lose(code), None
        raise KafkaError.for_code(code, f"SyncGroup of group {self.group!r}")

    def revoked(self, done: Mapping[TopicPartition, Sequence[KeyRange]]) -> None:
        """The application finished revoking ``done``: stop claiming it and rejoin, so the
        follow-up rebalance hands it on."""
        self.revoking = difference(self.revoking, done)
        self.owned = difference(self.owned, done)
        self.rejoin_needed = True

    # -- Heartbeat -------------------------------------------------------------------------
    def heartbeat_request(self, version: int) -> HeartbeatRequest:
        return heartbeat_request(version, self.group, self.generation, self.member_id, self.instance_id)

    def on_heartbeat(self, response: HeartbeatResponse) -> Answer:
        code = response.error_code
        if code == ErrorCode.NONE:
            return Answer.OK
        if code == ErrorCode.REBALANCE_IN_PROGRESS:
            self.rejoin_needed = True
            return Answer.JOIN
        if code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION):
            return self._lose(code)
        raise KafkaError.for_code(code, f"Heartbeat of group {self.group!r}")

    # -- leaving and losing ----------------------------------------------------------------
    def leave_request(self, version: int, reason: str) -> LeaveGroupRequest | None:
        """LeaveGroup, or None when there is nothing to leave. A static member does not
        leave (KIP-345): its session timeout removes it, so a restart keeps its share."""
        request = None
        if self.member_id and self.instance_id is None and self.phase != Phase.UNJOINED:
            request = leave_group_request(version, self.group, self.member_id, self.instance_id, reason)
        return request

    def left(self) -> Answer:
        """Out of the group (LeaveGroup sent, or the poll interval expired): what it owned
        is lost; a later poll joins again as a new member."""
        return self._lose(ErrorCode.UNKNOWN_MEMBER_ID)

    def _lose(self, code: int) -> Answer:
        if code == ErrorCode.UNKNOWN_MEMBER_ID:
            self.member_id = ""
        self.generation = self.joined_generation = -1
        self.phase = Phase.UNJOINED
        self.lost_owned = union(self.lost_owned, self.owned)
        self.owned, self.revoking = {}, {}
        self.cooperative = frozenset()
        return Answer.LOST if self.lost_owned else Answer.JOIN

    def take_lost(self) -> Assignment:
        lost, self.lost_owned = self.lost_owned, {}
        return lost


# -- range-level set arithmetic on assignments ------------------------------------------------
def difference(a: Mapping[TopicPartition, Sequence[KeyRange]], b: Mapping[TopicPartition, Sequence[KeyRange]]
               ) -> Assignment:
    out: Assignment = {}
    for tp, ranges in a.items():
        rest = subtract(to_intervals(ranges), to_intervals(b[tp])) if tp in b else to_intervals(ranges)
        if rest:
            out[tp] = to_ranges(rest)
    return out


def union(a: Mapping[TopicPartition, Sequence[KeyRange]], b: Mapping[TopicPartition, Sequence[KeyRange]]
          ) -> Assignment:
    out: Assignment = {tp: list(r) for tp, r in a.items()}
    for tp, ranges in b.items():
        out[tp] = to_ranges(to_intervals(out[tp]) + to_intervals(ranges)) if tp in out else list(ranges)
    return out
