"""Exactly-once Kafka Streams, processing-bound: K x P instances of one application on the
virtual range topic ``T.krK`` against P instances on T (docs/virtual-topics.md).

The application is ``KeyCountApp`` (``benchmarks/java/streams``, launched by
``harness.streams_app`` with its JVM options): ``groupByKey().count()`` with
``processing.guarantee=exactly_once_v2``, one stream thread per instance, commit interval
100 ms (Streams' default under exactly-once), RocksDB store, Streams' record cache at its
default, and ``--delay-us 1000 --delay-mode sleep``: 1 ms of paced work per record, parked
rather than burnt, so an instance does at most 1,000 records/s. The contenders, one run
each per round, the order rotating from round to round (``benchmarks.rounds``):

- ``direct``: P instances on T (P partitions) straight at the broker -- the baseline of the
  goal;
- ``proxy``: P instances on T through the proxy (the real topic, no virtual partitions):
  what the extra hop alone costs, so that the virtual row can be read against both
  (``--no-eos-proxy-baseline`` leaves it out: a third less time);
- ``virtual``: K x P instances on ``T.krK`` through the proxy, each instance one virtual
  partition = one key-hash range of a real partition; the transactional offset commits of
  virtual partitions go through the proxy's shadow groups.

Every run has a topic, an output topic and an application id of its own, and a backlog
written before the instances start (``key-<i mod 10000>``, 100-byte values, librdkafka's
partitioner, so each key lives in one partition), sized for
``instances x 1000/s x (settle + window + 12 s)``: it outlasts the start-up and the window
(no instance goes faster than 1,000/s; a slower one only takes longer to work it off).

Throughput comes from the instances' ``progress`` lines (every 250 ms: records handed to the
counting step), each instance on its own clock: over ``--eos-window`` seconds (default 40)
that start once every instance is RUNNING and has been processing for 5 s in a row
(start-up, joins and restores excluded), the sum over the instances of (processed at the
end - at the start) / (the JVM's milliseconds between those two lines). The instances then
work off the backlog, are stopped (SIGTERM: the last transaction commits), and the output is
checked exactly: ``read_counts`` (read_committed, straight from the broker) must equal the
number of input records of each key. A run whose output is not exact, or that failed, is
reported in the JSON (``runs``, ``failures``) and makes the benchmark fail once the JSON is
written. Each run also keeps the CPU of the instances and of the proxy (its process and its
workers), the machine's busy share and the proxy's mean latency per API over the window.

``acceptable.recovery.lag`` is raised so far that Streams counts every instance as caught
up: at its default (10,000 changelog records) the tasks of instances that joined a few
seconds after the first one could stay on it, behind warm-up replicas, until a probing
rebalance 10 minutes later (with a backlog the first instance's changelog grows fast).
Every contender runs with it.

An instance is not free while it sleeps: each costs ~0.15-0.25 of a core (Streams, its
clients, the commits), so on a 2-core machine 8 instances (``--partitions 2`` or
``--shares 8``) saturate it, and what is measured there is the machine.

    python -m benchmarks eos                        # 3 rounds: about 12-15 minutes
    python -m benchmarks eos --quick                # 1 round, 10 s windows: about 2-3 minutes
    python -m benchmarks eos --partitions 2 --shares 4 --no-eos-proxy-baseline

It holds ``/tmp/keyrange-bench.lock`` like every benchmark of ``python -m benchmarks`` (do
not wrap it in ``flock`` on that file: it would wait for itself). Not in the default set of
``python -m benchmarks``: run it by name. Writes ``benchmarks/results/eos.json`` and
``eos.png`` (``--output-dir`` elsewhere).
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import psutil

from benchmarks.benchmark import Benchmark
from benchmarks.rounds import Row, goal, rotation
from benchmarks.workloads import data
from harness import streams_app
from harness.kafka_cluster import KafkaCluster
from harness.processes import cpu_seconds
from harness.streams_app import StreamsAppError, StreamsFleet, StreamsInstance, read_counts
from proxy.local_kafka import ProxyProcess, scratch_dir

KEYS = 10_000
VALUE_BYTES = 100
PROGRESS_MS = 250
SETTLE_S = 5.0  # every instance RUNNING and processing for this long before the window
QUICK_SETTLE_S = 3.0
SLACK_S = 12.0  # backlog beyond settle + window: what the first instances process before the window
QUICK_SLACK_S = 10.0
START_TIMEOUT_S = 180.0  # spawn to every instance RUNNING
STEADY_TIMEOUT_S = 90.0  # RUNNING to every instance processing for the settle time
GOAL_EFFICIENCY = 0.8
# the proxy's requests whose latency in the window the JSON keeps (the transactional path)
APIS = ("Produce", "Fetch", "AddPartitionsToTxn", "AddOffsetsToTxn", "TxnOffsetCommit", "EndTxn", "FindCoordinator",
        "Heartbeat", "OffsetFetch")
_METRIC = re.compile(r'^kafka_proxy_request_latency_seconds_(sum|count)\{api="([A-Za-z]+)"\} ([0-9.e+-]+)$', re.M)
# every instance counts as caught up for every task, so tasks spread at once (see above)
CONFIGS = {"acceptable.recovery.lag": str(2**62)}
TITLE = "Exactly-once Kafka Streams, 1 ms per record: K x P instances on T.krK against P on T"
METHOD = ("KeyCountApp (Kafka Streams, exactly_once_v2, commit every 100 ms, one thread, 1 ms of paced sleep per "
          "record): P instances on T direct (baseline), P on T through the proxy, K x P on T.krK through the proxy; "
          "a fresh topic, backlog and application id per run, rounds alternating. Records/s from the instances' "
          "progress lines over a window that starts once all are RUNNING and processing; then the backlog is "
          "worked off and the read_committed output must equal the input's count of every key.")


def contenders(args) -> list[str]:
    return ["direct", *(["proxy"] if args.eos_proxy_baseline else []), "virtual"]


def instances_of(contender: str, partitions: int, shares: int) -> int:
    return partitions * shares if contender == "virtual" else partitions


def backlog(instances: int, delay_us: int, seconds: float) -> int:
    """Records that ``instances`` at their fastest (one record per ``delay_us``) process in ``seconds``."""
    return int(instances * 1e6 / delay_us * seconds)


def steps(args) -> int:
    return 2 + args.rounds * len(contenders(args))


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the future is done
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)],
                                  operation_timeout=30)
    futures[topic].result(timeout=60)


def _proxy_latency(proxy: ProxyProcess) -> dict[str, tuple[float, float]]:
    """api -> (seconds summed, requests) of the proxy's request latency histogram."""
    if proxy.metrics_url is None:
        return {}
    try:
        text = urllib.request.urlopen(proxy.metrics_url, timeout=10).read().decode()
    except OSError:
        return {}
    out: dict[str, list[float]] = {}
    for kind, api, value in _METRIC.findall(text):
        out.setdefault(api, [0.0, 0.0])[0 if kind == "sum" else 1] = float(value)
    return {api: (v[0], v[1]) for api, v in out.items()}


