"""Workload 2, key-ordered and processing-bound: 1 ms of work per record, one partition,
10,000 keys, N = 1, 4, 16 workers:

- ours: N key-range consumers (``proxy.client.Consumer``, assign mode, equal shares of the
  key-hash space) through the proxy, each a Python process of its own
  (``key_ordered_worker``), individual commit after every poll in the background;
  ours_subscribe: the same as members of one group (``subscribe``; the group's keyrange
  assignor cuts the partition);
- share groups: N KafkaShareConsumers of one share group (``benchmarks/java/share``);
- Parallel Consumer: one consumer, KEY ordering, maxConcurrency N;
- a plain consumer group of N KafkaConsumers: on one partition only one member works.
  It is the baseline of every row.

Every worker paces its work the same way (each call ends one work time after the previous
call's deadline, so neither trio's millisecond timer rounding nor the JVM's park overshoot
counts as work; a worker idle for more than two work times restarts from now, so waiting
for records is never made up) and checks each key's sequence numbers: a record
of a key processed after a later record of that key is an order violation (the same
record again is counted as a redelivery). Rates are counted over a window that starts a
warm-up after the first record was processed.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil

from benchmarks.benchmark import Benchmark, Progress
from benchmarks.peers import parallel_consumer, share_groups
from benchmarks.rounds import Row, goal, rotation
from benchmarks.workloads import data
from benchmarks.workloads.key_ordered_worker import read_log
from benchmarks.workloads.stopping import stop_processes
from harness import java_tools
from harness.kafka_cluster import KafkaCluster
from harness.processes import cpu_seconds, spawn
from proxy.local_kafka import ProxyProcess, scratch_dir

TOPIC = "ko-work"
ROOT = Path(__file__).resolve().parents[2]
PEERS = ("ours", "ours_subscribe", "share_group", "parallel_consumer", "plain_group")


def ours(bootstrap: str, topic: str, workers: int, *, work_ms: float = 1.0, warmup: float = 3.0,
         window: float = 8.0, records: int = 0, timeout: float = 180.0, subscribe: bool = False,
         proxy_pid: int | None = None, profile: Path | None = None) -> dict:
    """N range consumers through the proxy at ``bootstrap``, each a process of its own
    (``key_ordered_worker``); the same JSON fields as the Java harness (records/s over the
    window, or until ``records`` were processed). ``subscribe``: members of one group that
    splits the partition by key range (the keyrange assignor) instead of assign mode with
    equal shares. The warm-up starts once every worker has processed a record, so process
    start-up and joins are over. CPU per record over the window of the workers, of the
    proxy (``proxy_pid``) and of the whole machine; ``profile``: py-spy's collapsed
    stacks of worker 0 over the warm-up and the window, written there."""
    group = f"bench-{uuid.uuid4().hex[:8]}"
    workdir = scratch_dir("bench-key-ordered-workers-")
    prefixes = [str(workdir / f"w{i}") for i in range(workers)]
    processes = []
    for i in range(workers):
        with open(prefixes[i] + ".err", "wb") as err:
            processes.append(spawn(
                [sys.executable, "-m", "benchmarks.workloads.key_ordered_worker", "--bootstrap", bootstrap,
                 "--topic", topic, "--group", group, "--index", str(i), "--workers", str(workers),
                 "--work-ms", str(work_ms), "--out", prefixes[i], *(["--subscribe"] if subscribe else [])],
                cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err))
    spy: subprocess.Popen | None = None
    began = time.monotonic()
    deadline = began + timeout
    try:
        def counts() -> list[tuple[float, int] | None]:
            for i, process in enumerate(processes):
                if process.poll() is not None:
                    err = Path(prefixes[i] + ".err").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"key-ordered worker {i} exited with {process.returncode}:\n{err}")
            return [_last_progress(prefix + ".progress") for prefix in prefixes]

        def wait_for(condition, limit: float) -> bool:
            while time.monotonic() < limit:
                if condition(counts()):
                    return True
                time.sleep(0.02)
            return False

        if not wait_for(lambda c: any(c), deadline):
            raise TimeoutError(f"no worker processed a record within {timeout} s")
        # a worker left without records (a group member given nothing) is reported, not waited for
        wait_for(all, min(deadline, time.monotonic() + 60))
        working = sum(1 for c in counts() if c)
        if profile is not None:
            spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid",
                                    str(processes[0].pid), "--rate", "250", "--format", "raw", "--output",
                                    str(profile), "--nonblocking"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if records:
            if not wait_for(lambda c: sum(x[1] for x in c if x) >= records, deadline):
                raise TimeoutError(f"fewer than {records} records processed within {timeout} s")
            start = end = None
        else:
            time.sleep(warmup)
            pids = [p.pid for p in processes]
            start, cpu0 = time.monotonic(), _cpu(pids, proxy_pid)
            time.sleep(window)
            end, cpu1 = time.monotonic(), _cpu(pids, proxy_pid)
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=60)
        stop_processes(processes)
    logs = [read_log(prefix + ".log") for prefix in prefixes]
    check = check_order(logs)
    processed = check["processed"]
    if start is None or end is None:
        counted, seconds = processed, max(t for _, _, times in logs for t in times[-1:]) - began
        cpu: dict = {}
    else:
        counted = sum(1 for _, _, times in logs for t in times if start <= t < end)
        seconds = end - start
        per_record = 1e6 / max(1, counted)
        cpu = {f"cpu_us_per_record_{side}": round((cpu1[side] - cpu0[side]) * per_record, 1) for side in cpu0}
    first_at = min(times[0] for _, _, times in logs if times)
    return {"peer": "ours_subscribe" if subscribe else "ours", "workers": workers, "records": counted,
            "seconds": round(seconds, 3), "records_per_s": round(counted / seconds, 1), "processed_total": processed,
            "order_violations": check["violations"], "redeliveries": check["redeliveries"],
            "keys_seen": check["keys"], "first_record_after_s": round(first_at - began, 3),
            "members_working": working, **cpu}


def _last_progress(path: str) -> tuple[float, int] | None:
    """A worker's latest (time, records processed), None before its first record."""
    try:
        with open(path, "rb") as source:
            source.seek(0, os.SEEK_END)
            size = source.tell()
            source.seek(max(0, size - 200))
            lines = source.read().splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        parts = line.split()
        if len(parts) == 3 and parts[0] == b"C":
            return float(parts[1]), int(parts[2])
    return None


