"""Produce requests through a client connection over real loopback TCP: a large one no
feature reads has its body spliced from the client's socket to the broker's, and
everything around it (correlation ids, response order, acks=0, metrics, the frame-size
limit, either side dying in the middle of a body) stays as exact as for a request read
whole."""

from __future__ import annotations

import math
import random
import struct

import pytest
import trio

from proxy.net import streams as streams_module
from proxy.net.streams import FrameStream
from proxy.pipeline import ConnectionContext, Feature, FeatureChain, Request, Route
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.framing import frame_bytes, peek_correlation_id, peek_request_header
from proxy.protocol.peek import produce_acks
from proxy.server.connection import ClientConnection
from proxy.server.metrics import ProxyMetrics

from .test_streams import dribble, tcp_pair

pytestmark = pytest.mark.skipif(streams_module._SPLICE is None, reason="no os.splice on this platform")

PRODUCE = messages.body_class(ApiKey.PRODUCE, "request")
PRODUCE_RESPONSE = messages.body_class(ApiKey.PRODUCE, "response")
VERSION = 9
MAX_FRAME = 4 * 1024 * 1024


def produce_request(correlation_id: int, record_bytes: int, *, acks: int = 1, seed: int = 0) -> bytes:
    """A framed Produce request whose one record set is ``record_bytes`` random bytes (the
    proxy never looks inside it)."""
    header = messages.new_request_header(ApiKey.PRODUCE, VERSION, correlation_id, "producer")
    data = PRODUCE.PartitionProduceData(index=0, records=random.Random(seed).randbytes(record_bytes))
    body = messages.new_body(ApiKey.PRODUCE, VERSION, "request", transactional_id=None, acks=acks, timeout_ms=30000,
                             topic_data=[PRODUCE.TopicProduceData(name="t", partition_data=[data])])
    return frame_bytes(messages.encode_request(header, body))


def produce_response(correlation_id: int, base_offset: int) -> bytes:
    partition = PRODUCE_RESPONSE.PartitionProduceResponse(index=0, error_code=0, base_offset=base_offset,
                                                          log_append_time_ms=-1, log_start_offset=0,
                                                          record_errors=[], error_message=None)
    body = messages.new_body(ApiKey.PRODUCE, VERSION, "response", throttle_time_ms=0,
                             responses=[PRODUCE_RESPONSE.TopicProduceResponse(name="t",
                                                                              partition_responses=[partition])])
    return frame_bytes(messages.encode_response(ApiKey.PRODUCE, VERSION, messages.new_response_header(correlation_id),
                                                body))


class Broker:
    """Answers every Produce with acks != 0, in order; keeps the raw bytes it received."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.raw = bytearray()
        self.answered: list[int] = []

    async def serve(self, die_after: int | None = None) -> None:
        """Until the proxy closes the connection; with ``die_after``, close it after that
        many bytes, in the middle of whatever frame they end in."""
        pending = bytearray()
        while True:
            try:
                chunk = await self.stream.receive_some(256 * 1024)
            except trio.BrokenResourceError:
                chunk = b""
            if not chunk:
                await self.stream.aclose()
                return
            self.raw += chunk
            if die_after is not None and len(self.raw) >= die_after:
                await self.stream.aclose()
                return
            pending += chunk
            while len(pending) >= 4:
                (size,) = struct.unpack_from(">i", pending)
                if len(pending) < 4 + size:
                    break
                frame = bytes(pending[4 : 4 + size])
                del pending[: 4 + size]
                peek = peek_request_header(frame)
                if produce_acks(frame, peek) != 0:
                    await self.stream.send_all(produce_response(peek.correlation_id, len(self.answered)))
                    self.answered.append(peek.correlation_id)


class Served:
    """One ClientConnection between a real client socket and a real broker socket."""

    def __init__(self, chain: FeatureChain, metrics: ProxyMetrics) -> None:
        self.chain = chain
        self.metrics = metrics

    async def start(self, nursery: trio.Nursery, *, die_after: int | None = None) -> Served:
        self.client, proxy_side = await tcp_pair()
        upstream, broker_side = await tcp_pair()
        self.broker = Broker(broker_side)

        async def open_upstream() -> trio.abc.Stream:
            return upstream

        self.connection = ClientConnection(proxy_side, "127.0.0.1:1", open_upstream=open_upstream, chain=self.chain,
                                           metrics=self.metrics, max_frame_bytes=MAX_FRAME, max_inflight=4,
                                           idle_timeout=math.inf, target="bootstrap")
        nursery.start_soon(self.connection.run)
        nursery.start_soon(self.broker.serve, die_after)
        return self

    async def responses(self, count: int) -> list[int]:
        """The correlation ids of the next ``count`` responses the client receives."""
        frames = FrameStream(self.client, MAX_FRAME)
        ids = []
        for _ in range(count):
            frame = await frames.receive_frame()
            assert frame is not None, "the proxy closed the client's connection"
            ids.append(peek_correlation_id(frame))
        return ids


def sample(metrics: ProxyMetrics, name: str, labels: dict | None = None) -> float:
    return metrics.registry.get_sample_value(name, labels or {}) or 0


class ProduceReader(Feature):
    """Reads every Produce request (as a feature checking topic names would)."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []

    def request_stages(self):
        return {ApiKey.PRODUCE: self.on_produce}

    async def on_produce(self, ctx: ConnectionContext, request: Request) -> Route | None:
        self.seen.append(bytes(request.frame))
        return None


