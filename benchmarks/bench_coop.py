"""Cooperative fetch against Kafka share groups: N consumers of one partition, each record
to any consumer (docs/cooperative-fetch.md), in the same run, rounds alternating.

Three cases, each on one partition of keyed records with 100-byte values written before the
rounds (a backlog: the tests cover records written while they are read) by librdkafka with
``batch.size`` 16 KiB, the Java producer's default (``--coop-batch-bytes``). The batch size
matters to coop: a chunk is whole batches (the broker answers a Fetch with at least one
whole batch, whatever its byte limit), so a chunk is never smaller than one producer batch;
with 256 KiB batches a 16 KiB coop fetch gets about 2,200 records, 2.2 s of work at 1 ms.

- ``delivery``: no work per record, N = 1, 4, 16; ``coop`` against ``share``;
- ``work``: 1 ms of work per record, N = 1, 4, 16; ``coop`` against ``share``;
- ``hot``: 1 ms of work per record and half the records under one key, N = 4, 16; ``coop``
  against ``keyrange`` (N key-range consumers, equal shares of the key-hash space: the
  member holding the hot key has at least half of the records, so they cannot go faster
  than about 2 x one consumer).

The contenders:

- ``coop``: N trio ``proxy.client.Consumer``\\ s through the proxy
  (``benchmarks.workloads.coop_worker``; a Python process each without work, where each needs
  a core; with paced work N/2 trio tasks in each of two processes, as the share harness runs
  its N consumers as threads of one JVM: ``consumers_per_process``), ``assign([tp], cooperative=True)`` in one
  group, ``allow_individual_commit``, ``mark_processed`` per record and
  ``await commit_processed()`` after every poll. Chunk size (``max_partition_fetch_bytes``):
  the client's default 1 MiB without work, 16 KiB (about 120 records, 0.12 s of work) with it;
- ``keyrange``: the same processes with ``assign({tp: [equal_shares(N)[i]]})``;
- ``striped``: N standard librdkafka consumers (confluent-kafka, a process each,
  ``benchmarks.workloads.striped_worker``) of the striped virtual topic ``T.coopN``
  (docs/cooperative-fetch.md#standard-clients-striped-virtual-topics), stripe i assigned to
  member i, positions committed asynchronously after each batch; N = 1 reads ``T`` itself
  through the proxy. The proxy runs with ``virtual.topics.enabled=true`` for every contender;
- ``coop xR``: the ``coop`` consumers spread over R port-per-broker proxy instances in front
  of the same broker (``--instances``, default 1 2 3; member i through instance i mod R, as
  a load balancer in front of proxy replicas spreads a group's members), no work and 1 ms,
  N = 4 and 16 (N >= R). The grants of every instance go through
  ``__cooperative_fetch_grants`` (docs/high-availability.md); ``coop`` is one instance;
- ``--coop-build NAME=FOLDER`` (e.g. ``in-memory=/tmp/coop-before``): the ``coop``
  consumers through one proxy of another checkout, started from its own folder
  (``bench_builds.start_build``), no work and 1 ms, every N: the build before the grants
  were replicated through Kafka (1a3d1ea, grants in the proxy's memory) is the baseline of
  the log's cost;
- ``share``: N KafkaShareConsumers of one share group, one thread each, in one JVM
  (``benchmarks/java/share`` ShareBench, ``share.auto.offset.reset=earliest``). Without
  work Kafka's default ``share.acquire.mode`` (batch_optimized) and 500 records per poll;
  with work ``record_limit`` and 100 records per poll, about the coop chunk, so that N
  members fit in the partition's record locks (``group.share.partition.max.record.locks``,
  2,000 by default; with 500 records per poll only 4 members hold records at once).

The work is the share harness's (``Bench.process``): paced, not computed, one record after
another per consumer, each record's deadline one work time after the previous one's
(restarting from now after an idle gap), parked until then (``trio.sleep_until`` /
``LockSupport.parkNanos``): 1 ms of a slow call per record, no CPU.

Every run drains its topic. The coop and keyrange workers connect first and start together
once all are ready (process start-up is not measured); the share JVM's threads start
together. **Records/s is the rate over the middle of the run**: between the moments 10 % and
90 % of the topic's records had been handed out (start-up, first fetches, joins and the
tail, where fewer members have work left, are left out); with a hot key under key ranges
most of that middle is the hot member working alone, which is the point. Each run's topic is
sized so that a contender at its goal spends ``--coop-seconds`` (default 10; hot key: half)
in it: ``N x 1,000 x seconds`` records per processing-bound topic (one topic per N), and
``--coop-delivery-records`` (default 800,000, about 100 MB) for delivery.

Checks per run: the coop and keyrange workers report every offset they processed (as
contiguous runs); a run ends when the distinct offsets equal the records written, and then
reports the records handed out, the duplicates (handed out - distinct), offsets outside the
topic, and whether the group's committed offset reached the log end (read from the broker).
A run that stalls (no new offset for 60 s, beyond the 45 s lease) or fails keeps the tail of
the proxy's log in the JSON and fails the benchmark once the JSON is written. Share runs end
when the records handed out reach the records written (ShareBench ``--records``); their
duplicates are at least handed out - written. Each run also keeps the CPU of the proxy, the
consumers and the broker over the middle (cores used), the proxy's coop counters and mean
Fetch and OffsetCommit latency, and per-member counts.

    python -m benchmarks coop                 # 3 rounds: about 17 minutes on 2 cores
    git worktree add /tmp/coop-before 1a3d1ea   # and build its C kernels in place, e.g. pip wheel
    # --no-deps -w /tmp/w /tmp/coop-before, then unzip the wheel's three .so files into the folder
    python -m benchmarks coop --coop-build in-memory=/tmp/coop-before   # about 20 minutes
    python -m benchmarks coop --quick         # 1 round, small topics: about 3-4 minutes
    python -m benchmarks coop --rounds 2 --coop-seconds 6
    python -m benchmarks coop --coop-cases delivery --coop-contenders coop --workers 4 16 --instances 1 3 \
        --coop-delivery-records 4000000      # longer runs without work, 1 against 3 instances only

Not in the default set of ``python -m benchmarks``: run it by name. It holds
``/tmp/keyrange-bench.lock`` like every benchmark there (do not wrap it in ``flock`` on that
file). Writes ``benchmarks/results/coop.json`` and ``coop.png`` (``--output-dir`` elsewhere).
"""

from __future__ import annotations

import bisect
import json
import random
import re
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import psutil

from benchmarks.bench_builds import revision, start_build
from benchmarks.benchmark import Benchmark
from benchmarks.peers import java_harness, share_groups
from benchmarks.rounds import Row, goal, rotation
from benchmarks.workloads import data
from benchmarks.workloads.stopping import stop_processes
from harness.kafka_cluster import KafkaCluster
from harness.processes import cpu_seconds, spawn
from proxy.local_kafka import ProxyProcess, scratch_dir

