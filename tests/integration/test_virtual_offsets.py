"""ListOffsets and OffsetsForLeaderEpoch naming several shares of one real partition in one
request, through the proxy against a real broker (docs/wire-contract.md#9-virtual-range-topics):
each share is answered its own question, never another share's. A broker takes one
question per partition in a request, so shares asking different ones (a Java consumer's
``seekToEnd`` of one share and ``seekToBeginning`` of another, sent together) are asked
upstream separately."""

from __future__ import annotations

import pytest

from harness.raw_client import RawClient
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import ErrorCode

from .virtual_checks import produce

pytestmark = pytest.mark.kafka

EARLIEST, LATEST = -2, -1
RECORDS = 60
LIST = messages.body_class(ApiKey.LIST_OFFSETS, "request")
EPOCH = messages.body_class(ApiKey.OFFSET_FOR_LEADER_EPOCH, "request")


def _ask(raw: RawClient, questions: dict[int, int], ask) -> dict[int, tuple]:
    """Each virtual partition's answer to ``ask(raw, questions)``, in one request: the
    shares' different questions are asked upstream apart, none is told to ask again."""
    answers = ask(raw, questions)
    assert all(error != ErrorCode.OFFSET_NOT_AVAILABLE for error, *_ in answers.values()), answers
    return answers


def _list_offsets(raw: RawClient, timestamps: dict[int, int], topic: str) -> dict[int, tuple]:
    response = raw.call(ApiKey.LIST_OFFSETS, 7, replica_id=-1, isolation_level=0, topics=[
        LIST.ListOffsetsTopic(name=topic, partitions=[
            LIST.ListOffsetsPartition(partition_index=v, current_leader_epoch=-1, timestamp=timestamp)
            for v, timestamp in timestamps.items()])])
    [answered] = response.topics
    assert answered.name == topic
    return {p.partition_index: (p.error_code, p.offset) for p in answered.partitions}


def _end_offsets(raw: RawClient, epochs: dict[int, int], topic: str) -> dict[int, tuple]:
    response = raw.call(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, replica_id=-1, topics=[
        EPOCH.OffsetForLeaderTopic(topic=topic, partitions=[
            EPOCH.OffsetForLeaderPartition(partition=v, current_leader_epoch=-1, leader_epoch=epoch)
            for v, epoch in epochs.items()])])
    [answered] = response.topics
    assert answered.topic == topic
    return {p.partition: (p.error_code, p.leader_epoch, p.end_offset) for p in answered.partitions}


def _leader_epoch(raw: RawClient, topic: str) -> int:
    request_class = messages.body_class(ApiKey.METADATA, "request")
    response = raw.call(ApiKey.METADATA, 12, topics=[request_class.MetadataRequestTopic(name=topic)],
                        allow_auto_topic_creation=False)
    [entry] = response.topics
    [partition] = entry.partitions
    return partition.leader_epoch


def test_shares_of_one_partition_asking_different_timestamps_get_their_own_offsets(kafka, proxy, topic_factory):
    topic = topic_factory(kafka, partitions=1)
    produce(kafka.bootstrap_servers, topic, RECORDS)
    virtual = f"{topic}.kr4"
    with RawClient.connect(proxy.bootstrap_servers) as raw:
        # seekToEnd of shares 0 and 2, seekToBeginning of shares 1 and 3, in one request
        questions = {0: LATEST, 1: EARLIEST, 2: LATEST, 3: EARLIEST}
        answers = _ask(raw, questions, lambda raw, asked: _list_offsets(raw, asked, virtual))
        assert answers == {0: (0, RECORDS), 1: (0, 0), 2: (0, RECORDS), 3: (0, 0)}
        # All asking the same: answered alike, as before.
        assert _list_offsets(raw, dict.fromkeys(range(4), EARLIEST), virtual) == dict.fromkeys(range(4), (0, 0))


def test_shares_of_one_partition_asking_different_leader_epochs_get_their_own_end_offsets(kafka, proxy,
                                                                                          topic_factory):
    topic = topic_factory(kafka, partitions=1)
    produce(kafka.bootstrap_servers, topic, RECORDS)
    virtual = f"{topic}.kr2"
    with RawClient.connect(proxy.bootstrap_servers) as raw:
        epoch = _leader_epoch(raw, topic)
        # Share 0 last fetched in the current epoch; share 1 names one the log does not
        # have yet, which Kafka answers with no epoch and no end offset.
        answers = _ask(raw, {0: epoch, 1: epoch + 1}, lambda raw, asked: _end_offsets(raw, asked, virtual))
        assert answers == {0: (0, epoch, RECORDS), 1: (0, -1, -1)}