SIZES = [300, 300_000, 70_000, 3 * 1024 * 1024, 2000, 1_500_000]


@pytest.mark.parametrize("seed", [1, 2])
async def test_large_produce_requests_are_spliced_and_answered_in_order(seed):
    metrics = ProxyMetrics()
    requests = [produce_request(i + 1, size, seed=seed * 100 + i) for i, size in enumerate(SIZES)]
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            served = await Served(FeatureChain([]), metrics).start(nursery)
            nursery.start_soon(dribble, served.client, b"".join(requests), seed)
            assert await served.responses(len(requests)) == list(range(1, len(requests) + 1))
            await served.client.aclose()
            await served.connection.closed.wait()
    assert served.broker.raw == b"".join(requests)
    assert served.broker.answered == list(range(1, len(requests) + 1))
    # Bodies that had not all arrived when the head was read go on spliced: the big ones.
    assert 1 <= sample(metrics, "kafka_proxy_spliced_requests_total") <= 4
    labels = {"api": "Produce"}
    assert sample(metrics, "kafka_proxy_requests_total", labels) == len(requests)
    assert sample(metrics, "kafka_proxy_request_bytes_total", labels) == sum(map(len, requests))
    assert sample(metrics, "kafka_proxy_inflight_requests") == 0


async def test_a_produce_that_a_feature_reads_arrives_whole_and_is_not_spliced():
    metrics = ProxyMetrics()
    reader = ProduceReader()
    requests = [produce_request(i + 1, size, seed=i) for i, size in enumerate(SIZES)]
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            served = await Served(FeatureChain([reader]), metrics).start(nursery)
            nursery.start_soon(dribble, served.client, b"".join(requests), 3)
            assert await served.responses(len(requests)) == list(range(1, len(requests) + 1))
            await served.client.aclose()
    assert reader.seen == [r[4:] for r in requests]
    assert served.broker.raw == b"".join(requests)
    assert sample(metrics, "kafka_proxy_spliced_requests_total") == 0


async def test_spliced_acks_zero_requests_expect_no_response():
    metrics = ProxyMetrics()
    requests = [produce_request(1, 2_000_000, acks=0), produce_request(2, 500, acks=-1),
                produce_request(3, 1_000_000, acks=0), produce_request(4, 1_000_000, acks=-1)]
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            served = await Served(FeatureChain([]), metrics).start(nursery)
            nursery.start_soon(dribble, served.client, b"".join(requests), 5)
            assert await served.responses(2) == [2, 4]
            await served.client.aclose()
            await served.connection.closed.wait()
    assert served.broker.raw == b"".join(requests)
    assert sample(metrics, "kafka_proxy_spliced_requests_total") >= 1
    assert sample(metrics, "kafka_proxy_inflight_requests") == 0


