"""One metrics and probe endpoint for a proxy of several ``workers``.

Each worker serves its own metrics on a port of its own; the supervisor answers on
``metrics.port`` for the proxy as a whole, so a scrape, a dashboard and an orchestrator's
probes see one proxy however many processes serve it. The supervisor keeps no metrics of
its own beyond its workers': it reads every worker's exposition when it is scraped and adds
them up (``merge_expositions``, pure).

Most series add up: counters, histograms, and gauges of things held (connections, bytes
cached, leases). A few do not, and take the least or the greatest of the workers' values
instead: the proxy is ready only while every worker is (the least), runs the settings
generation every worker runs and has reloaded its settings as often as every worker has
(the least: a SIGHUP reaches every worker), and started when its first worker did. A worker
that restarts begins its counters at zero again, so the sum drops once; Prometheus' rate()
reads a drop as a counter reset, as it does for a restarted single process.
"""

from __future__ import annotations

import logging
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

log = logging.getLogger("proxy.workers")

SCRAPE_TIMEOUT = 5.0  # seconds one worker has to answer the supervisor's scrape or probe

LEAST_OF = frozenset({
    "kafka_proxy_ready",
    "kafka_proxy_config_generation",
    "kafka_proxy_config_reloads",
    "process_start_time_seconds",
    "process_max_fds",
})
GREATEST_OF = frozenset({
    "kafka_proxy_config_last_reload_timestamp_seconds",
    "kafka_proxy_config_restart_pending",
    "kafka_proxy_coop_marker_lag",
})


def _combine(family: str, kind: str, sample: str) -> Callable[[float, float], float]:
    if sample.endswith("_created") or family in LEAST_OF:
        return min
    if family in GREATEST_OF or kind == "info":
        return max
    return float.__add__


def merge_expositions(texts: Sequence[str]) -> str:
    """The Prometheus text exposition of several workers as one process's: every series
    (name and labels) once, its values combined as the module docstring says; families in
    the order they first appear."""
    families: dict[str, tuple[str, str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            _, _, series = families.setdefault(family.name, (family.type, family.documentation, {}))
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                value = float(sample.value)
                if key in series:
                    series[key] = _combine(family.name, family.type, sample.name)(series[key], value)
                else:
                    series[key] = value
    lines: list[str] = []
    for name, (kind, documentation, series) in families.items():
        lines.append(f"# HELP {name} {_escape_help(documentation)}")
        lines.append(f"# TYPE {name} {kind}")
        for (sample_name, labels), value in series.items():
            label_text = ",".join(f'{key}="{_escape_label(val)}"' for key, val in labels)
            lines.append(f"{sample_name}{{{label_text}}} {floatToGoString(value)}" if labels
                         else f"{sample_name} {floatToGoString(value)}")
    return "\n".join(lines) + "\n" if lines else ""


def supervisor_lines(workers: int, answering: int, restarts: int) -> str:
    """The supervisor's own series, after its workers'."""
    return (
        "# HELP kafka_proxy_workers Worker processes this proxy runs (the setting workers).\n"
        "# TYPE kafka_proxy_workers gauge\n"
        f"kafka_proxy_workers {workers}\n"
        "# HELP kafka_proxy_workers_answering Workers whose metrics this scrape read in time (the others count "
        "with the metrics they last gave).\n"
        "# TYPE kafka_proxy_workers_answering gauge\n"
        f"kafka_proxy_workers_answering {answering}\n"
        "# HELP kafka_proxy_worker_restarts Workers started again after they exited on their own.\n"
        "# TYPE kafka_proxy_worker_restarts counter\n"
        f"kafka_proxy_worker_restarts_total {restarts}\n"
    )


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_label(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class WorkerView:
    """What the endpoint needs from the supervisor: each worker's metrics address (None
    while it starts), and the restarts so far. Read from the endpoint's threads."""

    def __init__(self, host: str, count: int) -> None:
        self.host = host
        self.ports: list[int | None] = [None] * count
        self.restarts = 0
        # each worker's last exposition read, served again while it does not answer in time
        # (a busy event loop): a series left out would read as a counter reset
        self.last: list[str | None] = [None] * count

    def started(self, index: int, port: int | None) -> None:
        """Worker ``index`` (started again, or for the first time) serves on ``port``."""
        if self.ports[index] != port:
            self.ports[index] = port
            self.last[index] = None


def _get(host: str, port: int, path: str) -> tuple[int, str]:
    url_host = f"[{host}]" if ":" in host else host
    try:
        with urllib.request.urlopen(f"http://{url_host}:{port}{path}", timeout=SCRAPE_TIMEOUT) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def readiness(view: WorkerView) -> list[str]:
    """Why the proxy is not ready: every worker's reasons, each line naming the worker."""
    reasons: list[str] = []
    for index, port in enumerate(view.ports):
        if port is None:
            reasons.append(f"worker {index}: starting")
            continue
        try:
            status, body = _get(view.host, port, "/readyz")
        except OSError as exc:
            reasons.append(f"worker {index}: does not answer ({exc})")
            continue
        if status != 200:
            reasons += [f"worker {index}: {line}" for line in body.splitlines() if line] or [f"worker {index}: {status}"]
    return reasons


def scrape(view: WorkerView) -> str:
    """Every worker's metrics added up, the workers read at once; a worker that does not
    answer in time counts with the exposition it last gave."""
    answered: list[bool] = [False] * len(view.ports)

    def read(index: int, port: int) -> None:
        try:
            status, body = _get(view.host, port, "/metrics")
        except OSError as exc:
            log.warning("worker metrics unread worker=%d reason=%s", index, exc)
            return
        if status == 200 and view.ports[index] == port:
            view.last[index] = body
            answered[index] = True

    readers = [threading.Thread(target=read, args=(index, port), daemon=True)
               for index, port in enumerate(view.ports) if port is not None]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(SCRAPE_TIMEOUT + 1)
    texts = [text for text in view.last if text is not None]
    return merge_expositions(texts) + supervisor_lines(len(view.ports), sum(answered), view.restarts)


def serve(view: WorkerView, host: str, port: int) -> ThreadingHTTPServer:
    """The supervisor's endpoint on ``host:port`` (0: the system picks), served from a
    thread: /metrics, /livez (the supervisor answers), /readyz (every worker is ready)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the http.server name)
            path = self.path.split("?", 1)[0]
            if path in ("/metrics", "/"):
                self._answer(200, scrape(view), "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/livez":
                self._answer(200, "ok\n")
            elif path == "/readyz":
                reasons = readiness(view)
                self._answer(503, "\n".join(reasons) + "\n") if reasons else self._answer(200, "ready\n")
            else:
                self._answer(404, "not found\n")

        def _answer(self, status: int, text: str, content_type: str = "text/plain; charset=utf-8") -> None:
            body = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 (the http.server name)
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    server = Server((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="worker-metrics", daemon=True).start()
    log.info("metrics endpoint listening port=%s workers=%d", server.server_address[1], len(view.ports))
    return server
