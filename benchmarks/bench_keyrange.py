"""Key-range fetch: N consumers sharing one partition through the proxy, against one
consumer reading the whole partition straight from the broker, in the same run.

The range consumers are a minimal wire client (``proxy.testing.raw_client``), one thread
and one connection each, counting records from batch headers. The direct baseline is one
standard consumer (Kafka's ConsumerPerformance) reading the whole partition; the same raw
client reading it directly is reported too. Reports, per N in ``--consumers``:
- aggregate records/s delivered to the N range consumers, and its ratio to the direct rate;
- broker read amplification: record bytes the proxy read from the broker for the
  partition / the partition's size (with the records cache on, and with it off);
- the proxy's peak RSS against ``max.bytes.key.range.results``.

Run: ``.venv/bin/python -m benchmarks.bench_keyrange``; writes benchmarks/results/keyrange.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil

from proxy.ranges import equal_shares
from proxy.records.batch import RecordBatch, iter_batches
from proxy.testing import java_tools
from proxy.testing.kafka_cluster import KafkaCluster
from proxy.testing.proxy_process import ProxyProcess
from proxy.testing.raw_client import RawClient
from proxy.testing.scratch import scratch_dir

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


def _consume(bootstrap: str, ranges, end: int, max_bytes: int, counts: list, slot: int) -> None:
    with RawClient.connect(bootstrap, client_id=f"bench-{slot}") as client:
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
        counts[slot] = delivered


def _run_consumers(bootstrap: str, n: int | None, end: int, max_bytes: int) -> tuple[float, int]:
    shares = [None] if n is None else [[share] for share in equal_shares(n)]
    counts = [0] * len(shares)
    threads = [threading.Thread(target=_consume, args=(bootstrap, ranges, end, max_bytes, counts, i))
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


def _partition_bytes(bootstrap: str, end: int) -> int:
    size = position = 0
    with RawClient.connect(bootstrap) as client:
        topic_id = client.topic_id(TOPIC)
        while position < end:
            entry = client.range_fetch(topic_id, 0, position, None, max_bytes=4 << 20)
            for batch in iter_batches(entry.records or b""):
                if isinstance(batch, RecordBatch):
                    size += batch.header.size
                    position = batch.header.next_offset
    return size


class RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.process = psutil.Process(pid)
        self.peak = self.process.memory_info().rss
        self.baseline = self.peak
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(0.05):
            self.peak = max(self.peak, self.process.memory_info().rss)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--consumers", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--max-bytes", type=int, default=1 << 20, help="fetch size of every consumer")
    parser.add_argument("--cache-mb", type=int, default=200)
    parser.add_argument("--output", type=Path, default=RESULTS / "keyrange.json")
    args = parser.parse_args(argv)
    workdir = scratch_dir("bench-keyrange-")
    report: dict = {
        "command": " ".join(["python -m benchmarks.bench_keyrange", *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"python": platform.python_version(), "cpus": psutil.cpu_count()},
        "records": args.records, "value_size": args.value_size, "fetch_max_bytes": args.max_bytes,
        "cache_bytes": args.cache_mb << 20,
        "runs": [],
    }
    with KafkaCluster.start(1, workdir=workdir / "kafka") as cluster:
        java_tools.create_topic(cluster.bootstrap_servers, TOPIC, partitions=1)
        _produce(cluster.bootstrap_servers, args.records, args.value_size)
        end = args.records
        partition_bytes = _partition_bytes(cluster.bootstrap_servers, end)
        report["partition_bytes"] = partition_bytes
        seconds, delivered = _run_consumers(cluster.bootstrap_servers, None, end, args.max_bytes)
        raw_rate = delivered / seconds
        report["direct_raw_client"] = {"seconds": seconds, "records": delivered, "records_per_s": raw_rate}
        performance = java_tools.consumer_performance(cluster.bootstrap_servers, TOPIC, end, timeout=600)
        line = [row for row in performance.stdout.splitlines() if re.match(r"^\d{4}-", row)][-1]
        # fetch.nMsg.sec: the consume rate without the JVM start and group join
        direct_rate = float(line.split(",")[9])
        report["direct"] = {"consumer": "Kafka ConsumerPerformance (Java consumer), fetch.nMsg.sec",
                            "records_per_s": direct_rate}
        print(f"direct whole partition: Java consumer {direct_rate:,.0f} records/s, "
              f"raw client {raw_rate:,.0f} records/s", flush=True)
        for cache_on in (True, False):
            for n in args.consumers:
                overrides = {"metrics.port": "0", "max.bytes.key.range.results": str(args.cache_mb << 20),
                             f"topic.{TOPIC}.reserve.message.value.range.fetch": "true" if cache_on else "false"}
                proxy = ProxyProcess.start(cluster.bootstrap_servers, overrides=overrides,
                                           workdir=workdir / f"proxy-{n}-{cache_on}")
                sampler = RssSampler(proxy.pid)
                sampler.start()
                try:
                    seconds, delivered = _run_consumers(proxy.bootstrap_servers, n, end, args.max_bytes)
                    broker = _broker_bytes(proxy)
                finally:
                    sampler.stop_event.set()
                    sampler.join()
                    proxy.stop()
                run = {
                    "consumers": n, "records_cache": cache_on, "seconds": seconds, "records": delivered,
                    "records_per_s": delivered / seconds, "ratio_to_direct": delivered / seconds / direct_rate,
                    "ratio_to_direct_raw_client": delivered / seconds / raw_rate,
                    "broker_read_amplification": broker / partition_bytes,
                    "proxy_rss_baseline_mb": sampler.baseline / 2**20, "proxy_rss_peak_mb": sampler.peak / 2**20,
                }
                report["runs"].append(run)
                print(f"N={n:2d} cache={'on ' if cache_on else 'off'}: {run['records_per_s']:,.0f} records/s "
                      f"(x{run['ratio_to_direct']:.2f} of direct), amplification {run['broker_read_amplification']:.2f}, "
                      f"RSS peak {run['proxy_rss_peak_mb']:.0f} MB", flush=True)
    report["goals"] = {"ratio_at_4": ">= 0.5", "amplification_at_4_with_cache": "<= 1.1"}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