ROOT = Path(__file__).resolve().parents[1]
KEYS = 10_000
VALUE_BYTES = 100
HOT_SHARE = 0.5
HOT_KEY = b"hot"
WORK_MS = 1.0
WORK_CHUNK_BYTES = 16 * 1024  # coop with work: ~120 records a chunk
DELIVERY_CHUNK_BYTES = 0  # coop without work: the client's default max_partition_fetch_bytes (1 MiB)
SHARE_WORK_MAX_POLL = 100
SHARE_PROGRESS_MS = 100
MIDDLE = (0.1, 0.9)
READY_TIMEOUT_S = 120.0
STALL_S = 60.0  # no new offset for this long: the run failed (the lease is 45 s)
COMMIT_WAIT_S = 15.0
GOAL_DELIVERY = 3.0
GOAL_WORK = 0.9
GOAL_HOT = 0.8
HOT_CAP = 2.0
CASES = ("delivery", "work", "hot")
CONTENDERS = {"delivery": ("coop", "share", "striped"), "work": ("coop", "share", "striped"),
              "hot": ("coop", "keyrange", "striped")}
SPREAD_CASES = ("delivery", "work")  # the cases run on several instances and through another build
GOAL_BUILD = 0.8  # one instance, grants through the log, against the build that kept them in memory
GOAL_INSTANCES = 1.0  # R instances against one
_LATENCY = re.compile(r'^kafka_proxy_request_latency_seconds_(sum|count)\{api="([A-Za-z]+)"\} ([0-9.e+-]+)$', re.M)
_ASK = re.compile(r"^kafka_proxy_coop_ask_seconds_(sum|count) ([0-9.e+-]+)$", re.M)  # through the grants log
_COOP = re.compile(r"^(kafka_proxy_coop_[a-z_]+_total)(\{[^}]*\})? ([0-9.e+-]+)$", re.M)
# what the range commits of a group whose members commit through several instances cost
_COMMITS = re.compile(r"^kafka_proxy_individual_commit_(foreign_writes|corrections)_total ([0-9.e+-]+)$", re.M)
TITLE = "Cooperative fetch: N consumers of one partition against share groups (and key ranges with a hot key)"
METHOD = ("One partition, 100-byte keyed values written before the rounds (librdkafka, batch.size in the sizes). N trio Consumers through the proxy "
          "(assign(cooperative=True); a process each without work, two processes of N/2 trio tasks with work; "
          "commit_processed after every poll), and N standard librdkafka "
          "consumers of the striped virtual topic T.coopN (a stripe and a process each), against N "
          "KafkaShareConsumers (one JVM), without work and with 1 ms of paced work per record (one record at a "
          "time per consumer, as the share harness); with half the records under one key, coop against N key-range "
          "consumers. Without work and with 1 ms, the coop consumers also spread over R proxy instances "
          "(member i through instance i mod R) and, with --coop-build, through one proxy of another checkout "
          "(the build that kept the grants in memory). Every run drains its topic; records/s between 10 % and 90 % of the records handed out; "
          "coop/keyrange runs must hand out every offset (distinct offsets = records written). Rounds alternate "
          "the order; one consumer (coop N=1) is the baseline of the scaling goals.")


# -- sizes --------------------------------------------------------------------------------------------------------

def spread(contender: str) -> int:
    """How many proxy instances the members of ``contender`` go through (``coop xR``: R)."""
    return int(contender.removeprefix("coop x")) if contender.startswith("coop x") else 1


def contenders(args, case: str, n: int) -> tuple[str, ...]:
    """The contenders of ``case`` with N = ``n``: the base ones, then ``coop xR`` for every
    R > 1 of ``--instances`` with N >= R, then the other build (``--coop-build``) by name;
    ``--coop-contenders`` keeps only the base ones it names."""
    chosen = args.coop_contenders
    out = tuple(c for c in CONTENDERS[case] if not chosen or c in chosen)
    if case in SPREAD_CASES:
        out += tuple(f"coop x{r}" for r in sorted(set(args.instances)) if 1 < r <= n)
        if args.coop_build:
            out += (args.coop_build[0],)
    return out


def sizes(args) -> dict:
    workers = sorted(set([1, *args.workers]))
    seconds = args.coop_seconds
    per_consumer = 1000 / WORK_MS
    return {
        "workers": workers,
        "hot_workers": [n for n in workers if n > 1],
        "delivery_records": args.coop_delivery_records,
        "work_records": {n: int(n * per_consumer * seconds) for n in workers},
        "hot_records": {n: int(n * per_consumer * seconds / 2) for n in workers if n > 1},
    }


def cases(args) -> tuple[str, ...]:
    """The cases to run: every one, or those of ``--coop-cases`` (the others' rows and goals stay out)."""
    return tuple(case for case in CASES if case in (args.coop_cases or CASES))


def plan(args) -> list[tuple[str, int, str]]:
    """One round's runs in round 0's order: (case, N, contender)."""
    s = sizes(args)
    runs = []
    for case in cases(args):
        for n in (s["hot_workers"] if case == "hot" else s["workers"]):
            for contender in contenders(args, case, n):
                runs.append((case, n, contender))
    return runs


def round_order(args, number: int) -> list[tuple[str, int, str]]:
    """The round's runs: the cases, the Ns and the contenders of each N rotate from round to
    round, each N's contenders by one place a round (from a place of their own, so that the
    Ns of a round do not all start with the same contender): a contender that went first
    goes last the next round, whatever the number of Ns. (Rotated by the N's place in the
    rotated order instead, an N's contenders kept one order in every round when there are
    as many Ns as contenders: the second contender always ran first, while the machine
    warmed up over the rounds.)"""
    s = sizes(args)
    out = []
    for case in rotation(cases(args), number):
        ns = s["hot_workers"] if case == "hot" else s["workers"]
        for n in rotation(ns, number):
            for contender in rotation(contenders(args, case, n), number + list(ns).index(n)):
                out.append((case, n, contender))
    return out


def steps(args) -> int:
    return 3 + args.rounds * len(plan(args))


# -- data ---------------------------------------------------------------------------------------------------------

def _create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)], operation_timeout=30)
    futures[topic].result(timeout=60)