def _cpu(workers: list[int], proxy_pid: int | None) -> dict[str, float]:
    """CPU seconds (user + system) used so far by the workers, the proxy and the machine; the
    proxy's over every process of it (``harness.processes.cpu_seconds``: its command is the
    supervisor of its own worker processes)."""
    def seconds(pids: list[int]) -> float:
        total = 0.0
        for pid in pids:
            try:
                times = psutil.Process(pid).cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total

    machine = psutil.cpu_times()
    out = {"workers": seconds(workers), "machine": machine.user + machine.system + machine.nice
           + getattr(machine, "softirq", 0.0) + getattr(machine, "irq", 0.0)}
    if proxy_pid is not None:
        out["proxy"] = cpu_seconds([proxy_pid])
    return out


def check_order(logs: list[tuple]) -> dict[str, int]:
    """Per-key order over every worker's processed records, merged by finish time: a record
    of a key finished after a later record of that key is a violation; the same record
    again a redelivery."""
    merged = sorted((t, k, s) for keys, sequences, times in logs for k, s, t in zip(keys, sequences, times))
    last: dict[int, int] = {}
    violations = redeliveries = 0
    for _, key, sequence in merged:
        previous = last.get(key)
        if previous is not None and sequence <= previous:
            if sequence == previous:
                redeliveries += 1
            else:
                violations += 1
        last[key] = sequence
    return {"processed": len(merged), "violations": violations, "redeliveries": redeliveries, "keys": len(last)}


