"""Direct vs through the proxy, in the same run, with Kafka's own performance tools.

Measures (each direct and through the proxy, alternating, ``--rounds`` times):
- consume throughput: ConsumerPerformance over ``--consume-mb`` of 1 KB records;
- produce throughput: ProducerPerformance, 1 KB records, unthrottled
  (``--produce-rounds`` times, twice ``--rounds`` unless given: it varies most);
- produce latency at a fixed rate (``--latency-rate-mb`` MB/s): the p99 the proxy adds;
- proxy CPU seconds per MB forwarded (user + system of the proxy process and its workers),
  consumed and produced.

``--against KEY=VALUE`` (repeatable) runs a second proxy with those settings beside the
first in every round (``--override`` sets both): what a non-default setting costs, as a
ratio to the default proxy of the same round, under ``against`` in the report, its
settings named there.

Method. Both sides get the same workload and the same treatment:
- one unrecorded consume each way first (the broker's JIT and page cache warm up on the
  first reads; before this the first direct run was up to 30% slower than the others);
- within a round the two runs are back to back, and which goes first alternates from
  round to round, so neither side always gets the warmer or the quieter slot;
- a throughput's ``ratio`` is the median over rounds of the round's proxy/direct ratio
  (paired: both runs of a round saw the same machine load); the medians of each side
  and their ratio are reported too (``ratio_of_medians``).

Writes ``benchmarks/results/proxy.json``. Run: ``make bench-proxy`` or
``.venv/bin/python -m benchmarks.bench_proxy``.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import sys
import urllib.request
from pathlib import Path

import psutil

from benchmarks.benchmark import Benchmark
from benchmarks.rounds import rotation
from harness import java_tools, processes
from harness.kafka_cluster import KafkaCluster
from proxy.local_kafka import ProxyProcess, scratch_dir

RESULTS = Path(__file__).resolve().parent / "results"
RECORD_SIZE = 1024


def _consume(bootstrap: str, topic: str, records: int) -> dict:
    result = java_tools.consumer_performance(bootstrap, topic, records, timeout=900,
                                             consumer_config={"fetch.max.bytes": "52428800"})
    # CSV: start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec
    line = [row for row in result.stdout.splitlines() if re.match(r"^\d{4}-", row)][-1]
    cells = [c.strip() for c in line.split(",")]
    return {"mb": float(cells[2]), "mb_per_s": float(cells[3]), "records": int(cells[4]),
            "records_per_s": float(cells[5]), "fetch_mb_per_s": float(cells[8])}


def _readahead_counts(proxy: ProxyProcess) -> dict:
    """The proxy's fetch prediction counters so far (the consume rounds): how many of the
    consumer's fetches were answered from an early fetch (reported as "readahead", the
    feature's former name, so results stay comparable)."""
    if proxy.metrics_url is None:
        return {}
    text = urllib.request.urlopen(proxy.metrics_url, timeout=10).read().decode()
    counts = {}
    for name in ("sent", "hits", "wasted"):
        match = re.search(rf"^kafka_proxy_fetch_prediction_{name}_total ([0-9.e+]+)$", text, re.M)
        counts[name] = int(float(match.group(1))) if match else 0
    return counts


def _native_requests(proxy: ProxyProcess) -> int:
    """Requests the proxy's native relay carried so far (``kafka_proxy_native_relay_requests_total``):
    a proxy that carried none ran every frame on its event loop."""
    text = urllib.request.urlopen(proxy.metrics_url, timeout=10).read().decode()
    match = re.search(r"^kafka_proxy_native_relay_requests_total ([0-9.e+]+)$", text, re.M)
    return int(float(match.group(1))) if match else 0