def produce(bootstrap: str, topic: str, records: int, *, batch_bytes: int, hot: bool = False, seed: int = 7) -> int:
    """``records`` records to partition 0 in order (librdkafka, idempotent, ``batch.size`` =
    ``batch_bytes``): record i under ``key-<i mod KEYS>`` with ``data.value_of``'s value;
    with ``hot``, each record with probability :data:`HOT_SHARE` (seeded) under the key
    ``hot`` instead (values numbered as key KEYS). Returns the records of the hot key."""
    rng = random.Random(seed)
    hot_records = 0

    def record_of(i: int) -> tuple[bytes, bytes]:
        nonlocal hot_records
        if hot and rng.random() < HOT_SHARE:
            hot_records += 1
            return HOT_KEY, data.value_of(KEYS + (hot_records - 1) * (KEYS + 1), KEYS + 1, VALUE_BYTES)
        return data.key_of(i, KEYS), data.value_of(i, KEYS, VALUE_BYTES)

    data.produce_keyed(bootstrap, topic, records, keys=KEYS, batch_bytes=batch_bytes, record_of=record_of)
    return hot_records


def _log_end(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer as RdConsumer
    from confluent_kafka import TopicPartition as RdPartition

    probe = RdConsumer({"bootstrap.servers": bootstrap, "group.id": "coop-bench-probe"})
    try:
        return probe.get_watermark_offsets(RdPartition(topic, 0), timeout=10)[1]
    finally:
        probe.close()


def _committed(bootstrap: str, group: str, topic: str) -> int | None:
    from confluent_kafka import Consumer as RdConsumer
    from confluent_kafka import TopicPartition as RdPartition

    probe = RdConsumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        (found,) = probe.committed([RdPartition(topic, 0)], timeout=10)
        return found.offset if found.offset >= 0 else None
    finally:
        probe.close()


# -- measuring ----------------------------------------------------------------------------------------------------

def middle_rate(events: list[tuple[float, int]], records: int) -> dict:
    """From (time, records handed out so far) in time order: the rate between the first
    moments at which 10 % and 90 % of ``records`` had been handed out."""
    low, high = (int(records * f) for f in MIDDLE)
    totals = [count for _, count in events]
    i, j = bisect.bisect_left(totals, max(1, low)), bisect.bisect_left(totals, high)
    if j >= len(events) or i >= j:
        return {"records_per_s": None}
    (t0, c0), (t1, c1) = events[i], events[j]
    if t1 <= t0:
        return {"records_per_s": None}
    return {"records_per_s": round((c1 - c0) / (t1 - t0), 1), "middle": (t0, t1), "middle_s": round(t1 - t0, 3),
            "middle_records": c1 - c0}


class _Sampler:
    """CPU seconds of the proxy, the consumers and the broker, and the machine's busy and
    total seconds, sampled over a run; interpolated at any two moments. A proxy instance
    counts with its workers (``harness.processes.cpu_seconds``): its command is their
    supervisor."""

    def __init__(self, proxy_pids: list[int], broker_pid: int | None) -> None:
        self.proxy_pids, self.broker_pid = proxy_pids, broker_pid
        self.consumer_pids: list[int] = []
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.last = 0.0
        self.known: dict[int, float] = {}  # a process that has gone keeps its last reading

    def _cpu(self, pids: list[int | None], *, tree: bool = False) -> float:
        total = 0.0
        for pid in pids:
            if pid is None:
                continue
            try:
                if tree:
                    self.known[pid] = cpu_seconds([pid])
                else:
                    times = psutil.Process(pid).cpu_times()
                    self.known[pid] = times.user + times.system
            except psutil.Error:
                pass
            total += self.known.get(pid, 0.0)
        return total

    def sample(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < 0.25:
            return
        self.last = now
        machine = psutil.cpu_times()
        total = sum(machine)
        each = {f"proxy {number}": self._cpu([pid], tree=True) for number, pid in enumerate(self.proxy_pids)}
        self.samples.append((now, {**each, "proxy": sum(each.values()),
                                   "consumers": self._cpu(self.consumer_pids),
                                   "broker": self._cpu([self.broker_pid]),
                                   "machine_busy": total - machine.idle - getattr(machine, "iowait", 0.0),
                                   "machine_total": total}))

    def at(self, moment: float) -> dict[str, float] | None:
        times = [t for t, _ in self.samples]
        i = bisect.bisect_left(times, moment)
        if not self.samples or i == 0 or i >= len(self.samples):
            return None
        (ta, a), (tb, b) = self.samples[i - 1], self.samples[i]
        f = (moment - ta) / (tb - ta) if tb > ta else 0.0
        return {k: a[k] + (b[k] - a[k]) * f for k in a}

    def between(self, t0: float, t1: float, records: int) -> dict:
        a, b = self.at(t0), self.at(t1)
        if a is None or b is None or t1 <= t0:
            return {}
        seconds = t1 - t0
        out = {f"{k}_cores": round((b[k] - a[k]) / seconds, 3) for k in ("proxy", "consumers", "broker")}
        out["machine_busy"] = round((b["machine_busy"] - a["machine_busy"])
                                    / max(1e-9, b["machine_total"] - a["machine_total"]), 3)
        if records:
            out.update({f"{k}_us_per_record": round((b[k] - a[k]) * 1e6 / records, 1)
                        for k in ("proxy", "consumers", "broker")})
        if len(self.proxy_pids) > 1:  # what each instance used: the busiest bounds what one machine each serves
            out["proxy_cores_each"] = [round((b[f"proxy {n}"] - a[f"proxy {n}"]) / seconds, 3)
                                       for n in range(len(self.proxy_pids))]
        return out


def _scrape(proxies: list[ProxyProcess]) -> dict:
    """The proxies' request latencies and coop counters, summed over the instances."""
    out: dict = {"latency": {}, "coop": {}, "commits": {}}
    for proxy in proxies:
        if proxy.metrics_url is None:
            continue
        try:
            text = urllib.request.urlopen(proxy.metrics_url, timeout=10).read().decode()
        except OSError:
            continue
        for kind, api, value in _LATENCY.findall(text):
            out["latency"].setdefault(api, [0.0, 0.0])[0 if kind == "sum" else 1] += float(value)
        for kind, value in _ASK.findall(text):
            out["latency"].setdefault("ask", [0.0, 0.0])[0 if kind == "sum" else 1] += float(value)
        for name, labels, value in _COOP.findall(text):
            key = name.removeprefix("kafka_proxy_coop_").removesuffix("_total") + (labels or "")
            out["coop"][key] = out["coop"].get(key, 0.0) + float(value)
        for name, value in _COMMITS.findall(text):
            out["commits"][name] = out["commits"].get(name, 0.0) + float(value)
    return out


def _proxy_delta(before: dict, after: dict, seconds: float) -> dict:
    coop = {k: int(v - before.get("coop", {}).get(k, 0.0)) for k, v in after.get("coop", {}).items()
            if v - before.get("coop", {}).get(k, 0.0)}
    latency = {}
    for api in ("Fetch", "OffsetCommit", "ask"):
        total, count = after.get("latency", {}).get(api, (0.0, 0.0))
        total0, count0 = before.get("latency", {}).get(api, (0.0, 0.0))
        if count > count0:
            latency[api] = {"per_s": round((count - count0) / seconds, 1),
                            "mean_ms": round((total - total0) / (count - count0) * 1000, 2)}
    commits = {k: int(v - before.get("commits", {}).get(k, 0.0)) for k, v in after.get("commits", {}).items()}
    return {"coop_counters": coop, "commit_counters": commits, "requests": latency}


class _LogWatch:
    """New ERROR / Traceback lines of the proxy's log since the last look."""

    def __init__(self, proxy: ProxyProcess) -> None:
        self.proxy = proxy
        self.position = self._size()

    def _size(self) -> int:
        try:
            return self.proxy.log_path.stat().st_size
        except OSError:
            return 0

    def new_problems(self, limit: int = 20) -> list[str]:
        try:
            with open(self.proxy.log_path, "rb") as log:
                log.seek(self.position)
                text = log.read().decode(errors="replace")
                self.position = log.tell()
        except OSError:
            return []
        lines = [line for line in text.splitlines() if "ERROR" in line or "Traceback" in line or "CRITICAL" in line]
        return lines[:limit]

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.proxy.log_text().splitlines()[-lines:])
        except OSError:
            return ""


class _Progress:
    """One worker's ``.progress`` file, read as it grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.position = 0
        self.rest = b""
        self.ready: float | None = None
        self.error: str | None = None
        self.events: list[tuple[float, int]] = []

    def read(self) -> list[tuple[int, int]]:
        """New lines: records their times and counts; returns the offset runs they carry."""
        try:
            with open(self.path, "rb") as source:
                source.seek(self.position)
                chunk = source.read()
                self.position = source.tell()
        except FileNotFoundError:
            return []
        lines = (self.rest + chunk).split(b"\n")
        self.rest = lines.pop()
        runs = []
        for line in lines:
            parts = line.split(b" ", 3)
            if parts[0] == b"P" and len(parts) == 4:
                self.events.append((float(parts[1]), int(parts[2])))
                for run in parts[3].split(b","):
                    first, _, last = run.partition(b"-")
                    runs.append((int(first), int(last)))
            elif parts[0] == b"R":
                self.ready = float(parts[1])
            elif parts[0] == b"E":
                self.error = line[2:].decode(errors="replace")
        return runs


def _merge(series: list[list[tuple[float, int]]]) -> list[tuple[float, int]]:
    """Several workers' (time, own count) as (time, sum of the latest counts)."""
    merged = sorted((t, i, c) for i, events in enumerate(series) for t, c in events)
    latest = [0] * len(series)
    total = 0
    out = []
    for t, i, c in merged:
        total += c - latest[i]
        latest[i] = c
        out.append((t, total))
    return out


def consumers_per_process(mode: str, n: int, work_ms: float) -> int:
    """How many of N trio consumers share a process: one each without work (each needs a
    core's worth of Python), half each over two processes with paced work (mostly waiting:
    N processes would spend the 2 cores waking up; the share harness runs its N consumers
    as threads of one JVM). librdkafka consumers (``striped``): one each."""
    if mode == "striped" or not work_ms or n < 2:
        return 1
    return (n + 1) // 2


def python_run(cluster: KafkaCluster, proxies: list[ProxyProcess], watches: list[_LogWatch], *, topic: str,
               records: int, n: int, mode: str, work_ms: float, chunk_bytes: int, timeout: float) -> dict:
    """N worker processes draining ``topic``: ``coop_worker`` (``mode`` coop or keyrange) or
    ``striped_worker`` (``mode`` striped), through ``proxies`` (consumer i through
    ``proxies[i mod len(proxies)]``; striped: the first)."""
    group = f"coop-{mode}-{n}-{uuid.uuid4().hex[:8]}"
    workdir = scratch_dir("bench-coop-workers-")
    prefixes = [workdir / f"w{i}" for i in range(n)]
    per_process = consumers_per_process(mode, n, work_ms)
    result: dict = {"group": group, "records": records, "members": n, "consumers_per_process": per_process,
                    "instances": len(proxies)}
    sampler = _Sampler([proxy.pid for proxy in proxies], cluster.running_nodes[0].pid)
    bootstraps = [a for proxy in proxies for a in ("--bootstrap", proxy.bootstrap_servers)]
    spawned = time.monotonic()
    processes = []
    owner = []  # consumer index -> its process's index
    for first in range(0, n, per_process):
        count = min(per_process, n - first)
        common = ["--topic", topic, "--group", group, "--index", str(first),
                  "--members", str(n), "--work-ms", str(work_ms), "--out", str(workdir / "w")]
        if mode == "striped":
            command = [sys.executable, "-m", "benchmarks.workloads.striped_worker", *bootstraps[:2], *common]
        else:
            command = [sys.executable, "-m", "benchmarks.workloads.coop_worker", *bootstraps, *common, "--mode", mode,
                       "--chunk-bytes", str(chunk_bytes), "--consumers", str(count)]
        with open(f"{prefixes[first]}.err", "wb") as err:
            processes.append(spawn(command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err))
        owner += [len(processes) - 1] * count
    sampler.consumer_pids = [p.pid for p in processes]
    progress = [_Progress(Path(f"{prefix}.progress")) for prefix in prefixes]
    seen = bytearray(records)
    distinct = strays = 0

    def check() -> None:
        for i, p in enumerate(progress):
            process = processes[owner[i]]
            if p.error or process.poll() is not None:
                first = owner.index(owner[i])
                err = Path(f"{prefixes[first]}.err").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{mode} worker {i} {'failed: ' + p.error if p.error else 'exited'} "
                                   f"(code {process.poll()}):\n{err}")

    try:
        while not all(p.ready for p in progress):
            for p in progress:
                p.read()
            check()
            if time.monotonic() - spawned > READY_TIMEOUT_S:
                raise TimeoutError(f"workers not ready after {READY_TIMEOUT_S:g} s")
            time.sleep(0.05)
        result["spawn_to_ready_s"] = round(time.monotonic() - spawned, 2)
        before = _scrape(proxies)
        sampler.sample(force=True)
        go = time.monotonic()
        for process in processes:
            process.stdin.write(b"go\n")
            process.stdin.flush()
        last_new = go
        while distinct < records:
            time.sleep(0.05)
            new = 0
            for p in progress:
                for first, last in p.read():
                    if last >= records:
                        strays += last - max(first, records) + 1
                        last = records - 1
                    if first <= last:
                        segment = seen[first:last + 1]
                        fresh = segment.count(0)
                        if fresh:
                            seen[first:last + 1] = b"\x01" * len(segment)
                            new += fresh
            distinct += new
            sampler.sample()
            check()
            now = time.monotonic()
            if new:
                last_new = now
            elif now - last_new > STALL_S:
                raise TimeoutError(f"stalled: no new offset for {STALL_S:g} s at {distinct} of {records} distinct")
            if now - go > timeout:
                raise TimeoutError(f"not drained within {timeout:g} s: {distinct} of {records} distinct")
        drained = time.monotonic()
        sampler.sample(force=True)
        after = _scrape(proxies)
        result["go_to_drained_s"] = round(drained - go, 2)
        # the members' last commits: the group's committed offset at the log end
        committed = None
        while time.monotonic() - drained < COMMIT_WAIT_S:
            committed = _committed(cluster.bootstrap_servers, group, topic)
            if committed == records:
                break
            time.sleep(0.5)
        result["committed_at_end"] = committed
        result["commit_settled_s"] = round(time.monotonic() - drained, 2)
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["proxy_log"] = [str(proxy.log_path) for proxy in proxies]
        result["proxy_log_tail"] = [watch.tail() for watch in watches]
    finally:
        stop_processes(processes)
    for p in progress:
        p.read()
    events = _merge([p.events for p in progress])
    handed = events[-1][1] if events else 0
    result.update({"handed_out": handed, "distinct": distinct, "duplicates": handed - distinct - strays,
                   "missing": records - distinct, "strays": strays,
                   "per_member": [p.events[-1][1] if p.events else 0 for p in progress]})
    first = [p.events[0][0] for p in progress if p.events]
    if first and "error" not in result:
        result["go_to_first_record_s"] = round(min(first) - go, 3)
    rate = middle_rate(events, records)
    middle = rate.pop("middle", None)
    result.update(rate)
    if middle:
        result["cpu"] = sampler.between(*middle, rate["middle_records"])
        result["proxy"] = _proxy_delta(before, after, drained - go) if "error" not in result else {}
    stats = []
    for prefix in prefixes:
        try:
            stats.append(json.loads(Path(f"{prefix}.json").read_text()))
        except (OSError, ValueError):
            pass
    if stats:
        totals = {k: round(sum(s.get(k, 0) for s in stats), 3) for k in ("polls", "commits", "poll_s", "commit_s",
                                                                             "work_s", "cpu_s")}
        metrics: dict[str, int] = {}
        for s in stats:
            for k, v in s.get("metrics", {}).items():
                if v:
                    metrics[k] = metrics.get(k, 0) + v
        result["workers"] = {**totals, "metrics": metrics}
        if metrics.get("cooperative_chunks"):
            result["records_per_chunk"] = round(metrics.get("cooperative_records", 0) / metrics["cooperative_chunks"], 1)
    problems = [line for watch in watches for line in watch.new_problems()]
    if problems:
        result["proxy_log_problems"] = problems
        result["proxy_log"] = [str(proxy.log_path) for proxy in proxies]
    return result


