"""Key-range fetch: N consumers sharing one partition through the proxy, against one
consumer reading the whole partition straight from the broker, in the same run.

The range consumers are a minimal wire client (``harness.raw_client``), one thread
and one connection each, counting records from batch headers. The direct baseline is one
standard consumer (Kafka's ConsumerPerformance) reading the whole partition; the same raw
client reading it directly is reported too. Reports, per N in ``--consumers``:
- aggregate records/s delivered to the N range consumers, and its ratio to the direct rate;
- broker read amplification: record bytes the proxy read from the broker for the
  partition / the partition's size;
- the proxy's peak RSS and the result cache's peak bytes (``kafka_proxy_keyrange_cache_bytes``,
  sampled every 0.25 s) against ``max.bytes.key.range.results``.

Contenders per N: the proxy's defaults (records cached, ``reserve.message.value.range.fetch=true``,
and ``max.bytes.key.range.results`` 200 MiB), offsets only (``reserve.message.value.range.fetch=false``,
the proposal's default), and records cached under each other cap of ``--cache-mb``. Every
contender that is not the defaults names its non-default settings (``settings`` of its
runs and summary). ``--slow-ms`` makes one of the N consumers wait that long after each
fetch, so the others run ahead and the cache holds its shares until it comes: where the
cap binds.

Every round runs the direct reads and every contender once, in an order that rotates from
round to round; each figure is the median over ``--rounds`` with its lowest and highest
round. The 2 M records default keeps each read above a second.

Run: ``.venv/bin/python -m benchmarks.bench_keyrange``; writes benchmarks/results/keyrange.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil

from benchmarks.benchmark import Benchmark
from benchmarks.rounds import Row, rotation
from harness import java_tools
from harness.kafka_cluster import KafkaCluster
from harness.processes import rss_bytes
from harness.raw_client import RawClient
from harness.raw_client import partition_bytes as raw_partition_bytes
from proxy.keyrange.settings import KeyRangeSettings
from proxy.local_kafka import ProxyProcess, scratch_dir
from proxy.ranges import equal_shares
from proxy.records.batch import RecordBatch, iter_batches

RESULTS = Path(__file__).resolve().parent / "results"
TOPIC = "bench-keyrange"


def _produce(bootstrap: str, records: int, value_size: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 262144,
                         "compression.type": "none", "queue.buffering.max.messages": 1_000_000})
    value = b"v" * value_size
    for i in range(records):
        while True:
            try:
                producer.produce(TOPIC, key=f"customer-{i % 10007}".encode(), value=value)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0


def _consume(bootstrap: str, ranges, end: int, max_bytes: int, counts: list, slot: int, pause: float = 0.0) -> None:
    with RawClient.to_leader(bootstrap, TOPIC, client_id=f"bench-{slot}") as client:
        topic_id = client.topic_id(TOPIC)
        position = delivered = 0
        while position < end:
            entry = client.range_fetch(topic_id, 0, position, ranges, max_bytes=max_bytes, max_wait_ms=100)
            if entry.error_code:
                raise RuntimeError(f"fetch error {entry.error_code}")
            for batch in iter_batches(entry.records or b""):
                if isinstance(batch, RecordBatch):
                    if batch.header.base_offset + batch.header.last_offset_delta >= position:
                        delivered += batch.header.record_count
                    position = max(position, batch.header.next_offset)
            if pause:
                time.sleep(pause)  # the slow consumer: its work on what it fetched
        counts[slot] = delivered


def _run_consumers(bootstrap: str, n: int | None, end: int, max_bytes: int,
                   slow_ms: float = 0.0) -> tuple[float, int]:
    """``n`` raw clients (None: one, without ranges) reading [0, end); the first of several
    waits ``slow_ms`` after each fetch. (seconds, records delivered)."""
    shares = [None] if n is None else [[share] for share in equal_shares(n)]
    counts = [0] * len(shares)
    threads = [threading.Thread(target=_consume, args=(bootstrap, ranges, end, max_bytes, counts, i,
                                                        slow_ms / 1000 if i == 0 and len(shares) > 1 else 0.0))
               for i, ranges in enumerate(shares)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - began, sum(counts)


def _broker_bytes(proxy: ProxyProcess) -> float:
    text = urllib.request.urlopen(proxy.metrics_url, timeout=10).read().decode()
    total = 0.0
    for match in re.finditer(r'^kafka_proxy_keyrange_broker_bytes_total\{[^}]*topic="bench-keyrange"[^}]*\} ([0-9.e+]+)$',
                             text, re.M):
        total += float(match.group(1))
    return total


def _cache_bytes(metrics_url: str) -> float:
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    match = re.search(r"^kafka_proxy_keyrange_cache_bytes ([0-9.e+]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


class RssSampler(threading.Thread):
    """The proxy's peak RSS (every 0.05 s; summed over its process and its workers) and,
    given its metrics, the result cache's peak bytes (every 0.25 s: a scrape costs the
    proxy a little CPU)."""

    def __init__(self, pid: int, metrics_url: str | None = None) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.metrics_url = metrics_url
        self.peak = rss_bytes(pid)
        self.baseline = self.peak
        self.cache_peak = 0.0
        self.stop_event = threading.Event()

    def run(self) -> None:
        ticks = 0
        while not self.stop_event.wait(0.05):
            self.peak = max(self.peak, rss_bytes(self.pid))
            ticks += 1
            if self.metrics_url and ticks % 5 == 0:
                self.cache_peak = max(self.cache_peak, _cache_bytes(self.metrics_url))


def _direct_java(bootstrap: str, end: int) -> float:
    performance = java_tools.consumer_performance(bootstrap, TOPIC, end, timeout=600)
    line = [row for row in performance.stdout.splitlines() if re.match(r"^\d{4}-", row)][-1]
    return float(line.split(",")[9])  # fetch.nMsg.sec: the consume rate without the JVM start and group join


DEFAULT_CACHE_MB = KeyRangeSettings().cache_bytes >> 20
CACHED, OFFSETS = "records cached", "offsets only"


def _settings(cache: str, cache_mb: int) -> dict[str, str]:
    """The non-default proxy settings of a contender (the proxy's defaults: records cached,
    the default cap)."""
    settings = {}
    if cache == OFFSETS:
        settings["reserve.message.value.range.fetch"] = "false"
    if cache_mb != DEFAULT_CACHE_MB:
        settings["max.bytes.key.range.results"] = str(cache_mb << 20)
    return settings


def _through_proxy(cluster: KafkaCluster, workdir: Path, args: argparse.Namespace, n: int, cache: str, cache_mb: int,
                   end: int, partition_bytes: int) -> dict:
    """N range consumers through a proxy of their own, started cold for this run."""
    settings = _settings(cache, cache_mb)
    proxy = ProxyProcess.start(cluster.bootstrap_servers, overrides={"metrics.port": "0", **settings}, workdir=workdir)
    sampler = RssSampler(proxy.pid, proxy.metrics_url)
    sampler.start()
    try:
        seconds, delivered = _run_consumers(proxy.bootstrap_servers, n, end, args.max_bytes, args.slow_ms)
        broker = _broker_bytes(proxy)
    finally:
        sampler.stop_event.set()
        sampler.join()
        proxy.stop()
    if delivered != end:
        raise RuntimeError(f"{_label(n, cache, cache_mb)} delivered {delivered} of {end} records")
    return {"consumers": n, "records_cache": cache == CACHED, "settings": settings, "seconds": seconds,
            "records": delivered, "records_per_s": delivered / seconds,
            "broker_read_amplification": broker / partition_bytes,
            "proxy_rss_baseline_mb": sampler.baseline / 2**20, "proxy_rss_peak_mb": sampler.peak / 2**20,
            "cache_peak_mb": sampler.cache_peak / 2**20}


def _label(n: int, cache: str, cache_mb: int) -> str:
    settings = _settings(cache, cache_mb)
    return f"N={n} {cache}" + (f" ({', '.join(f'{k}={v}' for k, v in settings.items())})" if settings else "")


def _summary(rounds: list[dict], label: str) -> dict:
    """Medians over the rounds, with each round's ratio paired with that round's direct runs
    (``benchmarks.rounds.Row``)."""
    runs = [r[label] for r in rounds]
    rates = [run["records_per_s"] for run in runs]
    to_java = Row("", label, "records/s", rates, "direct_java",
                  [r["direct_java"]["records_per_s"] for r in rounds]).as_dict()
    to_raw = Row("", label, "records/s", rates, "direct_raw_client",
                 [r["direct_raw_client"]["records_per_s"] for r in rounds]).as_dict()
    amplification = Row("", label, "x", [run["broker_read_amplification"] for run in runs]).as_dict()
    return {"label": label, "consumers": runs[0]["consumers"], "records_cache": runs[0]["records_cache"],
            "settings": runs[0]["settings"], "records_per_s": to_java["value"], "records_per_s_spread": to_java["spread"],
            "seconds": [run["seconds"] for run in runs],
            "ratio_to_direct": to_java["ratio"], "ratio_to_direct_spread": to_java["ratio_spread"],
            "ratio_to_direct_raw_client": to_raw["ratio"], "ratio_to_direct_raw_client_spread": to_raw["ratio_spread"],
            "broker_read_amplification": amplification["value"],
            "broker_read_amplification_spread": amplification["spread"],
            "proxy_rss_peak_mb": max(run["proxy_rss_peak_mb"] for run in runs),
            "cache_peak_mb": max(run["cache_peak_mb"] for run in runs)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--consumers", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--max-bytes", type=int, default=1 << 20, help="fetch size of every consumer")
    parser.add_argument("--cache-mb", type=int, nargs="+", default=[DEFAULT_CACHE_MB],
                        help="max.bytes.key.range.results of the records-cached contenders, in MiB (the proxy's "
                             f"default {DEFAULT_CACHE_MB} is not an override)")
    parser.add_argument("--slow-ms", type=float, default=0.0,
                        help="one of the N consumers waits this long after each fetch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULTS / "keyrange.json")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.records < 1 or min(args.consumers) < 1:
        parser.error("--rounds, --records and every --consumers count must be at least 1")
    workdir = scratch_dir("bench-keyrange-")
    report: dict = {
        "command": " ".join(["python -m benchmarks.bench_keyrange", *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"python": platform.python_version(), "cpus": psutil.cpu_count(),
                    "load_average_at_start": [round(x, 2) for x in os.getloadavg()]},
        "method": ("per round, in an order rotating from round to round: the whole partition read directly by "
                   "Kafka's ConsumerPerformance (fetch.nMsg.sec) and by the raw client, then every N and cache "
                   "setting through a proxy started cold for the run; ratios are per round, paired with that "
                   "round's direct runs, and reported as the median with the lowest and highest round"),
        "records": args.records, "value_size": args.value_size, "fetch_max_bytes": args.max_bytes,
        "cache_bytes": [mb << 20 for mb in args.cache_mb], "slow_consumer_ms": args.slow_ms, "rounds": [],
    }
    configs = [(n, CACHED, mb) for mb in args.cache_mb for n in args.consumers]
    configs += [(n, OFFSETS, DEFAULT_CACHE_MB) for n in args.consumers]
    labels = ["direct_java", "direct_raw_client", *(_label(*c) for c in configs)]
    with KafkaCluster.start(1, workdir=workdir / "kafka") as cluster:
        java_tools.create_topic(cluster.bootstrap_servers, TOPIC, partitions=1)
        _produce(cluster.bootstrap_servers, args.records, args.value_size)
        end = args.records
        partition_bytes = raw_partition_bytes(cluster.bootstrap_servers, TOPIC, end)
        report["partition_bytes"] = partition_bytes
        _direct_java(cluster.bootstrap_servers, end)  # warm-up (JIT, page cache), not recorded
        for number in range(args.rounds):
            this_round: dict = {}
            for label in rotation(labels, number):
                if label == "direct_java":
                    this_round[label] = {"records_per_s": _direct_java(cluster.bootstrap_servers, end)}
                elif label == "direct_raw_client":
                    seconds, delivered = _run_consumers(cluster.bootstrap_servers, None, end, args.max_bytes)
                    this_round[label] = {"seconds": seconds, "records": delivered, "records_per_s": delivered / seconds}
                else:
                    n, cache, cache_mb = configs[labels.index(label) - 2]
                    this_round[label] = _through_proxy(cluster, workdir / f"proxy-{number}-{labels.index(label)}",
                                                       args, n, cache, cache_mb, end, partition_bytes)
            report["rounds"].append(this_round)
            print(f"round {number + 1}: direct Java {this_round['direct_java']['records_per_s']:,.0f}, raw "
                  f"{this_round['direct_raw_client']['records_per_s']:,.0f}; "
                  + ", ".join(f"{_label(*c)} {this_round[_label(*c)]['records_per_s']:,.0f}" for c in configs)
                  + " records/s", flush=True)
    report["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["runs"] = [_summary(report["rounds"], _label(*c)) for c in configs]
    for run in report["runs"]:
        print(f"{run['label']}: {run['records_per_s']:,.0f} records/s, "
              f"x{run['ratio_to_direct']:.2f} of direct ({run['ratio_to_direct_spread'][0]:.2f}-"
              f"{run['ratio_to_direct_spread'][1]:.2f}), amplification {run['broker_read_amplification']:.2f}, "
              f"RSS peak {run['proxy_rss_peak_mb']:.0f} MB, cache peak {run['cache_peak_mb']:.0f} MB", flush=True)
    report["goals"] = {"ratio_at_4": ">= 0.5", "amplification_at_4_with_cache": "<= 1.1"}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


BENCHMARK = Benchmark(
    "bench_keyrange", "Key-range fetch: N raw consumers of one partition against one direct consumer",
    main=main, with_all=True)


if __name__ == "__main__":
    sys.exit(main())