def _produce(bootstrap: str, topic: str, records: int, throughput: int = -1) -> dict:
    result = java_tools.producer_performance(bootstrap, topic, records, record_size=RECORD_SIZE,
                                             throughput=throughput, timeout=900,
                                             producer_props={"acks": "1", "linger.ms": "5", "batch.size": "262144"})
    line = [row for row in result.stdout.splitlines() if "records sent" in row][-1]
    # "N records sent, X records/sec (Y MB/sec), A ms avg latency, M ms max latency,
    #  P50 ms 50th, P95 ms 95th, P99 ms 99th, P999 ms 99.9th."
    def number(pattern: str) -> float:
        return float(re.search(pattern, line).group(1))

    return {"records": int(number(r"(\d+) records sent")),
            "records_per_s": number(r"([\d.]+) records/sec"),
            "mb_per_s": number(r"\(([\d.]+) MB/sec\)"),
            "avg_latency_ms": number(r"([\d.]+) ms avg latency"),
            "max_latency_ms": number(r"([\d.]+) ms max latency"),
            "p50_ms": number(r"([\d.]+) ms 50th"),
            "p95_ms": number(r"([\d.]+) ms 95th"),
            "p99_ms": number(r"([\d.]+) ms 99th"),
            "p999_ms": number(r"([\d.]+) ms 99\.9th")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--consume-mb", type=int, default=1024)
    parser.add_argument("--produce-mb", type=int, default=512)
    parser.add_argument("--latency-rate-mb", type=float, default=10.0)
    parser.add_argument("--latency-seconds", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--produce-rounds", type=int, default=None)
    parser.add_argument("--output", type=Path, default=RESULTS / "proxy.json")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a proxy setting for the run (repeatable), e.g. socket.send.buffer.bytes=-1")
    parser.add_argument("--against", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of a second proxy measured beside the first (repeatable)")
    args = parser.parse_args(argv)

    consume_records = args.consume_mb * 1024 * 1024 // RECORD_SIZE
    produce_records = args.produce_mb * 1024 * 1024 // RECORD_SIZE
    latency_rate = int(args.latency_rate_mb * 1024 * 1024 / RECORD_SIZE)
    latency_records = latency_rate * args.latency_seconds
    produce_rounds = args.produce_rounds if args.produce_rounds is not None else 2 * args.rounds
    workdir = scratch_dir("bench-proxy-")
    report: dict = {
        "command": " ".join(["python -m benchmarks.bench_proxy", *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"python": platform.python_version(), "cpus": psutil.cpu_count(),
                    "cpu": platform.processor() or platform.machine()},
        "record_size": RECORD_SIZE,
        "method": ("one unrecorded consume each way first; the runs of a round back to back, "
                   "their order rotating from round to round; ratio = median over "
                   f"rounds of proxy/direct; {args.rounds} consume and latency rounds, "
                   f"{produce_rounds} produce rounds"),
        "settings": dict(item.split("=", 1) for item in args.override),
    }
    with KafkaCluster.start(1, workdir=workdir / "kafka",
                            broker_properties={"num.partitions": "1"}) as cluster:
        overrides = {"metrics.port": "0", **report["settings"]}
        against = dict(item.split("=", 1) for item in args.against)
        proxies = {"proxy": ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / "proxy",
                                               overrides=overrides)}
        other = "proxy (" + ", ".join(f"{k}={v}" for k, v in against.items()) + ")" if against else None
        try:
            if other is not None:
                proxies[other] = ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / "against",
                                                    overrides={**overrides, **against})
            proxy = proxies["proxy"]
            pids = {name: p.pid for name, p in proxies.items()}
            java_tools.create_topic(cluster.bootstrap_servers, "bench-consume", partitions=1)
            print(f"filling bench-consume with {args.consume_mb} MB ...", flush=True)
            _produce(cluster.bootstrap_servers, "bench-consume", consume_records)

            modes = {"direct": cluster.bootstrap_servers, **{name: p.bootstrap_servers for name, p in proxies.items()}}

            def in_turn(round_number: int) -> list[tuple[str, str]]:
                return [(mode, modes[mode]) for mode in rotation(list(modes), round_number)]

            def cpu_of(mode: str) -> float:
                return processes.cpu_seconds([pids[mode]]) if mode in pids else 0.0

            def line(kind: str, runs: dict, key: str, unit: str) -> str:
                return f"{kind}: " + ", ".join(f"{mode} {runs[mode][-1][key]:.1f} {unit}" for mode in modes)

            for bootstrap in modes.values():  # warm-up, not recorded
                _consume(bootstrap, "bench-consume", consume_records)
            consume: dict[str, list[dict]] = {mode: [] for mode in modes}
            for round_number in range(args.rounds):
                for mode, bootstrap in in_turn(round_number):
                    before = cpu_of(mode)
                    run = _consume(bootstrap, "bench-consume", consume_records)
                    run["cpu_ms_per_mb"] = 1000 * (cpu_of(mode) - before) / run["mb"]
                    consume[mode].append(run)
                print(line(f"consume round {round_number}", consume, "mb_per_s", "MB/s"), flush=True)
            readahead = _readahead_counts(proxy)

            produce: dict[str, list[dict]] = {mode: [] for mode in modes}
            produced_mb = produce_records * RECORD_SIZE / 2**20
            for round_number in range(produce_rounds):
                for index, (mode, bootstrap) in enumerate(in_turn(round_number)):
                    topic = f"bench-produce-{round_number}-{index}"
                    java_tools.create_topic(cluster.bootstrap_servers, topic, partitions=1)
                    before = cpu_of(mode)
                    run = _produce(bootstrap, topic, produce_records)
                    run["cpu_ms_per_mb"] = 1000 * (cpu_of(mode) - before) / produced_mb
                    produce[mode].append(run)
                print(line(f"produce round {round_number}", produce, "mb_per_s", "MB/s"), flush=True)

            latency: dict[str, list[dict]] = {mode: [] for mode in modes}
            for round_number in range(args.rounds):
                for index, (mode, bootstrap) in enumerate(in_turn(round_number)):
                    topic = f"bench-latency-{round_number}-{index}"
                    java_tools.create_topic(cluster.bootstrap_servers, topic, partitions=1)
                    latency[mode].append(_produce(bootstrap, topic, latency_records, throughput=latency_rate))
                print(line(f"latency round {round_number}, p99", latency, "p99_ms", "ms"), flush=True)
            report["native_relay_requests"] = {name: _native_requests(p) for name, p in proxies.items()}
        finally:
            for running in proxies.values():
                running.stop()

    def median(rows: list[dict], key: str) -> float:
        return statistics.median(row[key] for row in rows)

    def throughput(runs: dict, records: int, goal: str, mode: str = "proxy") -> dict:
        paired = [proxy["mb_per_s"] / direct["mb_per_s"] for direct, proxy in zip(runs["direct"], runs[mode])]
        summary = {"records": records, "runs": {"direct": runs["direct"], "proxy": runs[mode]},
                   "direct_mb_per_s": median(runs["direct"], "mb_per_s"),
                   "proxy_mb_per_s": median(runs[mode], "mb_per_s"),
                   "round_ratios": paired,
                   "ratio": statistics.median(paired),
                   "proxy_cpu_ms_per_mb": median(runs[mode], "cpu_ms_per_mb")}
        summary["ratio_of_medians"] = summary["proxy_mb_per_s"] / summary["direct_mb_per_s"]
        summary["goal"] = goal
        return summary

    report["consume"] = throughput(consume, consume_records, ">= 0.90")
    report["consume"]["readahead"] = readahead
    report["produce"] = throughput(produce, produce_records, ">= 0.95")
    if other is not None:
        report["against"] = {"settings": against, "label": other}
        for kind, runs, records in (("consume", consume, consume_records), ("produce", produce, produce_records)):
            summary = throughput(runs, records, "", other)
            del summary["goal"]
            to_proxy = [o["mb_per_s"] / p["mb_per_s"] for p, o in zip(runs["proxy"], runs[other])]
            summary["round_ratios_to_proxy"] = to_proxy
            summary["ratio_to_proxy"] = statistics.median(to_proxy)
            cpu_gap = [o["cpu_ms_per_mb"] - p["cpu_ms_per_mb"] for p, o in zip(runs["proxy"], runs[other])]
            summary["cpu_ms_per_mb_minus_proxy"] = statistics.median(cpu_gap)
            summary["cpu_ms_per_mb_minus_proxy_rounds"] = cpu_gap
            report["against"][kind] = summary
        report["against"]["latency"] = {"runs": latency[other], "p99_ms": median(latency[other], "p99_ms")}
    report["latency"] = {
        "rate_mb_per_s": args.latency_rate_mb,
        "records": latency_records,
        "runs": latency,
        "direct_p99_ms": median(latency["direct"], "p99_ms"),
        "proxy_p99_ms": median(latency["proxy"], "p99_ms"),
    }
    report["latency"]["p99_added_ms"] = report["latency"]["proxy_p99_ms"] - report["latency"]["direct_p99_ms"]
    report["latency"]["goal"] = "p99 added <= 1 ms"
    report["proxy_cpu_seconds_per_mb"] = report["consume"]["proxy_cpu_ms_per_mb"] / 1000
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("consume", "produce", "latency")}, indent=1, default=str)[:3000])
    print(f"proxy CPU per MB forwarded: {report['proxy_cpu_seconds_per_mb'] * 1000:.2f} ms")
    if other is not None:
        for kind in ("consume", "produce"):
            summary = report["against"][kind]
            print(f"{other}, {kind}: {summary['ratio_to_proxy']:.3f} x the default proxy "
                  f"({min(summary['round_ratios_to_proxy']):.3f}-{max(summary['round_ratios_to_proxy']):.3f}), "
                  f"CPU per MB {summary['cpu_ms_per_mb_minus_proxy']:+.3f} ms", flush=True)
    print(f"wrote {args.output}")
    return 0


BENCHMARK = Benchmark(
    "bench_proxy", "Direct against through the proxy, with Kafka's own performance tools",
    main=main, with_all=True)


if __name__ == "__main__":
    sys.exit(main())
