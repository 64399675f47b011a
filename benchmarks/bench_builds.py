"""Two builds of the proxy against each other, and against the broker, in one run.

A change that should not move performance (a refactor, a dependency bump) is checked by
running the code before and after it side by side: one broker, one proxy process per
build, and Kafka's own performance tools going direct, through the first build and
through the second in every round, in an order that rotates from round to round.

    git worktree add /tmp/before <rev>          # and build its C kernels in place
    .venv/bin/python -m benchmarks.bench_builds --build before=/tmp/before \\
        --build after=. --rounds 8 --output-dir benchmarks/results/architecture

Reported per build: consume and produce MB/s (ConsumerPerformance, ProducerPerformance,
1 KB records) as ratios to direct, each round paired with the direct run of the same
round; and the proxy's CPU (user + system of its process and any workers under it) per MB
moved, as a ratio to the first build's in the same round. Writes ``builds.json`` and ``builds.png``.

``--workload delivery`` compares builds on the key-range delivery workload instead: N raw
clients (``benchmarks.workloads.keyrange_delivery.raw_clients``, equal key ranges of one
partition of 100-byte keyed records, cached shares on) through a fresh proxy of each build
per run, against one raw client reading the partition direct in the same round; and the
proxy's CPU per million records handed out. Writes ``builds_delivery.json`` and its chart.

    .venv/bin/python -m benchmarks.bench_builds --workload delivery --build before=/tmp/before \
        --build after=. --rounds 3 --consumers 4 16
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from benchmarks import results
from benchmarks.bench_proxy import RECORD_SIZE, _consume, _produce
from benchmarks.benchmark import Benchmark
from benchmarks.rounds import Row, rotation
from harness import java_tools, processes
from harness.kafka_cluster import KafkaCluster
from proxy.local_kafka import ProxyProcess, scratch_dir

DIRECT = "direct"


def parse_build(text: str) -> tuple[str, Path]:
    """``NAME=FOLDER`` of ``--build``: the name and the checkout's root."""
    name, sep, folder = text.partition("=")
    path = Path(folder).resolve()
    if not sep or not name or name == DIRECT:
        raise argparse.ArgumentTypeError(f"--build takes NAME=FOLDER (NAME not {DIRECT!r}), got {text!r}")
    if not (path / "proxy" / "server" / "cli.py").is_file():
        raise argparse.ArgumentTypeError(f"{path} is not a checkout of the proxy (no proxy/server/cli.py)")
    return name, path


