"""Workers: one proxy process against two (``workers=2``), same run.

    flock /tmp/keyrange-bench.lock .venv/bin/python -m benchmarks.bench_workers

One one-node Kafka, one partition of keyed records (``--mb`` MB, 100-byte values, 10,007
keys). Each run starts a fresh proxy (default settings, ``metrics.port=0``, and
``workers`` 1 or 2: with two, the bootstrap port is shared and the node's port is served by
one of them) and reads the whole partition with clients that fetch from the leader's
address, as real clients do:

- ``key ranges N=4`` / ``N=16``: N raw key-range clients (``harness.raw_client``, one
  thread and connection each, equal shares), as the key-range delivery workload runs them;
- ``plain x4``: four raw clients each reading the whole partition without ranges (four
  consumer groups of one partition: the plain Fetch path, four times the bytes).

Per run: records/s delivered in all, the proxy's CPU seconds (every process of it: the
supervisor and its workers) per million records, and for key ranges the broker read
amplification (record bytes all workers read from the broker for the partition / the
partition's size). Rounds alternate the two settings (order rotating); ratios are paired
within a round. The client threads share this process's interpreter, so the client side
caps what both settings can show on 2 cores; the CPU per record is the figure that says
what a worker costs.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import urllib.request
from pathlib import Path

from benchmarks import results
from benchmarks.benchmark import Benchmark
from benchmarks.rounds import Row, goal, rotation
from benchmarks.workloads.keyrange_delivery import TOPIC, raw_clients, timed_threads
from harness.processes import cpu_seconds
from harness.raw_client import partition_bytes as raw_partition_bytes

WORKLOADS = ("key ranges N=4", "key ranges N=16", "plain x4")
SETTINGS = ("1", "2")


def _broker_bytes(metrics_ports: list[int]) -> float:
    pattern = rf'^kafka_proxy_keyrange_broker_bytes_total\{{[^}}]*topic="{TOPIC}"[^}}]*\}} ([0-9.e+]+)$'
    total = 0.0
    for port in metrics_ports:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        total += sum(float(m.group(1)) for m in re.finditer(pattern, text, re.M))
    return total


def plain_readers(bootstrap: str, readers: int, end: int) -> tuple[float, int]:
    """``readers`` raw clients each reading offsets [0, end) without ranges, at once."""
    outcomes: list[tuple[float, int]] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            outcomes.append(raw_clients(bootstrap, None, end))
        except BaseException as exc:  # reported below
            errors.append(exc)

    seconds = timed_threads([(one, ())] * readers)
    if errors:
        raise errors[0]
    return seconds, sum(delivered for _, delivered in outcomes)


def one_run(cluster, workdir: Path, workers: str, workload: str, records: int, partition_bytes: int) -> dict:
    from proxy.local_kafka import ProxyProcess

    proxy = ProxyProcess.start(cluster.bootstrap_servers, overrides={"metrics.port": "0", "workers": workers},
                               workdir=workdir / f"proxy-{time.monotonic_ns()}")
    try:
        ports = [w["metrics_port"] for w in proxy.info.get("workers", [])] or [proxy.info["metrics_port"]]
        cpu_before = cpu_seconds([proxy.pid])
        if workload == "plain x4":
            seconds, delivered = plain_readers(proxy.bootstrap_servers, 4, records)
            expected = 4 * records
        else:
            seconds, delivered = raw_clients(proxy.bootstrap_servers, int(workload.split("=")[1]), records)
            expected = records
        cpu = cpu_seconds([proxy.pid]) - cpu_before
        amplification = _broker_bytes(ports) / partition_bytes if workload != "plain x4" else None
    finally:
        proxy.stop()
    if delivered != expected:
        raise RuntimeError(f"{workload} with workers={workers} delivered {delivered} of {expected} records")
    return {"records_per_s": delivered / seconds, "cpu_s_per_million": cpu / delivered * 1e6,
            "amplification": amplification}


def run(report: dict, args, cluster, workdir: Path) -> None:
    from benchmarks.workloads import data
    from harness import java_tools

    records = args.mb * 2**20 // 130
    java_tools.create_topic(cluster.bootstrap_servers, TOPIC, partitions=1)
    data.produce_keyed(cluster.bootstrap_servers, TOPIC, records, keys=10007, value_size=100)
    partition_bytes = raw_partition_bytes(cluster.bootstrap_servers, TOPIC, records)
    report["sizes"].update({"records": records, "partition MB": round(partition_bytes / 2**20, 1)})
    runs: dict[tuple[str, str], list[dict]] = {}
    one_run(cluster, workdir, "1", "key ranges N=4", records, partition_bytes)  # warm-up, not recorded
    for number in range(args.rounds):
        for workload in WORKLOADS:
            for workers in rotation(list(SETTINGS), number):
                outcome = one_run(cluster, workdir, workers, workload, records, partition_bytes)
                runs.setdefault((workload, workers), []).append(outcome)
                print(f"{time.strftime('%H:%M:%S')} round {number + 1} {workload} workers={workers}: "
                      f"{outcome['records_per_s']:,.0f} records/s, {outcome['cpu_s_per_million']:.2f} CPU s per "
                      f"million, amplification {outcome['amplification']}", flush=True)
    report["runs"] = {f"{w} | workers={s}": v for (w, s), v in runs.items()}
    rows = []
    for workload in WORKLOADS:
        one, two = runs[(workload, "1")], runs[(workload, "2")]
        rows.append(Row(workload, "workers=2", "records/s", [r["records_per_s"] for r in two], "workers=1",
                        [r["records_per_s"] for r in one]))
        rows.append(Row(f"{workload}: proxy CPU per million records", "workers=2", "s",
                        [r["cpu_s_per_million"] for r in two], "workers=1", [r["cpu_s_per_million"] for r in one],
                        higher_is_better=False))
        if one[0]["amplification"] is not None:
            rows.append(Row(f"{workload}: broker read amplification", "workers=2", "x",
                            [r["amplification"] for r in two], "workers=1", [r["amplification"] for r in one],
                            higher_is_better=False))
    report["rows"] = [row.as_dict() for row in rows]
    by = {row.group: row for row in rows}
    report["goals"] = [goal(f"{w}: records/s with 2 workers >= 1 worker", by[w].ratio, 1.0) for w in WORKLOADS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=48, help="size of the partition read in each run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output-dir", type=Path, default=results.RESULTS)
    args = parser.parse_args(argv)
    from harness.kafka_cluster import KafkaCluster
    from proxy.local_kafka import scratch_dir

    command = " ".join(["flock /tmp/keyrange-bench.lock .venv/bin/python -m benchmarks.bench_workers",
                        *(argv if argv is not None else sys.argv[1:])])
    report = results.new_report(
        "workers", "Workers: one proxy process against two (workers=2)", command,
        __doc__.split("\n\n", 2)[2].strip(), {"mb": args.mb, "rounds": args.rounds,
                                              "settings": "defaults; workers=1 or 2; metrics.port=0"})
    workdir = scratch_dir("bench-workers-")
    with KafkaCluster.start(1, workdir=workdir / "kafka") as cluster:
        run(report, args, cluster, workdir)
    path = results.finish(report, args.output_dir)
    print(path)
    for entry in report["goals"]:
        print(entry)
    return 0


BENCHMARK = Benchmark("bench_workers", "Workers: one proxy process against two", main=main)


if __name__ == "__main__":
    raise SystemExit(main())
