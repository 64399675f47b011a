"""Typed errors of the key-range consumer.

Broker error codes surface as ``KafkaError`` subclasses carrying the code and the Kafka
name, so callers can catch a family (``RetriableError``) or one kind
(``OffsetOutOfRangeError``) without comparing numbers.
"""

from __future__ import annotations

from proxy.protocol.constants import ErrorCode


class ConsumerError(Exception):
    """Base of every error the consumer raises itself."""


class ConfigError(ConsumerError, ValueError):
    """A consumer setting that is missing, of the wrong type, or out of range."""


class IllegalStateError(ConsumerError):
    """The call does not fit the consumer's state (for example a partition not assigned)."""


class RangeFetchNotSupportedError(ConsumerError):
    """A key-range assignment, but the cluster (the proxy) does not advertise
    ``keyrange.fetch`` on the connection that would serve it: it cannot filter by range."""


class CooperativeFetchNotSupportedError(ConsumerError):
    """A cooperative assignment, but the cluster (the proxy) does not advertise
    ``cooperative.fetch`` on the connection that would serve it: nobody there hands out
    chunks, and a plain broker would give every member the whole partition."""


class ConsumerConnectionError(ConsumerError):
    """No bootstrap server answered within the request timeout."""


class KafkaError(ConsumerError):
    """An error code from the cluster. ``code`` is Kafka's number, ``name`` its name."""

    code: int = -1
    name: str = "UNKNOWN_SERVER_ERROR"
    retriable: bool = False

    def __init__(self, message: str = "", *, code: int | None = None, name: str | None = None) -> None:
        if code is not None:
            self.code = code
        if name is not None:
            self.name = name
        detail = f": {message}" if message else ""
        super().__init__(f"{self.name} ({self.code}){detail}")

    @staticmethod
    def for_code(code: int, message: str = "") -> KafkaError:
        """The typed error for a broker error code (a plain ``KafkaError`` when unlisted)."""
        cls = _BY_CODE.get(code)
        if cls is not None:
            return cls(message)
        return KafkaError(message, code=code, name=ERROR_NAMES.get(code, f"UNKNOWN_ERROR_CODE_{code}"))


class RetriableError(KafkaError):
    retriable = True


class OffsetOutOfRangeError(KafkaError):
    """The position is outside the partition's log and ``auto_offset_reset`` is "none"."""

    code, name = ErrorCode.OFFSET_OUT_OF_RANGE, "OFFSET_OUT_OF_RANGE"


class CommitFailedError(ConsumerError):
    """The member left its group because it did not poll within ``max_poll_interval_ms``
    (KIP-62): what it processed since may be handed to others, so nothing of it is
    committed. The next ``poll`` reports the partitions lost and joins again."""


class NoOffsetForPartitionError(ConsumerError):
    """No position for a partition and ``auto_offset_reset`` is "none"; ``seek`` first."""


class CorruptRecordError(KafkaError):
    code, name = ErrorCode.CORRUPT_MESSAGE, "CORRUPT_MESSAGE"


class UnknownTopicOrPartitionError(RetriableError):
    code, name = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "UNKNOWN_TOPIC_OR_PARTITION"


class LeaderNotAvailableError(RetriableError):
    code, name = ErrorCode.LEADER_NOT_AVAILABLE, "LEADER_NOT_AVAILABLE"


class NotLeaderOrFollowerError(RetriableError):
    code, name = ErrorCode.NOT_LEADER_OR_FOLLOWER, "NOT_LEADER_OR_FOLLOWER"


class RequestTimedOutError(RetriableError):
    code, name = ErrorCode.REQUEST_TIMED_OUT, "REQUEST_TIMED_OUT"


class ReplicaNotAvailableError(RetriableError):
    code, name = ErrorCode.REPLICA_NOT_AVAILABLE, "REPLICA_NOT_AVAILABLE"


class CoordinatorLoadInProgressError(RetriableError):
    code, name = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "COORDINATOR_LOAD_IN_PROGRESS"


class CoordinatorNotAvailableError(RetriableError):
    code, name = ErrorCode.COORDINATOR_NOT_AVAILABLE, "COORDINATOR_NOT_AVAILABLE"


class NotCoordinatorError(RetriableError):
    code, name = ErrorCode.NOT_COORDINATOR, "NOT_COORDINATOR"


class IllegalGenerationError(KafkaError):
    code, name = ErrorCode.ILLEGAL_GENERATION, "ILLEGAL_GENERATION"