async def test_a_client_dying_in_the_middle_of_a_spliced_body_closes_its_connection():
    metrics = ProxyMetrics()
    first, second = produce_request(1, 1000), produce_request(2, 2_000_000)
    cut = len(second) // 2
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            served = await Served(FeatureChain([]), metrics).start(nursery)
            await served.client.send_all(first)
            assert await served.responses(1) == [1]
            await served.client.send_all(second[:cut])
            await served.client.aclose()
            await served.connection.closed.wait()
    # The broker got the first request and at most the part of the second that was sent
    # (what the proxy still held is dropped), then its connection closed: nothing ever
    # follows a broken frame.
    raw = bytes(served.broker.raw)
    assert raw.startswith(first) and len(raw) < len(first) + len(second)
    assert (first + second[:cut]).startswith(raw)
    assert sample(metrics, "kafka_proxy_inflight_requests") == 0


async def test_a_broker_dying_in_the_middle_of_a_spliced_body_closes_only_that_client():
    metrics = ProxyMetrics()
    chain = FeatureChain([])
    big = produce_request(1, 3 * 1024 * 1024)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            doomed = await Served(chain, metrics).start(nursery, die_after=len(big) // 3)
            other = await Served(chain, metrics).start(nursery)
            nursery.start_soon(doomed.client.send_all, big)
            received = bytearray()
            while chunk := await _receive_or_reset(doomed.client):
                received += chunk
            assert received == b""  # no response: the client's connection closes, and it retries
            await doomed.connection.closed.wait()
            # The other connection goes on, spliced requests included.
            await other.client.send_all(produce_request(7, 2_000_000) + produce_request(8, 100))
            assert await other.responses(2) == [7, 8]
            await other.client.aclose()
            await other.connection.closed.wait()
    assert sample(metrics, "kafka_proxy_inflight_requests") == 0


async def _receive_or_reset(stream: trio.SocketStream) -> bytes:
    try:
        return await stream.receive_some(65536)
    except trio.BrokenResourceError:  # reset by the proxy's close, with our request unread
        return b""


async def test_the_frame_size_limit_holds_for_requests_that_would_be_spliced():
    metrics = ProxyMetrics()
    first = produce_request(1, 1000)
    oversized = produce_request(2, MAX_FRAME + 10)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            served = await Served(FeatureChain([]), metrics).start(nursery)
            await served.client.send_all(first)
            assert await served.responses(1) == [1]
            nursery.start_soon(_send_ignoring_reset, served.client, oversized)
            await served.connection.closed.wait()
    assert served.broker.raw == first  # not one byte of the oversized request went upstream
    assert sample(metrics, "kafka_proxy_connection_errors_total", {"kind": "protocol"}) == 1
    assert sample(metrics, "kafka_proxy_spliced_requests_total") == 0


async def _send_ignoring_reset(stream: trio.SocketStream, data: bytes) -> None:
    try:
        await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the proxy closed the connection on the size prefix, as it should


async def test_a_drain_in_the_middle_of_a_spliced_body_ends_the_connection_at_once():
    """The broker holds part of a frame and will answer nothing more: waiting for it (until
    the server's drain timeout) would only keep the client waiting for nothing."""
    metrics = ProxyMetrics()
    first, big = produce_request(1, 1000), produce_request(2, 2_000_000)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            served = await Served(FeatureChain([]), metrics).start(nursery)
            await served.client.send_all(first)
            assert await served.responses(1) == [1]
            await served.client.send_all(big[: len(big) // 2])  # and then nothing: a stalled client

            def passing_on() -> bool:
                return sample(metrics, "kafka_proxy_inflight_requests") == 1 and len(served.broker.raw) > len(first)

            while not passing_on():  # polled under the test's deadline
                await trio.sleep(0.01)
            served.connection.drain()
            with trio.fail_after(5):
                await served.connection.closed.wait()
            await served.client.aclose()
    assert sample(metrics, "kafka_proxy_inflight_requests") == 0
