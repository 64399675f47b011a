"""The Spark source's bootstrap: servers tried again with a backoff until the timeout."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from proxy.spark import cluster
from proxy.spark.options import KeyRangeSourceError


async def test_a_server_that_answers_after_refusing_for_a_while_is_connected(monkeypatch, autojump_clock):
    tries: list[tuple[str, int, float]] = []

    async def open_node(host, port, timeout, client_id):
        tries.append((host, port, trio.current_time()))
        if trio.current_time() < 2.0:
            raise ConnectionRefusedError(111, "refused")
        return object()

    monkeypatch.setattr(cluster, "_open_node", open_node)
    connected = await cluster.ProxyNodes.connect("127.0.0.1:1,127.0.0.1:2", timeout=30)
    assert connected.seed is not None
    assert trio.current_time() >= 2.0
    assert {(h, p) for h, p, _ in tries} == {("127.0.0.1", 1), ("127.0.0.1", 2)}
    gaps = [b - a for (_, _, a), (_, _, b) in zip(tries[::2], tries[2::2])]
    assert gaps and max(gaps) <= cluster._CONNECT_BACKOFF_MAX + 1e-6  # backs off, but never longer than a second


async def test_no_server_within_the_timeout_is_a_clear_error(monkeypatch, autojump_clock):
    async def open_node(host, port, timeout, client_id):
        raise ConnectionRefusedError(111, "refused")

    monkeypatch.setattr(cluster, "_open_node", open_node)
    with pytest.raises(KeyRangeSourceError, match=r"no server answered within 5 s .*127.0.0.1:9"):
        await cluster.ProxyNodes.connect("127.0.0.1:9", timeout=5)
    assert 4.0 <= trio.current_time() <= 5.0
