"""Prometheus metrics of the proxy, and the small trio HTTP endpoint that serves them.

Label children are looked up once per api key and cached, because ``labels()`` costs a
dictionary walk and a lock on every call and the request path runs it several times per
request.

Resource use, for soak runs and dashboards: ``process_resident_memory_bytes``,
``process_open_fds`` and the rest of prometheus_client's process collector (read from
/proc/self when scraped, on a worker thread), and ``kafka_proxy_trio_tasks``, the live trio
tasks as trio's run statistics count them (the endpoint runs in the proxy's trio thread).
Nothing scraped on the event loop walks the connections: a walk of the task tree of 5,000
connections (15,000 tasks) took 6.5 ms on a warm heap, and listing their 10,000
descriptors 6-20 ms, each a pause at every scrape.
"""

from __future__ import annotations

import logging

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from proxy.protocol.messages import api_name
from proxy.server.health import Health

log = logging.getLogger("proxy.metrics")

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


def live_trio_tasks() -> float:
    """Every live task of the trio run this thread is in (system tasks included); NaN
    outside a trio run, e.g. when a test renders the metrics from plain code."""
    try:
        return float(trio.lowlevel.current_statistics().tasks_living)
    except RuntimeError:
        return float("nan")


class ProxyMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("kafka_proxy_requests", "Requests forwarded or answered, by API.", ["api"], registry=r)
        self.request_bytes = Counter("kafka_proxy_request_bytes", "Request bytes received from clients, by API.",
                                     ["api"], registry=r)
        self.response_bytes = Counter("kafka_proxy_response_bytes", "Response bytes sent to clients, by API.",
                                      ["api"], registry=r)
        self.latency = Histogram("kafka_proxy_request_latency_seconds",
                                 "Time from a request's arrival to its response leaving, by API.",
                                 ["api"], buckets=_LATENCY_BUCKETS, registry=r)
        self.connections = Gauge("kafka_proxy_client_connections", "Open client connections.", registry=r)
        self.connections_total = Counter("kafka_proxy_client_connections_accepted", "Client connections accepted.",
                                         registry=r)
        self.connections_refused = Counter("kafka_proxy_client_connections_refused",
                                           "Client connections refused, by reason.", ["reason"], registry=r)
        self.connections_closed = Counter("kafka_proxy_client_connections_closed",
                                          "Client connections the proxy closed on a timeout, by reason "
                                          "(setup_timeout, idle).", ["reason"], registry=r)
        self.errors = Counter("kafka_proxy_connection_errors", "Connections closed on an error, by kind.", ["kind"],
                              registry=r)
        self.frames_refused = Counter("kafka_proxy_frames_refused",
                                      "Client connections closed for a frame over a size limit, by the limit "
                                      "(max.frame.bytes.unauthenticated, max.frame.bytes).", ["limit"], registry=r)
        self.protocol_limits = Counter("kafka_proxy_protocol_limits_refused",
                                       "Client connections closed for a request over a protocol limit (more array "
                                       "elements or tagged fields than Kafka 4.4 reads), by what was over.",
                                       ["limit"], registry=r)
        # Read when scraped from the server's RequestBudget (watch_budget).
        self.request_bytes_held = Gauge("kafka_proxy_request_bytes_held",
                                        "Bytes of client frames the proxy holds (queued.max.request.bytes bounds "
                                        "it).", registry=r)
        self.request_budget_waits = Gauge("kafka_proxy_request_budget_waits",
                                          "Times a client's reader waited for queued.max.request.bytes to free "
                                          "(a running total).", registry=r)
        # Read when scraped from the proxy's Health (watch_health, once the endpoint serves it).
        self.ready = Gauge("kafka_proxy_ready", "1 while the proxy is ready (what /readyz answers 200 to), else 0.",
                           registry=r)
        self.upstream_connects = Counter("kafka_proxy_upstream_connects", "Upstream connections opened.", registry=r)
        self.upstream_connect_failures = Counter("kafka_proxy_upstream_connect_failures",
                                                 "Upstream connection attempts that failed.", registry=r)
        # Changed twice per request: a plain number, read when the metrics are scraped.
        self.inflight_requests = 0
        self.inflight = Gauge("kafka_proxy_inflight_requests", "Requests awaiting their response.", registry=r)
        self.inflight.set_function(lambda: self.inflight_requests)
        self.spliced_requests = Counter("kafka_proxy_spliced_requests",
                                        "Large requests no feature reads (Produce) whose body went from the client's "
                                        "socket to the broker's without entering the proxy.", registry=r)
        self.native_requests = Counter("kafka_proxy_native_relay_requests",
                                       "Requests forwarded by the native relay loop (no feature reads them).",
                                       registry=r)
        self.native_runs = Counter("kafka_proxy_native_relay_runs",
                                   "Runs of the native relay loop, by how they ended (slice, idle, request, "
                                   "response, woken, aborted, upstream_closed, protocol, broken).",
                                   ["ended"], registry=r)
        self.native_unavailable = Counter("kafka_proxy_native_relay_busy",
                                          "Times a connection could have used the native relay but every "
                                          "native.relay.threads thread was taken.", registry=r)
        self.memory_trims = Counter("kafka_proxy_memory_trims", "Times freed heap was offered back to the kernel "
                                    "(memory.trim.interval.ms).", registry=r)
        self.memory_trim_seconds = Counter("kafka_proxy_memory_trim_seconds", "Time spent giving freed heap back.",
                                           registry=r)
        self.memory_returned_bytes = Counter("kafka_proxy_memory_returned_bytes",
                                             "Resident bytes given back to the kernel by heap trims.", registry=r)
        self._per_api: dict[int, tuple] = {}
        # Resource use, read when scraped: process_resident_memory_bytes, process_open_fds, ...
        # in a registry of their own, read off the event loop (``render_off_loop``)
        self.process_registry = CollectorRegistry()
        ProcessCollector(registry=self.process_registry)
        self.trio_tasks = Gauge("kafka_proxy_trio_tasks", "Live trio tasks, counted when the metrics are scraped.",
                                registry=r)
        self.trio_tasks.set_function(live_trio_tasks)

    def watch_budget(self, budget) -> None:
        """Export a ``proxy.net.budget.RequestBudget``'s figures, read when scraped."""
        self.request_bytes_held.set_function(lambda: budget.held)
        self.request_budget_waits.set_function(lambda: budget.waits)

    def watch_health(self, health: Health) -> None:
        """Export readiness as ``kafka_proxy_ready``, read when scraped: an alert can say how
        long an instance has not been ready, which the probe alone only tells the orchestrator."""
        self.ready.set_function(lambda: 0.0 if health.reasons() else 1.0)

    def for_api(self, api_key: int) -> tuple:
        """(requests, request_bytes, response_bytes, latency) children for one api key."""
        children = self._per_api.get(api_key)
        if children is None:
            try:
                name = api_name(api_key)
            except KeyError:
                name = f"api_{api_key}"
            children = (
                self.requests.labels(name),
                self.request_bytes.labels(name),
                self.response_bytes.labels(name),
                self.latency.labels(name),
            )
            self._per_api[api_key] = children
        return children

    def render(self) -> bytes:
        return generate_latest(self.registry) + generate_latest(self.process_registry)

    async def render_off_loop(self) -> bytes:
        """``render``, the process figures read on a worker thread: ``process_open_fds``
        lists /proc/self/fd, 6-20 ms with the 10,000 descriptors of 5,000 connections held,
        which on the event loop would be a pause at every scrape."""
        process = await trio.to_thread.run_sync(generate_latest, self.process_registry)
        return generate_latest(self.registry) + process


