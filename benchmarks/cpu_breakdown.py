"""Where the proxy's CPU goes, by kind of code: the kernel (sockets, copies, scheduling),
the Python interpreter, the C kernels, the native relay loop, libc. The bare relay does
nothing but the kernel's part, so the difference between the two is what the proxy's own
code costs, and the kernel's part of the relay is the floor any proxy on this machine pays
to move the bytes.

``perf record`` samples one hop (its process and those under it: the proxy's workers) while
a workload runs through it:

- ``consume`` / ``produce``: Kafka's ConsumerPerformance / ProducerPerformance (1 KB
  records, as the passthrough benchmark), through the bare relay and through the proxy;
- ``delivery``: N raw key-range clients (as the key-range delivery benchmark: the proxy's
  defaults, records cached), through the proxy.

    .venv/bin/python -m benchmarks.cpu_breakdown [--mb 1024] [--consumers 4 16]

Writes ``benchmarks/results/cpu_breakdown.json``: per run the hop's user and system CPU
per MB (or per record) from its own counters, and perf's share of samples per shared
object. Needs ``perf`` (Debian: linux-perf) and permission to sample the process. Holds the
benchmark lock while it runs, like ``python -m benchmarks``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks import results
from benchmarks.benchmark import Benchmark
from benchmarks.lock import bench_lock
from benchmarks.peers import bare_relay
from benchmarks.workloads.passthrough import RECORD_SIZE, consume, produce
from harness import java_tools, processes
from harness.kafka_cluster import KafkaCluster
from harness.wait import wait_until
from proxy.local_kafka import ProxyProcess, free_port, scratch_dir


def _shares(data: Path) -> dict[str, float]:
    """perf's share of samples (percent) per shared object."""
    done = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", "dso", "--stdio",
                           "-g", "none"], capture_output=True, text=True, check=True)
    shares: dict[str, float] = {}
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].endswith("%") and not line.startswith("#"):
            name = parts[1].strip("[]")
            kind = ("kernel" if name.startswith("kernel") else "python" if name.startswith("libpython")
                    else "C kernels" if name.startswith(("_ckernels", "_cpacked")) else
                    "native relay" if name.startswith("_cpump") else
                    "libc" if name.startswith("libc") else "other")
            shares[kind] = round(shares.get(kind, 0.0) + float(parts[0].rstrip("%")), 2)
    return shares


class _Sampled:
    """perf record of ``pid`` and the processes under it (the proxy's workers: its command
    is their supervisor) while the block runs, and their own CPU counters."""

    def __init__(self, pid: int, data: Path) -> None:
        self.pid = pid
        self.data = data

    def __enter__(self) -> _Sampled:
        self.before = processes.user_system_seconds([self.pid])
        pids = ",".join(str(process.pid) for process in processes.tree(self.pid))
        self.perf = subprocess.Popen(["perf", "record", "-F", "999", "-p", pids, "-o",
                                      str(self.data)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        # perf prints nothing until it stops; its data file appears once it samples
        wait_until(lambda: self.data.exists() and self.data.stat().st_size > 0, timeout=30,
                   what="perf recording")
        return self

    def __exit__(self, *exc) -> None:
        self.perf.send_signal(subprocess.signal.SIGINT)
        self.perf.wait(timeout=120)
        after = processes.user_system_seconds([self.pid])
        self.user = after[0] - self.before[0]
        self.system = after[1] - self.before[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=1024, help="MB consumed, produced and read by key range")
    parser.add_argument("--consumers", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--output-dir", type=Path, default=results.RESULTS)
    args = parser.parse_args(argv)
    if shutil.which("perf") is None:
        parser.error("perf is not installed (Debian: apt-get install linux-perf)")
    if args.mb < 1 or min(args.consumers) < 1:
        parser.error("--mb and every --consumers count must be at least 1")
    records = args.mb * 2**20 // RECORD_SIZE
    workdir = scratch_dir("bench-cpu-breakdown-")
    runs = []
    relay_port = free_port()
    with bench_lock(print), contextlib.ExitStack() as stack:
        cluster = stack.enter_context(KafkaCluster.start(1, workdir=workdir / "kafka",
                                                         **bare_relay.cluster_options(relay_port)))
        relay = stack.enter_context(bare_relay.running(relay_port, bare_relay.target(cluster)))
        proxy = ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / "proxy")
        stack.callback(proxy.stop)
        hops = {"bare relay": (f"127.0.0.1:{relay_port}", relay.pid), "proxy": (proxy.bootstrap_servers, proxy.pid)}
        java_tools.create_topic(cluster.bootstrap_servers, "cpu-consume", partitions=1)
        produce(cluster.bootstrap_servers, "cpu-consume", records)
        for bootstrap, _ in hops.values():
            consume(bootstrap, "cpu-consume", records)  # warm-up
        for kind in ("consume", "produce"):
            for name, (bootstrap, pid) in hops.items():
                with _Sampled(pid, workdir / f"{kind}-{name}.data") as sampled:
                    if kind == "consume":
                        run = consume(bootstrap, "cpu-consume", records)
                    else:
                        topic = f"cpu-produce-{name.replace(' ', '-')}"
                        java_tools.create_topic(cluster.bootstrap_servers, topic, partitions=1)
                        run = produce(bootstrap, topic, records)
                mb = records * RECORD_SIZE / 2**20
                runs.append({"workload": kind, "hop": name, "mb_per_s": run["mb_per_s"],
                             "user_ms_per_mb": round(1000 * sampled.user / mb, 3),
                             "system_ms_per_mb": round(1000 * sampled.system / mb, 3),
                             "samples_percent": _shares(sampled.data)})
                print(runs[-1], flush=True)
        runs.extend(_delivery(cluster, workdir, args))
    report = {"benchmark": "cpu_breakdown", "command": " ".join(["python -m benchmarks.cpu_breakdown",
                                                                  *(sys.argv[1:] if argv is None else argv)]),
              "machine": results.machine(), "runs": runs}
    args.output_dir.mkdir(parents=True, exist_ok=True)
    path = args.output_dir / "cpu_breakdown.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


def _delivery(cluster: KafkaCluster, workdir: Path, args: argparse.Namespace) -> list[dict]:
    from benchmarks.workloads import data
    from benchmarks.workloads.keyrange_delivery import TOPIC, raw_clients

    records = args.mb * 2**20 // 130
    java_tools.create_topic(cluster.bootstrap_servers, TOPIC, partitions=1)
    data.produce_keyed(cluster.bootstrap_servers, TOPIC, records, keys=10_007, value_size=100)
    raw_clients(cluster.bootstrap_servers, None, records)  # the page cache
    runs = []
    for n in args.consumers:
        proxy = ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / f"proxy-{n}")  # its defaults
        try:
            with _Sampled(proxy.pid, workdir / f"delivery-{n}.data") as sampled:
                seconds, delivered = raw_clients(proxy.bootstrap_servers, n, records)
        finally:
            proxy.stop()
        runs.append({"workload": f"delivery N={n}", "hop": "proxy", "records_per_s": round(delivered / seconds),
                     "user_us_per_record": round(1e6 * sampled.user / delivered, 4),
                     "system_us_per_record": round(1e6 * sampled.system / delivered, 4),
                     "samples_percent": _shares(sampled.data)})
        print(runs[-1], flush=True)
    return runs


BENCHMARK = Benchmark("cpu_breakdown", "Where the proxy's CPU goes, by kind of code (perf)", main=main)


if __name__ == "__main__":
    sys.exit(main())
