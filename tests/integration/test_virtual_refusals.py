"""Writes to and administration of a virtual range topic are refused with a message naming
its real topic (docs/virtual-topics.md), whichever way the client names it, and the real
topic is left as it was."""

from __future__ import annotations

import pytest

from harness.raw_client import RawClient
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import ErrorCode
from proxy.records.builder import build_batch, encode_record

pytestmark = pytest.mark.kafka


def _end_offsets(bootstrap: str, topic: str, partitions: int) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)]
    finally:
        consumer.close()


def test_librdkafka_producing_to_a_virtual_topic_is_refused(kafka, proxy, topic_factory):
    from confluent_kafka import KafkaError, Producer

    topic = topic_factory(kafka, partitions=2)
    outcomes = []
    producer = Producer({"bootstrap.servers": proxy.bootstrap_servers, "retries": 0, "acks": "all"})
    producer.produce(f"{topic}.kr4", key=b"k", value=b"v", on_delivery=lambda err, msg: outcomes.append(err))
    assert producer.flush(30) == 0
    [error] = outcomes
    assert error is not None and error.code() == KafkaError.TOPIC_EXCEPTION
    assert _end_offsets(kafka.bootstrap_servers, topic, 2) == [0, 0]


def test_creating_a_virtual_topic_is_refused_with_the_real_topics_name(kafka, proxy, topic_factory):
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = topic_factory(kafka, partitions=2)
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap_servers})
    future = admin.create_topics([NewTopic(f"{topic}.kr4", num_partitions=1, replication_factor=1)])[f"{topic}.kr4"]
    with pytest.raises(Exception) as refused:
        future.result(timeout=30)
    error = refused.value.args[0]
    assert error.code() == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert f"{topic}.kr4" in error.str() and topic in error.str()


def test_produce_by_topic_id_to_a_virtual_topic_is_refused(kafka, proxy, topic_factory):
    """Produce v13 names a topic by id; the id of a virtual topic is the one the proxy's
    Metadata handed out, and it is refused like the name."""
    topic = topic_factory(kafka, partitions=2)
    metadata_class = messages.body_class(ApiKey.METADATA, "request")
    produce_class = messages.body_class(ApiKey.PRODUCE, "request")
    with RawClient.connect(proxy.bootstrap_servers) as raw:
        metadata = raw.call(ApiKey.METADATA, 12, topics=[metadata_class.MetadataRequestTopic(name=f"{topic}.kr4")],
                            allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        [described] = metadata.topics
        assert described.error_code == 0 and len(described.partitions) == 8
        record = encode_record(offset_delta=0, key=b"k", value=b"v")
        batch = build_batch(base_offset=0, last_offset_delta=0, records=[record], record_count=1,
                            base_timestamp=1, max_timestamp=1)
        response = raw.call(ApiKey.PRODUCE, 13, acks=-1, timeout_ms=10000, topic_data=[
            produce_class.TopicProduceData(topic_id=described.topic_id, partition_data=[
                produce_class.PartitionProduceData(index=5, records=batch)])])
    [answer] = response.responses
    assert answer.topic_id == described.topic_id
    [part] = answer.partition_responses
    assert part.index == 5 and part.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert f"{topic}.kr4" in part.error_message
    assert _end_offsets(kafka.bootstrap_servers, topic, 2) == [0, 0]
