"""Connection load: what idle client connections cost the proxy, whether they slow the
active ones, and how it behaves at ``max.connections`` and under a crowd of silent clients.

    flock /tmp/keyrange-bench.lock .venv/bin/python -m benchmarks.bench_connections

One one-node Kafka; the proxy as one process (``workers=1``, the one setting not left at
its default: every figure here is what one event loop holds, and ``max.connections`` is
counted by each worker); the load generator is this process,
on trio, holding every socket itself (an idle socket costs it a file descriptor and a few
hundred bytes, no task).

1. Held connections: opened in steps (0, 1,000, 2,500, 5,000), each having had an
   ApiVersions request answered through the proxy, so the proxy also holds a broker
   connection for each. At each step, once the proxy counts them all, its RSS and open file
   descriptors (summed over its process and its workers: ``harness.processes``), and the
   broker's descriptors. Memory per connection = the least-squares slope of RSS over the steps.
2. Active load: 200 more connections in request loops of Metadata (no topics: the brokers
   only; the proxy decodes and rewrites every response), closed loop (each sends its next
   request when the last is answered) and paced (each one request per 100 ms: 2,000/s in
   all), in windows of a few seconds after a warm-up; requests/s, p50/p99 latency, and the
   proxy's CPU seconds per request. The same load runs against a second proxy process of
   the same settings, in front of the same broker, that holds no idle connection: rounds
   alternate the two (order rotating), and each ratio is paired within a round. Both see
   the broker with the 5,000 connections of the first one, so the ratio is the proxy's
   own cost of holding them.
3. ``max.connections`` = 5,200 with 5,000 held: 300 more clients each send ApiVersions;
   exactly 200 must be answered and 100 closed without an answer, counted in
   ``kafka_proxy_client_connections_refused_total``; then every one of the 5,200 held
   must still answer.
4. Silent connections (no request: no broker connection), on a fresh proxy, in the same
   steps as 1: their RSS and descriptors.
5. A crowd of 5,000 silent connections against ``connections.setup.timeout.ms`` = 5 s, on a
   fresh proxy: when each was closed against its deadline, and the log lines written.

``main`` writes ``benchmarks/results/connections.json`` and ``connections.png``.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import struct
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import trio

from benchmarks import results
from benchmarks.benchmark import Benchmark
from benchmarks.rounds import Row, goal, rotation
from harness.processes import cpu_seconds, open_fds, rss_bytes
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey

ONE_WORKER = {"workers": "1"}  # what one process holds (see the docstring)
CONNECT_CONCURRENCY = 64  # connections being opened at once (the proxy's listen backlog is 1024)
CHECK_CONCURRENCY = 256  # held connections asked at once in the final check
HELD = "held (each had ApiVersions answered: a broker connection too)"
SILENT = "silent (no request: no broker connection)"


# -- the wire ---------------------------------------------------------------------------------
def _frame(api_key: int, version: int, correlation_id: int, **fields) -> bytes:
    header = messages.new_request_header(api_key, version, correlation_id, "bench-connections")
    body = messages.encode_request(header, messages.new_body(api_key, version, "request", **fields))
    return struct.pack(">i", len(body)) + body


def api_versions(correlation_id: int) -> bytes:
    return _frame(ApiKey.API_VERSIONS, 3, correlation_id, client_software_name="bench", client_software_version="1")


def metadata(correlation_id: int) -> bytes:
    return _frame(ApiKey.METADATA, 12, correlation_id, topics=[], allow_auto_topic_creation=False)


class Refused(Exception):
    """The proxy closed the connection instead of answering."""


async def exchange(stream: trio.SocketStream, request: bytes) -> int:
    """Send one request, read its response; the response's correlation id."""
    await stream.send_all(request)
    buffer = bytearray()
    while True:
        try:
            chunk = await stream.receive_some(65536)
        except trio.BrokenResourceError as exc:  # reset: the proxy closed with our bytes unread
            raise Refused() from exc
        if not chunk:
            raise Refused()
        buffer += chunk
        if len(buffer) >= 8:
            size, correlation_id = struct.unpack_from(">ii", buffer)
            if len(buffer) >= 4 + size:
                return correlation_id