def share_run(cluster: KafkaCluster, *, topic: str, records: int, n: int, work_ms: float, timeout: float) -> dict:
    """N KafkaShareConsumers (ShareBench) until ``records`` were handed out."""
    group = f"coop-share-{n}-{uuid.uuid4().hex[:8]}"
    workdir = scratch_dir("bench-coop-share-")
    share_groups.start_from_earliest(cluster.bootstrap_servers, group)
    args = ["--bootstrap", cluster.bootstrap_servers, "--topic", topic, "--group", group, "--workers", n,
            "--mode", "share", "--work-ms", work_ms, "--records", records, "--timeout", int(timeout),
            "--progress-ms", SHARE_PROGRESS_MS]
    if work_ms:
        args += ["--acquire-mode", "record_limit", "--max-poll-records", SHARE_WORK_MAX_POLL]
    else:
        args += ["--acquire-mode", "batch_optimized", "--max-poll-records", 500]
    result: dict = {"group": group, "records": records, "members": n,
                    "settings": " ".join(map(str, args[args.index("--acquire-mode"):]))}
    sampler = _Sampler([], cluster.running_nodes[0].pid)
    out_path, err_path = workdir / "share.out", workdir / "share.err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        began = time.monotonic()
        process = spawn(java_harness.command("bench-share", share_groups.MAIN, args), stdin=subprocess.DEVNULL,
                        stdout=out, stderr=err)
    sampler.consumer_pids = [process.pid]
    try:
        while process.poll() is None:
            sampler.sample()
            if time.monotonic() - began > timeout + 60:
                process.kill()
                process.wait()
                raise TimeoutError(f"ShareBench did not end within {timeout + 60:g} s")
            time.sleep(0.05)
        sampler.sample(force=True)
        stdout = out_path.read_text(errors="replace")
        lines = [line for line in stdout.splitlines() if line.startswith("{")]
        if process.returncode != 0 or not lines:
            tail = "\n".join(err_path.read_text(errors="replace").strip().splitlines()[-20:])
            raise RuntimeError(f"ShareBench exited with {process.returncode}:\n{tail or stdout[-2000:]}")
        harness = json.loads(lines[-1])
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        return result
    events = []
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "progress":
            events.append((int(parts[1]) / 1e6, int(parts[2])))
    handed = max(harness["processed_total"], events[-1][1] if events else 0)
    result.update({"handed_out": handed, "duplicates_at_least": max(0, handed - records),
                   "go_to_drained_s": round(time.monotonic() - began, 2),
                   "first_record_after_s": harness.get("first_record_after_s")})
    rate = middle_rate(events, records)
    middle = rate.pop("middle", None)
    result.update(rate)
    if middle:
        result["cpu"] = sampler.between(*middle, rate["middle_records"])
    return result