def revision(path: Path) -> str:
    done = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def start_build(bootstrap_servers: str, folder: Path, **options) -> ProxyProcess:
    """The proxy of the checkout ``folder`` (its C kernels built in place), run from that
    folder with it first on the module path, so that none of this checkout's code runs in
    it; ``options`` as ``ProxyProcess.start``'s."""
    return ProxyProcess.start(bootstrap_servers, cwd=folder, env={**os.environ, "PYTHONPATH": str(folder)}, **options)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", type=parse_build, action="append", required=True, metavar="NAME=FOLDER",
                        help="a checkout to run the proxy from (twice or more; the first is the CPU baseline)")
    parser.add_argument("--consume-mb", type=int, default=1024)
    parser.add_argument("--produce-mb", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--output-dir", type=Path, default=results.RESULTS)
    parser.add_argument("--workload", choices=("passthrough", "delivery"), default="passthrough")
    parser.add_argument("--delivery-mb", type=int, default=320, help="delivery: partition size")
    parser.add_argument("--consumers", type=int, nargs="+", default=[4, 16], help="delivery: range consumers N")
    args = parser.parse_args(argv)
    builds = dict(args.build)
    if len(builds) < 2:
        parser.error("give at least two --build, with different names")
    if args.workload == "delivery":
        if args.delivery_mb < 1 or min(args.consumers) < 1:
            parser.error("--delivery-mb and every --consumers count must be at least 1")
        return _delivery(builds, args, argv)
    names = list(builds)
    consume_records = args.consume_mb * 1024 * 1024 // RECORD_SIZE
    produce_records = args.produce_mb * 1024 * 1024 // RECORD_SIZE

    report = results.new_report(
        "builds", "Builds of the proxy side by side: " + ", ".join(f"{n} ({revision(p)})" for n, p in builds.items()),
        " ".join(["python -m benchmarks.bench_builds", *(sys.argv[1:] if argv is None else argv)]),
        "One broker, one proxy process per build. Each round runs ConsumerPerformance over the same topic "
        "and ProducerPerformance into a fresh topic, direct and through every build, in an order rotating from "
        "round to round, after one unrecorded consume each way. Ratios are per round, paired with that round's "
        "direct run (throughput) or first build (CPU per MB).",
        {"consume MB": args.consume_mb, "produce MB": args.produce_mb, "rounds": args.rounds,
         "record bytes": RECORD_SIZE, "builds": {n: f"{p} ({revision(p)})" for n, p in builds.items()}})

    consume: dict[str, list[float]] = {n: [] for n in [DIRECT, *names]}
    produce: dict[str, list[float]] = {n: [] for n in [DIRECT, *names]}
    cpu: dict[str, dict[str, list[float]]] = {"consume": {n: [] for n in names}, "produce": {n: [] for n in names}}
    workdir = scratch_dir("bench-builds-")
    with KafkaCluster.start(1, workdir=workdir / "kafka", broker_properties={"num.partitions": "1"}) as cluster:
        # each build's own proxy: run from its root folder (C kernels built in place)
        proxies = {n: start_build(cluster.bootstrap_servers, path, workdir=workdir / n) for n, path in builds.items()}
        try:
            pids = {n: p.pid for n, p in proxies.items()}
            bootstrap = {DIRECT: cluster.bootstrap_servers, **{n: p.bootstrap_servers for n, p in proxies.items()}}
            java_tools.create_topic(cluster.bootstrap_servers, "builds-consume", partitions=1)
            print(f"filling builds-consume with {args.consume_mb} MB ...", flush=True)
            _produce(cluster.bootstrap_servers, "builds-consume", consume_records)
            for name in bootstrap:  # warm-up, not recorded
                _consume(bootstrap[name], "builds-consume", consume_records)
            for round_number in range(args.rounds):
                for name in rotation([DIRECT, *names], round_number):
                    for kind, values in (("consume", consume), ("produce", produce)):
                        before = processes.cpu_seconds([pids[name]]) if name != DIRECT else 0.0
                        if kind == "consume":
                            run = _consume(bootstrap[name], "builds-consume", consume_records)
                            mb = run["mb"]
                        else:
                            topic = f"builds-produce-{name}-{round_number}"
                            java_tools.create_topic(cluster.bootstrap_servers, topic, partitions=1)
                            run = _produce(bootstrap[name], topic, produce_records)
                            mb = produce_records * RECORD_SIZE / 2**20
                        values[name].append(run["mb_per_s"])
                        if name != DIRECT:
                            cpu[kind][name].append((processes.cpu_seconds([pids[name]]) - before) * 1000 / mb)
                print(f"round {round_number}: consume " + ", ".join(f"{n} {v[-1]:.0f}" for n, v in consume.items())
                      + " MB/s; produce " + ", ".join(f"{n} {v[-1]:.0f}" for n, v in produce.items()) + " MB/s",
                      flush=True)
        finally:
            for proxy in proxies.values():
                proxy.stop()

    for kind, values in (("consume", consume), ("produce", produce)):
        for name in names:
            report["rows"].append(Row(f"{kind} MB/s", name, "MB/s", values[name], DIRECT, values[DIRECT]).as_dict())
        report["rows"].append(Row(f"{kind} proxy CPU ms per MB (lower is better)", names[0], "ms/MB",
                                  cpu[kind][names[0]], higher_is_better=False).as_dict())
        for name in names[1:]:
            report["rows"].append(Row(f"{kind} proxy CPU ms per MB (lower is better)", name, "ms/MB", cpu[kind][name],
                                      names[0], cpu[kind][names[0]], higher_is_better=False).as_dict())
    return _finish(report, args.output_dir)


def _delivery(builds: dict[str, Path], args: argparse.Namespace, argv: list[str] | None) -> int:
    from benchmarks.workloads import data
    from benchmarks.workloads.keyrange_delivery import TOPIC, raw_clients

    names = list(builds)
    records = args.delivery_mb * 2**20 // 130
    report = results.new_report(
        "builds_delivery",
        "Builds of the proxy side by side, key-range delivery: " + ", ".join(
            f"{n} ({revision(p)})" for n, p in builds.items()),
        " ".join(["python -m benchmarks.bench_builds", *(sys.argv[1:] if argv is None else argv)]),
        "One broker, one partition of 100-byte keyed records (10,007 keys). Each round reads it with one raw "
        "client direct and, for every N, with N raw clients of equal key ranges through a fresh proxy of every "
        "build (cached shares on), in an order rotating from round to round, after one unrecorded direct read. "
        "Ratios are per round, paired with that round's direct read (records/s) or first build (CPU per record).",
        {"partition MB": args.delivery_mb, "records": records, "consumers": args.consumers, "rounds": args.rounds,
         "builds": {n: f"{p} ({revision(p)})" for n, p in builds.items()}})
    contenders = [DIRECT, *(f"{name} N={n}" for n in args.consumers for name in names)]
    rates: dict[str, list[float]] = {c: [] for c in contenders}
    cpu: dict[str, list[float]] = {c: [] for c in contenders[1:]}
    workdir = scratch_dir("bench-builds-delivery-")
    # Records cached: the default now, set for builds from before it made it one, so every
    # build runs the same way (and the report says so).
    overrides = {"metrics.port": "0", f"topic.{TOPIC}.reserve.message.value.range.fetch": "true"}
    report["notes"].append(f"Every build runs with topic.{TOPIC}.reserve.message.value.range.fetch=true: the "
                           "proxy's default, set for builds from before it was.")
    with KafkaCluster.start(1, workdir=workdir / "kafka") as cluster:
        java_tools.create_topic(cluster.bootstrap_servers, TOPIC, partitions=1)
        print(f"writing {records:,} records ({args.delivery_mb} MB) ...", flush=True)
        data.produce_keyed(cluster.bootstrap_servers, TOPIC, records, keys=10_007, value_size=100)
        raw_clients(cluster.bootstrap_servers, None, records)  # warm-up: the page cache
        for round_number in range(args.rounds):
            for contender in rotation(contenders, round_number):
                if contender == DIRECT:
                    seconds, delivered = raw_clients(cluster.bootstrap_servers, None, records)
                else:
                    name, _, n = contender.partition(" N=")
                    proxy = start_build(cluster.bootstrap_servers, builds[name], overrides=overrides,
                                        workdir=workdir / f"{name}-{n}-{round_number}")
                    try:
                        before = processes.cpu_seconds([proxy.pid])
                        seconds, delivered = raw_clients(proxy.bootstrap_servers, int(n), records)
                        cpu[contender].append((processes.cpu_seconds([proxy.pid]) - before) * 1e6 / delivered)
                    finally:
                        proxy.stop()
                if delivered != records:
                    raise RuntimeError(f"{contender} delivered {delivered} of {records} records")
                rates[contender].append(delivered / seconds)
            print(f"round {round_number}: " + ", ".join(f"{c} {v[-1]:,.0f}" for c, v in rates.items())
                  + " records/s", flush=True)
    for n in args.consumers:
        first = f"{names[0]} N={n}"
        for name in names:
            contender = f"{name} N={n}"
            report["rows"].append(Row(f"N={n} records/s", contender, "records/s", rates[contender],
                                      "raw client direct", rates[DIRECT]).as_dict())
        for name in names[1:]:
            contender = f"{name} N={n}"
            report["rows"].append(Row(f"N={n} records/s against the first build", contender, "records/s",
                                      rates[contender], first, rates[first]).as_dict())
        report["rows"].append(Row(f"N={n} proxy CPU us per record (lower is better)", first, "us",
                                  cpu[first], higher_is_better=False).as_dict())
        for name in names[1:]:
            contender = f"{name} N={n}"
            report["rows"].append(Row(f"N={n} proxy CPU us per record (lower is better)", contender, "us",
                                      cpu[contender], first, cpu[first], higher_is_better=False).as_dict())
    return _finish(report, args.output_dir)


def _finish(report: dict, output_dir: Path) -> int:
    """Write the report and print its rows."""
    path = results.finish(report, output_dir)
    for row in report["rows"]:
        line = f"{row['group']}: {row['name']} {row['value']:.3g} {row['unit']}"
        if row["ratio"] is not None:
            line += (f", ratio to {row['baseline']} {row['ratio']:.3f} "
                     f"({row['ratio_spread'][0]:.3f}-{row['ratio_spread'][1]:.3f})")
        print(line)
    print(f"wrote {path}")
    return 0


BENCHMARK = Benchmark(
    "bench_builds", "Two builds of the proxy side by side (needs --build NAME=FOLDER twice)",
    main=main)


if __name__ == "__main__":
    sys.exit(main())