async def connect(port: int) -> trio.SocketStream:
    sock = trio.socket.socket()
    await sock.connect(("127.0.0.1", port))
    return trio.SocketStream(sock)


async def open_many(port: int, count: int, *, request: bool) -> tuple[list[trio.SocketStream], int]:
    """``count`` new connections, each with an ApiVersions answered if ``request``; and how
    many were refused (closed without an answer; those are closed here)."""
    opened: list[trio.SocketStream] = []
    refused = 0
    limiter = trio.CapacityLimiter(CONNECT_CONCURRENCY)

    async def one(index: int) -> None:
        nonlocal refused
        async with limiter:
            stream = await connect(port)
            if request:
                try:
                    await exchange(stream, api_versions(index))
                except Refused:
                    refused += 1
                    await stream.aclose()
                    return
            opened.append(stream)

    async with trio.open_nursery() as nursery:
        for index in range(count):
            nursery.start_soon(one, index)
    return opened, refused


async def close_all(streams: Sequence[trio.SocketStream]) -> None:
    for stream in streams:
        await stream.aclose()


# -- the proxy and the broker, seen from /metrics (and /proc: harness.processes) ---------------
def scrape(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


async def metric(url: str, name: str) -> float:
    return (await trio.to_thread.run_sync(scrape, url)).get(name, 0.0)


async def wait_for_metric(url: str, name: str, target: float, timeout: float) -> None:
    """Until the proxy's ``name`` equals ``target``, polled every 50 ms, for ``timeout`` seconds at most."""
    deadline = trio.current_time() + timeout
    value = await metric(url, name)
    while value != target:
        if trio.current_time() > deadline:
            raise RuntimeError(f"{name} is {value}, not {target}, after {timeout} s")
        await trio.sleep(0.05)
        value = await metric(url, name)


CONNECTIONS = "kafka_proxy_client_connections"
REFUSED = 'kafka_proxy_client_connections_refused_total{reason="max_connections"}'
SETUP_CLOSED = 'kafka_proxy_client_connections_closed_total{reason="setup_timeout"}'
GC_FULL_SECONDS = 'kafka_proxy_gc_pause_seconds_total{generation="2"}'
GC_FULL_RUNS = 'kafka_proxy_gc_collections_total{generation="2"}'
HEAP_BLOCKS = "kafka_proxy_heap_blocks"
FROZEN_WALKS = "kafka_proxy_gc_frozen_walks_total"
STOCK = {"memory.gc.freeze.interval.ms": "0"}  # the collector as CPython sets it (frozen once at start)


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of ys over xs."""
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    return (sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
            / sum((x - mean_x) ** 2 for x in xs))


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


# -- the phases --------------------------------------------------------------------------------
async def steps(port: int, url: str, pid: int, broker_pid: int | None, targets: Sequence[int], *, request: bool,
                say) -> tuple[list[dict], list[trio.SocketStream]]:
    held: list[trio.SocketStream] = []
    points = []
    for target in targets:
        began = time.monotonic()
        opened, refused = await open_many(port, target - len(held), request=request)
        if refused:
            raise RuntimeError(f"{refused} connections refused below max.connections")
        held += opened
        took = time.monotonic() - began
        await wait_for_metric(url, CONNECTIONS, target, timeout=60)
        rss, fds = rss_bytes(pid), open_fds(pid)
        broker_fds = open_fds(broker_pid) if broker_pid else None
        points.append({"connections": target, "proxy_rss_bytes": rss, "proxy_fds": fds, "broker_fds": broker_fds,
                       "open_seconds": round(took, 2)})
        say(f"{'held' if request else 'silent'} {target}: rss {rss / 2**20:.1f} MiB, fds {fds}, "
            f"broker fds {broker_fds}, opened in {took:.1f} s")
    return points, held


async def active_window(port: int, url: str, pid: int, count: int, *, warmup: float, window: float,
                        pace: float | None) -> dict:
    """``count`` connections in Metadata loops (closed loop, or one request per ``pace``
    seconds each); what the ``window`` seconds after ``warmup`` measured. Returns once the
    proxy has seen them close again."""
    base = await metric(url, CONNECTIONS)
    streams, refused = await open_many(port, count, request=True)
    if refused:
        raise RuntimeError(f"{refused} active connections refused")
    latencies: list[float] = []
    start = trio.current_time()
    measure_from, end = start + warmup, start + warmup + window
    cpu: dict[str, float] = {}

    async def loop(index: int, stream: trio.SocketStream) -> None:
        request = metadata(index)
        next_at = start + (pace * index / count if pace else 0.0)
        while True:
            if pace:
                await trio.sleep_until(next_at)
                next_at += pace
            began = trio.current_time()
            if began >= end:
                return
            await exchange(stream, request)
            if began >= measure_from:
                latencies.append(trio.current_time() - began)

    async def cpu_marks() -> None:
        await trio.sleep_until(measure_from)
        cpu["from"] = cpu_seconds([pid])
        before = await trio.to_thread.run_sync(scrape, url)
        await trio.sleep_until(end)
        cpu["to"] = cpu_seconds([pid])
        after = await trio.to_thread.run_sync(scrape, url)
        for key, metric_name in (("gc_full_seconds", GC_FULL_SECONDS), ("gc_full_collections", GC_FULL_RUNS)):
            cpu[key] = after.get(metric_name, 0.0) - before.get(metric_name, 0.0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(cpu_marks)
        for index, stream in enumerate(streams):
            nursery.start_soon(loop, index, stream)
    await close_all(streams)
    await wait_for_metric(url, CONNECTIONS, base, timeout=60)
    requests = len(latencies)
    return {"requests_per_second": requests / window, "p50_ms": percentile(latencies, 0.5) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000, "p999_ms": percentile(latencies, 0.999) * 1000,
            "max_ms": max(latencies) * 1000, "proxy_cpu_us_per_request": (cpu["to"] - cpu["from"]) / requests * 1e6,
            "requests": requests, "gc_full_seconds": cpu["gc_full_seconds"],
            "gc_full_collections": cpu["gc_full_collections"]}


async def active_pair(port: int, url: str, pid: int, args, say, label: str) -> dict:
    """A closed-loop window, then a paced one."""
    closed = await active_window(port, url, pid, args.active, warmup=args.warmup, window=args.window, pace=None)
    paced = await active_window(port, url, pid, args.active, warmup=args.warmup, window=args.window,
                                pace=args.pace_ms / 1000)
    say(f"active {label}: closed loop {closed['requests_per_second']:,.0f}/s p50 {closed['p50_ms']:.2f} ms "
        f"p99 {closed['p99_ms']:.2f} ms cpu {closed['proxy_cpu_us_per_request']:.0f} us/req; paced "
        f"{paced['requests_per_second']:,.0f}/s p50 {paced['p50_ms']:.2f} ms p99 {paced['p99_ms']:.2f} ms "
        f"max {paced['max_ms']:.0f} ms; full collections {closed['gc_full_collections']:.0f} + "
        f"{paced['gc_full_collections']:.0f} taking {closed['gc_full_seconds'] + paced['gc_full_seconds']:.2f} s")
    return {"closed_loop": closed, "paced": paced}


async def churn_soak(port: int, url: str, pid: int, minutes: float, churn: int, interval: float,
                     say) -> list[dict]:
    """With the held connections open: every second ``churn`` connections are opened, have
    an ApiVersions answered and close, for ``minutes``; every ``interval`` seconds the
    proxy's RSS, heap blocks and walks of the frozen heap are sampled."""
    samples: list[dict] = []
    began = trio.current_time()
    end = began + minutes * 60
    opened_total = 0

    async def sampler() -> None:
        while trio.current_time() < end:
            values = await trio.to_thread.run_sync(scrape, url)
            samples.append({"seconds": round(trio.current_time() - began, 1), "proxy_rss_bytes": rss_bytes(pid),
                            "heap_blocks": values.get(HEAP_BLOCKS, 0.0), "frozen_walks": values.get(FROZEN_WALKS, 0.0),
                            "gc_full_seconds": values.get(GC_FULL_SECONDS, 0.0), "churned": opened_total})
            await trio.sleep(interval)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sampler)
        while trio.current_time() < end:
            second = trio.current_time() + 1.0
            streams, refused = await open_many(port, churn, request=True)
            if refused:
                raise RuntimeError(f"{refused} churn connections refused")
            opened_total += len(streams)
            await close_all(streams)
            await trio.sleep_until(second)
    last = samples[-1]
    say(f"soak {minutes:g} min, {opened_total:,} connections churned: rss {last['proxy_rss_bytes'] / 2**20:.1f} MiB, "
        f"heap blocks {last['heap_blocks']:,.0f}, walks {last['frozen_walks']:.0f}")
    return samples