def run(report: dict, progress, *, workers: list[int], rounds: int, work_ms: float, keys: int,
        warmup: float, window: float) -> None:
    ideal = max(workers) * 1000 / work_ms
    records = int(ideal * (warmup + window + 6) * 1.3)
    report["sizes"] = {"records": records, "keys": keys, "value bytes": 100, "work per record": f"{work_ms:g} ms",
                       "workers": workers, "rounds": rounds, "warm-up": f"{warmup:g} s", "window": f"{window:g} s"}
    workdir = scratch_dir("bench-key-ordered-")
    progress.step("starting Kafka and the proxy")
    with KafkaCluster.start(1, workdir=workdir / "kafka", broker_properties=share_groups.BROKER_PROPERTIES) as cluster:
        proxy = ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / "proxy")
        try:
            progress.step(f"writing {records:,} records of {keys:,} keys")
            java_tools.create_topic(cluster.bootstrap_servers, TOPIC, partitions=1)
            data.produce_keyed(cluster.bootstrap_servers, TOPIC, records, keys=keys, value_size=100)

            def measure(peer: str, n: int) -> dict:
                group = f"ko-{peer}-{n}-{uuid.uuid4().hex[:6]}"
                options = {"work_ms": work_ms, "warmup": warmup, "window": window}
                if peer in ("ours", "ours_subscribe"):
                    return ours(proxy.bootstrap_servers, TOPIC, n, subscribe=peer == "ours_subscribe",
                                proxy_pid=proxy.pid, **options)
                if peer == "share_group":
                    return share_groups.key_ordered(cluster.bootstrap_servers, TOPIC, group, n, **options)
                if peer == "parallel_consumer":
                    return parallel_consumer.key_ordered(cluster.bootstrap_servers, TOPIC, group, n, **options)
                return share_groups.key_ordered(cluster.bootstrap_servers, TOPIC, group, n, mode="plain", **options)

            runs: dict[tuple[str, int], list[dict]] = {(p, n): [] for p in PEERS for n in workers}
            for number in range(rounds):
                for n in workers:
                    for peer in rotation(PEERS, number + n):
                        progress.step(f"round {number + 1}/{rounds}: {peer}, N={n}")
                        runs[(peer, n)].append(measure(peer, n))
        finally:
            proxy.stop()

    def rates(peer: str, n: int) -> list[float]:
        return [r["records_per_s"] for r in runs[(peer, n)]]

    rows = []
    for n in workers:
        for peer in PEERS[:-1]:
            violations = [r["order_violations"] for r in runs[(peer, n)]]
            rows.append(Row(f"N={n} records/s", peer, "records/s", rates(peer, n), "plain_group",
                            rates("plain_group", n),
                            note=f"order violations per round: {violations}; redeliveries: "
                                 f"{[r['redeliveries'] for r in runs[(peer, n)]]}"))
        for peer in ("ours", "ours_subscribe"):
            rows.append(Row(f"N={n} records/s", peer, "records/s", rates(peer, n), "parallel_consumer",
                            rates("parallel_consumer", n)))
    for n in workers:
        for side in ("workers", "proxy", "machine"):
            field = f"cpu_us_per_record_{side}"
            values = [r[field] for r in runs[("ours", n)] if field in r]
            if values:
                rows.append(Row(f"N={n} CPU per record (lower is better)", f"ours: {side}", "us", values,
                                higher_is_better=False))
    report["rows"] = [row.as_dict() for row in rows]
    goals = []
    for mine in ("ours", "ours_subscribe"):
        one = rates(mine, 1) if 1 in workers else None
        for n in workers:
            if one and n > 1:
                scaling = statistics.median(r / (n * o) for r, o in zip(rates(mine, n), one))
                goals.append(goal(f"{mine} at N={n} >= 0.9 x N x {mine} at N=1", scaling, 0.9))
            versus_pc = statistics.median(o / p for o, p in zip(rates(mine, n), rates("parallel_consumer", n)))
            goals.append(goal(f"{mine} >= Parallel Consumer at N={n}", versus_pc, 1.0))
        total_violations = sum(r["order_violations"] for n in workers for r in runs[(mine, n)])
        goals.append(goal(f"{mine}: per-key order violations", total_violations, 0, at_least=False))
    report["goals"] = goals
    report["order_violations"] = {f"{peer} N={n}": [r["order_violations"] for r in runs[(peer, n)]]
                                  for peer in PEERS for n in workers}
    report["runs"] = {f"{peer} N={n}": runs[(peer, n)] for peer in PEERS for n in workers}
    report["notes"].append("ours: assign mode, equal key-hash shares; ours_subscribe: members of one group "
                           "(subscribe, the keyrange assignor), measured once every member has processed a record.")


def _from_args(report: dict, progress: Progress, args: argparse.Namespace) -> None:
    run(report, progress, workers=args.workers, rounds=args.rounds, work_ms=1.0, keys=10_000, warmup=args.warmup,
        window=args.window)


BENCHMARK = Benchmark(
    "key_ordered", "Key-ordered, processing-bound: 1 ms of work per record, one partition, 10,000 keys",
    method="Each worker paces 1 ms per record (deadlines chained within a poll) and checks every key's sequence "
           "numbers; records/s over a window after a warm-up; the baseline is a plain consumer group on the "
           "same partition in the same round (one member works).",
    steps=lambda args: 2 + args.rounds * len(args.workers) * 5, run=_from_args, default=True)
