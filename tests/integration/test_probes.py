"""/livez and /readyz on the metrics port against a real broker that is stopped and started
again: the proxy is live throughout, ready only while its broker accepts connections, not
ready while it drains after SIGTERM, and says each change once in its log."""

from __future__ import annotations

import signal
import urllib.error
import urllib.request

from harness.kafka_cluster import KafkaCluster
from harness.wait import wait_until


def _probe(proxy, path: str) -> tuple[int, str]:
    url = proxy.metrics_url.removesuffix("/metrics") + path
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_readiness_follows_the_broker_and_the_drain(tmp_path, proxy_factory):
    cluster = KafkaCluster.start(1, workdir=tmp_path / "kafka")
    try:
        proxy = proxy_factory(cluster, metrics_port="0", shutdown_drain_timeout_ms="10000")
        wait_until(lambda: _probe(proxy, "/readyz") == (200, "ready\n"), timeout=30, interval=0.2,
                   what="ready once the broker answered")
        assert _probe(proxy, "/livez") == (200, "ok\n")

        cluster.stop_node(1)
        wait_until(lambda: _probe(proxy, "/readyz")[0] == 503, timeout=30, interval=0.2,
                   what="not ready with the broker down")
        status, reasons = _probe(proxy, "/readyz")
        assert "broker 1 unreachable" in reasons, reasons
        assert _probe(proxy, "/livez") == (200, "ok\n")  # the proxy itself is fine

        cluster.start_node(1)
        wait_until(lambda: _probe(proxy, "/readyz") == (200, "ready\n"), timeout=60, interval=0.2,
                   what="ready again with the broker back")
        log = proxy.log_text()
        assert "not ready reasons='broker 1 unreachable" in log
        assert log.count('msg="ready"') >= 2, log[-2000:]

        proxy.process.send_signal(signal.SIGTERM)
        wait_until(lambda: proxy.process.poll() is not None or "draining" in _probe_quietly(proxy),
                   timeout=15, interval=0.05, what="not ready while draining")
    finally:
        cluster.close()


def _probe_quietly(proxy) -> str:
    try:
        return _probe(proxy, "/readyz")[1]
    except OSError:
        return "draining"  # the endpoint is gone: the proxy stopped after its drain