def growth_per_hour(samples: Sequence[dict], key: str) -> float:
    """The least-squares slope of ``key`` over the samples after the first quarter, per
    hour, as a fraction of its mean there."""
    tail = samples[len(samples) // 4:]
    xs = [s["seconds"] / 3600 for s in tail]
    ys = [float(s[key]) for s in tail]
    mean = statistics.fmean(ys)
    return slope(xs, ys) / mean if mean and len(tail) >= 3 else 0.0


async def check_all_answer(streams: Sequence[trio.SocketStream]) -> int:
    answered = 0
    limiter = trio.CapacityLimiter(CHECK_CONCURRENCY)

    async def one(index: int, stream: trio.SocketStream) -> None:
        nonlocal answered
        async with limiter:
            if await exchange(stream, metadata(index)) == index:
                answered += 1

    async with trio.open_nursery() as nursery:
        for index, stream in enumerate(streams):
            nursery.start_soon(one, index, stream)
    return answered


async def setup_crowd(port: int, url: str, count: int, timeout: float) -> dict:
    """``count`` silent connections; when the proxy closed each, against its deadline."""
    lateness: list[float] = []
    early = 0
    limiter = trio.CapacityLimiter(CONNECT_CONCURRENCY)

    async def one() -> None:
        nonlocal early
        async with limiter:
            began = trio.current_time()
            stream = await connect(port)
        try:
            with trio.fail_after(timeout + 60):
                data = await stream.receive_some(1)
        except trio.BrokenResourceError:
            data = b""
        assert data == b"", "the proxy sent bytes to a silent client"
        closed_after = trio.current_time() - began
        if closed_after < timeout:
            early += 1
        lateness.append(closed_after - timeout)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)
    return {"connections": count, "timeout_s": timeout, "closed_before_deadline": early,
            "late_p50_ms": percentile(lateness, 0.5) * 1000, "late_p99_ms": percentile(lateness, 0.99) * 1000,
            "late_max_ms": max(lateness) * 1000, "counted": await metric(url, SETUP_CLOSED)}