def _latency_in_window(before: dict, after: dict, seconds: float) -> dict[str, dict]:
    """Per API: requests/s and mean latency (ms) between two scrapes."""
    out = {}
    for api in APIS:
        total, count = after.get(api, (0.0, 0.0))
        total0, count0 = before.get(api, (0.0, 0.0))
        if count > count0:
            out[api] = {"per_s": round((count - count0) / seconds, 1),
                        "mean_ms": round((total - total0) / (count - count0) * 1000, 2)}
    return out


def _produce(bootstrap: str, topic: str, records: int, keys: int) -> None:
    """``records`` keyed records (``data.key_of``), partitioned by the key (librdkafka's
    default partitioner, so every key lives in one partition), acks=all, idempotent."""
    data.produce_keyed(bootstrap, topic, records, keys=keys, value_size=VALUE_BYTES, partition=None)


def expected_counts(records: int, keys: int) -> dict[str, int]:
    """The input's number of records of each key (record i has key ``key-<i mod keys>``)."""
    whole, extra = divmod(records, keys)
    return {data.key_of(k, keys).decode(): whole + (1 if k < extra else 0) for k in range(min(keys, records))}


def compare(expected: dict[str, int], counts: dict[str, int], limit: int = 5) -> dict:
    under = {k: (counts.get(k, 0), n) for k, n in expected.items() if counts.get(k, 0) < n}
    over = {k: (n, expected.get(k, 0)) for k, n in counts.items() if n > expected.get(k, 0)}
    wrong = {**under, **over}
    return {"exact": not wrong, "keys": len(expected), "keys_counted": len(counts), "keys_under": len(under),
            "keys_over": len(over), "records_expected": sum(expected.values()),
            "records_counted": sum(counts.values()),
            "examples": [f"{k}: {got} counted, {want} written" for k, (got, want) in list(wrong.items())[:limit]]}


