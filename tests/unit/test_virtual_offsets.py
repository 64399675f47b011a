"""ListOffsets and OffsetsForLeaderEpoch of virtual partitions, sans-IO and through one
client connection: several shares of one real partition in one request each get the answer
to their own question (a broker takes one question per partition in a request), in one
request when they all ask the same."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from proxy.net.streams import FrameStream
from proxy.pipeline import ClusterView, DecodedResponse, Feature, FeatureChain, Route
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import ErrorCode
from proxy.protocol.framing import frame_bytes, peek_request_header
from proxy.server.config import build_config
from proxy.server.connection import ClientConnection
from proxy.server.metrics import ProxyMetrics
from proxy.virtual import rewrite
from proxy.virtual.naming_feature import VirtualNamingFeature
from proxy.virtual.resolver import VirtualResolver
from tests.unit.test_virtual_core import _Resolver

EARLIEST, LATEST = -2, -1
LOG_START, HIGH_WATERMARK = 100, 5000
LIST_VERSION, EPOCH_VERSION = 7, 4
LIST = messages.body_class(ApiKey.LIST_OFFSETS, "request")
LIST_RESPONSE = messages.body_class(ApiKey.LIST_OFFSETS, "response")
EPOCH = messages.body_class(ApiKey.OFFSET_FOR_LEADER_EPOCH, "request")
EPOCH_RESPONSE = messages.body_class(ApiKey.OFFSET_FOR_LEADER_EPOCH, "response")
EPOCH_ENDS = {5: 2000, 3: 800}  # the new leader's log: epoch 3 ended at 800 (records after it were lost)


def _offset_of(timestamp: int, partition: int) -> int:
    """The broker's offset for a timestamp: distinct per question and per partition."""
    return {EARLIEST: LOG_START, LATEST: HIGH_WATERMARK}.get(timestamp, 1000 + timestamp) + 10_000 * partition


def _list_broker(body):
    """A broker's ListOffsets answer, a partition named twice refused as Kafka does."""
    named = [(t.name, p.partition_index) for t in body.topics for p in t.partitions]
    response = messages.new_body(ApiKey.LIST_OFFSETS, LIST_VERSION, "response", topics=[])
    for topic in body.topics:
        parts = []
        for p in topic.partitions:
            if named.count((topic.name, p.partition_index)) > 1:
                parts.append(LIST_RESPONSE.ListOffsetsPartitionResponse(
                    partition_index=p.partition_index, error_code=int(ErrorCode.INVALID_REQUEST)))
                continue
            parts.append(LIST_RESPONSE.ListOffsetsPartitionResponse(
                partition_index=p.partition_index, error_code=0, timestamp=-1,
                offset=_offset_of(p.timestamp, p.partition_index), leader_epoch=0))
        response.topics.append(LIST_RESPONSE.ListOffsetsTopicResponse(name=topic.name, partitions=parts))
    return response


def _epoch_broker(body):
    return messages.new_body(ApiKey.OFFSET_FOR_LEADER_EPOCH, EPOCH_VERSION, "response", topics=[
        EPOCH_RESPONSE.OffsetForLeaderTopicResult(topic=t.topic, partitions=[
            EPOCH_RESPONSE.EpochEndOffset(error_code=0, partition=p.partition, leader_epoch=p.leader_epoch,
                                          end_offset=EPOCH_ENDS[p.leader_epoch]) for p in t.partitions])
        for t in body.topics])


def _list_request(*topics: tuple[str, list[tuple[int, int]]]):
    return messages.new_body(ApiKey.LIST_OFFSETS, LIST_VERSION, "request", replica_id=-1, isolation_level=1, topics=[
        LIST.ListOffsetsTopic(name=name, partitions=[
            LIST.ListOffsetsPartition(partition_index=index, current_leader_epoch=-1, timestamp=timestamp)
            for index, timestamp in parts]) for name, parts in topics])


def _list_offsets(body) -> tuple[list, dict]:
    """The plan's requests as a broker answers them; the client's answer, by (topic, partition)."""
    plan = rewrite.list_offsets_request(body, _Resolver())
    assert plan is not None
    sent = [body, *plan.extra]
    for number, extra in enumerate(plan.extra, start=1):
        plan.answers[number] = _list_broker(extra)
    response = _list_broker(body)
    rewrite.list_offsets_response(response, plan)
    return sent, {(t.name, p.partition_index): (p.error_code, p.offset) for t in response.topics
                  for p in t.partitions}


def _named(body) -> list[tuple[str, int]]:
    return [(t.name, p.partition_index) for t in body.topics for p in t.partitions]


def test_each_share_gets_the_offset_of_its_own_timestamp():
    """seekToEnd of share 0 and seekToBeginning of share 1 in one request: answered the
    high watermark, share 1 would skip every record it has."""
    sent, got = _list_offsets(_list_request(("t.kr4", [(0, LATEST), (1, EARLIEST)])))
    assert got == {("t.kr4", 0): (0, HIGH_WATERMARK), ("t.kr4", 1): (0, LOG_START)}
    assert [_named(body) for body in sent] == [[("t", 0)], [("t", 0)]]
    assert sent[1].isolation_level == 1 and sent[1].replica_id == -1  # the client's own settings