# -- the benchmark ------------------------------------------------------------------------------------------------

def _describe(run: dict) -> str:
    if "error" in run:
        return f"FAILED: {run['error'][:400]}"
    rate = run.get("records_per_s")
    text = f"{rate:,.0f} records/s" if rate else "no middle rate"
    text += f" over {run.get('middle_s', 0):.1f} s, handed out {run['handed_out']:,} of {run['records']:,}"
    if "distinct" in run:
        text += (f", missing {run['missing']}, duplicates {run['duplicates']}, committed "
                 f"{run['committed_at_end']}, per member {run['per_member']}")
    else:
        text += f", duplicates >= {run['duplicates_at_least']}"
    cpu = run.get("cpu") or {}
    if cpu:
        text += (f"; cores proxy {cpu.get('proxy_cores')}, consumers {cpu.get('consumers_cores')}, broker "
                 f"{cpu.get('broker_cores')}, machine busy {cpu.get('machine_busy')}")
    return text


def run(report: dict, progress, args) -> None:
    s = sizes(args)
    workers, hot_workers = s["workers"], s["hot_workers"]
    rounds = args.rounds
    report["sizes"] = {
        "consumers N": workers, "hot-key N": hot_workers, "rounds": rounds,
        "delivery records": f"{s['delivery_records']:,}",
        "1 ms records": ", ".join(f"N={n} {r:,}" for n, r in s["work_records"].items()),
        "hot-key records": ", ".join(f"N={n} {r:,}" for n, r in s["hot_records"].items()),
        "value bytes": VALUE_BYTES, "keys": f"{KEYS:,} (+ the hot key at {HOT_SHARE:.0%})",
        "producer batch.size": f"{args.coop_batch_bytes:,} B",
        "coop chunk": f"{DELIVERY_CHUNK_BYTES or 1 << 20} B without work, {WORK_CHUNK_BYTES} B with",
        "share records per poll": f"500 (batch_optimized) without work, {SHARE_WORK_MAX_POLL} (record_limit) with",
        "measured": f"records/s between {MIDDLE[0]:.0%} and {MIDDLE[1]:.0%} of the records handed out",
        "proxy instances (coop xR)": ", ".join(map(str, sorted(set([1, *args.instances])))),
    }
    if args.coop_build:
        name, folder = args.coop_build
        report["sizes"]["other build"] = f"{name}: {folder} ({revision(folder)}), one instance"
        report["notes"].append(f"The {name} build ({revision(folder)}) runs from its own checkout with its own "
                               "defaults and the same settings as this build's instances (virtual.topics.enabled="
                               "true), one process for the whole run.")
    workdir = scratch_dir("bench-coop-")
    progress.step("building the Java harness (if changed)")
    java_harness.build()
    progress.step("starting Kafka and the proxy")
    runs: list[dict] = []
    failures: list[str] = []
    with KafkaCluster.start(1, workdir=workdir / "kafka", broker_properties=share_groups.BROKER_PROPERTIES) as cluster:
        broker = cluster.bootstrap_servers
        topics: dict[tuple[str, int], str] = {}
        progress.step("writing the topics")
        hot_records_of_key = {}
        topics[("delivery", 0)] = "coop-delivery"
        for n in workers:
            topics[("work", n)] = f"coop-work-n{n}"
        for n in hot_workers:
            topics[("hot", n)] = f"coop-hot-n{n}"
        written = {}
        began = time.monotonic()
        for (case, n), topic in topics.items():
            _create_topic(broker, topic)
            if case == "delivery":
                produce(broker, topic, s["delivery_records"], batch_bytes=args.coop_batch_bytes)
            elif case == "work":
                produce(broker, topic, s["work_records"][n], batch_bytes=args.coop_batch_bytes)
            else:
                hot_records_of_key[n] = produce(broker, topic, s["hot_records"][n], batch_bytes=args.coop_batch_bytes,
                                                hot=True)
            written[topic] = _log_end(broker, topic)
        report["sizes"]["writing the topics"] = f"{time.monotonic() - began:.0f} s"
        report["hot_key_records"] = {f"N={n}": f"{k} of {s['hot_records'][n]}" for n, k in hot_records_of_key.items()}
        # R instances of this build (the first serves every one-instance contender), and the
        # other build's proxy; each for the whole run
        overrides = {"metrics.port": "0", "virtual.topics.enabled": "true"}
        report["settings"] = {"virtual.topics.enabled": "true"}  # off by default; the striped rows read T.coopK
        proxies: list[ProxyProcess] = []
        other: ProxyProcess | None = None
        try:
            for number in range(max([1, *args.instances])):
                proxies.append(ProxyProcess.start(broker, overrides=overrides, workdir=workdir / f"proxy-{number}"))
            if args.coop_build:
                name, folder = args.coop_build
                other = start_build(broker, folder, overrides=overrides, workdir=workdir / f"proxy-{name}")
        except BaseException:
            for proxy in proxies:
                proxy.stop()
            raise
        everyone = proxies + ([other] if other else [])
        watches = {proxy.pid: _LogWatch(proxy) for proxy in everyone}
        report["proxy_log"] = [str(proxy.log_path) for proxy in everyone]
        try:
            for number in range(rounds):
                for case, n, contender in round_order(args, number):
                    topic = topics[(case, 0 if case == "delivery" else n)]
                    records = written[topic]
                    work_ms = 0.0 if case == "delivery" else WORK_MS
                    progress.step(f"round {number + 1}/{rounds}: {case}, {contender}, N={n}")
                    # generous: at least half of one consumer's rate with work, 20,000/s without
                    timeout = 120 + (records * work_ms / 1000 * 2 if work_ms else records / 20_000)
                    try:
                        if contender == "share":
                            result = share_run(cluster, topic=topic, records=records, n=n, work_ms=work_ms,
                                               timeout=timeout)
                        else:
                            serving = [other] if other and contender == args.coop_build[0] else \
                                proxies[:spread(contender)]
                            result = python_run(cluster, serving, [watches[p.pid] for p in serving], topic=topic,
                                                records=records, n=n,
                                                mode=contender if contender in ("keyrange", "striped") else "coop",
                                                work_ms=work_ms,
                                                chunk_bytes=WORK_CHUNK_BYTES if work_ms else DELIVERY_CHUNK_BYTES,
                                                timeout=timeout)
                    except Exception as exc:  # one run failing must not lose the others
                        result = {"error": f"{type(exc).__name__}: {exc}"}
                    result = {"case": case, "contender": contender, "n": n, "round": number + 1, "topic": topic,
                              **result}
                    runs.append(result)
                    line = f"round {number + 1}/{rounds} {case} {contender} N={n}: {_describe(result)}"
                    bad = "error" in result or result.get("missing") or result.get("strays") or (
                        "committed_at_end" in result and result["committed_at_end"] != result["records"])
                    print(f"  {'!!! ' if bad else ''}{line}", file=sys.stderr if bad else sys.stdout, flush=True)
                    if bad:
                        failures.append(line)
        finally:
            for proxy in everyone:
                proxy.stop()
    _summarise(report, runs, failures, workers=workers, hot_workers=hot_workers, rounds=rounds, args=args)


