"""Workload 1, passthrough: Kafka's ConsumerPerformance and ProducerPerformance (1 KB
records, one partition) direct, through the bare relay, through Kroxylicious and through our
proxy, in the same run on the same broker.

Per round every path runs once (order rotating); after one unrecorded consume per path
(the broker's page cache and JIT warm up on the first reads). Reports MB/s against direct,
our proxy against the bare relay and Kroxylicious (paired per round), CPU milliseconds per
MB of each hop (user + system of its process and those under it: the proxy's workers), and
the produce p99 each hop adds at a fixed rate.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics

from benchmarks.benchmark import Benchmark, Progress
from benchmarks.peers import bare_relay, kroxylicious
from benchmarks.rounds import Row, goal, rotation
from harness import java_tools, processes
from harness.kafka_cluster import KafkaCluster
from proxy.local_kafka import ProxyProcess, free_port, scratch_dir

RECORD_SIZE = 1024
PATHS = ("direct", "bare_relay", "kroxylicious", "proxy")
PRODUCER = {"acks": "1", "linger.ms": "5", "batch.size": "262144"}


def consume(bootstrap: str, topic: str, records: int, *, timeout: float = 900) -> dict:
    """One ConsumerPerformance run; its CSV line as numbers."""
    result = java_tools.consumer_performance(bootstrap, topic, records, timeout=timeout,
                                             consumer_config={"fetch.max.bytes": "52428800"})
    line = [row for row in result.stdout.splitlines() if re.match(r"^\d{4}-", row)][-1]
    cells = [c.strip() for c in line.split(",")]
    return {"mb": float(cells[2]), "mb_per_s": float(cells[3]), "records": int(cells[4]),
            "records_per_s": float(cells[5]), "fetch_mb_per_s": float(cells[8]),
            "fetch_records_per_s": float(cells[9])}


def produce(bootstrap: str, topic: str, records: int, *, throughput: int = -1, timeout: float = 900) -> dict:
    """One ProducerPerformance run (1 KB records, acks=1); throughput and latency figures."""
    result = java_tools.producer_performance(bootstrap, topic, records, record_size=RECORD_SIZE,
                                             throughput=throughput, timeout=timeout, producer_props=PRODUCER)
    line = [row for row in result.stdout.splitlines() if "records sent" in row][-1]

    def number(pattern: str) -> float:
        return float(re.search(pattern, line).group(1))

    return {"records": int(number(r"(\d+) records sent")), "records_per_s": number(r"([\d.]+) records/sec"),
            "mb_per_s": number(r"\(([\d.]+) MB/sec\)"), "p50_ms": number(r"([\d.]+) ms 50th"),
            "p99_ms": number(r"([\d.]+) ms 99th"), "max_latency_ms": number(r"([\d.]+) ms max latency")}


def _cpu(pid: int | None) -> float:
    return 0.0 if pid is None else processes.cpu_seconds([pid])


def run(report: dict, progress, *, consume_mb: int, produce_mb: int, rounds: int, latency_seconds: int,
        latency_rate_mb: float = 10.0) -> None:
    consume_records = consume_mb * 2**20 // RECORD_SIZE
    produce_records = produce_mb * 2**20 // RECORD_SIZE
    latency_rate = int(latency_rate_mb * 2**20 / RECORD_SIZE)
    report["sizes"] = {"consume MB": consume_mb, "produce MB": produce_mb, "rounds": rounds,
                       "latency": f"{latency_rate_mb:g} MB/s for {latency_seconds} s", "record bytes": RECORD_SIZE}
    workdir = scratch_dir("bench-passthrough-")
    relay_port = free_port()
    progress.step("starting Kafka, the bare relay, Kroxylicious and the proxy")
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(KafkaCluster.start(1, workdir=workdir / "kafka",
                                                         **bare_relay.cluster_options(relay_port)))
        relay = stack.enter_context(bare_relay.running(relay_port, bare_relay.target(cluster)))
        krox_bootstrap, krox = stack.enter_context(kroxylicious.running(cluster.bootstrap_servers))
        proxy = ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / "proxy")
        stack.callback(proxy.stop)
        bootstrap = {"direct": cluster.bootstrap_servers, "bare_relay": f"127.0.0.1:{relay_port}",
                     "kroxylicious": krox_bootstrap, "proxy": proxy.bootstrap_servers}
        hop = {"direct": None, "bare_relay": relay.pid, "kroxylicious": krox.pid, "proxy": proxy.pid}

        progress.step(f"filling the consume topic with {consume_mb} MB")
        java_tools.create_topic(cluster.bootstrap_servers, "pt-consume", partitions=1)
        produce(cluster.bootstrap_servers, "pt-consume", consume_records)
        for path in PATHS:
            progress.step(f"warm-up consume through {path}")
            consume(bootstrap[path], "pt-consume", consume_records)

        consumed = {p: [] for p in PATHS}
        produced = {p: [] for p in PATHS}
        latency = {p: [] for p in PATHS}
        for number in range(rounds):
            for path in rotation(PATHS, number):
                progress.step(f"round {number + 1}/{rounds}: consume through {path}")
                before = _cpu(hop[path])
                result = consume(bootstrap[path], "pt-consume", consume_records)
                result["cpu_ms_per_mb"] = 1000 * (_cpu(hop[path]) - before) / result["mb"]
                consumed[path].append(result)
            for path in rotation(PATHS, number):
                progress.step(f"round {number + 1}/{rounds}: produce through {path}")
                topic = f"pt-produce-{path}-{number}"
                java_tools.create_topic(cluster.bootstrap_servers, topic, partitions=1)
                before = _cpu(hop[path])
                result = produce(bootstrap[path], topic, produce_records)
                result["cpu_ms_per_mb"] = 1000 * (_cpu(hop[path]) - before) / (produce_records * RECORD_SIZE / 2**20)
                produced[path].append(result)
                java_tools.topics(cluster.bootstrap_servers, "--delete", "--topic", topic)
            for path in rotation(PATHS, number):
                progress.step(f"round {number + 1}/{rounds}: produce at {latency_rate_mb:g} MB/s through {path}")
                topic = f"pt-latency-{path}-{number}"
                java_tools.create_topic(cluster.bootstrap_servers, topic, partitions=1)
                latency[path].append(produce(bootstrap[path], topic, latency_rate * latency_seconds,
                                             throughput=latency_rate))
                java_tools.topics(cluster.bootstrap_servers, "--delete", "--topic", topic)

    def values(runs: dict, path: str, key: str) -> list[float]:
        return [r[key] for r in runs[path]]

    rows = []
    for direction, runs in (("consume", consumed), ("produce", produced)):
        for path in PATHS[1:]:
            rows.append(Row(f"{direction} MB/s", path, "MB/s", values(runs, path, "mb_per_s"), "direct",
                            values(runs, "direct", "mb_per_s")))
        for peer in ("bare_relay", "kroxylicious"):
            rows.append(Row(f"{direction}: proxy against peers", "proxy", "MB/s", values(runs, "proxy", "mb_per_s"),
                            peer, values(runs, peer, "mb_per_s")))
        for path in PATHS[2:]:
            rows.append(Row(f"{direction} CPU ms per MB (lower is better)", path, "ms/MB",
                            values(runs, path, "cpu_ms_per_mb"), "bare_relay",
                            values(runs, "bare_relay", "cpu_ms_per_mb"), higher_is_better=False))
    added = {p: [r["p99_ms"] - d["p99_ms"] for r, d in zip(latency[p], latency["direct"])] for p in PATHS[1:]}
    for path in PATHS[1:]:
        rows.append(Row(f"produce p99 at {latency_rate_mb:g} MB/s", path, "ms", values(latency, path, "p99_ms"),
                        "direct", values(latency, "direct", "p99_ms"), higher_is_better=False,
                        note=f"added p99 per round: {', '.join(f'{a:+.1f}' for a in added[path])} ms"))
    report["rows"] = [row.as_dict() for row in rows]
    by = {(r.group, r.name, r.baseline): r for r in rows}

    def ratio(group: str, name: str, baseline: str) -> float | None:
        return by[(group, name, baseline)].ratio

    cpu_gap = statistics.median(p - r for p, r in zip(values(consumed, "proxy", "cpu_ms_per_mb"),
                                                      values(consumed, "bare_relay", "cpu_ms_per_mb")))
    cpu_gap_produce = statistics.median(p - r for p, r in zip(values(produced, "proxy", "cpu_ms_per_mb"),
                                                              values(produced, "bare_relay", "cpu_ms_per_mb")))
    report["goals"] = [
        goal("consume: proxy >= bare relay", ratio("consume: proxy against peers", "proxy", "bare_relay"), 1.0),
        goal("produce: proxy >= 0.97 x bare relay", ratio("produce: proxy against peers", "proxy", "bare_relay"), 0.97),
        goal("consume: proxy >= Kroxylicious", ratio("consume: proxy against peers", "proxy", "kroxylicious"), 1.0),
        goal("produce: proxy >= Kroxylicious", ratio("produce: proxy against peers", "proxy", "kroxylicious"), 1.0),
        goal("consume CPU per MB: proxy - bare relay <= 0.05 ms", cpu_gap, 0.05, at_least=False, unit="ms"),
        goal("produce CPU per MB: proxy - bare relay <= 0.15 ms", cpu_gap_produce, 0.15, at_least=False, unit="ms"),
    ]
    report["added_p99_ms"] = {p: statistics.median(a) for p, a in added.items()}
    report["runs"] = {"consume": consumed, "produce": produced, "latency": latency}
    report["quoted"] = kroxylicious.QUOTED
    report["notes"].append(f"Kroxylicious measured here is {kroxylicious.VERSION} (kroxylicious-runtime from Maven "
                           "Central, started by benchmarks/java/kroxylicious); kroxylicious-app is not published.")


def _from_args(report: dict, progress: Progress, args: argparse.Namespace) -> None:
    run(report, progress, consume_mb=args.consume_mb, produce_mb=args.produce_mb, rounds=args.rounds,
        latency_seconds=args.latency_seconds)


BENCHMARK = Benchmark(
    "passthrough", "Passthrough: direct, bare relay, Kroxylicious, our proxy",
    method="Kafka's ConsumerPerformance and ProducerPerformance, 1 KB records, one partition; per round every "
           "path once, order rotating; one unrecorded consume per path first. CPU = user + system seconds of "
           "the hop's process per MB moved.",
    steps=lambda args: 6 + args.rounds * 12, run=_from_args, default=True)