class RebalanceInProgressError(RetriableError):
    """A group request during a rebalance (for example a commit between JoinGroup and
    SyncGroup); what it carried stays pending, so commit again shortly."""

    code, name = ErrorCode.REBALANCE_IN_PROGRESS, "REBALANCE_IN_PROGRESS"


class FencedInstanceIdError(KafkaError):
    """Another consumer joined with the same group_instance_id (static membership)."""

    code, name = ErrorCode.FENCED_INSTANCE_ID, "FENCED_INSTANCE_ID"


class UnknownMemberIdError(KafkaError):
    code, name = ErrorCode.UNKNOWN_MEMBER_ID, "UNKNOWN_MEMBER_ID"


class GroupAuthorizationFailedError(KafkaError):
    code, name = ErrorCode.GROUP_AUTHORIZATION_FAILED, "GROUP_AUTHORIZATION_FAILED"


class TopicAuthorizationFailedError(KafkaError):
    code, name = ErrorCode.TOPIC_AUTHORIZATION_FAILED, "TOPIC_AUTHORIZATION_FAILED"


class UnsupportedVersionError(KafkaError):
    code, name = ErrorCode.UNSUPPORTED_VERSION, "UNSUPPORTED_VERSION"


class InvalidRequestError(KafkaError):
    code, name = ErrorCode.INVALID_REQUEST, "INVALID_REQUEST"


class KafkaStorageError(RetriableError):
    code, name = ErrorCode.KAFKA_STORAGE_ERROR, "KAFKA_STORAGE_ERROR"


class FencedLeaderEpochError(RetriableError):
    code, name = ErrorCode.FENCED_LEADER_EPOCH, "FENCED_LEADER_EPOCH"


class UnknownLeaderEpochError(RetriableError):
    code, name = ErrorCode.UNKNOWN_LEADER_EPOCH, "UNKNOWN_LEADER_EPOCH"


class OffsetNotAvailableError(RetriableError):
    code, name = ErrorCode.OFFSET_NOT_AVAILABLE, "OFFSET_NOT_AVAILABLE"


class NetworkExceptionError(RetriableError):
    """No connection to the cluster could be had for a call (``commit``): retry it later;
    what it would have sent is still pending."""

    code, name = ErrorCode.NETWORK_EXCEPTION, "NETWORK_EXCEPTION"


class UnknownTopicIdError(RetriableError):
    code, name = ErrorCode.UNKNOWN_TOPIC_ID, "UNKNOWN_TOPIC_ID"


class InconsistentTopicIdError(RetriableError):
    code, name = ErrorCode.INCONSISTENT_TOPIC_ID, "INCONSISTENT_TOPIC_ID"


_BY_CODE: dict[int, type[KafkaError]] = {
    cls.code: cls
    for cls in (
        OffsetOutOfRangeError, CorruptRecordError, UnknownTopicOrPartitionError, LeaderNotAvailableError,
        NotLeaderOrFollowerError, RequestTimedOutError, ReplicaNotAvailableError, CoordinatorLoadInProgressError,
        CoordinatorNotAvailableError, NotCoordinatorError, IllegalGenerationError, UnknownMemberIdError,
        GroupAuthorizationFailedError, RebalanceInProgressError, FencedInstanceIdError,
        TopicAuthorizationFailedError, UnsupportedVersionError, InvalidRequestError, KafkaStorageError,
        FencedLeaderEpochError, UnknownLeaderEpochError, OffsetNotAvailableError, UnknownTopicIdError,
        InconsistentTopicIdError, NetworkExceptionError,
    )
}

# Names for the messages of plain KafkaErrors: every code the protocol constants list, and
# two more a fetch path can meet.
ERROR_NAMES: dict[int, str] = {
    **{int(code): code.name for code in ErrorCode},
    57: "LOG_DIR_NOT_FOUND",
    58: "SASL_AUTHENTICATION_FAILED",
}

# Partition errors after which the consumer refreshes metadata and retries with back-off.
METADATA_REFRESH_CODES = frozenset({
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.REPLICA_NOT_AVAILABLE, ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.OFFSET_NOT_AVAILABLE, ErrorCode.UNKNOWN_TOPIC_ID,
    ErrorCode.INCONSISTENT_TOPIC_ID,
})

# Group-request errors after which the consumer finds the coordinator again and retries.
# UNSTABLE_OFFSET_COMMIT (88): a transactional offset commit is pending; retry shortly.
COORDINATOR_RETRY_CODES = frozenset({
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR,
    ErrorCode.UNSTABLE_OFFSET_COMMIT,
})
