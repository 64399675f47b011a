"""What one more TCP hop costs a consumer on this machine, and what the proxy adds to it.

ConsumerPerformance (1 KB records, ``--consume-mb``) in the same run, in turns, through:
- ``direct``: the broker;
- ``bare_relay``: ``benchmarks.bare_relay``, two threads per connection moving bytes with
  ``splice`` and doing nothing else (the broker advertises the relay's port on a listener
  of its own, so the consumer's fetches go through it): the floor of any proxy;
- ``proxy``: the proxy with its defaults;
- ``proxy_readahead``: the proxy with fetch prediction (``fetch.prediction.enabled=true``; the
  contender keeps the feature's former name, so results stay comparable).

Each of the ``--rounds`` rounds runs every mode once, in an order that rotates from round
to round, after one unrecorded consume each. Ratios are medians over rounds of the
round's mode/direct ratio. CPU seconds per MB are reported for the relay and the proxies
(each proxy's process and its workers), and the machine's busy cores during each run.

Writes ``benchmarks/results/hop.json``. Run: ``.venv/bin/python -m benchmarks.bench_hop``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

from benchmarks.bench_proxy import RECORD_SIZE, _consume, _produce, _readahead_counts
from benchmarks.benchmark import Benchmark
from harness import java_tools
from harness.kafka_cluster import KafkaCluster
from harness.processes import cpu_seconds
from harness.wait import wait_until
from proxy.local_kafka import ProxyProcess, free_port, scratch_dir

RESULTS = Path(__file__).resolve().parent / "results"
# Each proxy contender's settings other than the defaults (named in the report's modes).
SETTINGS = {"proxy_readahead": {"fetch.prediction.enabled": "true"}}
RELAY_LISTENER = "RELAY"


def _busy_cores(before, after, seconds: float) -> float:
    def busy(times) -> float:
        return times.user + times.system + times.irq + times.softirq + getattr(times, "steal", 0.0)

    return (busy(after) - busy(before)) / seconds


def _start_relay(port: int, target: str) -> subprocess.Popen:
    relay = subprocess.Popen([sys.executable, "-m", "benchmarks.bare_relay", str(port), target])

    def listening() -> bool:
        return any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
                   for c in psutil.Process(relay.pid).net_connections())

    try:
        wait_until(listening, timeout=30, what="the bare relay listening")
    except BaseException:
        relay.kill()
        relay.wait()
        raise
    return relay


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--consume-mb", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULTS / "hop.json")
    args = parser.parse_args(argv)

    records = args.consume_mb * 1024 * 1024 // RECORD_SIZE
    workdir = scratch_dir("bench-hop-")
    relay_port = free_port()
    report: dict = {
        "command": " ".join(["python -m benchmarks.bench_hop", *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"python": platform.python_version(), "cpus": psutil.cpu_count(),
                    "cpu": platform.processor() or platform.machine()},
        "record_size": RECORD_SIZE,
        "consume_mb": args.consume_mb,
        "method": ("one unrecorded consume per mode first; every round runs each mode once, the order "
                   "rotating from round to round; ratio = median over rounds of mode/direct"),
    }
    with KafkaCluster.start(1, workdir=workdir / "kafka", broker_properties={"num.partitions": "1"},
                            extra_listeners={RELAY_LISTENER: "PLAINTEXT"},
                            advertised_ports={RELAY_LISTENER: {1: relay_port}}) as cluster:
        node = cluster.nodes[0]
        relay = _start_relay(relay_port, f"{node.host}:{node.listener_ports[RELAY_LISTENER]}")
        proxies = {
            "proxy": ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / "proxy"),
            "proxy_readahead": ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / "proxy-readahead",
                                                  overrides={"metrics.port": "0", **SETTINGS["proxy_readahead"]}),
        }
        try:
            java_tools.create_topic(cluster.bootstrap_servers, "bench-hop", partitions=1)
            print(f"filling bench-hop with {args.consume_mb} MB ...", flush=True)
            _produce(cluster.bootstrap_servers, "bench-hop", records)
            modes = {"direct": cluster.bootstrap_servers, "bare_relay": f"127.0.0.1:{relay_port}",
                     **{name: p.bootstrap_servers for name, p in proxies.items()}}
            pids = {"bare_relay": relay.pid, **{name: p.pid for name, p in proxies.items()}}
            for bootstrap in modes.values():  # warm-up, not recorded
                _consume(bootstrap, "bench-hop", records)
            runs: dict[str, list[dict]] = {mode: [] for mode in modes}
            names = list(modes)
            for round_number in range(args.rounds):
                shift = round_number % len(names)
                line = f"round {round_number}:"
                for mode in names[shift:] + names[:shift]:
                    pid = pids.get(mode)
                    cpu_before = cpu_seconds([pid]) if pid else 0.0
                    machine_before, began = psutil.cpu_times(), time.monotonic()
                    run = _consume(modes[mode], "bench-hop", records)
                    run["busy_cores"] = _busy_cores(machine_before, psutil.cpu_times(), time.monotonic() - began)
                    if pid:
                        run["cpu_ms_per_mb"] = 1000 * (cpu_seconds([pid]) - cpu_before) / run["mb"]
                    runs[mode].append(run)
                    line += f" {mode} {run['mb_per_s']:.0f} MB/s"
                print(line, flush=True)
            readahead = _readahead_counts(proxies["proxy_readahead"])
        finally:
            relay.kill()
            relay.wait()
            for process in proxies.values():
                process.stop()

    summary = {}
    for mode, mode_runs in runs.items():
        entry = {"runs": mode_runs, "mb_per_s": statistics.median(r["mb_per_s"] for r in mode_runs),
                 "busy_cores": statistics.median(r["busy_cores"] for r in mode_runs)}
        if mode != "direct":
            ratios = [r["mb_per_s"] / d["mb_per_s"] for r, d in zip(mode_runs, runs["direct"])]
            entry.update(round_ratios=ratios, ratio=statistics.median(ratios),
                         cpu_ms_per_mb=statistics.median(r["cpu_ms_per_mb"] for r in mode_runs))
        entry["settings"] = dict(SETTINGS.get(mode, {}))  # proxy settings other than the defaults
        summary[mode] = entry
    summary["proxy_readahead"]["readahead"] = readahead
    report["modes"] = summary
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    for mode, entry in summary.items():
        extra = f", ratio {entry['ratio']:.3f}, {entry['cpu_ms_per_mb']:.2f} ms CPU/MB" if "ratio" in entry else ""
        print(f"{mode}: {entry['mb_per_s']:.0f} MB/s, {entry['busy_cores']:.2f} cores busy{extra}")
    print(f"wrote {args.output}")
    return 0


BENCHMARK = Benchmark(
    "bench_hop", "What one more TCP hop costs a consumer, and what the proxy adds to it",
    main=main, with_all=True)


if __name__ == "__main__":
    sys.exit(main())
