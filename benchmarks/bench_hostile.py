"""Hostile clients beside a normal one: what a crowd declaring 100 MiB frames costs the
proxy's memory, and whether a consumer of the same proxy notices.

    flock /tmp/keyrange-bench.lock .venv/bin/python -m benchmarks.bench_hostile

One Kafka node; the proxy as a process of its own, default settings; a one-partition topic
written once before the rounds (the consumer's figure is throughput, not correctness).
Each round runs both contenders, in an order that rotates:

- quiet: a librdkafka consumer reads the whole topic through the proxy from the start;
- attacked: first ``--attackers`` connections each declare a 100 MiB frame and send eight
  bytes of it (its request header's start): a third right away as an ApiVersions (an
  authentication request: its size prefix and API key close it), a third right away as a
  Produce (held, its frame half-read, until ``connections.setup.timeout.ms``), a third
  after an ApiVersions and a Metadata were answered (past authentication: held, their
  frames half-read); then, with those held, the same consumer reads the topic. The
  proxy's resident memory (RSS of its process and its workers, summed) is sampled
  throughout; its growth is the peak during the attacked window less the value just
  before the attackers connected.

``main`` writes ``benchmarks/results/hostile.json`` and ``hostile.png``.
"""

from __future__ import annotations

import argparse
import resource
import socket
import statistics
import struct
import sys
import threading
import time
import uuid
from pathlib import Path

from benchmarks import results
from benchmarks.benchmark import Benchmark
from benchmarks.rounds import Row, goal, rotation
from benchmarks.workloads import data
from harness.processes import rss_bytes
from harness.raw_client import RawClient
from proxy.protocol.api_keys import ApiKey

MIB = 1024 * 1024
DECLARED = 100 * MIB
QUIET, ATTACKED = "quiet", "attacked"


class RssSampler:
    """The peak RSS of a process and those under it (the proxy's workers), sampled every 20 ms
    on a thread while in use."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes(self.pid))
            self._stop.wait(0.02)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes(self.pid))


def attack(port: int, count: int) -> list[socket.socket]:
    """``count`` connections declaring 100 MiB frames (see the module's docstring). The
    sockets, to be closed by the caller (those closed by the proxy included)."""
    sockets = []
    for index in range(count):
        client = RawClient("127.0.0.1", port, client_id="bench-hostile")
        sockets.append(client.sock)
        api_key = ApiKey.API_VERSIONS if index % 3 == 0 else ApiKey.PRODUCE
        declaration = struct.pack(">ihhi", DECLARED, api_key, 3 if api_key == ApiKey.API_VERSIONS else 9, 1)
        if index % 3 == 2:  # past authentication first
            client.call(ApiKey.API_VERSIONS, 3, client_software_name="bench", client_software_version="1")
            client.call(ApiKey.METADATA, 12, topics=[], allow_auto_topic_creation=False)
        try:
            client.sock.sendall(declaration)
        except OSError:
            pass  # closed at the size prefix already
    return sockets


def consume(bootstrap: str, topic: str, count: int) -> float:
    """Seconds for a librdkafka consumer to read ``count`` records from the start."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-hostile-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    seen = 0
    began = time.perf_counter()
    deadline = time.monotonic() + 300
    try:
        while seen < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"consumed {seen} of {count}")
            for message in consumer.consume(1000, timeout=1.0):
                if message.error() is None:
                    seen += 1
        return time.perf_counter() - began
    finally:
        consumer.close()