# -- the chart ----------------------------------------------------------------------------------
def draw(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (memory, fds, active) = plt.subplots(1, 3, figsize=(16, 4.8), gridspec_kw={"width_ratios": [1, 1, 1.2]})
    series = report["series"]
    for name, points in series.items():
        xs = [p["connections"] for p in points]
        rss = [p["proxy_rss_bytes"] / 2**20 for p in points]
        per = report["per_connection"][name]["rss_bytes"]
        line = memory.plot(xs, rss, marker="o", label=f"{name.split(' (')[0]}: {per / 1024:.1f} KiB per connection")
        fds.plot(xs, [p["proxy_fds"] for p in points], marker="o", color=line[0].get_color(),
                 label=f"proxy, {name.split(' (')[0]}")
        if points[0]["broker_fds"] is not None:
            fds.plot(xs, [p["broker_fds"] for p in points], marker="x", linestyle="--", color=line[0].get_color(),
                     label=f"broker, {name.split(' (')[0]}")
    memory.set_xlabel("client connections held")
    memory.set_ylabel("proxy RSS (MiB)")
    memory.set_title("Proxy memory", fontsize=10)
    memory.legend(fontsize=8)
    fds.set_xlabel("client connections held")
    fds.set_ylabel("open file descriptors")
    fds.set_title("File descriptors", fontsize=10)
    fds.legend(fontsize=8)
    rows = [r for r in report["rows"] if r.get("ratio") is not None]
    labels = [f"{r['group']}" for r in rows]
    ratios = [r["ratio"] for r in rows]
    low = [r["ratio"] - r["ratio_spread"][0] for r in rows]
    high = [r["ratio_spread"][1] - r["ratio"] for r in rows]
    positions = list(range(len(rows)))[::-1]
    active.barh(positions, ratios, xerr=[low, high], capsize=3)
    active.set_yticks(positions, labels, fontsize=7)
    active.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    for y, ratio in zip(positions, ratios):
        active.text(ratio, y, f" {ratio:.2f}", va="center", fontsize=7)
    active.set_xlabel(f"holding {report['sizes']['steps'][-1]:,} idle / holding none "
                      f"(median of {len(rows[0]['round_ratios']) if rows else 0} rounds; bars: range)", fontsize=8)
    active.set_title(f"{report['sizes']['active']} active connections", fontsize=10)
    figure.suptitle(report["title"], fontsize=11)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


# -- main -------------------------------------------------------------------------------------------
def _say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


async def run(report: dict, args, cluster, workdir: Path) -> None:
    from proxy.local_kafka import ProxyProcess

    broker_pid = cluster.nodes[0].pid
    top = args.steps[-1]
    limit = top + args.active
    settings = {"metrics.port": "0", "max.connections": str(limit), **ONE_WORKER}
    proxy = ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / "proxy", overrides=settings)
    bare = ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / "bare", overrides=settings)
    stock = ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / "stock", overrides={**settings, **STOCK})
    pid, url = proxy.pid, proxy.metrics_url
    assert url is not None and bare.metrics_url is not None and stock.metrics_url is not None
    contenders = {"held": (proxy.port, url, pid), "bare": (bare.port, bare.metrics_url, bare.pid),
                  "stock": (stock.port, stock.metrics_url, stock.pid)}
    try:
        _say(f"proxy pid {pid} (to hold {top}), bare proxy pid {bare.pid}; max.connections {limit}; "
             f"broker pid {broker_pid}")
        for port, metrics_url, process in contenders.values():  # warm-up, not recorded
            await active_window(port, metrics_url, process, args.active, warmup=0, window=args.window, pace=None)
        points, held = await steps(proxy.port, url, pid, broker_pid, args.steps, request=True, say=_say)
        report["series"] = {HELD: points}
        stock_held, refused = await open_many(stock.port, top, request=True)
        if refused:
            raise RuntimeError(f"{refused} connections refused below max.connections")
        windows: dict[str, list[dict]] = {"held": [], "bare": [], "stock": []}
        labels = {"held": f"with {top} held", "bare": "bare", "stock": f"with {top} held, collector as CPython sets it"}
        for round_number in range(args.rounds):
            for name in rotation(["bare", "held", "stock"], round_number):
                windows[name].append(await active_pair(*contenders[name], args, _say,
                                                       f"round {round_number + 1}, {labels[name]}"))
        report["active"] = windows
        await close_all(stock_held)
        stock.stop()
        if args.soak_minutes > 0:
            report["soak"] = await churn_soak(proxy.port, url, pid, args.soak_minutes, args.churn, 10.0, _say)
        # max.connections: `top` held, `beyond` more try; exactly `limit - top` get in.
        await wait_for_metric(url, CONNECTIONS, top, timeout=60)
        refused_before = await metric(url, REFUSED)
        extra, refused = await open_many(proxy.port, args.beyond, request=True)
        counted = await metric(url, REFUSED) - refused_before
        held += extra
        answered = await check_all_answer(held)
        log_lines = sum("refusing connection" in line for line in proxy.log_text().splitlines())
        report["refusals"] = {"max_connections": limit, "held": top, "tried": args.beyond, "admitted": len(extra),
                              "refused": refused, "refusals_counted": counted, "refusal_log_lines": log_lines,
                              "held_answered_after": answered, "held_total": len(held)}
        _say(f"max.connections {limit}: {len(extra)} of {args.beyond} admitted, {refused} refused "
             f"({counted:.0f} counted, {log_lines} log lines); {answered} of {len(held)} held answer")
        await close_all(held)
        await wait_for_metric(url, CONNECTIONS, 0, timeout=120)
        report["after_close"] = {"proxy_rss_bytes": rss_bytes(pid), "proxy_fds": open_fds(pid),
                                 "broker_fds": open_fds(broker_pid) if broker_pid else None}
    finally:
        proxy.stop()
        bare.stop()
        stock.stop()

    # Silent connections: no request, no broker connection; a fresh proxy (the first one's
    # freed memory would be reused), the setup timeout out of the way.
    silent = ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / "silent",
                                overrides={"metrics.port": "0", "connections.setup.timeout.ms": "600000", **ONE_WORKER})
    try:
        assert silent.metrics_url is not None
        points, held = await steps(silent.port, silent.metrics_url, silent.pid, None, args.steps, request=False,
                                   say=_say)
        report["series"][SILENT] = points
        await close_all(held)
    finally:
        silent.stop()

    # A crowd of silent clients against the setup timeout.
    crowd = ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / "crowd",
                               overrides={"metrics.port": "0", **ONE_WORKER,
                                          "connections.setup.timeout.ms": str(int(args.crowd_timeout * 1000))})
    try:
        assert crowd.metrics_url is not None
        outcome = await setup_crowd(crowd.port, crowd.metrics_url, args.crowd, args.crowd_timeout)
        outcome["log_lines"] = sum("closing connection not set up in time" in line
                                   for line in crowd.log_text().splitlines())
        report["setup_crowd"] = outcome
        _say(f"setup crowd: {outcome}")
    finally:
        crowd.stop()


