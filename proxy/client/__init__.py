"""The key-range consumer: a trio Kafka consumer that shares partitions by key-hash range."""

from proxy.client.config import ConsumerConfig
from proxy.client.consumer import Consumer
from proxy.client.errors import (
    CommitFailedError,
    ConfigError,
    ConsumerConnectionError,
    ConsumerError,
    CooperativeFetchNotSupportedError,
    IllegalStateError,
    KafkaError,
    NetworkExceptionError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    RangeFetchNotSupportedError,
    RebalanceInProgressError,
    RetriableError,
)
from proxy.client.group import RebalanceListener
from proxy.client.records import ConsumerRecord, ConsumerRecords, FetchMetadata, TopicPartition
from proxy.ranges import KeyRange, equal_share, equal_shares

__all__ = [
    "CommitFailedError", "ConfigError", "Consumer", "ConsumerConfig", "ConsumerConnectionError", "ConsumerError", "ConsumerRecord",
    "CooperativeFetchNotSupportedError",
    "ConsumerRecords", "FetchMetadata", "IllegalStateError", "KafkaError", "KeyRange", "NetworkExceptionError",
    "NoOffsetForPartitionError", "OffsetOutOfRangeError", "RangeFetchNotSupportedError", "RebalanceInProgressError",
    "RebalanceListener", "RetriableError",
    "TopicPartition", "equal_share", "equal_shares",
]
