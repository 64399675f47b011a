"""Virtual range topics (docs/virtual-topics.md): unmodified Java consumers scale past one
partition by subscribing to ``T.krK``.

Two parts, rounds alternating (every contender once per round, order rotating; ratios are
paired within a round, see ``benchmarks.rounds``):

1. processing-bound, 1 ms of work per record, one real partition: K KafkaConsumers of one
   classic group on ``T.krK`` through the proxy (K = 2, 4, 8), and one on ``T`` through
   the proxy (K = 1), against one KafkaConsumer on ``T`` direct. Goal: K x 0.9 of it.
   The consumers are the key-ordered harness's plain group (``benchmarks/java/share``,
   ``--mode plain``), which paces the work and counts per-key order violations.
2. no work: records/s delivered to 4 KafkaConsumers on ``T.kr4`` against one on ``T``
   direct, reading the same number of records (joins included in both), and the broker
   read amplification of the virtual reads (record bytes the proxy read from the broker /
   the partition's record bytes; a fresh proxy per run). Goal: <= 1.1.

    python -m benchmarks virtual --rounds 2     # takes the benchmarks' lock itself
"""

from __future__ import annotations

import re
import statistics
import urllib.request
import uuid

from benchmarks.benchmark import Benchmark
from benchmarks.peers import share_groups
from benchmarks.rounds import Row, goal, rotation
from benchmarks.workloads import data
from harness import java_tools
from harness.kafka_cluster import KafkaCluster
from proxy.local_kafka import ProxyProcess, scratch_dir

WORK_TOPIC = "virtual-work"
READ_TOPIC = "virtual-read"
SHARES = (2, 4, 8)
KEYS = 10_000
TITLE = "Virtual range topics: K Java consumers of one partition through T.krK"
METHOD = ("Java KafkaConsumers of one classic group (the key-ordered harness, --mode plain). Part 1: 1 ms of work "
          "per record, records/s over a window after a warm-up, K on T.krK through the proxy against one on T "
          "direct in the same round. Part 2: no work, 4 on T.kr4 against one on T direct reading the same "
          "records, and the proxy's broker bytes per partition byte (fresh proxy per run).")


def steps(args) -> int:
    return 3 + args.rounds * (len(SHARES) + 2 + 2)


def _broker_bytes(proxy: ProxyProcess, topic: str) -> float:
    assert proxy.metrics_url is not None
    text = urllib.request.urlopen(proxy.metrics_url, timeout=10).read().decode()
    pattern = rf'^kafka_proxy_virtual_broker_bytes_total\{{[^}}]*topic="{topic}"[^}}]*\}} ([0-9.e+]+)$'
    return sum(float(m.group(1)) for m in re.finditer(pattern, text, re.M))


def _partition_bytes(kafka_dir, topic: str) -> int:
    """The partition's record bytes: its log segments on the broker's disk."""
    return sum(path.stat().st_size for path in kafka_dir.rglob(f"{topic}-0/*.log"))


# What it measures is off by default: every proxy of the run turns it on, and the report says so.
SETTINGS = {"virtual.topics.enabled": "true"}