def summarise(report: dict, args) -> None:
    top = args.steps[-1]
    per: dict[str, dict] = {}
    for name, points in report["series"].items():
        xs = [p["connections"] for p in points]
        per[name] = {"rss_bytes": slope(xs, [p["proxy_rss_bytes"] for p in points]),
                     "proxy_fds": slope(xs, [p["proxy_fds"] for p in points])}
        if points[0]["broker_fds"] is not None:
            per[name]["broker_fds"] = slope(xs, [p["broker_fds"] for p in points])
        last = points[-1]
        report["rows"].append(Row(f"proxy RSS per connection, {name.split(' (')[0]}", "slope over the steps",
                                  "KiB", [per[name]["rss_bytes"] / 1024], higher_is_better=False,
                                  note=name).as_dict())
        report["rows"].append(Row(f"proxy fds at {top:,}, {name.split(' (')[0]}", "proxy", "fds",
                                  [float(last["proxy_fds"])], higher_is_better=False).as_dict())
    report["per_connection"] = per
    bare = report["active"]["bare"]
    for contender, name in (("held", f"{top:,} idle held"),
                            ("stock", f"{top:,} idle held, memory.gc.freeze.interval.ms=0")):
        windows = report["active"][contender]
        for mode, label in (("closed_loop", "closed loop"), ("paced", f"paced {args.pace_ms:g} ms")):
            for key, unit, higher, title in (("requests_per_second", "req/s", True, "requests/s"),
                                             ("p50_ms", "ms", False, "p50"), ("p99_ms", "ms", False, "p99"),
                                             ("proxy_cpu_us_per_request", "us", False, "proxy CPU per request")):
                if mode == "paced" and key == "requests_per_second":
                    continue  # set by the pace
                group = f"{label}: {title}" if contender == "held" else f"{label}: {title} (gc as CPython sets it)"
                report["rows"].append(Row(group, name, unit, [w[mode][key] for w in windows], baseline="none held",
                                          baseline_values=[b[mode][key] for b in bare],
                                          higher_is_better=higher).as_dict())
        report["rows"].append(Row(f"full collections' pause per window ({contender})", name, "s",
                                  [w["closed_loop"]["gc_full_seconds"] + w["paced"]["gc_full_seconds"]
                                   for w in windows], higher_is_better=False).as_dict())
    soak = report.get("soak")
    if soak:
        for key, title in (("proxy_rss_bytes", "RSS"), ("heap_blocks", "heap blocks")):
            report["rows"].append(Row(f"soak: {title} growth per hour", f"{top:,} held, {args.churn}/s churned", "%",
                                      [100 * growth_per_hour(soak, key)], higher_is_better=False).as_dict())
    rows = {r["group"]: r for r in report["rows"]}
    refusals = report["refusals"]
    expected = refusals["tried"] - (refusals["max_connections"] - refusals["held"])
    report["goals"] += [
        goal(f"closed-loop requests/s with {top:,} idle held >= 0.95 x with none",
             rows["closed loop: requests/s"]["ratio"], 0.95),
        goal(f"paced p99 with {top:,} idle held <= 1.2 x with none", rows[f"paced {args.pace_ms:g} ms: p99"]["ratio"],
             1.2, at_least=False),
        {"goal": f"refused beyond max.connections == {expected}", "measured": refusals["refused"],
         "threshold": expected, "direction": "==", "unit": "", "met": refusals["refused"] == expected
         and refusals["refusals_counted"] == expected},
        {"goal": "every held connection answers after the refusals", "measured": refusals["held_answered_after"],
         "threshold": refusals["held_total"], "direction": "==", "unit": "",
         "met": refusals["held_answered_after"] == refusals["held_total"]},
        *([goal("soak: proxy RSS growth per hour <= 5 %", rows["soak: RSS growth per hour"]["value"], 5.0,
                at_least=False)] if report.get("soak") else []),
        {"goal": "setup timeout: no silent connection closed early, every one counted",
         "measured": report["setup_crowd"]["counted"], "threshold": args.crowd, "direction": "==", "unit": "",
         "met": report["setup_crowd"]["closed_before_deadline"] == 0 and report["setup_crowd"]["counted"] == args.crowd},
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, nargs="+", default=[0, 1000, 2500, 5000],
                        help="connections held at each measurement (the first should be 0)")
    parser.add_argument("--active", type=int, default=200, help="connections in request loops")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of each active window not measured")
    parser.add_argument("--window", type=float, default=5.0, help="seconds of each active window measured")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the active load, the two proxies alternating")
    parser.add_argument("--pace-ms", type=float, default=100.0, help="paced windows: ms between two requests of one connection")
    parser.add_argument("--beyond", type=int, default=300, help="connections tried with the held ones open")
    parser.add_argument("--crowd", type=int, default=5000, help="silent connections against the setup timeout")
    parser.add_argument("--crowd-timeout", type=float, default=5.0, help="connections.setup.timeout.ms there, in s")
    parser.add_argument("--soak-minutes", type=float, default=5.0,
                        help="minutes of connection churn with the held connections open (0 skips it)")
    parser.add_argument("--churn", type=int, default=100, help="connections opened and closed each second of the soak")
    parser.add_argument("--output-dir", type=Path, default=results.RESULTS)
    args = parser.parse_args(argv)
    if args.steps[0] != 0 or sorted(args.steps) != args.steps:
        parser.error("--steps must start at 0 and rise")
    if args.beyond <= args.active:
        parser.error("--beyond must exceed --active (max.connections is the top step + --active)")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 2 * args.steps[-1] + args.beyond + args.crowd + 1000
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, needed), hard))
    from harness.kafka_cluster import KafkaCluster
    from proxy.local_kafka import scratch_dir

    command = " ".join(["flock /tmp/keyrange-bench.lock .venv/bin/python -m benchmarks.bench_connections",
                        *(argv if argv is not None else sys.argv[1:])])
    top = args.steps[-1]
    report = results.new_report(
        "connections", f"Connection load: {top:,} idle client connections, {args.active} active, max.connections",
        command,
        f"One Kafka node, the proxy as one process (workers=1; every other setting its default unless named), this process the client (trio, every socket held by it). Held "
        f"connections opened in steps {args.steps}, each with an ApiVersions answered through the proxy (so a broker "
        f"connection each); at each step the proxy's RSS and open fds, summed over its process and its workers (and "
        f"the broker's fds); memory "
        f"per connection is the least-squares slope. Active load: {args.active} connections looping Metadata (no "
        f"topics), closed loop, then paced at one request per {args.pace_ms:g} ms each, {args.warmup:g} s warm-up + "
        f"{args.window:g} s measured per window, against the proxy holding {top:,} and against a second proxy of the "
        f"same settings (same broker) holding none, and against a third holding {top:,} with the collector as CPython "
        f"sets it (memory.gc.freeze.interval.ms=0: frozen once at start), {args.rounds} rounds alternating the three "
        f"(order rotating), one "
        f"unrecorded window on each first; ratios paired within a round. max.connections = {top + args.active:,}: with {top:,} held, "
        f"{args.beyond} more send ApiVersions. Silent connections (no request) on a fresh proxy in the same steps. "
        f"{args.crowd:,} silent connections on a proxy with connections.setup.timeout.ms = "
        f"{args.crowd_timeout * 1000:.0f}. Soak: {args.soak_minutes:g} min with the {top:,} held open, {args.churn} "
        f"connections opened (ApiVersions answered) and closed each second; RSS and heap blocks sampled every "
        f"10 s, growth per hour the least-squares slope after the first quarter over the mean.",
        {"steps": args.steps, "active": args.active, "window_s": args.window, "warmup_s": args.warmup,
         "pace_ms": args.pace_ms, "rounds": args.rounds, "beyond": args.beyond, "crowd": args.crowd,
         "soak_minutes": args.soak_minutes, "churn": args.churn,
         "ulimit_n": resource.getrlimit(resource.RLIMIT_NOFILE)[0]})
    workdir = scratch_dir("bench-connections-")
    began = time.monotonic()
    with KafkaCluster.start(1, workdir=workdir / "kafka") as cluster:
        _say(f"kafka up in {cluster.start_seconds:.1f} s")
        trio.run(run, report, args, cluster, workdir)
    summarise(report, args)
    report["notes"] += [
        f"whole run {time.monotonic() - began:.0f} s",
        "the broker is a stock one-node KRaft Kafka (max.connections and max.connections.per.ip unlimited, "
        "-Xmx512m); it holds one connection per held client (its fds rise by one each), and saw them during the "
        "windows of both proxies",
        f"after the {top + args.active:,} connections closed the proxy's RSS stays near its peak "
        f"({report['after_close']['proxy_rss_bytes'] / 2**20:.0f} MiB): Python keeps freed memory for reuse",
    ]
    path = results.finish(report, args.output_dir)
    draw(report, path.with_suffix(".png"))
    print(path)
    for entry in report["goals"]:
        print(entry)
    return 0


BENCHMARK = Benchmark(
    "bench_connections", "Connection load: idle connections, active ones beside them, max.connections",
    main=main)


if __name__ == "__main__":
    raise SystemExit(main())