def _progress(instance: StreamsInstance) -> tuple[int, int] | None:
    """(JVM milliseconds, processed) of the instance's last ``progress`` line."""
    last = None
    try:
        text = instance.stdout_path.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        fields = line.split("\t")
        if fields[0] == "progress" and len(fields) >= 3:
            last = (int(fields[1]), int(fields[2]))
    return last


def _cpu_seconds(pids: list[int | None]) -> float:
    """The Streams instances' CPU: a JVM each, and one that has gone counts nothing (the
    proxy's is ``harness.processes.cpu_seconds``: its command is a supervisor of workers)."""
    total = 0.0
    for pid in pids:
        if pid is None:
            continue
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def _machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far."""
    times = psutil.cpu_times()
    total = sum(times)
    return total - times.idle - getattr(times, "iowait", 0.0), total


def _until(condition, timeout: float, what: str, check, interval: float = 0.25) -> float:
    """Poll until ``condition()``; the seconds it took. ``check`` raises when waiting is pointless."""
    began = time.monotonic()
    while not condition():
        check()
        if time.monotonic() - began > timeout:
            raise StreamsAppError(f"{what} did not happen within {timeout:g} s")
        time.sleep(interval)
    return time.monotonic() - began


def _steady(fleet: StreamsFleet, settle: float, timeout: float) -> tuple[float, str | None]:
    """Wait until every instance is RUNNING and its processed count grew in every second of
    the last ``settle`` seconds; the seconds waited, and a note when it timed out (the window
    then starts anyway: an instance left without work is a result, not a harness error)."""
    began = time.monotonic()
    last = [i.processed for i in fleet]
    steady_since: float | None = None
    while True:
        time.sleep(1.0)
        fleet.check_alive()
        fleet.processed()  # reads every instance's new lines
        now = [i.processed for i in fleet]
        moving = all(n > before for n, before in zip(now, last))
        last = now
        running = all(i.state == "RUNNING" for i in fleet)
        at = time.monotonic()
        if running and moving:
            steady_since = steady_since or at - 1.0
            if at - steady_since >= settle:
                return at - began, None
        else:
            steady_since = None
        if at - began > timeout:
            idle = [i.name for i, n in zip(fleet, now) if n == 0]
            return at - began, (f"not steady after {timeout:g} s (states "
                                f"{[i.state for i in fleet]}, never processed: {idle or 'none'}); measured anyway")


def run_once(cluster: KafkaCluster, proxy: ProxyProcess, workdir: Path, contender: str, number: int, *,
             partitions: int, shares: int, delay_us: int, window: float, settle: float, slack: float) -> dict:
    """One contender's run on a fresh topic and application; its measurement and the check
    of its output."""
    instances = instances_of(contender, partitions, shares)
    per_instance = 1e6 / delay_us
    records = backlog(instances, delay_us, settle + window + slack)
    tag = uuid.uuid4().hex[:6]
    topic = f"eos-{number}-{contender}-{tag}"
    output = f"{topic}-counts"
    application = f"eos-{contender}-{tag}"
    bootstrap = cluster.bootstrap_servers if contender == "direct" else proxy.bootstrap_servers
    input_topic = f"{topic}.kr{shares}" if contender == "virtual" else topic
    result: dict = {"contender": contender, "round": number + 1, "instances": instances, "input": input_topic,
                    "records": records, "application_id": application}
    _create_topic(cluster.bootstrap_servers, topic, partitions)
    began = time.monotonic()
    _produce(cluster.bootstrap_servers, topic, records, KEYS)
    result["produce_s"] = round(time.monotonic() - began, 1)
    with StreamsFleet(instances, bootstrap=bootstrap, input_topic=input_topic, output_topic=output,
                      workdir=workdir / application, application_id=application, delay_us=delay_us,
                      progress_ms=PROGRESS_MS, configs=CONFIGS, extra_args=["--delay-mode", "sleep"]) as fleet:
        spawned = time.monotonic()
        fleet.start()
        fleet.wait_running(START_TIMEOUT_S)
        result["start_to_running_s"] = round(time.monotonic() - spawned, 1)
        waited, note = _steady(fleet, settle, STEADY_TIMEOUT_S)
        result["running_to_window_s"] = round(waited, 1)
        if note:
            result["note"] = note
        # the window
        states_before = [len(i.states) for i in fleet]
        marks = [_progress(i) for i in fleet]
        wall0, cpu0 = time.monotonic(), (cpu_seconds([proxy.pid]), _cpu_seconds([i.pid for i in fleet]))
        latency0 = _proxy_latency(proxy)
        machine0 = _machine_busy()
        result["processed_before_window"] = sum(m[1] for m in marks if m)
        result["load_average_at_window"] = round(os.getloadavg()[0], 2)
        while time.monotonic() - wall0 < window:
            time.sleep(min(1.0, max(0.0, window - (time.monotonic() - wall0))))
            fleet.check_alive()
        ends = [_progress(i) for i in fleet]
        wall1, cpu1 = time.monotonic(), (cpu_seconds([proxy.pid]), _cpu_seconds([i.pid for i in fleet]))
        latency1 = _proxy_latency(proxy)
        machine1 = _machine_busy()
        rates = []
        for start, end in zip(marks, ends):
            if start is None or end is None or end[0] <= start[0]:
                rates.append(0.0)
            else:
                rates.append((end[1] - start[1]) * 1000.0 / (end[0] - start[0]))
        seconds = wall1 - wall0
        processed_in_window = sum(e[1] for e in ends if e) - sum(m[1] for m in marks if m)
        result.update({
            "records_per_s": round(sum(rates), 1),
            "per_instance_records_per_s": [round(r, 1) for r in rates],
            "wall_records_per_s": round(processed_in_window / seconds, 1),
            "window_s": round(seconds, 2),
            "proxy_cores": None if contender == "direct" else round((cpu1[0] - cpu0[0]) / seconds, 3),
            "instances_cores": round((cpu1[1] - cpu0[1]) / seconds, 3),
            # busy share of all the machine's cores (1.0: every core busy), whoever used them
            "machine_busy": round((machine1[0] - machine0[0]) / max(1e-9, machine1[1] - machine0[1]), 3),
        })
        if contender != "direct":  # the proxy's view of the requests in the window
            result["proxy_requests"] = _latency_in_window(latency0, latency1, seconds)
        left = records - sum(e[1] for e in ends if e)
        result["records_left_after_window"] = left
        if left < max(0.05 * records, instances * per_instance * 2):  # shares differ by a few percent
            result.setdefault("warnings", []).append(
                f"only {left} records were left at the end of the window: the backlog may have run dry in it")
        rebalanced = [f"{i.name}: {' -> '.join(s for _, s in i.states[n:])}"
                      for i, n in zip(fleet, states_before) if len(i.states) > n]
        if rebalanced:
            result.setdefault("warnings", []).append(f"state changes in the window: {'; '.join(rebalanced)}")
        # work off the backlog, stop (the last transactions commit), check the output exactly
        drained = time.monotonic()
        quiet = {"total": -1, "since": time.monotonic()}

        def done() -> bool:
            total = fleet.processed()
            if total != quiet["total"]:
                quiet.update(total=total, since=time.monotonic())
            return total >= records and time.monotonic() - quiet["since"] >= 2.5

        _until(done, left / (0.25 * instances * per_instance) + 90,
               f"the instances processing all {records} records (at {fleet.processed()})", fleet.check_alive)
        result["drain_s"] = round(time.monotonic() - drained, 1)
        stopping = time.monotonic()
        codes = fleet.stop()
        result["stop_s"] = round(time.monotonic() - stopping, 1)
        result["exit_codes"] = codes
        result["processed_total"] = fleet.processed()
        result["processed_again"] = result["processed_total"] - records
        errors = fleet.errors()
        if errors:
            result["errors"] = errors[:10]
        if any(code != 0 for code in codes):
            result.setdefault("warnings", []).append(
                f"exit codes {codes}: " + " | ".join(i.stderr_tail(3) for i in fleet))
    reading = time.monotonic()
    counts = read_counts(cluster.bootstrap_servers, output, timeout=180)
    result["read_output_s"] = round(time.monotonic() - reading, 1)
    result["output"] = compare(expected_counts(records, KEYS), counts)
    result["run_s"] = round(time.monotonic() - began, 1)
    return result


def _describe(run: dict) -> str:
    if "error" in run:
        return f"FAILED: {run['error'][:300]}"
    out = run["output"]
    exact = "output exact" if out["exact"] else (
        f"OUTPUT NOT EXACT: {out['keys_under']} keys under, {out['keys_over']} over, "
        f"{out['records_counted']} counted of {out['records_expected']}; {out['examples']}")
    return (f"{run['records_per_s']:,.0f} records/s ({run['instances']} instances, per instance "
            f"{run['per_instance_records_per_s']}), {exact}, run {run['run_s']:.0f} s")


# The instances read T.krK, virtual topics, off by default: the proxy has them on, and the report
# says so.
SETTINGS = {"virtual.topics.enabled": "true"}


def run(report: dict, progress, args) -> None:
    report["settings"] = dict(SETTINGS)
    partitions, shares, delay_us, rounds = args.partitions, args.shares, args.eos_delay_us, args.rounds
    window = args.eos_window
    settle, slack = (QUICK_SETTLE_S, QUICK_SLACK_S) if args.quick else (SETTLE_S, SLACK_S)
    names = contenders(args)
    report["sizes"] = {
        "P (partitions of T)": partitions, "K (shares)": shares,
        "instances": ", ".join(f"{c} {instances_of(c, partitions, shares)}" for c in names),
        "records per run": ", ".join(
            f"{c} {backlog(instances_of(c, partitions, shares), delay_us, settle + window + slack):,}" for c in names),
        "keys": KEYS, "value bytes": VALUE_BYTES, "work per record": f"{delay_us} us (sleep)",
        "window": f"{window:g} s", "settle": f"{settle:g} s", "rounds": rounds,
    }
    workdir = scratch_dir("bench-eos-")
    progress.step("building the Streams programs (if changed)")
    streams_app.build()
    progress.step("starting Kafka and the proxy")
    runs: list[dict] = []
    failures: list[str] = []
    with KafkaCluster.start(1, workdir=workdir / "kafka") as cluster:
        proxy = ProxyProcess.start(cluster.bootstrap_servers, overrides={**SETTINGS, "metrics.port": "0"},
                                   workdir=workdir / "proxy")
        try:
            for number in range(rounds):
                for contender in rotation(names, number):
                    instances = instances_of(contender, partitions, shares)
                    where = {"direct": "T direct", "proxy": "T through the proxy",
                             "virtual": f"T.kr{shares} through the proxy"}[contender]
                    progress.step(f"round {number + 1}/{rounds}: {instances} instance(s) on {where}")
                    try:
                        result = run_once(cluster, proxy, workdir, contender, number, partitions=partitions,
                                          shares=shares, delay_us=delay_us, window=window, settle=settle,
                                          slack=slack)
                    except Exception as exc:  # one run failing must not lose the others
                        result = {"contender": contender, "round": number + 1, "instances": instances,
                                  "error": f"{type(exc).__name__}: {exc}"}
                    runs.append(result)
                    line = f"round {number + 1}/{rounds} {contender}: {_describe(result)}"
                    print(f"  {line}", file=sys.stderr if "error" in result else sys.stdout, flush=True)
                    if "error" in result:
                        failures.append(line)
                    elif not result["output"]["exact"]:
                        failures.append(line)
                        print(f"  !!! {line}", file=sys.stderr, flush=True)
        finally:
            proxy.stop()
    _summarise(report, runs, failures, partitions=partitions, shares=shares, names=names)


def _summarise(report: dict, runs: list[dict], failures: list[str], *, partitions: int, shares: int,
               names: list[str]) -> None:
    rounds = sorted({r["round"] for r in runs})
    # only rounds in which every contender measured, so the ratios stay paired
    complete = [n for n in rounds if all(any(r["round"] == n and r["contender"] == c and "error" not in r
                                             for r in runs) for c in names)]

    def rates(contender: str, per_instance: bool = False) -> list[float]:
        out = []
        for n in complete:
            r = next(r for r in runs if r["round"] == n and r["contender"] == contender)
            out.append(r["records_per_s"] / (r["instances"] if per_instance else 1))
        return out

    def exactness(contender: str) -> str:
        marks = ["exact" if "error" not in r and r["output"]["exact"] else "NOT EXACT" if "error" not in r
                 else "failed" for r in runs if r["contender"] == contender]
        return f"output per round: {', '.join(marks)}"

    group = f"records/s, P={partitions}, K={shares}"
    base = f"{partitions} on T direct"
    virtual = f"{partitions * shares} on T.kr{shares} via proxy"
    rows = [Row(group, virtual, "records/s", rates("virtual"), base, rates("direct"), note=exactness("virtual"))]
    if "proxy" in names:
        rows.append(Row(group, f"{partitions} on T via proxy", "records/s", rates("proxy"), base, rates("direct"),
                        note=exactness("proxy")))
        rows.append(Row(group, virtual, "records/s", rates("virtual"), f"{partitions} on T via proxy",
                        rates("proxy")))
    rows.append(Row("records/s per instance", virtual, "records/s", rates("virtual", True), base,
                    rates("direct", True), note=exactness("direct")))
    report["rows"] = [row.as_dict() for row in rows if row.values]
    ratio = rows[0].ratio if rows[0].values else None
    threshold = GOAL_EFFICIENCY * shares
    report["goals"] = [
        goal(f"K={shares}: {partitions * shares} instances on T.kr{shares} >= {GOAL_EFFICIENCY:g} x {shares} x "
             f"{partitions} on T direct (ratio >= {threshold:g})", ratio, threshold),
        goal("runs whose read_committed output is not exactly the input's per-key counts, or that failed",
             len(failures), 0, at_least=False),
    ]
    report["runs"] = runs
    report["failures"] = failures
    ratios = rows[0].ratios
    if ratios:
        report["notes"].append(
            f"virtual / direct per round: {[round(r, 3) for r in ratios]} (min {min(ratios):.3f}, median "
            f"{statistics.median(ratios):.3f}, max {max(ratios):.3f}); goal >= {threshold:g}.")
    report["notes"].append(
        "Every instance is a JVM (-Xmx384m, SerialGC) on the same 2-core machine as the broker and the proxy; the "
        "1 ms of work is a sleep and takes no core, the instances' own CPU (Streams, the clients) is in "
        "runs[].instances_cores, the proxy's in runs[].proxy_cores, the machine's busy share in "
        "runs[].machine_busy, the proxy's mean latency per API in the window in runs[].proxy_requests.")
    report["notes"].append(
        "The proxy runs with virtual.topics.enabled=true (one proxy for the whole benchmark). "
        "acceptable.recovery.lag is raised for every contender so tasks spread at once (see the module docstring).")
    if len(complete) < len(rounds):
        report["notes"].append(f"rounds left out of the rows (a run failed): "
                               f"{[n for n in rounds if n not in complete]}")


BENCHMARK = Benchmark("eos", TITLE, method=METHOD, steps=steps, run=run, default=False)  # runs only when named
