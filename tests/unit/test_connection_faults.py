"""A fault in a feature (a bug of ours) ends the connection it happened on, and nothing else."""

from __future__ import annotations

import math

import trio
import trio.testing

from proxy.pipeline import ConnectionContext, Feature, FeatureChain, Request, Route
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.framing import frame_bytes
from proxy.server.connection import ClientConnection
from proxy.server.metrics import ProxyMetrics


class _Faulty(Feature):
    """Fails on Metadata, in its request stage or in a task it starts; passes the rest."""

    def __init__(self, in_task: bool) -> None:
        self.in_task = in_task

    def request_stages(self):
        return {ApiKey.METADATA: self.on_metadata}

    async def on_metadata(self, ctx: ConnectionContext, request: Request) -> Route | None:
        if not self.in_task:
            raise RuntimeError("a bug in a request stage")

        async def fails() -> None:
            raise RuntimeError("a bug in a feature's task")

        ctx.start_soon(fails)
        return None


def _metadata_request(correlation_id: int) -> bytes:
    header = messages.new_request_header(ApiKey.METADATA, 12, correlation_id, "probe")
    return frame_bytes(messages.encode_request(header, messages.new_body(ApiKey.METADATA, 12, "request", topics=None)))


async def _serve_one(feature: Feature) -> tuple[bytes, ProxyMetrics]:
    """One connection through ``feature``: what its client reads before it closes, and the metrics."""
    client, proxy_side = trio.testing.memory_stream_pair()
    upstream, _broker = trio.testing.memory_stream_pair()
    metrics = ProxyMetrics()

    async def open_upstream():
        return upstream

    connection = ClientConnection(proxy_side, "127.0.0.1:1", open_upstream=open_upstream,
                                  chain=FeatureChain([feature]), metrics=metrics, max_frame_bytes=1 << 20,
                                  max_inflight=8, idle_timeout=math.inf, target="bootstrap")
    received = bytearray()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(connection.run)
            await client.send_all(_metadata_request(1))
            while chunk := await client.receive_some():
                received += chunk
            await connection.closed.wait()
    return bytes(received), metrics


def _internal_errors(metrics: ProxyMetrics) -> float:
    return metrics.registry.get_sample_value("kafka_proxy_connection_errors_total", {"kind": "internal"}) or 0


async def test_a_failing_request_stage_closes_its_connection_and_only_it():
    received, metrics = await _serve_one(_Faulty(in_task=False))
    assert received == b""  # no answer: the client sees the connection close, and retries
    assert _internal_errors(metrics) == 1


async def test_a_failing_feature_task_closes_its_connection_and_only_it():
    received, metrics = await _serve_one(_Faulty(in_task=True))
    assert received == b""
