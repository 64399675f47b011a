"""Where the proxy's time goes on the passthrough path: py-spy samples the proxy process
while Kafka's ConsumerPerformance (or ProducerPerformance) runs through it, and the
samples are summed per function (self time, and time including callees).

    python -m benchmarks.profile_proxy [--direction consume|produce] [--mb 512]

Writes ``benchmarks/results/profile_<direction>.txt`` (the summary) next to the raw
collapsed stacks (``profile_<direction>.collapsed``). Holds the benchmark lock while it
runs, like ``python -m benchmarks``.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.__main__ import _bench_lock
from benchmarks.results import RESULTS
from benchmarks.workloads.passthrough import RECORD_SIZE, consume, produce
from proxy.testing import java_tools
from proxy.testing.kafka_cluster import KafkaCluster
from proxy.testing.proxy_process import ProxyProcess
from proxy.testing.scratch import scratch_dir


def summarise(collapsed: str, top: int = 40) -> str:
    """Self and inclusive sample counts per frame from py-spy's collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        total += samples
        frames = stack.split(";")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--direction", choices=("consume", "produce"), default="consume")
    parser.add_argument("--mb", type=int, default=512)
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    records = args.mb * 2**20 // RECORD_SIZE
    workdir = scratch_dir("bench-profile-")
    raw = args.output_dir / f"profile_{args.direction}.collapsed"
    with _bench_lock(print), KafkaCluster.start(1, workdir=workdir / "kafka") as cluster:
        proxy = ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / "proxy")
        try:
            java_tools.create_topic(cluster.bootstrap_servers, "profile", partitions=1)
            if args.direction == "consume":
                produce(cluster.bootstrap_servers, "profile", records)
                consume(proxy.bootstrap_servers, "profile", records)  # warm-up
            recorder = subprocess.Popen([spy, "record", "--pid", str(proxy.pid), "--rate", "250", "--format", "raw",
                                         "--output", str(raw), "--nonblocking"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                if args.direction == "consume":
                    run = consume(proxy.bootstrap_servers, "profile", records)
                else:
                    run = produce(proxy.bootstrap_servers, "profile", records)
            finally:
                recorder.send_signal(subprocess.signal.SIGINT)
                recorder.wait(timeout=60)
        finally:
            proxy.stop()
    text = f"{args.direction} through the proxy, {args.mb} MB of 1 KB records: {run['mb_per_s']} MB/s\n\n"
    text += summarise(raw.read_text() if raw.exists() else "")
    out = args.output_dir / f"profile_{args.direction}.txt"
    out.write_text(text)
    print(text[:4000])
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
