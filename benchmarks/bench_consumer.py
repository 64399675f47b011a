"""Processing-bound scaling: N key-range consumers sharing one partition.

Each record costs ``--work-ms`` of awaited work (a call to a slow service), done one record
after another in each consumer, so per-key order holds. The calls of one poll's records
chain their deadlines (call k ends k x work after the poll returned, or later if the loop
is late), so the event loop's millisecond timer granularity does not count as work while
any time spent inside poll does. One consumer on the partition is
the most a standard group can put on it; N consumers each take an equal share of the
key-hash space through the proxy. All consumers are trio tasks of this one process: the
work is awaited, not computed, as it would be for a service call.

Every consumer marks each record processed and commits individually (OffsetCommit with
ranges) after each poll, in a background task so the commit round trip overlaps the work.

For each N in ``--consumers``: a fresh group; the aggregate rate is counted over a
``--window`` of seconds that starts ``--warmup`` seconds after every consumer has
processed its first record. The result for N is the rate against N times the rate of one
consumer in the same run (goal: at least 0.9). One consumer reading the broker directly
(no proxy) is measured too, as the reference for what the proxy costs a single consumer.

Writes benchmarks/results/consumer.json. Run: ``.venv/bin/python -m benchmarks.bench_consumer``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import uuid
from pathlib import Path

import psutil
import trio

from benchmarks.benchmark import Benchmark
from harness.kafka_cluster import KafkaCluster
from proxy.client import Consumer, TopicPartition, equal_shares
from proxy.local_kafka import ProxyProcess, scratch_dir

RESULTS = Path(__file__).resolve().parent / "results"


def _produce(bootstrap: str, topic: str, records: int, keys: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                         "compression.type": "none", "acks": "all"})
    value = b"v" * 100
    for i in range(records):
        while True:
            try:
                producer.produce(topic, key=b"key-%d" % (i % keys), value=value, partition=0)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError("records left unsent")


async def _measure(bootstrap: str, topic: str, consumers: int, *, work_ms: float, warmup: float,
                   window: float, ranged: bool) -> dict:
    tp = TopicPartition(topic, 0)
    group = f"bench-{uuid.uuid4().hex[:8]}"
    processed = [0] * consumers
    started = [trio.Event() for _ in range(consumers)]
    shares = equal_shares(consumers)
    work = work_ms / 1000
    commits = [0] * consumers
    polling = [0.0] * consumers  # seconds spent inside poll (waiting for records)

    async def member(i: int, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with Consumer(bootstrap, group_id=group, client_id=f"bench-{i}", auto_offset_reset="earliest",
                            allow_individual_commit=True, max_poll_records=500) as consumer:
            consumer.assign({tp: [shares[i]] if ranged else []})
            task_status.started()
            async with trio.open_nursery() as background:
                committing = False

                async def commit() -> None:
                    nonlocal committing
                    try:
                        await consumer.commit()
                        commits[i] += 1
                    finally:
                        committing = False

                while True:
                    entered = time.perf_counter()
                    records = await consumer.poll(1.0)
                    polling[i] += time.perf_counter() - entered
                    # The service answers each call exactly `work` after the previous one
                    # was answered. Deadlines chain from the previous deadline, so the event
                    # loop's millisecond timer granularity is not counted as work; they
                    # restart after every poll, so time spent waiting in poll is never
                    # made up.
                    due = trio.current_time()
                    for record in records:
                        due += work
                        await trio.sleep_until(due)  # the slow service call
                        consumer.mark_processed(record)
                        processed[i] += 1
                        started[i].set()
                    if not committing:
                        committing = True
                        background.start_soon(commit)

    async with trio.open_nursery() as nursery:
        for i in range(consumers):
            await nursery.start(member, i)
        with trio.fail_after(120):
            for event in started:
                await event.wait()
        await trio.sleep(warmup)
        before, t0, polled0 = sum(processed), time.perf_counter(), sum(polling)
        cpu0 = psutil.Process().cpu_times()
        await trio.sleep(window)
        after, t1, polled1 = sum(processed), time.perf_counter(), sum(polling)
        cpu1 = psutil.Process().cpu_times()
        nursery.cancel_scope.cancel()
    rate = (after - before) / (t1 - t0)
    return {"consumers": consumers, "ranged": ranged, "records_per_s": round(rate, 1),
            "per_consumer_records_per_s": round(rate / consumers, 1),
            "commits": sum(commits),
            "time_in_poll_share": round((polled1 - polled0) / (consumers * (t1 - t0)), 3),
            "client_process_cpu_share": round((cpu1.user + cpu1.system - cpu0.user - cpu0.system) / (t1 - t0), 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--consumers", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--work-ms", type=float, default=1.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--window", type=float, default=6.0)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--output", type=Path, default=RESULTS / "consumer.json")
    args = parser.parse_args(argv)
    if min(args.consumers) < 1:
        parser.error("--consumers: every count must be at least 1")
    # enough for the largest N to stay busy through warm-up and window (with headroom)
    ideal_rate = 1000 / args.work_ms
    records = int(max(args.consumers) * ideal_rate * (args.warmup + args.window + 4) * 1.3)
    workdir = scratch_dir("bench-consumer-")
    results: dict = {
        "command": " ".join([".venv/bin/python -m benchmarks.bench_consumer",
                             *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"python": platform.python_version(), "cpus": psutil.cpu_count(), "cpu": platform.machine(),
                    "load_average_at_start": [round(x, 2) for x in os.getloadavg()]},
        "method": (f"one partition of {records} records (100-byte values, {args.keys} keys); each record costs "
                   f"{args.work_ms} ms of awaited work, sequential per consumer, deadlines chained within a poll's "
                   f"records (timer granularity not counted, time in poll counted); individual commit after every "
                   f"poll; aggregate rate over {args.window} s after {args.warmup} s of warm-up"),
        "runs": [],
    }
    with KafkaCluster.start(1, workdir=workdir / "kafka") as cluster:
        from tests.conftest import create_topic

        topic = "bench-consumer"
        create_topic(cluster, topic, partitions=1)
        _produce(cluster.bootstrap_servers, topic, records, args.keys)
        proxy = ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / "proxy")
        try:
            direct = trio.run(lambda: _measure(cluster.bootstrap_servers, topic, 1, work_ms=args.work_ms,
                                               warmup=args.warmup, window=args.window, ranged=False))
            direct["path"] = "direct"
            results["direct_one_consumer"] = direct
            print("direct", direct, flush=True)
            for n in args.consumers:
                run = trio.run(lambda: _measure(proxy.bootstrap_servers, topic, n, work_ms=args.work_ms,
                                                warmup=args.warmup, window=args.window, ranged=n > 1))
                run["path"] = "proxy"
                results["runs"].append(run)
                print("proxy", run, flush=True)
        finally:
            proxy.stop()
    one = next((r["records_per_s"] for r in results["runs"] if r["consumers"] == 1), None)
    if one:
        results["scaling_vs_n_times_one"] = {str(r["consumers"]): round(r["records_per_s"] / (r["consumers"] * one), 3)
                                             for r in results["runs"]}
        results["proxy_one_vs_direct_one"] = round(one / results["direct_one_consumer"]["records_per_s"], 3)
        results["goal"] = "N consumers on one partition reach at least 0.9 x N x one consumer"
        results["goal_met"] = all(v >= 0.9 for v in results["scaling_vs_n_times_one"].values())
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results.get("scaling_vs_n_times_one")), "goal met" if results.get("goal_met") else "goal NOT met")
    return 0


BENCHMARK = Benchmark(
    "bench_consumer", "Processing-bound scaling: N key-range consumers sharing one partition",
    main=main, with_all=True)


if __name__ == "__main__":
    raise SystemExit(main())