def _answer(status: str, body: bytes, content_type: str = "text/plain; charset=utf-8") -> bytes:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    return head + body


async def serve_metrics(metrics: ProxyMetrics, host: str, port: int, health: Health | None = None,
                        task_status=trio.TASK_STATUS_IGNORED) -> None:
    """GET /metrics on ``host:port``, and the probes: /livez (200 while the event loop
    answers) and /readyz (200, or 503 with the reasons, see ``proxy.server.health``).
    Anything else gets 404. One request per connection."""

    async def handle(stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(5):
                request = b""
                while b"\r\n\r\n" not in request and len(request) < 8192:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        return
                    request += chunk
                line = request.split(b"\r\n", 1)[0].split()
                path = line[1].split(b"?")[0] if len(line) >= 2 and line[0] == b"GET" else None
                if path in (b"/metrics", b"/"):
                    answer = _answer("200 OK", await metrics.render_off_loop(), CONTENT_TYPE_LATEST)
                elif path == b"/livez":
                    answer = _answer("200 OK", b"ok\n")
                elif path == b"/readyz" and health is not None:
                    reasons = health.reasons()
                    answer = (_answer("200 OK", b"ready\n") if not reasons else
                              _answer("503 Service Unavailable", ("\n".join(reasons) + "\n").encode()))
                else:
                    answer = _answer("404 Not Found", b"not found\n")
                await stream.send_all(answer)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await stream.aclose()

    if health is not None:
        metrics.watch_health(health)
    listeners = await trio.open_tcp_listeners(port, host=host)
    log.info("metrics endpoint listening port=%s", listeners[0].socket.getsockname()[1])
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handle, listeners)