def run(report: dict, args, cluster, workdir: Path) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    from proxy.local_kafka import ProxyProcess

    topic = f"hostile-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    for future in admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)]).values():
        future.result(timeout=60)
    data.produce_keyed(cluster.bootstrap_servers, topic, args.records, keys=1000, value_size=args.record_bytes)
    megabytes = args.records * args.record_bytes / 1e6
    proxy = ProxyProcess.start(cluster.bootstrap_servers, overrides={"metrics.port": "0"}, workdir=workdir / "proxy")
    try:
        consume(proxy.bootstrap_servers, topic, args.records)  # warm-up, unrecorded
        rates: dict[str, list[float]] = {QUIET: [], ATTACKED: []}
        growth: list[float] = []
        for round_number in range(args.rounds):
            for contender in rotation([QUIET, ATTACKED], round_number):
                if contender == QUIET:
                    rates[QUIET].append(megabytes / consume(proxy.bootstrap_servers, topic, args.records))
                    continue
                before = rss_bytes(proxy.pid)
                with RssSampler(proxy.pid) as sampler:
                    held = attack(proxy.port, args.attackers)
                    try:
                        rates[ATTACKED].append(megabytes / consume(proxy.bootstrap_servers, topic, args.records))
                    finally:
                        for sock in held:
                            sock.close()
                growth.append((sampler.peak - before) / MIB)
                print(f"round {round_number}: attacked rss growth {growth[-1]:.1f} MiB", file=sys.stderr)
            print(f"round {round_number}: quiet {rates[QUIET][-1]:.1f} MB/s attacked {rates[ATTACKED][-1]:.1f} MB/s",
                  file=sys.stderr)
    finally:
        proxy.stop(timeout=10)
    report["rows"].append(Row("consumer", f"librdkafka consumer with {args.attackers} hostile connections held",
                              "MB/s", rates[ATTACKED], QUIET, rates[QUIET]).as_dict())
    report["rows"].append(Row("consumer", "librdkafka consumer alone", "MB/s", rates[QUIET]).as_dict())
    report["rows"].append(Row("memory", f"proxy RSS growth with {args.attackers} connections declaring 100 MiB "
                              "(the first attacked round; see the notes)", "MiB", growth[:1],
                              higher_is_better=False).as_dict())
    report["rss_growth_mib_by_round"] = growth
    quiet = rates[QUIET]
    quiet_low = min(quiet) / statistics.median(quiet)
    ratio = statistics.median(a / q for a, q in zip(rates[ATTACKED], quiet))
    report["goals"] += [
        goal(f"proxy RSS growth with {args.attackers} connections declaring 100 MiB frames", max(growth), 100,
             at_least=False, unit="MiB"),
        goal("consumer throughput attacked / quiet (paired median) within the quiet rounds' spread "
             f"(lowest quiet / median quiet = {quiet_low:.3f})", ratio, quiet_low),
    ]
    report["notes"] += [
        f"{args.records:,} records of {args.record_bytes} B ({megabytes:.0f} MB) read per window",
        "the first attacked round is the one that shows what the attack costs: later rounds reuse the memory "
        "the first one's connections gave back to the heap (resident memory follows what the proxy holds only "
        "after memory.trim.interval.ms), so their growth reads near 0",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attackers", type=int, default=1000, help="connections declaring 100 MiB frames")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--record-bytes", type=int, default=512)
    parser.add_argument("--output-dir", type=Path, default=results.RESULTS)
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4 * args.attackers + 1000:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4 * args.attackers + 1000), hard))
    from harness.kafka_cluster import KafkaCluster
    from proxy.local_kafka import scratch_dir

    command = " ".join(["flock /tmp/keyrange-bench.lock .venv/bin/python -m benchmarks.bench_hostile",
                        *(argv if argv is not None else sys.argv[1:])])
    report = results.new_report(
        "hostile", f"Hostile clients: {args.attackers} connections declaring 100 MiB frames beside a consumer",
        command, __doc__.split("\n\n", 2)[2].split("``main``")[0].strip(),
        {"attackers": args.attackers, "rounds": args.rounds, "records": args.records,
         "record_bytes": args.record_bytes, "settings": "defaults"})
    workdir = scratch_dir("bench-hostile-")
    with KafkaCluster.start(1, workdir=workdir / "kafka") as cluster:
        run(report, args, cluster, workdir)
    path = results.finish(report, args.output_dir)
    print(path)
    for entry in report["goals"]:
        print(entry)
    return 0


BENCHMARK = Benchmark("bench_hostile", "Hostile clients: connections declaring 100 MiB frames beside a consumer",
                      main=main)


if __name__ == "__main__":
    raise SystemExit(main())
