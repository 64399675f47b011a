"""The proxy's resource gauges: live trio tasks counted at scrape time, and the process
collector's memory and file descriptors, on the proxy's own registry."""

from __future__ import annotations

import math

import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from proxy.server.metrics import ProxyMetrics, live_trio_tasks, serve_metrics


def _samples(text: str) -> dict[str, float]:
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if not sample.labels}


def test_live_tasks_outside_a_trio_run_are_not_a_number() -> None:
    assert math.isnan(live_trio_tasks())
    text = ProxyMetrics().render().decode()  # rendering from plain code still works
    assert "kafka_proxy_trio_tasks NaN" in text


async def test_the_gauge_follows_the_tasks_started_and_finished() -> None:
    metrics = ProxyMetrics()

    def gauge() -> float:
        return _samples(metrics.render().decode())["kafka_proxy_trio_tasks"]

    before = gauge()
    assert before >= 2  # at least trio's init task and this test's task
    release = trio.Event()

    async def parent() -> None:
        async with trio.open_nursery() as inner:
            for _ in range(3):
                inner.start_soon(release.wait)

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(release.wait)
        nursery.start_soon(parent)
        await trio.testing.wait_all_tasks_blocked()
        assert gauge() == before + 4 + 1 + 3
        release.set()
    assert gauge() == before


async def test_the_endpoint_serves_tasks_rss_and_open_fds() -> None:
    metrics = ProxyMetrics()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_metrics, metrics, "127.0.0.1", 0)
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                response = b""
                while chunk := await stream.receive_some(65536):
                    response += chunk
        nursery.cancel_scope.cancel()
    head, body = response.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200")
    values = _samples(body.decode())
    assert values["kafka_proxy_trio_tasks"] >= 4  # init, this test, the listener, the handler
    assert values["process_resident_memory_bytes"] > 1 << 20
    assert values["process_open_fds"] >= 3