def _summarise(report: dict, runs: list[dict], failures: list[str], *, workers: list[int], hot_workers: list[int],
               rounds: int, args) -> None:
    def rates(case: str, contender: str, n: int) -> list[float | None]:
        out = []
        for number in range(1, rounds + 1):
            found = [r for r in runs if (r["case"], r["contender"], r["n"], r["round"]) == (case, contender, n, number)]
            out.append(found[0].get("records_per_s") if found and "error" not in found[0] else None)
        return out

    def paired(a: list[float | None], b: list[float | None], factor: float = 1.0) -> tuple[list[float], list[float]]:
        keep = [(x, y * factor) for x, y in zip(a, b) if x is not None and y is not None]
        return [x for x, _ in keep], [y for _, y in keep]

    one = rates("work", "coop", 1)
    rows: list[Row] = []
    goals = []
    group = "no work, records/s"
    for n in workers:
        values, base = paired(rates("delivery", "coop", n), rates("delivery", "share", n))
        rows.append(Row(group, f"coop N={n}", "records/s", values, f"share N={n}", base))
    for n in workers:
        if n > 1:
            values, base = paired(rates("delivery", "coop", n), rates("delivery", "coop", 1))
            rows.append(Row(group, f"coop N={n}", "records/s", values, "coop N=1", base))
    group = "1 ms per record, records/s"
    for n in workers:
        if n > 1:
            values, base = paired(rates("work", "coop", n), one, n)
            rows.append(Row(group, f"coop N={n}", "records/s", values, f"{n} x coop N=1", base))
    for n in workers:
        values, base = paired(rates("work", "coop", n), rates("work", "share", n))
        rows.append(Row(group, f"coop N={n}", "records/s", values, f"share N={n}", base))
    for n in workers:
        if n > 1:
            values, base = paired(rates("work", "share", n), one, n)
            rows.append(Row(group, f"share N={n}", "records/s", values, f"{n} x coop N=1", base))
    group = f"hot key ({HOT_SHARE:.0%}), 1 ms per record, records/s"
    for n in hot_workers:
        values, base = paired(rates("hot", "coop", n), one, n)
        rows.append(Row(group, f"coop N={n}", "records/s", values, f"{n} x coop N=1", base))
    for n in hot_workers:
        values, base = paired(rates("hot", "keyrange", n), one)
        rows.append(Row(group, f"keyrange N={n}", "records/s", values, "coop N=1 (one consumer)", base))
    for n in hot_workers:
        values, base = paired(rates("hot", "coop", n), rates("hot", "keyrange", n))
        rows.append(Row(group, f"coop N={n}", "records/s", values, f"keyrange N={n}", base))
    # Standard consumers (librdkafka) on the striped virtual topic T.coopN, one stripe each
    group = "standard consumers on T.coopN (stripes), records/s"
    for n in workers:
        values, base = paired(rates("delivery", "striped", n), rates("delivery", "share", n))
        rows.append(Row(group, f"striped N={n}, no work", "records/s", values, f"share N={n}, no work", base))
    for n in workers:
        if n > 1:
            values, base = paired(rates("work", "striped", n), one, n)
            rows.append(Row(group, f"striped N={n}, 1 ms", "records/s", values, f"{n} x coop N=1", base))
    for n in workers:
        values, base = paired(rates("work", "striped", n), rates("work", "share", n))
        rows.append(Row(group, f"striped N={n}, 1 ms", "records/s", values, f"share N={n}, 1 ms", base))
    for n in hot_workers:
        values, base = paired(rates("hot", "striped", n), one, n)
        rows.append(Row(group, f"striped N={n}, hot key", "records/s", values, f"{n} x coop N=1", base))
    # The members spread over R instances, and the build that kept the grants in memory
    instances = sorted(r for r in set(args.instances) if r > 1)
    build = args.coop_build[0] if args.coop_build else None
    for case in SPREAD_CASES:
        group = f"proxy instances{' and builds' if build else ''}, {'no work' if case == 'delivery' else '1 ms per record'}, records/s"
        for n in workers:
            for r in instances:
                if r <= n:
                    values, base = paired(rates(case, f"coop x{r}", n), rates(case, "coop", n))
                    rows.append(Row(group, f"coop N={n}, {r} instances", "records/s", values,
                                    f"coop N={n}, 1 instance", base))
        if build:
            for n in workers:
                values, base = paired(rates(case, "coop", n), rates(case, build, n))
                rows.append(Row(group, f"coop N={n}, 1 instance", "records/s", values, f"{build} build N={n}", base))
            for n in workers:
                for r in instances:
                    if r <= n:
                        values, base = paired(rates(case, f"coop x{r}", n), rates(case, build, n))
                        rows.append(Row(group, f"coop N={n}, {r} instances", "records/s", values,
                                        f"{build} build N={n}", base))
    by = {(r.group, r.name, r.baseline): r for r in rows}

    def ratio(group_prefix: str, name: str, baseline: str) -> float | None:
        for (g, nm, b), row in by.items():
            if g.startswith(group_prefix) and nm == name and b == baseline and row.values:
                return row.ratio
        return None

    if 4 in workers:
        goals.append(goal(f"no work: coop N=4 >= {GOAL_DELIVERY:g} x share groups N=4",
                          ratio("no work", "coop N=4", "share N=4"), GOAL_DELIVERY))
    for n in workers:
        if n > 1:
            goals.append(goal(f"1 ms per record: coop N={n} >= {GOAL_WORK:g} x {n} x one consumer (coop N=1)",
                              ratio("1 ms", f"coop N={n}", f"{n} x coop N=1"), GOAL_WORK))
    for n in workers:
        goals.append(goal(f"1 ms per record: coop N={n} >= share groups N={n}",
                          ratio("1 ms", f"coop N={n}", f"share N={n}"), 1.0))
    for n in hot_workers:
        goals.append(goal(f"hot key: coop N={n} >= {GOAL_HOT:g} x {n} x one consumer",
                          ratio("hot key", f"coop N={n}", f"{n} x coop N=1"), GOAL_HOT))
    for n in hot_workers:
        goals.append(goal(f"hot key: keyrange N={n} <= {HOT_CAP:g} x one consumer (the premise: the hot key caps it)",
                          ratio("hot key", f"keyrange N={n}", "coop N=1 (one consumer)"), HOT_CAP, at_least=False))
    if 4 in workers:
        goals.append(goal(f"no work: standard consumers on T.coop4 (striped N=4) >= {GOAL_DELIVERY:g} x share groups N=4",
                          ratio("standard", "striped N=4, no work", "share N=4, no work"), GOAL_DELIVERY))
    for n in workers:
        if n > 1:
            goals.append(goal(f"1 ms per record: striped N={n} >= {GOAL_WORK:g} x {n} x one consumer (coop N=1)",
                              ratio("standard", f"striped N={n}, 1 ms", f"{n} x coop N=1"), GOAL_WORK))
            goals.append(goal(f"1 ms per record: striped N={n} >= share groups N={n}",
                              ratio("standard", f"striped N={n}, 1 ms", f"share N={n}, 1 ms"), 1.0))
    for n in hot_workers:
        goals.append(goal(f"hot key: striped N={n} >= {GOAL_HOT:g} x {n} x one consumer",
                          ratio("standard", f"striped N={n}, hot key", f"{n} x coop N=1"), GOAL_HOT))
    for case in SPREAD_CASES:
        what = "no work" if case == "delivery" else "1 ms per record"
        prefix = f"proxy instances{' and builds' if build else ''}, {what}"
        if build:
            for n in workers:
                goals.append(goal(f"{what}: coop N={n}, grants through the log, 1 instance >= {GOAL_BUILD:g} x the "
                                  f"{build} build", ratio(prefix, f"coop N={n}, 1 instance", f"{build} build N={n}"),
                                  GOAL_BUILD))
        for n in workers:
            for r in instances:
                if r <= n:
                    goals.append(goal(f"{what}: coop N={n} on {r} instances >= on 1",
                                      ratio(prefix, f"coop N={n}, {r} instances", f"coop N={n}, 1 instance"),
                                      GOAL_INSTANCES))
    if args.coop_cases or args.coop_contenders:  # what was left out measured nothing
        goals = [g for g in goals if g["measured"] is not None]
    goals.append(goal("runs that failed, stalled, missed an offset or did not commit to the log end", len(failures), 0,
                      at_least=False))
    # CPU per record over the middle of the coop runs (where the time goes)
    for case in ("delivery", "work"):
        for n in workers:
            for side in ("proxy", "consumers", "broker"):
                for contender in contenders(args, case, n):
                    if contender in ("share", "striped") or (contender != "coop" and side != "proxy"):
                        continue
                    values = [r["cpu"][f"{side}_us_per_record"] for r in runs
                              if (r["case"], r["contender"], r["n"]) == (case, contender, n) and r.get("cpu")]
                    label = "" if contender == "coop" else f", {_label(contender, build)}"
                    if values:
                        rows.append(Row(f"coop CPU per record, {'no work' if case == 'delivery' else '1 ms'} "
                                        f"(lower is better)", f"N={n}: {side}{label}", "us", values,
                                        higher_is_better=False))
    for case in SPREAD_CASES:
        for n in workers:
            for r in instances:
                if 1 < r <= n:
                    rows += _spread_rows(runs, case, n, r)
    report["rows"] = [row.as_dict() for row in rows if row.values]
    report["goals"] = goals
    report["runs"] = runs
    report["failures"] = failures
    duplicates = {}
    for r in runs:
        if "duplicates" in r:
            duplicates.setdefault(f"{r['case']} {r['contender']} N={r['n']}", []).append(r["duplicates"])
        elif "duplicates_at_least" in r:
            duplicates.setdefault(f"{r['case']} {r['contender']} N={r['n']}", []).append(r["duplicates_at_least"])
    report["duplicates"] = duplicates
    report["notes"].append(
        "Duplicates per run (coop, keyrange: handed out - distinct offsets; share: at least handed out - written): "
        + "; ".join(f"{k} {v}" for k, v in duplicates.items()) + ".")
    report["notes"].append(
        "Records/s is the rate between the moments 10 % and 90 % of a topic's records had been handed out "
        "(all members started together, the first fetches and the tail left out); every run drains its topic. "
        "The one consumer of the scaling goals is coop N=1 with 1 ms per record in the same round (the hot-key rows "
        "use it too: one consumer's rate does not depend on the keys).")
    report["notes"].append(
        "Everything shares 2 cores: the broker, the proxies (one per instance and build, each for the whole "
        "run; idle ones follow the grants log they served), N Python consumer "
        "processes or one share JVM. runs[].cpu has the cores each used over the middle of the run (proxy: "
        "each instance's process and its workers, summed over the instances the run went through) and the "
        "machine's busy share; runs[].proxy the proxy's coop counters, its range commits that met another "
        "instance's write and those that corrected the coordinator (commit_counters), and mean "
        "Fetch/OffsetCommit latency and that of an ask through the grants log (ask); "
        "runs[].workers the consumers' seconds in poll, work and commit_processed.")
    loop = []
    for case in CASES:
        for n in (hot_workers if case == "hot" else workers):
            shares = []
            for r in runs:
                w = r.get("workers")
                if (r["case"], r["contender"], r["n"]) == (case, "coop", n) and w:
                    busy = w["poll_s"] + w["commit_s"] + w["work_s"]
                    if busy:
                        shares.append((w["poll_s"] / busy, w["commit_s"] / busy, w["work_s"] / busy))
            if shares:
                poll, commit, work = (statistics.median(x[i] for x in shares) for i in range(3))
                loop.append(f"{case} N={n}: poll {poll:.0%}, commit_processed {commit:.0%}, work {work:.0%}")
    if loop:
        report["notes"].append("Where the coop consumers' loop spends its time (medians over rounds, summed over the "
                               "members; poll includes waiting for a chunk): " + "; ".join(loop) + ".")
    medians = {}
    for case in CASES:
        for n in (hot_workers if case == "hot" else workers):
            for contender in contenders(args, case, n):
                values = [v for v in rates(case, contender, n) if v is not None]
                if values:
                    medians[f"{case} {contender} N={n}"] = {"median": statistics.median(values),
                                                            "spread": [min(values), max(values)], "values": values}
    report["medians"] = medians


