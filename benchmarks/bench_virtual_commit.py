"""Latency of a virtual topic's share-watermark commit through the proxy (docs/virtual-topics.md).

One connection to the coordinator through the proxy, closed loop: each request commits
every share of ``--partitions`` real partitions read as ``<topic>.kr<K>`` (plain
OffsetCommits of virtual partitions, as a standard client sends them). Latency per request
from the first byte sent to the last byte received. Run under the benchmark lock:

    flock /tmp/keyrange-bench.lock .venv/bin/python -m benchmarks.bench_virtual_commit
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import uuid

from benchmarks.bench_commits import _percentile, _request
from benchmarks.benchmark import Benchmark
from harness.commit_client import CommitClient, commit_body
from harness.kafka_cluster import KafkaCluster
from proxy.local_kafka import ProxyProcess, scratch_dir

# Virtual topics, what it measures, are off by default: the proxy has them on, and the output says so.
SETTINGS = {"virtual.topics.enabled": "true"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--shares", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    workdir = scratch_dir("bench-virtual-commit")
    virtual_partitions = args.partitions * args.shares
    rounds = []
    with KafkaCluster.start(1, workdir=workdir / "kafka") as cluster:
        from tests.conftest import create_topic

        topic = "bench-virtual-commit"
        create_topic(cluster, topic, partitions=args.partitions, replication_factor=1)
        proxy = ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / "proxy", overrides=SETTINGS)
        try:
            for _ in range(args.rounds):
                latencies = []
                with CommitClient(proxy.bootstrap_servers, f"bench-{uuid.uuid4().hex[:8]}") as client:
                    for number in range(args.warmup + args.requests):
                        body = commit_body(client.group, f"{topic}.kr{args.shares}",
                                           {v: number * 10 + v % args.shares for v in range(virtual_partitions)})
                        response, elapsed, _ = _request(client, body)
                        errors = {p.error_code for t in response.topics for p in t.partitions}
                        if errors != {0}:
                            raise RuntimeError(f"commit failed: errors {errors}")
                        if number >= args.warmup:
                            latencies.append(elapsed)
                rounds.append({"p50_ms": round(_percentile(latencies, 50) * 1000, 3),
                               "p99_ms": round(_percentile(latencies, 99) * 1000, 3),
                               "mean_ms": round(statistics.fmean(latencies) * 1000, 3),
                               "load_average": [round(x, 2) for x in os.getloadavg()]})
                print(json.dumps(rounds[-1]), flush=True)
        finally:
            proxy.stop()
    print(json.dumps({"settings": SETTINGS, "virtual_partitions_per_request": virtual_partitions, "rounds": rounds}))
    return 0


BENCHMARK = Benchmark("bench_virtual_commit", "Latency of a virtual topic's share-watermark commit", main=main)


if __name__ == "__main__":
    raise SystemExit(main())
