"""A processing-bound Spark job on a 2-partition topic: Spark's Kafka source against the
``keyrange`` source.

Each record costs ``--work-ms`` of work in a Python UDF: a wait, as for a call to a slow
service, so tasks beyond the core count still run side by side. Three readers of the same
records, in one local Spark session (``local[8]``):

- ``kafka``: Spark's Kafka source, one task per partition (parallelism 2);
- ``kafka_min_partitions_8``: Spark's Kafka source with ``minPartitions=8``: each partition's
  offsets cut into 4 ranges (parallelism 8); one key's records land in several tasks;
- ``keyrange_k4``: the ``keyrange`` source with ``splits.per.partition=4`` (parallelism 8):
  each task reads one hash share of one partition, in offset order.

Before measuring, the session is warmed up as a long-running application is: a few passes
of each reader with the real work on a small topic, so that every Python worker of Spark's
pool has imported what its tasks need (the passes' times are kept, the first one being a
cold session's first job; Spark stops idle workers after a minute, so the passes are
repeated after each job of the 2-task reader).

Per reader: records/s over the whole job (read, UDF, collect of the per-record results),
per-key order violations (a record whose work finished before the work of the previous
record of the same key, in offset order, had finished) and each task's first and last
record. Rounds alternate the readers so that noise from other load on the machine spreads
over all three; the median of the rounds is reported with the spread (min, max). Sizes:
96,000 records of 10,000 keys by default, so that each of the 8 tasks works about 25 s and
a job's start (planning, scheduling: about a second) weighs little. The hash shares of the
keys are not equal (with these keys the largest of the 8 holds 4.5% more than the mean;
with 100 keys up to a fifth more), and a job lasts as long as its largest share.

Goal: keyrange_k4 >= 3.5x kafka, 0 violations, and within 10% of kafka_min_partitions_8.

Writes benchmarks/results/spark.json and spark.png.
Run: ``.venv/bin/python -m benchmarks.bench_spark``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import uuid
from pathlib import Path

from benchmarks.benchmark import Benchmark

RESULTS = Path(__file__).resolve().parent / "results"
READERS = ("kafka", "kafka_min_partitions_8", "keyrange_k4")
WARM_UP_RECORDS = 8000  # 1,000 per task of the 8-task readers
WARM_UP_ORDER = ("keyrange_k4", "kafka_min_partitions_8") * 3


def produce(bootstrap: str, topic: str, records: int, keys: int) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=10)
    for n in range(records):
        producer.send(topic, key=f"key-{n % keys}".encode(), value=str(n).encode(), partition=n % 2)
    producer.flush(60)
    producer.close()


def reader_frame(spark, name: str, bootstrap: str, topic: str):
    if name == "keyrange_k4":
        return (spark.read.format("keyrange").option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", topic).option("splits.per.partition", "4").load())
    reader = spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
    if name == "kafka_min_partitions_8":
        reader = reader.option("minPartitions", "8")
    return reader.load()


def violations(rows) -> int:
    """Records whose work ended before the previous record of their key (offset order)."""
    by_key: dict[tuple[int, bytes], list[tuple[int, float]]] = {}
    for row in rows:
        by_key.setdefault((row["partition"], row["key"]), []).append((row["offset"], row["done"]))
    count = 0
    for entries in by_key.values():
        entries.sort()
        count += sum(1 for (_o1, t1), (_o2, t2) in zip(entries, entries[1:]) if t2 < t1)
    return count


def run_once(spark, name: str, bootstrap: str, topic: str, work_ms: float) -> dict:
    from pyspark.sql.functions import col, spark_partition_id, udf

    seconds = work_ms / 1000

    @udf("double")
    def work(value):
        time.sleep(seconds)  # the record's processing: a call to a slow service
        return time.time()

    df = reader_frame(spark, name, bootstrap, topic)
    started, wall = time.monotonic(), time.time()
    rows = df.select("partition", "key", "offset", work(col("value")).alias("done"),
                     spark_partition_id().alias("task")).collect()
    elapsed = time.monotonic() - started
    return {"records": len(rows), "seconds": round(elapsed, 3), "records_per_s": round(len(rows) / elapsed, 1),
            "order_violations": violations(rows), "tasks": len({r["task"] for r in rows}),
            "timeline": timeline(rows, wall)}


def timeline(rows, wall_start: float) -> list[list[float]]:
    """Per task: [records, first record's work done, last record's work done] in seconds
    from the job's start: a late start or a long task shows where a job's time went."""
    by_task: dict[int, list[float]] = {}
    for row in rows:
        by_task.setdefault(row["task"], []).append(row["done"])
    return [[len(done), round(min(done) - wall_start, 2), round(max(done) - wall_start, 2)]
            for _, done in sorted(by_task.items())]


def warm_up_session(spark, bootstrap: str, topic: str, work_ms: float,
                    readers: tuple[str, ...] = ("kafka",) + WARM_UP_ORDER) -> list[dict]:
    """Bring the session to the state of a long-running application before measuring.

    Spark keeps a pool of Python workers and hands each task whichever is idle; a worker
    pays its imports (pandas and pyarrow for an Arrow read, the source's own modules) on
    its first task of a kind. A job needs 16 workers at once for the 8-task readers (one
    reading, one running the UDF, per task), so a single warm-up pass leaves some of them
    cold, and a cold worker on 2 cores starts its task seconds late. The passes run with
    the real work on a small topic, so that all 16 are busy at the same time; their
    timings are kept in the results (``warm_up``), the first pass being a cold session's
    first job.

    Spark also stops the idle workers once no worker has been taken or given back for a
    minute, which the plain reader's job (two tasks for about 100 s) lets happen; the
    8-task passes (``WARM_UP_ORDER``) are therefore run again after each of its jobs."""
    passes = []
    for name in readers:
        result = run_once(spark, name, bootstrap, topic, work_ms)
        passes.append({"reader": name, "seconds": result["seconds"]})
        print(f"warm-up {name}: {result}", flush=True)
    return passes


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(READERS)
    medians = [result["readers"][n]["records_per_s"]["median"] for n in names]
    lows = [m - result["readers"][n]["records_per_s"]["min"] for n, m in zip(names, medians)]
    highs = [result["readers"][n]["records_per_s"]["max"] - m for n, m in zip(names, medians)]
    fig, ax = plt.subplots(figsize=(7, 4))
    bars = ax.bar(["Kafka source\n(2 tasks)", "Kafka source\nminPartitions=8", "keyrange source\nK=4 (8 tasks)"],
                  medians, yerr=[lows, highs], capsize=6, color=["#999999", "#d9a441", "#3b7dd8"])
    for bar, name in zip(bars, names):
        v = result["readers"][name]["order_violations"]["max"]
        ax.annotate(f"{v} order violations", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8, xytext=(0, 8), textcoords="offset points")
    ax.set_ylabel("records/s (median of rounds; bars: min-max)")
    ax.set_title(f"{result['work_ms']} ms per record in a Python UDF, 2 partitions, local Spark")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_spark")
    parser.add_argument("--records", type=int, default=96000)
    parser.add_argument("--keys", type=int, default=10000)
    parser.add_argument("--work-ms", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS / "spark.json"))
    args = parser.parse_args(argv)

    from kafka.admin import KafkaAdminClient, NewTopic

    from harness.kafka_cluster import KafkaCluster
    from proxy.local_kafka import ProxyProcess, scratch_dir
    from proxy.spark.session import local_session

    workdir = scratch_dir("keyrange-bench-spark-")
    topic = f"bench-spark-{uuid.uuid4().hex[:6]}"
    warm_topic = f"{topic}-warm-up"
    with KafkaCluster.start(1, workdir=workdir / "kafka") as cluster, \
            ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / "proxy") as proxy:
        admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topics([NewTopic(topic, 2, 1), NewTopic(warm_topic, 2, 1)])
        admin.wait_for_topics([topic, warm_topic], timeout_ms=30000)
        admin.close()
        produce(cluster.bootstrap_servers, topic, args.records, args.keys)
        produce(cluster.bootstrap_servers, warm_topic, WARM_UP_RECORDS, args.keys)
        spark = local_session("bench-spark", master="local[8]", shuffle_partitions=8)
        warm_up = warm_up_session(spark, proxy.bootstrap_servers, warm_topic, args.work_ms)
        rounds: dict[str, list[dict]] = {name: [] for name in READERS}
        for r in range(args.rounds):
            order = READERS if r % 2 == 0 else tuple(reversed(READERS))
            for name in order:
                result = run_once(spark, name, proxy.bootstrap_servers, topic, args.work_ms)
                assert result["records"] == args.records, result
                rounds[name].append(result)
                print(f"round {r + 1} {name}: {result}", flush=True)
                if name == "kafka":
                    warm_up_session(spark, proxy.bootstrap_servers, warm_topic, args.work_ms, WARM_UP_ORDER)
        spark.stop()

    def spread(values):
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    readers = {name: {"records_per_s": spread([x["records_per_s"] for x in runs]),
                      "order_violations": spread([x["order_violations"] for x in runs]),
                      "tasks": runs[0]["tasks"], "rounds": runs} for name, runs in rounds.items()}
    rate = {name: readers[name]["records_per_s"]["median"] for name in READERS}
    speedup = rate["keyrange_k4"] / rate["kafka"]
    vs_min = rate["keyrange_k4"] / rate["kafka_min_partitions_8"]
    result = {
        "command": "make venv jars && .venv/bin/python -m benchmarks.bench_spark " + " ".join(argv or sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "method": __doc__.split("\n\n", 1)[1].split("Writes")[0].strip(),
        "records": args.records, "keys": args.keys, "work_ms": args.work_ms, "rounds": args.rounds,
        "readers": readers,
        "warm_up": warm_up,
        "keyrange_vs_kafka": round(speedup, 2),
        "keyrange_vs_min_partitions_8": round(vs_min, 3),
        "goal": "keyrange_k4 >= 3.5x kafka, 0 order violations, within 10% of kafka_min_partitions_8",
        "goal_met": bool(speedup >= 3.5 and readers["keyrange_k4"]["order_violations"]["max"] == 0
                         and vs_min >= 0.9),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    chart(result, out.with_suffix(".png"))
    print(json.dumps({k: result[k] for k in ("keyrange_vs_kafka", "keyrange_vs_min_partitions_8", "goal_met")}))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


BENCHMARK = Benchmark(
    "bench_spark", "Spark: the keyrange source against Spark's Kafka source, processing-bound",
    main=main)


if __name__ == "__main__":
    sys.exit(main())