def test_a_share_beside_its_real_partition_gets_its_own_timestamp():
    sent, got = _list_offsets(_list_request(("t", [(0, LATEST)]), ("t.kr2", [(0, EARLIEST)])))
    assert got == {("t", 0): (0, HIGH_WATERMARK), ("t.kr2", 0): (0, LOG_START)}
    assert len(sent) == 2


def test_shares_asking_the_same_question_take_one_request():
    body = _list_request(("t.kr4", [(v, EARLIEST) for v in range(8)]))
    sent, got = _list_offsets(body)
    assert sent == [body]  # nothing beside the client's own request
    assert _named(body) == [("t", 0), ("t", 1)]
    assert got == {("t.kr4", v): (0, _offset_of(EARLIEST, v // 4)) for v in range(8)}


def test_no_request_names_a_partition_twice_and_the_answer_keeps_the_order_asked():
    questions = [(0, LATEST), (5, EARLIEST), (1, EARLIEST), (2, 7), (3, LATEST), (4, EARLIEST), (6, 9), (7, EARLIEST)]
    body = _list_request(("t.kr4", questions), ("u", [(0, LATEST)]))
    plan = rewrite.list_offsets_request(body, _Resolver())
    assert plan is not None and len(plan.extra) == 2  # real partition 0 was asked 3 different questions
    for request in [body, *plan.extra]:
        named = _named(request)
        assert len(named) == len(set(named))
    plan.answers = {number: _list_broker(extra) for number, extra in enumerate(plan.extra, start=1)}
    response = _list_broker(body)
    rewrite.list_offsets_response(response, plan)
    assert [t.name for t in response.topics] == ["t.kr4", "u"]
    answered = [(p.partition_index, p.error_code, p.offset) for p in response.topics[0].partitions]
    assert answered == [(v, 0, _offset_of(timestamp, v // 4)) for v, timestamp in questions]
    assert [(p.partition_index, p.offset) for p in response.topics[1].partitions] == [(0, HIGH_WATERMARK)]


def test_a_share_whose_own_question_went_unanswered_is_told_to_ask_again():
    """Never another share's answer: a further request that got no response leaves its
    shares with an error every client retries."""
    body = _list_request(("t.kr4", [(0, LATEST), (1, EARLIEST), (2, LATEST)]))
    plan = rewrite.list_offsets_request(body, _Resolver())
    response = _list_broker(body)
    rewrite.list_offsets_response(response, plan)
    answered = [(p.partition_index, p.error_code, p.offset) for p in response.topics[0].partitions]
    assert answered == [(0, 0, HIGH_WATERMARK), (1, ErrorCode.OFFSET_NOT_AVAILABLE, -1), (2, 0, HIGH_WATERMARK)]


def test_each_share_gets_the_end_offset_of_its_own_leader_epoch():
    """Share 0 last fetched in epoch 5, share 1 in epoch 3, which the new leader's log ends
    at 800: answered epoch 5's end (2000), share 1 would not truncate and would skip the
    new log's records between 800 and its position."""
    body = messages.new_body(ApiKey.OFFSET_FOR_LEADER_EPOCH, EPOCH_VERSION, "request", replica_id=-1, topics=[
        EPOCH.OffsetForLeaderTopic(topic="t.kr4", partitions=[
            EPOCH.OffsetForLeaderPartition(partition=0, current_leader_epoch=6, leader_epoch=5),
            EPOCH.OffsetForLeaderPartition(partition=1, current_leader_epoch=6, leader_epoch=3),
            EPOCH.OffsetForLeaderPartition(partition=2, current_leader_epoch=6, leader_epoch=5)])])
    plan = rewrite.offsets_for_leader_epoch_request(body, _Resolver())
    assert plan is not None and len(plan.extra) == 1
    assert [(p.partition, p.leader_epoch) for p in body.topics[0].partitions] == [(0, 5)]
    assert [(p.partition, p.leader_epoch) for p in plan.extra[0].topics[0].partitions] == [(0, 3)]
    plan.answers[1] = _epoch_broker(plan.extra[0])
    response = _epoch_broker(body)
    rewrite.offsets_for_leader_epoch_response(response, plan)
    got = [(p.partition, p.leader_epoch, p.end_offset) for t in response.topics for p in t.partitions]
    assert got == [(0, 5, 2000), (1, 3, 800), (2, 5, 2000)]


async def test_further_requests_carry_the_clients_header_and_keep_their_answers():
    body = _list_request(("t.kr4", [(0, LATEST), (1, EARLIEST), (2, 7)]))
    plan = rewrite.list_offsets_request(body, _Resolver())
    header = messages.new_request_header(ApiKey.LIST_OFFSETS, LIST_VERSION, 42, "app-1")
    own = rewrite.extra_requests(header, ApiKey.LIST_OFFSETS, plan)
    assert len(own) == 2
    for request, extra in zip(own, plan.extra, strict=True):
        sent_header, sent = messages.decode_request(request.frame)
        assert (sent_header.client_id, sent_header.request_api_version) == ("app-1", LIST_VERSION)
        assert sent_header.correlation_id == request.correlation_id < 0 and request.api_version == LIST_VERSION
        assert sent == extra
        await request.sink(messages.encode_response(ApiKey.LIST_OFFSETS, LIST_VERSION,
                                                    messages.new_response_header(request.correlation_id),
                                                    _list_broker(sent)))
    assert len({request.correlation_id for request in own}) == 2
    response = _list_broker(body)
    rewrite.list_offsets_response(response, plan)
    assert [p.offset for p in response.topics[0].partitions] == [HIGH_WATERMARK, LOG_START, _offset_of(7, 0)]


# -- through a client connection -------------------------------------------------------------


class _VirtualOffsets(Feature):
    """The virtual feature's ListOffsets path: the request rewritten onto the real topic,
    the further questions sent just before it, the response rewritten."""

    def request_stages(self):
        return {ApiKey.LIST_OFFSETS: self.on_list_offsets}

    async def on_list_offsets(self, ctx, request) -> Route | None:
        header, body = request.decoded()
        plan = rewrite.list_offsets_request(body, _Resolver())
        if plan is None:
            return None

        async def on_response(response: DecodedResponse) -> None:
            rewrite.list_offsets_response(response.body, plan)
            response.changed = True

        return Route(messages.encode_request(header, body), on_response=on_response,
                     before=rewrite.extra_requests(header, ApiKey.LIST_OFFSETS, plan))


def _virtual_topics_feature() -> Feature:
    config = build_config({"bootstrap.servers": "127.0.0.1:9092", "virtual.topics.enabled": "true"})
    cluster = ClusterView()
    cls = messages.body_class(ApiKey.METADATA, "response")
    cluster.learn_metadata(messages.new_body(ApiKey.METADATA, 12, "response", brokers=[], topics=[
        cls.MetadataResponseTopic(error_code=0, name="t", partitions=[
            cls.MetadataResponsePartition(error_code=0, partition_index=0, leader_id=0)])]))
    return VirtualNamingFeature(VirtualResolver(config.virtual, cluster))


@pytest.mark.parametrize("feature", [_VirtualOffsets, _virtual_topics_feature], ids=["rewrite", "feature"])
async def test_through_a_connection_the_further_request_goes_first_on_the_same_upstream(feature):
    client, proxy_side = trio.testing.memory_stream_pair()
    upstream, broker_side = trio.testing.memory_stream_pair()
    received: list[tuple[int, list]] = []  # what the broker got, in order: (correlation id, partitions)

    async def open_upstream():
        return upstream

    async def broker() -> None:
        frames = FrameStream(broker_side, 1 << 20)
        while (frame := await frames.receive_frame()) is not None:
            header, body = messages.decode_request(frame)
            received.append((header.correlation_id, [(p.partition_index, p.timestamp) for t in body.topics
                                                     for p in t.partitions]))
            await frames.send_frame(messages.encode_response(
                ApiKey.LIST_OFFSETS, LIST_VERSION, messages.new_response_header(header.correlation_id),
                _list_broker(body)))

    connection = ClientConnection(proxy_side, "127.0.0.1:1", open_upstream=open_upstream,
                                  chain=FeatureChain([feature()]), metrics=ProxyMetrics(),
                                  max_frame_bytes=1 << 20, max_inflight=8, idle_timeout=math.inf, target="node-0")
    answers = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(connection.run)
            nursery.start_soon(broker)
            frames = FrameStream(client, 1 << 20)
            for correlation_id, request in ((1, _list_request(("t.kr4", [(0, LATEST), (1, EARLIEST)]))),
                                            (2, _list_request(("t.kr4", [(0, LATEST), (1, LATEST)])))):
                header = messages.new_request_header(ApiKey.LIST_OFFSETS, LIST_VERSION, correlation_id, "app-1")
                frame = messages.encode_request(header, request)
                assert peek_request_header(frame).correlation_id == correlation_id
                await client.send_all(frame_bytes(frame))
            for _ in range(2):
                header, response = messages.decode_response(ApiKey.LIST_OFFSETS, LIST_VERSION,
                                                            await frames.receive_frame())
                answers.append((header.correlation_id, [(p.partition_index, p.offset) for p in
                                                        response.topics[0].partitions]))
            await client.aclose()
            nursery.cancel_scope.cancel()
    assert answers == [(1, [(0, HIGH_WATERMARK), (1, LOG_START)]), (2, [(0, HIGH_WATERMARK), (1, HIGH_WATERMARK)])]
    (own_id, own_asked), (first_id, first_asked), (second_id, second_asked) = received
    assert own_id < 0 and own_asked == [(0, EARLIEST)]  # share 1's question, just before the client's
    assert (first_id, first_asked) == (1, [(0, LATEST)])
    assert (second_id, second_asked) == (2, [(0, LATEST)])  # the same question twice: one request
