"""Where the time goes: py-spy samples the proxy (its process and its workers) while
Kafka's ConsumerPerformance (or ProducerPerformance) runs through it, or, with
``--direction key_ordered``, both the proxy and one of 16 range consumers (a process each)
while they do 1 ms of paced work per record (the key-ordered workload), or, with
``--direction delivery``, the proxy while 4 raw clients read equal key ranges of one
partition (the key-range delivery workload); the samples are summed per function (self
time, and time including callees).

    python -m benchmarks.profile_proxy [--direction consume|produce|key_ordered|delivery] [--mb 512]

Writes ``benchmarks/results/profile_<direction>.txt`` (the summary) next to the raw
collapsed stacks (``profile_<direction>.collapsed``). Holds the benchmark lock while it
runs, like ``python -m benchmarks``.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.benchmark import Benchmark
from benchmarks.lock import bench_lock
from benchmarks.results import RESULTS
from benchmarks.workloads.passthrough import RECORD_SIZE, consume, produce
from harness import java_tools
from harness.kafka_cluster import KafkaCluster
from proxy.local_kafka import ProxyProcess, scratch_dir

_PROCESS_FRAME = re.compile(r'process \d+:"')


def summarise(collapsed: str, top: int = 40) -> str:
    """Self and inclusive sample counts per frame from py-spy's collapsed stacks (without the
    ``process <pid>:"<command>"`` frames ``--subprocesses`` puts first: the workers run the
    same code, summed here as one process's would be)."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        total += samples
        frames = [frame for frame in stack.split(";") if not _PROCESS_FRAME.match(frame)]
        if not frames:
            continue
        own[frames[-1]] += samples
        for frame in set(frames):
            inclusive[frame] += samples
    if not total:
        return "no samples\n"
    lines = [f"{total} samples", "", "self %  function"]
    lines += [f"{100 * n / total:6.1f}  {frame}" for frame, n in own.most_common(top)]
    lines += ["", "incl %  function"]
    lines += [f"{100 * n / total:6.1f}  {frame}" for frame, n in inclusive.most_common(top)]
    return "\n".join(lines) + "\n"


def _key_ordered_client(bootstrap: str, directory: Path, proxy_pid: int) -> dict:
    """The key-ordered workload's 16 range consumers (a process each); py-spy samples the
    first of them over the warm-up and the window."""
    from benchmarks.workloads.key_ordered import ours

    return ours(bootstrap, "profile", 16, warmup=3, window=10, proxy_pid=proxy_pid,
                profile=directory / "profile_key_ordered_client.collapsed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--direction", choices=("consume", "produce", "key_ordered", "delivery"), default="consume")
    parser.add_argument("--mb", type=int, default=512)
    parser.add_argument("--consumers", type=int, default=4, help="delivery: raw clients of equal key ranges")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.consumers < 1:
        parser.error("--consumers must be at least 1")
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    records = args.mb * 2**20 // RECORD_SIZE
    workdir = scratch_dir("bench-profile-")
    suffix = f"_{args.consumers}" if args.direction == "delivery" and args.consumers != 4 else ""
    args.output_dir.mkdir(parents=True, exist_ok=True)
    raw = args.output_dir / f"profile_{args.direction}{suffix}.collapsed"
    with bench_lock(print), KafkaCluster.start(1, workdir=workdir / "kafka") as cluster:
        proxy = ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / "proxy")  # its defaults
        try:
            java_tools.create_topic(cluster.bootstrap_servers, "profile", partitions=1)
            if args.direction == "consume":
                produce(cluster.bootstrap_servers, "profile", records)
                consume(proxy.bootstrap_servers, "profile", records)  # warm-up
            elif args.direction == "key_ordered":
                from benchmarks.workloads import data

                data.produce_keyed(cluster.bootstrap_servers, "profile", 400_000, keys=10_000)
            elif args.direction == "delivery":
                from benchmarks.workloads import data, keyrange_delivery

                delivery_records = args.mb * 2**20 // 130
                java_tools.create_topic(cluster.bootstrap_servers, keyrange_delivery.TOPIC, partitions=1)
                data.produce_keyed(cluster.bootstrap_servers, keyrange_delivery.TOPIC, delivery_records, keys=10_007)
                keyrange_delivery.raw_clients(cluster.bootstrap_servers, None, delivery_records)  # page cache
            # --subprocesses: the proxy command supervises its workers, where the proxy's code runs
            recorder = subprocess.Popen([spy, "record", "--pid", str(proxy.pid), "--subprocesses", "--rate", "250",
                                         "--format", "raw", "--output", str(raw), "--nonblocking"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                if args.direction == "consume":
                    run = consume(proxy.bootstrap_servers, "profile", records)
                elif args.direction == "produce":
                    run = produce(proxy.bootstrap_servers, "profile", records)
                elif args.direction == "delivery":
                    seconds, delivered = keyrange_delivery.raw_clients(proxy.bootstrap_servers, args.consumers,
                                                                       delivery_records)
                    run = {"records_per_s": round(delivered / seconds)}
                else:
                    run = _key_ordered_client(proxy.bootstrap_servers, args.output_dir, proxy.pid)
            finally:
                recorder.send_signal(subprocess.signal.SIGINT)
                recorder.wait(timeout=60)
        finally:
            proxy.stop()
    if args.direction == "key_ordered":
        cpu = ", ".join(f"{side} {run[f'cpu_us_per_record_{side}']} us" for side in ("workers", "proxy", "machine"))
        text = (f"16 range consumers (a process each), 1 ms of paced work per record: {run['records_per_s']} "
                f"records/s (ideal 16000); CPU per record over the window: {cpu}\n\n"
                f"== one of the 16 consumer processes ==\n")
        text += summarise((args.output_dir / "profile_key_ordered_client.collapsed").read_text())
        text += "\n== the proxy ==\n"
    elif args.direction == "delivery":
        text = (f"{args.consumers} raw clients reading equal key ranges of {args.mb} MB (100-byte values) through "
                f"the proxy: "
                f"{run['records_per_s']} records/s\n\n")
    else:
        text = f"{args.direction} through the proxy, {args.mb} MB of 1 KB records: {run['mb_per_s']} MB/s\n\n"
    text += summarise(raw.read_text() if raw.exists() else "")
    out = args.output_dir / f"profile_{args.direction}{suffix}.txt"
    out.write_text(text)
    print(text[:4000])
    print(f"wrote {out}")
    return 0


BENCHMARK = Benchmark("profile_proxy", "Where the proxy's time goes, by function (py-spy)", main=main)


if __name__ == "__main__":
    sys.exit(main())
