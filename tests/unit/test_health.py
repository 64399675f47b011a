"""Readiness and the probes of the metrics port, without a broker: a listening socket
plays the fronted broker, and closing it makes the broker unreachable."""

from __future__ import annotations

import trio

from proxy.server.health import Health, watch_brokers
from proxy.server.metrics import ProxyMetrics, serve_metrics


async def _get(port: int, path: str) -> tuple[int, str]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    await stream.aclose()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


def test_readiness_needs_the_cluster_every_fronted_broker_and_no_drain():
    health = Health()
    assert health.reasons() == ["cluster metadata not known yet"]
    health.cluster_known = True
    assert health.ready
    health.unreachable = {2: "Connection refused"}
    assert health.reasons() == ["broker 2 unreachable: Connection refused"]
    health.unreachable = {}
    health.draining = True
    assert health.reasons() == ["draining"]


async def test_probes_follow_a_broker_going_away_and_coming_back():
    health = Health()
    health.cluster_known = True
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    broker_port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_metrics, ProxyMetrics(), "127.0.0.1", 0, health)
        await nursery.start(watch_brokers, health, lambda: {1: ("127.0.0.1", broker_port)}, lambda: True, 0.05)
        with trio.fail_after(10):
            while not health.ready:
                await trio.sleep(0.01)
            assert await _get(port, "/livez") == (200, "ok\n")
            assert await _get(port, "/readyz") == (200, "ready\n")
            assert "\nkafka_proxy_ready 1.0\n" in (await _get(port, "/metrics"))[1]
            await listeners[0].aclose()  # the broker goes away
            while health.ready:
                await trio.sleep(0.01)
            status, body = await _get(port, "/readyz")
            assert status == 503 and body.startswith("broker 1 unreachable"), body
            assert (await _get(port, "/livez"))[0] == 200
            assert "\nkafka_proxy_ready 0.0\n" in (await _get(port, "/metrics"))[1]
            listeners = await trio.open_tcp_listeners(broker_port, host="127.0.0.1")  # and comes back
            while not health.ready:
                await trio.sleep(0.01)
            assert await _get(port, "/readyz") == (200, "ready\n")
        nursery.cancel_scope.cancel()
    await listeners[0].aclose()


async def test_a_starting_proxy_is_ready_once_the_cluster_answered_not_a_check_interval_later():
    health = Health()
    answered = trio.Event()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    broker_port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        await nursery.start(watch_brokers, health, lambda: {1: ("127.0.0.1", broker_port)}, answered.is_set, 60.0)
        assert health.reasons() == ["cluster metadata not known yet"]
        await trio.sleep(0.3)  # the cluster answers after the first checks
        answered.set()
        with trio.fail_after(2):  # well within the 60 s interval
            while not health.ready:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    await listeners[0].aclose()
