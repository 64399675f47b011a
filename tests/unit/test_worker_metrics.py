"""The supervisor's metrics: several workers' expositions read as one process's."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from proxy.server.worker_metrics import merge_expositions, supervisor_lines


def _worker(connections: float, requests: float, ready: float, latencies: list[float], generation: float) -> str:
    registry = CollectorRegistry()
    Gauge("kafka_proxy_client_connections", "Open client connections.", registry=registry).set(connections)
    Counter("kafka_proxy_requests", "Requests, by API.", ["api"], registry=registry).labels("Fetch").inc(requests)
    Gauge("kafka_proxy_ready", "1 while ready.", registry=registry).set(ready)
    Gauge("kafka_proxy_config_generation", "The settings in force.", registry=registry).set(generation)
    histogram = Histogram("kafka_proxy_request_latency_seconds", "Latency.", ["api"], buckets=(0.01, 1),
                          registry=registry)
    for latency in latencies:
        histogram.labels("Fetch").observe(latency)
    return generate_latest(registry).decode()


def _values(text: str) -> dict[tuple[str, tuple], float]:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_what_workers_hold_and_count_adds_up():
    merged = _values(merge_expositions([_worker(3, 10, 1, [0.005, 2], 1), _worker(4, 5, 1, [0.5], 1)]))
    assert merged[("kafka_proxy_client_connections", ())] == 7
    assert merged[("kafka_proxy_requests_total", (("api", "Fetch"),))] == 15
    assert merged[("kafka_proxy_request_latency_seconds_count", (("api", "Fetch"),))] == 3
    assert merged[("kafka_proxy_request_latency_seconds_bucket", (("api", "Fetch"), ("le", "0.01")))] == 1
    assert merged[("kafka_proxy_request_latency_seconds_bucket", (("api", "Fetch"), ("le", "1.0")))] == 2
    assert merged[("kafka_proxy_request_latency_seconds_sum", (("api", "Fetch"),))] == 2.505


def test_ready_and_the_settings_generation_are_those_of_every_worker():
    merged = _values(merge_expositions([_worker(0, 0, 1, [], 2), _worker(0, 0, 0, [], 1)]))
    assert merged[("kafka_proxy_ready", ())] == 0
    assert merged[("kafka_proxy_config_generation", ())] == 1


def test_the_merge_is_a_valid_exposition_with_each_family_once():
    text = merge_expositions([_worker(1, 1, 1, [0.1], 1)] * 3) + supervisor_lines(3, 3, 1)
    families = [family.name for family in text_string_to_metric_families(text)]
    assert len(families) == len(set(families))
    assert text.count("# TYPE kafka_proxy_requests counter") == 1
    assert _values(text)[("kafka_proxy_workers", ())] == 3
    assert _values(text)[("kafka_proxy_worker_restarts_total", ())] == 1


def test_labels_are_escaped_again():
    registry = CollectorRegistry()
    Counter("kafka_proxy_x", "doc with \\ and\nnewline", ["reason"], registry=registry).labels('a"b\\c\nd').inc()
    merged = _values(merge_expositions([generate_latest(registry).decode()] * 2))
    assert merged[("kafka_proxy_x_total", (("reason", 'a"b\\c\nd'),))] == 2


def test_no_worker_answered_gives_only_the_supervisors_lines():
    assert merge_expositions([]) == ""


def test_a_worker_that_does_not_answer_counts_with_what_it_last_gave():
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from proxy.server.worker_metrics import WorkerView, scrape

    exposition = _worker(5, 7, 1, [], 1).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(exposition)))
            self.end_headers()
            self.wfile.write(exposition)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    view = WorkerView("127.0.0.1", 2)
    view.started(0, server.server_address[1])
    try:
        first = _values(scrape(view))
    finally:
        server.shutdown()
        server.server_close()
    second = _values(scrape(view))  # the worker's port is closed now
    assert first[("kafka_proxy_requests_total", (("api", "Fetch"),))] == 7
    assert first[("kafka_proxy_workers_answering", ())] == 1
    assert second[("kafka_proxy_requests_total", (("api", "Fetch"),))] == 7  # no drop that reads as a reset
    assert second[("kafka_proxy_workers_answering", ())] == 0
    view.started(0, None)  # started again: its counters begin at zero
    assert ("kafka_proxy_requests_total", (("api", "Fetch"),)) not in _values(scrape(view))
