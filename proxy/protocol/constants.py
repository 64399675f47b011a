"""Numbers of the Kafka protocol and of our extensions that more than one module needs.

Kafka error codes are an ``ErrorCode`` IntEnum, so code compares with ``ErrorCode.NONE``
rather than a bare ``0`` and a log line can print the name. The extension tag and the
fetch-session epochs are defined once here (docs/wire-contract.md explains them).
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """The Kafka error codes the proxy and the client produce or act upon.

    Values are Kafka's (``org.apache.kafka.common.protocol.Errors``); add a member when
    a module needs one, never compare with a bare number.
    """

    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    REPLICA_NOT_AVAILABLE = 9
    MESSAGE_TOO_LARGE = 10
    OFFSET_METADATA_TOO_LARGE = 12
    NETWORK_EXCEPTION = 13
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_COMMIT_OFFSET_SIZE = 28
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    NOT_CONTROLLER = 41
    INVALID_REQUEST = 42
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    CONCURRENT_TRANSACTIONS = 51
    UNKNOWN_PRODUCER_ID = 59
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    KAFKA_STORAGE_ERROR = 56
    GROUP_ID_NOT_FOUND = 69
    FETCH_SESSION_ID_NOT_FOUND = 70
    INVALID_FETCH_SESSION_EPOCH = 71
    MEMBER_ID_REQUIRED = 79
    FENCED_INSTANCE_ID = 82
    GROUP_SUBSCRIBED_TO_TOPIC = 86
    UNSTABLE_OFFSET_COMMIT = 88
    PRODUCER_FENCED = 90
    UNKNOWN_TOPIC_ID = 100
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    OFFSET_NOT_AVAILABLE = 78
    INCONSISTENT_TOPIC_ID = 103

    @classmethod
    def name_of(cls, code: int) -> str:
        """A readable name for any code, including ones this enum does not list."""
        try:
            return cls(code).name
        except ValueError:
            return f"ERROR_{code}"


# Every extension field of ours is a tagged field (KIP-482) with this tag.
EXTENSION_TAG = 10000
# The tag as the unsigned varint that precedes it on the wire: a frame without these two
# bytes carries no extension, which a cheap ``in`` test can tell.
EXTENSION_TAG_BYTES = bytes([0x90, 0x4E])

# Fetch sessions (KIP-227): epoch 0 opens a session, -1 asks for a sessionless full fetch
# (or closes a session), anything above continues one.
FETCH_SESSION_INITIAL_EPOCH = 0
FETCH_SESSION_FINAL_EPOCH = -1
FETCH_SESSIONLESS_ID = 0

# Limits on what a message may declare, as Kafka 4.4.0's readers enforce them. Kafka up
# to 4.3.1 allocates an object per declared array element or tagged field before the
# request is authenticated, so a few bytes declaring a huge count cost an older broker a
# huge allocation. The proxy refuses such a count wherever it reads one (the schema codecs,
# the hand-written peeks and walks, the C readers), so the brokers behind it never see it;
# a request that declares one closes its connection, as any other malformed request does.
# A record batch's record count is not such an array: it is bounded by the batch's bytes
# where it sizes anything, and large batches legitimately hold more records than this.
MAX_ARRAY_ELEMENTS = 1_000_000  # elements of one array (compact or not), record headers too
MAX_TAGGED_FIELDS = 10_000  # fields of one tagged-field section, request header included

# The extensions' names in ApiVersions' SupportedFeatures (v3+), which the proxy advertises
# and clients look for (docs/wire-contract.md section 2).
KEY_RANGE_FETCH_FEATURE = "keyrange.fetch"
INDIVIDUAL_COMMIT_FEATURE = "individual.commit"
COOPERATIVE_FETCH_FEATURE = "cooperative.fetch"