def run(report: dict, progress, args) -> None:
    rounds = args.rounds
    work_ms, warmup, window = 1.0, args.warmup * 2, args.window
    work_records = int(max(SHARES) * 1000 / work_ms * (warmup + window + 10) * 1.3)
    read_records = 200_000 if not args.quick else 20_000
    if args.quick:
        work_records = 30_000
    report["sizes"] = {"work records": work_records, "read records": read_records, "keys": KEYS,
                       "value bytes": 100, "work per record": f"{work_ms:g} ms", "K": list(SHARES),
                       "rounds": rounds, "warm-up": f"{warmup:g} s", "window": f"{window:g} s"}
    workdir = scratch_dir("bench-virtual-")
    report["settings"] = dict(SETTINGS)
    progress.step("starting Kafka and the proxy")
    work: dict[str, list[dict]] = {}
    reads: dict[str, list[float]] = {"direct": [], "K=4": []}
    amplification: list[float] = []
    with KafkaCluster.start(1, workdir=workdir / "kafka") as cluster:
        proxy = ProxyProcess.start(cluster.bootstrap_servers, overrides=SETTINGS, workdir=workdir / "proxy")
        try:
            progress.step(f"writing {work_records:,} + {read_records:,} records of {KEYS:,} keys")
            for topic, records in ((WORK_TOPIC, work_records), (READ_TOPIC, read_records)):
                java_tools.create_topic(cluster.bootstrap_servers, topic, partitions=1)
                data.produce_keyed(cluster.bootstrap_servers, topic, records, keys=KEYS, value_size=100)
            partition_bytes = _partition_bytes(workdir / "kafka", READ_TOPIC)
            report["sizes"]["read partition MB"] = round(partition_bytes / 2**20, 1)

            def working(contender: str) -> dict:
                group = f"virtual-{contender}-{uuid.uuid4().hex[:6]}"
                options = {"work_ms": work_ms, "warmup": warmup, "window": window}
                if contender == "direct":
                    return share_groups.key_ordered(cluster.bootstrap_servers, WORK_TOPIC, group, 1, mode="plain",
                                                    **options)
                k = int(contender[2:])
                topic = WORK_TOPIC if k == 1 else f"{WORK_TOPIC}.kr{k}"
                return share_groups.key_ordered(proxy.bootstrap_servers, topic, group, k, mode="plain", **options)

            def reading(contender: str) -> float:
                group = f"virtual-read-{uuid.uuid4().hex[:6]}"
                if contender == "direct":
                    result = share_groups.key_ordered(cluster.bootstrap_servers, READ_TOPIC, group, 1, mode="plain",
                                                      work_ms=0, records=read_records)
                    return result["records_per_s"]
                fresh = ProxyProcess.start(cluster.bootstrap_servers,
                                           overrides={"metrics.port": "0", **SETTINGS},
                                           workdir=workdir / f"proxy-{uuid.uuid4().hex[:6]}")
                try:
                    result = share_groups.key_ordered(fresh.bootstrap_servers, f"{READ_TOPIC}.kr4", group, 4,
                                                      mode="plain", work_ms=0, records=read_records)
                    amplification.append(_broker_bytes(fresh, READ_TOPIC) / partition_bytes)
                finally:
                    fresh.stop()
                return result["records_per_s"]

            contenders = ["direct", "K=1", *(f"K={k}" for k in SHARES)]
            for number in range(rounds):
                for contender in rotation(contenders, number):
                    progress.step(f"round {number + 1}/{rounds}: 1 ms of work, {contender}")
                    work.setdefault(contender, []).append(working(contender))
                for contender in rotation(["direct", "K=4"], number):
                    progress.step(f"round {number + 1}/{rounds}: no work, {contender}")
                    reads[contender].append(reading(contender))
        finally:
            proxy.stop()

    def rates(contender: str) -> list[float]:
        return [r["records_per_s"] for r in work[contender]]

    rows = [Row("1 ms of work per record, records/s", f"{c} through the proxy", "records/s", rates(c),
                "one consumer on T direct", rates("direct"),
                note=f"order violations per round: {[r['order_violations'] for r in work[c]]}")
            for c in ["K=1", *(f"K={k}" for k in SHARES)]]
    rows.append(Row("no work, records/s", "4 consumers on T.kr4", "records/s", reads["K=4"],
                    "one consumer on T direct", reads["direct"]))
    if amplification:
        rows.append(Row("broker read amplification (lower is better)", "4 consumers on T.kr4", "x", amplification,
                        "partition size", [1.0] * len(amplification), higher_is_better=False))
    report["rows"] = [row.as_dict() for row in rows]
    goals = []
    for k in SHARES:
        scaling = statistics.median(r / (k * d) for r, d in zip(rates(f"K={k}"), rates("direct")))
        goals.append(goal(f"K={k} on T.kr{k} >= 0.9 x K x one consumer on T", scaling, 0.9))
    if amplification:
        goals.append(goal("broker read amplification, 4 consumers on T.kr4, <= 1.1", statistics.median(amplification),
                          1.1, at_least=False))
    violations = sum(r["order_violations"] for c in work for r in work[c])
    goals.append(goal("per-key order violations", violations, 0, at_least=False))
    report["goals"] = goals
    report["runs"] = work
    report["reads"] = reads
    report["amplification"] = amplification
    report["notes"].append("Every K consumers are K JVMs on the same 2-core machine as the broker and the proxy.")


BENCHMARK = Benchmark("virtual", TITLE, method=METHOD, steps=steps, run=run, default=True)