def _spread_rows(runs: list[dict], case: str, n: int, r: int) -> list[Row]:
    """What each of ``r`` instances spends (the busiest: the core one machine of a deployment
    must have), against one instance serving every member in the same round, and what
    reading ahead costs (broker bytes read per byte handed out)."""
    what = "no work" if case == "delivery" else "1 ms"

    def by_round(contender: str) -> dict[int, dict]:
        return {x["round"]: x for x in runs
                if (x["case"], x["contender"], x["n"]) == (case, contender, n) and x.get("cpu")}

    spread_runs = {k: x for k, x in by_round(f"coop x{r}").items() if x["cpu"].get("proxy_cores_each")}
    one = by_round("coop")
    paired = sorted(set(spread_runs) & set(one))
    out = []
    if paired:
        out.append(Row(f"proxy cores of the busiest instance, {what} (lower is better)",
                       f"coop N={n}, busiest of {r} instances", "cores",
                       [max(spread_runs[k]["cpu"]["proxy_cores_each"]) for k in paired], f"coop N={n}, 1 instance",
                       [one[k]["cpu"]["proxy_cores"] for k in paired], higher_is_better=False))
    counters = [x.get("proxy", {}).get("coop_counters", {}) for x in spread_runs.values()]
    amplification = [c["read_bytes"] / c["chunk_bytes"] for c in counters if c.get("read_bytes") and c.get("chunk_bytes")]
    if amplification:
        out.append(Row(f"broker bytes read per byte handed out, {what} (lower is better)",
                       f"coop N={n}, {r} instances", "x", amplification, higher_is_better=False))
    return out


def _label(contender: str, build: str | None) -> str:
    """How a row names a contender beside plain ``coop``: its instances, or its build."""
    return f"{build} build" if contender == build else f"{spread(contender)} instances"


BENCHMARK = Benchmark("coop", TITLE, method=METHOD, steps=steps, run=run, default=False)  # runs only when named
