"""Individual commit: range commits against plain OffsetCommit, both through the proxy.

One client connection to the group coordinator (through the proxy) commits all 100
partitions of a topic per request, closed loop, and times every request:

- plain: a standard OffsetCommit (v9) of 100 partitions, offsets increasing (run first,
  before the log topic exists, as ``runs_plain_first``, and in every round after the range
  commits: the baseline);
- ranges=k (k in --ranges): every partition carries k ranges. Commits alternate between
  the even and the odd offsets of a 2k-offset window (gap amending): the first leaves k
  ranges above S, the second fills the gaps and moves S past the window, so the state
  stays bounded as in real use. Each request is a broker commit of S plus an acks=all
  write of the 100 states to __individual_commit_offsets.

Latency is timed from the first byte of the request sent to the last byte of the
response received: the commit as the proxy and the broker serve it. Encoding the request
and decoding the response in this client (its generic codec builds an object per range)
is outside it; the latency with them included is reported too (``*_with_codec_ms``).

Before the recorded rounds, ``--warmup-rounds`` unrecorded rounds run every configuration
once: the broker's JIT compiles the paths a range commit adds (Produce, ListOffsets) only
after some hundreds of requests, which otherwise lands on the first range configuration.

Reports requests/s, partition commits/s and latency percentiles per configuration, and
the p99 ratio against plain (goal: at most 2x). Writes benchmarks/results/commits.json.
Run: ``.venv/bin/python -m benchmarks.bench_commits``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import struct
import sys
import time
import uuid
from pathlib import Path

import psutil

from benchmarks.benchmark import Benchmark
from harness.commit_client import CommitClient, commit_body
from harness.kafka_cluster import KafkaCluster
from proxy.local_kafka import ProxyProcess, scratch_dir
from proxy.protocol import messages
from proxy.protocol.messages import ApiKey

RESULTS = Path(__file__).resolve().parent / "results"
PARTITIONS = 100


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[index]


def _request(client: CommitClient, body) -> tuple[object, float, float]:
    """One OffsetCommit: (response, seconds on the wire, seconds with this client's codec)."""
    raw = client.client
    started = time.perf_counter()
    raw.correlation += 1
    header = messages.new_request_header(ApiKey.OFFSET_COMMIT, 9, correlation_id=raw.correlation,
                                         client_id=raw.client_id)
    frame = messages.encode_request(header, body)
    sent = time.perf_counter()
    raw.sock.sendall(struct.pack(">i", len(frame)) + frame)
    answer = raw.receive()
    received = time.perf_counter()
    response_header, response = messages.decode_response(ApiKey.OFFSET_COMMIT, 9, answer)
    if response_header.correlation_id != raw.correlation:
        raise RuntimeError(f"correlation id {response_header.correlation_id}, expected {raw.correlation}")
    return response, received - sent, time.perf_counter() - started


def _run(client: CommitClient, topic: str, requests: int, ranges: int | None, warmup: int) -> tuple[list, list]:
    """Latencies (wire, with codec) of ``requests`` commits after ``warmup`` ones."""
    latencies = []
    with_codec = []
    for number in range(warmup + requests):
        if ranges is None:
            partitions = {p: number + 1 for p in range(PARTITIONS)}
        else:
            window = (number // 2) * 2 * ranges
            parity = number % 2
            partitions = {p: [(window + 2 * i + parity, window + 2 * i + parity) for i in range(ranges)]
                          for p in range(PARTITIONS)}
        body = commit_body(client.group, topic, partitions)
        response, elapsed, elapsed_with_codec = _request(client, body)
        errors = {p.error_code for t in response.topics for p in t.partitions}
        if errors != {0}:
            raise RuntimeError(f"commit failed: errors {errors}")
        if ranges is not None and number % 2 == 1:
            stable = {p.stable_offset for t in response.topics for p in t.partitions}
            assert stable == {(number // 2 + 1) * 2 * ranges}, stable
        if number >= warmup:
            latencies.append(elapsed)
            with_codec.append(elapsed_with_codec)
    return latencies, with_codec


def _stats(latencies: list[float], with_codec: list[float], ranges: int | None) -> dict:
    total = sum(latencies)
    return {
        "requests": len(latencies),
        "ranges_per_partition": ranges or 0,
        "requests_per_s": round(len(latencies) / total, 1),
        "partition_commits_per_s": round(len(latencies) * PARTITIONS / total, 1),
        "p50_ms": round(_percentile(latencies, 50) * 1000, 3),
        "p90_ms": round(_percentile(latencies, 90) * 1000, 3),
        "p99_ms": round(_percentile(latencies, 99) * 1000, 3),
        "max_ms": round(max(latencies) * 1000, 3),
        "mean_ms": round(statistics.fmean(latencies) * 1000, 3),
        "p50_with_codec_ms": round(_percentile(with_codec, 50) * 1000, 3),
        "p99_with_codec_ms": round(_percentile(with_codec, 99) * 1000, 3),
    }


def _ratios(runs: dict, field: str) -> dict:
    plain = runs["plain"][field]
    return {label: round(run[field] / plain, 2) for label, run in runs.items() if label.startswith("ranges")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--ranges", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure every configuration this many times, in turn (one cluster and proxy); "
                             "'runs' pools the rounds, 'rounds' holds each")
    parser.add_argument("--warmup-rounds", type=int, default=1,
                        help="unrecorded rounds of every configuration first, so that the broker's JIT has "
                             "compiled the paths each one uses (OffsetCommit, Produce, ListOffsets)")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a proxy setting for the run (repeatable), e.g. individual.commit.log.segment.bytes=104857600")
    parser.add_argument("--output", type=Path, default=RESULTS / "commits.json")
    args = parser.parse_args(argv)
    workdir = scratch_dir("bench-commits-")
    results: dict = {
        "command": " ".join([".venv/bin/python -m benchmarks.bench_commits",
                             *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"python": platform.python_version(), "cpus": psutil.cpu_count(), "cpu": platform.machine(),
                    "load_average_at_start": [round(x, 2) for x in os.getloadavg()]},
        "partitions": PARTITIONS,
        "nodes": args.nodes,
        "method": "one connection, closed loop, every request commits all partitions; latency per request from "
                  "the first byte sent to the last byte received (with the client's encoding and decoding: "
                  "*_with_codec_ms); plain-first before the log topic exists, then --warmup-rounds unrecorded "
                  "rounds of every configuration, then --rounds recorded ones",
        "runs": {},
        "rounds": [],
    }
    pooled: dict[str, tuple[list, list, int | None]] = {}
    with KafkaCluster.start(args.nodes, workdir=workdir / "kafka") as cluster:
        from tests.conftest import create_topic

        topic = "bench-commits"
        create_topic(cluster, topic, partitions=PARTITIONS, replication_factor=min(3, args.nodes))
        overrides = dict(item.split("=", 1) for item in args.override)
        results["proxy_overrides"] = overrides
        proxy = ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / "proxy", overrides=overrides)
        try:
            # Plain before and after: the first runs before the log topic exists (and before
            # any warm-up), the second (the baseline) once it does, as in steady state.
            with CommitClient(proxy.bootstrap_servers, f"bench-{uuid.uuid4().hex[:8]}") as client:
                latencies, with_codec = _run(client, topic, args.requests, None, args.warmup)
            results["runs_plain_first"] = _stats(latencies, with_codec, None)
            print("plain-first", results["runs_plain_first"], flush=True)
            configurations: list[tuple[str, int | None]] = [
                *((f"ranges={k}", k) for k in args.ranges), ("plain", None)]
            for label, ranges in configurations * args.warmup_rounds:
                with CommitClient(proxy.bootstrap_servers, f"bench-{uuid.uuid4().hex[:8]}") as client:
                    _run(client, topic, args.requests, ranges, args.warmup)
                print("warm-up", label, flush=True)
            for number in range(args.rounds):
                this_round: dict = {"load_average_at_start": [round(x, 2) for x in os.getloadavg()], "runs": {}}
                for label, ranges in configurations:
                    with CommitClient(proxy.bootstrap_servers, f"bench-{uuid.uuid4().hex[:8]}") as client:
                        latencies, with_codec = _run(client, topic, args.requests, ranges, args.warmup)
                    this_round["runs"][label] = _stats(latencies, with_codec, ranges)
                    entry = pooled.setdefault(label, ([], [], ranges))
                    entry[0].extend(latencies)
                    entry[1].extend(with_codec)
                    print(f"round {number + 1}", label, this_round["runs"][label], flush=True)
                this_round["p99_ratio_to_plain"] = _ratios(this_round["runs"], "p99_ms")
                results["rounds"].append(this_round)
        finally:
            proxy.stop()
    results["runs"] = {label: _stats(*entry) for label, entry in pooled.items()}
    results["p99_ratio_to_plain"] = _ratios(results["runs"], "p99_ms")
    results["p50_ratio_to_plain"] = _ratios(results["runs"], "p50_ms")
    results["p99_with_codec_ratio_to_plain"] = _ratios(results["runs"], "p99_with_codec_ms")
    results["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results["goal"] = "p99 of range commits at most 2x the plain commit's"
    results["goal_met"] = all(ratio <= 2.0 for ratio in results["p99_ratio_to_plain"].values())
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["p99_ratio_to_plain"]), "goal met" if results["goal_met"] else "goal NOT met")
    return 0


BENCHMARK = Benchmark(
    "bench_commits", "Individual commit: range commits against plain OffsetCommit",
    main=main, with_all=True)


if __name__ == "__main__":
    raise SystemExit(main())
