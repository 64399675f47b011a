"""Typed errors of the key-range consumer.

Broker error codes surface as ``KafkaError`` subclasses carrying the code and the Kafka
name, so callers can catch a family (``RetriableError``) or one kind
(``OffsetOutOfRangeError``) without comparing numbers.
"""

from __future__ import annotations


class ConsumerError(Exception):
    """Base of every error the consumer raises itself."""


class ConfigError(ConsumerError, ValueError):
    """A consumer setting that is missing, of the wrong type, or out of range."""


class IllegalStateError(ConsumerError):
    """The call does not fit the consumer's state (for example a partition not assigned)."""


class RangeFetchNotSupportedError(ConsumerError):
    """A key-range assignment, but the cluster (the proxy) does not advertise
    ``keyrange.fetch`` on the connection that would serve it: it cannot filter by range."""


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
    def for_code(code: int, message: str = "") -> "KafkaError":
        """The typed error for a broker error code (a plain ``KafkaError`` when unlisted)."""
        cls = _BY_CODE.get(code)
        if cls is not None:
            return cls(message)
        return KafkaError(message, code=code, name=ERROR_NAMES.get(code, f"UNKNOWN_ERROR_CODE_{code}"))


class RetriableError(KafkaError):
    retriable = True


class OffsetOutOfRangeError(KafkaError):
    """The position is outside the partition's log and ``auto_offset_reset`` is "none"."""

    code, name = 1, "OFFSET_OUT_OF_RANGE"


class NoOffsetForPartitionError(ConsumerError):
    """No position for a partition and ``auto_offset_reset`` is "none"; ``seek`` first."""


class CorruptRecordError(KafkaError):
    code, name = 2, "CORRUPT_MESSAGE"


class UnknownTopicOrPartitionError(RetriableError):
    code, name = 3, "UNKNOWN_TOPIC_OR_PARTITION"


class LeaderNotAvailableError(RetriableError):
    code, name = 5, "LEADER_NOT_AVAILABLE"


class NotLeaderOrFollowerError(RetriableError):
    code, name = 6, "NOT_LEADER_OR_FOLLOWER"


class RequestTimedOutError(RetriableError):
    code, name = 7, "REQUEST_TIMED_OUT"


class ReplicaNotAvailableError(RetriableError):
    code, name = 9, "REPLICA_NOT_AVAILABLE"


class CoordinatorLoadInProgressError(RetriableError):
    code, name = 14, "COORDINATOR_LOAD_IN_PROGRESS"


class CoordinatorNotAvailableError(RetriableError):
    code, name = 15, "COORDINATOR_NOT_AVAILABLE"


class NotCoordinatorError(RetriableError):
    code, name = 16, "NOT_COORDINATOR"


class IllegalGenerationError(KafkaError):
    code, name = 22, "ILLEGAL_GENERATION"


class UnknownMemberIdError(KafkaError):
    code, name = 25, "UNKNOWN_MEMBER_ID"


class GroupAuthorizationFailedError(KafkaError):
    code, name = 30, "GROUP_AUTHORIZATION_FAILED"


class TopicAuthorizationFailedError(KafkaError):
    code, name = 29, "TOPIC_AUTHORIZATION_FAILED"


class UnsupportedVersionError(KafkaError):
    code, name = 35, "UNSUPPORTED_VERSION"


class InvalidRequestError(KafkaError):
    code, name = 42, "INVALID_REQUEST"


class KafkaStorageError(RetriableError):
    code, name = 56, "KAFKA_STORAGE_ERROR"


class FencedLeaderEpochError(RetriableError):
    code, name = 74, "FENCED_LEADER_EPOCH"


class UnknownLeaderEpochError(RetriableError):
    code, name = 75, "UNKNOWN_LEADER_EPOCH"


class OffsetNotAvailableError(RetriableError):
    code, name = 78, "OFFSET_NOT_AVAILABLE"


class UnknownTopicIdError(RetriableError):
    code, name = 100, "UNKNOWN_TOPIC_ID"


class InconsistentTopicIdError(RetriableError):
    code, name = 103, "INCONSISTENT_TOPIC_ID"


_BY_CODE: dict[int, type[KafkaError]] = {
    cls.code: cls
    for cls in (
        OffsetOutOfRangeError, CorruptRecordError, UnknownTopicOrPartitionError, LeaderNotAvailableError,
        NotLeaderOrFollowerError, RequestTimedOutError, ReplicaNotAvailableError, CoordinatorLoadInProgressError,
        CoordinatorNotAvailableError, NotCoordinatorError, IllegalGenerationError, UnknownMemberIdError,
        GroupAuthorizationFailedError,
        TopicAuthorizationFailedError, UnsupportedVersionError, InvalidRequestError, KafkaStorageError,
        FencedLeaderEpochError, UnknownLeaderEpochError, OffsetNotAvailableError, UnknownTopicIdError,
        InconsistentTopicIdError,
    )
}

# Names of further codes a fetch path can meet, for messages of plain KafkaErrors.
ERROR_NAMES: dict[int, str] = {
    -1: "UNKNOWN_SERVER_ERROR",
    4: "INVALID_FETCH_SIZE",
    10: "MESSAGE_TOO_LARGE",
    13: "NETWORK_EXCEPTION",
    31: "CLUSTER_AUTHORIZATION_FAILED",
    57: "LOG_DIR_NOT_FOUND",
    58: "SASL_AUTHENTICATION_FAILED",
    70: "FETCH_SESSION_ID_NOT_FOUND",
    88: "UNSTABLE_OFFSET_COMMIT",
    71: "INVALID_FETCH_SESSION_EPOCH",
    **{code: cls.name for code, cls in _BY_CODE.items()},
}

# Partition errors after which the consumer refreshes metadata and retries with back-off.
METADATA_REFRESH_CODES = frozenset({3, 5, 6, 9, 56, 74, 75, 78, 100, 103})

# Group-request errors after which the consumer finds the coordinator again and retries.
# UNSTABLE_OFFSET_COMMIT (88): a transactional offset commit is pending; retry shortly.
COORDINATOR_RETRY_CODES = frozenset({14, 15, 16, 88})
