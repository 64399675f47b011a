"""Which key ranges a Fetch request asks for, per partition, across fetch sessions.

Pure functions and plain state: no sockets, no clocks. The connection-side code feeds
each decoded FetchRequest here and gets back, for every partition that must be filtered,
its effective ranges, and for every partition whose ranges are unacceptable, the reason.

Rules (docs/wire-contract.md#32-fetch):
- A partition's own ``KeyRanges`` win over the request's top-level ``KeyRanges``.
- Absent (null) means "no change": a new partition is then whole, a partition already in
  the fetch session keeps the ranges it had. An explicit empty list means the whole
  partition again.
- In a fetch session (KIP-227) ranges stay in force for later incremental requests until
  the partition is re-sent with other ranges, or forgotten, or the session ends.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from proxy.protocol.constants import (
    FETCH_SESSION_FINAL_EPOCH,
    FETCH_SESSION_INITIAL_EPOCH,
    FETCH_SESSIONLESS_ID,
    ErrorCode,
)
from proxy.protocol.message_types import FetchRequest, FetchResponse
from proxy.ranges import KeyRange, validate_ranges

# Session ids and epochs as Kafka defines them (KIP-227).
INITIAL_EPOCH = FETCH_SESSION_INITIAL_EPOCH
FINAL_EPOCH = FETCH_SESSION_FINAL_EPOCH
NO_SESSION = FETCH_SESSIONLESS_ID
INVALID_REQUEST = ErrorCode.INVALID_REQUEST

TopicKey = str | uuid.UUID  # a topic name (Fetch v12) or a topic id (v13+)
PartitionKey = tuple[TopicKey, int]
# the entries of a Fetch that name a topic
NamedTopic = FetchRequest.FetchTopic | FetchRequest.ForgottenTopic | FetchResponse.FetchableTopicResponse


def _wire_ranges(value: Sequence[FetchRequest.KeyRange] | None) -> tuple[KeyRange, ...] | None:
    if value is None:
        return None
    return tuple(KeyRange(r.start, r.end) for r in value)


@dataclass(slots=True)
class RequestRanges:
    """The outcome for one request.

    ``filtered``: partition -> the ranges to filter it by (never empty; a whole-partition
    request with explicit ranges yields ``(FULL_RANGE,)``). Partitions absent from it are
    forwarded untouched. ``invalid``: partition -> the reason its ranges are refused.
    ``session_id``/``epoch``: as the client sent them.
    """

    filtered: dict[PartitionKey, tuple[KeyRange, ...]] = field(default_factory=dict)
    invalid: dict[PartitionKey, str] = field(default_factory=dict)
    session_id: int = NO_SESSION
    epoch: int = FINAL_EPOCH

    @property
    def uses_ranges(self) -> bool:
        return bool(self.filtered or self.invalid)


def topic_key(topic: NamedTopic) -> TopicKey:
    """How a FetchTopic / FetchableTopicResponse / ForgottenTopic is named in this version
    (its id is zero before v13)."""
    topic_id = topic.topic_id
    if topic_id.int != 0:
        return topic_id
    return topic.topic


class FetchRangeSessions:
    """The ranges in force per fetch session of one client connection.

    ``pending`` holds the ranges of a request that creates a session until its response
    reveals the new session id (``bind_new_session``).
    """

    def __init__(self, max_sessions: int = 64) -> None:
        self.sessions: dict[int, dict[PartitionKey, tuple[KeyRange, ...]]] = {}
        self.max_sessions = max_sessions

    def resolve(self, request: FetchRequest) -> RequestRanges:
        session_id = request.session_id
        epoch = request.session_epoch
        out = RequestRanges(session_id=session_id, epoch=epoch)
        incremental = session_id != NO_SESSION and epoch > INITIAL_EPOCH
        previous = self.sessions.get(session_id, {}) if incremental else {}
        current: dict[PartitionKey, tuple[KeyRange, ...]] = dict(previous)
        default = _wire_ranges(request.key_ranges)
        for topic in request.topics:
            key = topic_key(topic)
            for partition in topic.partitions:
                pk = (key, partition.partition)
                own = _wire_ranges(partition.key_ranges)
                chosen = own if own is not None else default
                if chosen is None:
                    if pk not in previous:
                        current.pop(pk, None)
                    continue
                if not chosen:  # explicit empty list: the whole partition again
                    current.pop(pk, None)
                    continue
                reason = validate_ranges(chosen)
                if reason is not None:
                    out.invalid[pk] = reason
                    current.pop(pk, None)
                    continue
                current[pk] = chosen
        if incremental:
            for forgotten in request.forgotten_topics_data or ():
                key = topic_key(forgotten)
                for index in forgotten.partitions:
                    current.pop((key, index), None)
        out.filtered = current
        if session_id != NO_SESSION and epoch == FINAL_EPOCH:
            self.sessions.pop(session_id, None)  # the client closes its session
        elif incremental:
            self.sessions[session_id] = current
        return out

    def bind_new_session(self, session_id: int, ranges: RequestRanges) -> None:
        """A full request (epoch 0) created broker session ``session_id``: its ranges now
        belong to that session."""
        if session_id == NO_SESSION:
            return
        if len(self.sessions) >= self.max_sessions and session_id not in self.sessions:
            self.sessions.pop(next(iter(self.sessions)))  # oldest first: clients keep one or two
        self.sessions[session_id] = dict(ranges.filtered)

    def forget_session(self, session_id: int) -> None:
        self.sessions.pop(session_id, None)

