"""Soak: mixed load through the proxy for a long stretch, its resource use sampled as it goes.

    .venv/bin/python -m benchmarks.bench_soak --minutes 30
    .venv/bin/python -m benchmarks.bench_soak --minutes 2      # checks the harness

A one-node Kafka and the proxy (its own process; ``metrics.port``,
``virtual.topics.enabled=true``, ``fetch.prediction.enabled=true``, and 1 MiB segments for
``__individual_commit_offsets`` (``--ic-segment-bytes``), so that the broker's compaction of
the log shows within the run) carry, for ``--minutes``:

- a producer (librdkafka, acks=all, idempotent, through the proxy) writing keyed records at
  ``--rate`` records/s in total, in turn to three topics;
- ``ranges``: 4 ``proxy.client.Consumer`` in assign mode, each one key-hash quarter of both
  partitions of ``soak-ranges``, individual commit once a second;
- ``plain``: one librdkafka consumer of ``soak-ranges`` through the proxy, whole partitions
  (the plain Fetch path, fetch prediction on);
- ``group``: 5 ``proxy.client.Consumer`` members of one group on the 3 partitions of
  ``soak-group`` (the keyrange assignor splits partitions), individual commit once a second;
- ``virtual``: 4 librdkafka consumers of one group on ``soak-virtual.kr4`` (2 partitions, 8
  virtual ones);
- churn, one action every ``--churn-seconds`` in turn: three range consumers of one group
  (a third of the hash space each) that read ``soak-ranges`` from the group's position to
  near the log end, commit individually and leave; a librdkafka consumer of
  ``soak-virtual.kr2`` that reads up to 2,000 records in one of three groups, commits and
  leaves; the same with a plain librdkafka consumer of ``soak-group`` (behind the log end,
  so fetch prediction works); a metadata lookup plus a few connections opened and closed without
  a request; one ``group`` member leaving and a new one joining.

Every ``--interval`` seconds (10) the sampler reads the proxy's metrics endpoint (RSS, open
fds, live trio tasks, key-range cache bytes, individual-commit ranges held, fetch prediction
bytes, connections, CPU seconds), the size of ``__individual_commit_offsets`` (the sum of
its partitions' end offsets by ListOffsets, and the bytes of its log segments in the
broker's log directory) and the records acknowledged and handed out per role.

Then the producer stops, every role reads to the end and commits; acknowledged records are
accounted for per role (bitmaps of offsets: every acknowledged record of the role's topic
must have been handed out; re-deliveries are counted, they are legal after a member left).
Growth per hour of RSS, fds and tasks is the least-squares slope over the samples of the
load phase after ``--warmup-minutes`` (default: 5, at most a quarter of the run), as a
percentage of their mean there; the max-min spread is reported beside it, and the same
slope over the second half of that window only (a leak keeps its slope there, the heap
reaching its high-water mark flattens out). The goal is RSS growth under 5 %/hour.

Writes ``benchmarks/results/soak.json`` and ``soak.png`` (the samples over time). Holds
``/tmp/keyrange-bench.lock`` while it runs, as ``python -m benchmarks`` does.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import random
import socket
import statistics
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from benchmarks import results
from benchmarks.benchmark import Benchmark
from benchmarks.lock import bench_lock
from benchmarks.rounds import Row, goal, settings_text

LOCK = Path("/tmp/keyrange-bench.lock")
LOG_TOPIC = "__individual_commit_offsets"
RANGES_TOPIC, GROUP_TOPIC, VIRTUAL_TOPIC = "soak-ranges", "soak-group", "soak-virtual"
PARTITIONS = {RANGES_TOPIC: 2, GROUP_TOPIC: 3, VIRTUAL_TOPIC: 2}
RANGE_MEMBERS, GROUP_MEMBERS, VIRTUAL_MEMBERS, SHARES = 4, 5, 4, 4
# role -> (topic it must read completely, the group whose commits must reach the log end)
ROLES = {"ranges": (RANGES_TOPIC, "soak-ranges-g"), "plain": (RANGES_TOPIC, "soak-plain-g"),
         "group": (GROUP_TOPIC, "soak-group-g"), "virtual": (VIRTUAL_TOPIC, "soak-virtual-g")}
KEYS = 5000
VALUE_BYTES = 120
VISIT_RECORDS = 2000  # a librdkafka churn visitor reads at most this many records
VISIT_SECONDS = 20.0  # a range visitor reads for at most this long
VISIT_NEAR_END = 200  # records behind the high watermark at which a range visitor is done
TICK = 0.02  # seconds between the producer's bursts
GOAL_PCT_PER_HOUR = 5.0
DRAIN_LIMIT = 180.0  # seconds for every role to hand out everything after the producer stopped
SETTLE_LIMIT = 90.0  # then for the commits to reach the log end
# what the sampler reads from the metrics endpoint: sample field -> metric
SCRAPED = {"rss_bytes": "process_resident_memory_bytes", "open_fds": "process_open_fds",
           "trio_tasks": "kafka_proxy_trio_tasks", "cache_bytes": "kafka_proxy_keyrange_cache_bytes",
           "ic_ranges_held": "kafka_proxy_individual_commit_ranges_held",
           "readahead_bytes": "kafka_proxy_fetch_prediction_bytes", "connections": "kafka_proxy_client_connections",
           "cpu_seconds": "process_cpu_seconds_total"}
GROWTH_FIELDS = {"rss_bytes": "RSS", "open_fds": "open fds", "trio_tasks": "trio tasks"}


# -- figures (pure) -----------------------------------------------------------------------------
def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys over xs (0 with fewer than two distinct xs)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def growth(samples: Sequence[dict], name: str, since: float, until: float) -> dict:
    """Growth of ``name`` over the samples with ``since <= t <= until``: the least-squares
    slope per hour, as a percentage of the mean over those samples, and the spread."""
    window = [s for s in samples if since <= s["t"] <= until and s.get(name) is not None]
    values = [float(s[name]) for s in window]
    if len(values) < 2:
        return {"samples": len(values), "mean": None, "per_hour": None, "pct_per_hour": None, "spread": None,
                "first": None, "last": None, "min": None, "max": None}
    per_hour = slope([s["t"] for s in window], values) * 3600
    mean = statistics.fmean(values)
    return {"samples": len(values), "mean": mean, "per_hour": per_hour,
            "pct_per_hour": per_hour / mean * 100 if mean else None, "spread": max(values) - min(values),
            "first": values[0], "last": values[-1], "min": min(values), "max": max(values)}


def parse_metrics(text: str) -> dict[str, float]:
    """Unlabelled samples of a Prometheus text page, by sample name."""
    from prometheus_client.parser import text_string_to_metric_families

    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if not sample.labels}


class Bits:
    """A growable set of non-negative integers (offsets) as a bitmap."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.count = 0

    def add(self, value: int) -> bool:
        """Add ``value``; False if it was there already."""
        index, bit = value >> 3, 1 << (value & 7)
        if index >= len(self.data):
            self.data.extend(bytes(max(index + 1 - len(self.data), len(self.data), 64)))
        if self.data[index] & bit:
            return False
        self.data[index] |= bit
        self.count += 1
        return True

    def as_int(self) -> int:
        return int.from_bytes(self.data, "little")

    def missing_from(self, other: Bits, examples: int = 0) -> tuple[int, list[int]]:
        """How many values of this set ``other`` lacks, and the first ``examples`` of them."""
        left = self.as_int() & ~other.as_int()
        found: list[int] = []
        if examples and left:
            for index, byte in enumerate(left.to_bytes((left.bit_length() + 7) // 8, "little")):
                found += [index * 8 + bit for bit in range(8) if byte >> bit & 1]
                if len(found) >= examples:
                    break
        return left.bit_count(), found[:examples]


class Ledger:
    """Records acknowledged per partition, and handed out per role: thread-safe."""

    def __init__(self) -> None:
        self.acked: dict[tuple[str, int], Bits] = {}
        self.delivered: dict[str, dict[tuple[str, int], Bits]] = {role: {} for role in ROLES}
        self.redelivered: Counter[str] = Counter()
        self.visited: Counter[str] = Counter()  # records the churn visitors read
        self.failed = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def ack(self, topic: str, partition: int, offset: int) -> None:
        with self._lock:
            self.acked.setdefault((topic, partition), Bits()).add(offset)

    def deliver(self, role: str, topic: str, partition: int, offset: int) -> None:
        with self._lock:
            if not self.delivered[role].setdefault((topic, partition), Bits()).add(offset):
                self.redelivered[role] += 1

    def acked_count(self, topic: str | None = None) -> int:
        return sum(bits.count for (t, _), bits in list(self.acked.items()) if topic in (None, t))

    def delivered_count(self, role: str) -> int:
        return sum(bits.count for bits in list(self.delivered[role].values()))

    def lost(self, role: str, examples: int = 0) -> dict[tuple[str, int], tuple[int, list[int]]]:
        """Per partition of the role's topic: how many acknowledged offsets it never handed
        out, and the first ``examples`` of them (partitions with none are left out)."""
        topic = ROLES[role][0]
        with self._lock:
            out = {}
            for tp, bits in self.acked.items():
                if tp[0] == topic:
                    count, found = bits.missing_from(self.delivered[role].get(tp, Bits()), examples)
                    if count:
                        out[tp] = (count, found)
        return out

    def missing(self, role: str) -> int:
        return sum(count for count, _ in self.lost(role).values())


# -- the load -----------------------------------------------------------------------------------
@dataclass
class Soak:
    bootstrap: str  # the proxy
    broker: str  # the broker, for the probes
    rate: float
    ledger: Ledger = field(default_factory=Ledger)
    stop_producer: threading.Event = field(default_factory=threading.Event)
    stop_consumers: threading.Event = field(default_factory=threading.Event)
    hard_deadline: float = 0.0  # time.monotonic(): nothing runs past it
    errors: list[str] = field(default_factory=list)
    churn_done: Counter[str] = field(default_factory=Counter)
    commit_refusals: Counter[str] = field(default_factory=Counter)  # librdkafka commits refused, by error

    def running(self, stop: threading.Event) -> bool:
        return not stop.is_set() and time.monotonic() < self.hard_deadline

    def error(self, where: str, exc: BaseException) -> None:
        if len(self.errors) < 50:
            self.errors.append(f"{time.strftime('%H:%M:%S')} {where}: {exc!r}")


def produce(soak: Soak) -> None:
    """Keyed records at ``soak.rate`` per second in total, topics in turn, paced in TICK bursts
    (deadlines from the start, so pauses do not add up)."""
    from confluent_kafka import Producer

    ledger = soak.ledger

    def delivered(err, msg) -> None:
        if err is not None:
            ledger.failed += 1
            if len(ledger.errors) < 20:
                ledger.errors.append(str(err))
        else:
            ledger.ack(msg.topic(), msg.partition(), msg.offset())

    producer = Producer({"bootstrap.servers": soak.bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, "message.timeout.ms": 120_000})
    rng = random.Random(7)
    topics = itertools.cycle(ROLES[r][0] for r in ("ranges", "group", "virtual"))
    padding = b"x" * VALUE_BYTES
    began = time.monotonic()
    sent = 0
    try:
        for tick in itertools.count(1):
            if not soak.running(soak.stop_producer):
                break
            due = int((time.monotonic() - began) * soak.rate)
            while sent < due:
                try:
                    producer.produce(next(topics), key=b"user-%d" % rng.randrange(KEYS), value=b"%d:" % sent + padding,
                                     on_delivery=delivered)
                except BufferError:
                    break  # the queue is full: the next tick goes on
                sent += 1
            producer.poll(0)
            soak.stop_producer.wait(max(0.0, began + tick * TICK - time.monotonic()))
    except Exception as exc:  # noqa: BLE001 - reported in the result
        soak.error("producer", exc)
    finally:
        ledger.failed += producer.flush(60)


def commit_rdkafka(soak: Soak, consumer) -> None:
    """A synchronous commit of what ``consumer`` handed out; one refused because a rebalance
    is under way is counted, not fatal (the next commit, or the revoke's, carries it)."""
    from confluent_kafka import KafkaException

    from harness.clients import commit_consumed

    try:
        commit_consumed(consumer)
    except KafkaException as exc:
        soak.commit_refusals[exc.args[0].name()] += 1


def rdkafka_member(soak: Soak, role: str, name: str, topic: str, group: str, shares: int,
                   stop: threading.Event) -> None:
    """A librdkafka group member: records handed out go to the role's ledger (a virtual
    partition v is share v % K of real partition v // K), commits at least once a second."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": soak.bootstrap, "group.id": group, "client.id": name,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "session.timeout.ms": 10000, "heartbeat.interval.ms": 1000, "fetch.wait.max.ms": 500})
    real = topic.split(".kr")[0]
    try:
        consumer.subscribe([topic], on_revoke=lambda c, _partitions: commit_rdkafka(soak, c))
        last_commit = time.monotonic()
        while soak.running(stop):
            messages = consumer.consume(500, 0.5)
            for message in messages:
                if message.error():
                    soak.error(name, RuntimeError(str(message.error())))
                    continue
                partition, offset = message.partition(), message.offset()
                if partition is not None and offset is not None:
                    soak.ledger.deliver(role, real, partition // shares, offset)
            if time.monotonic() - last_commit >= 1.0:
                commit_rdkafka(soak, consumer)
                last_commit = time.monotonic()
        commit_rdkafka(soak, consumer)
    except Exception as exc:  # noqa: BLE001 - reported in the result
        soak.error(name, exc)
    finally:
        consumer.close()


async def trio_member(soak: Soak, role: str, name: str, group: str, stop: trio.Event, *,
                      assign: dict | None = None, subscribe: list[str] | None = None) -> None:
    """A ``proxy.client.Consumer`` with individual commit: marks every record, commits once a
    second and when it leaves."""
    from proxy.client import Consumer, RetriableError

    try:
        async with Consumer(soak.bootstrap, group_id=group, client_id=name, allow_individual_commit=True,
                            auto_offset_reset="earliest", heartbeat_interval_ms=1000,
                            session_timeout_ms=10_000) as consumer:
            if assign is not None:
                consumer.assign(assign)
            else:
                consumer.subscribe(subscribe or [])
            last_commit = trio.current_time()
            while not stop.is_set() and not soak.stop_consumers.is_set() and time.monotonic() < soak.hard_deadline:
                records = await consumer.poll(0.5)
                for record in records:
                    soak.ledger.deliver(role, record.topic, record.partition, record.offset)
                consumer.mark_processed(*records)
                if trio.current_time() - last_commit >= 1.0:
                    last_commit = trio.current_time()
                    try:
                        await consumer.commit()
                    except RetriableError:
                        pass  # a rebalance is completing: the marks stay for the next commit
            with trio.move_on_after(10):
                for _ in range(5):
                    try:
                        await consumer.commit()
                        break
                    except RetriableError:
                        await trio.sleep(0.5)  # backoff before the next try, bounded by the loop
    except Exception as exc:  # noqa: BLE001 - reported in the result
        soak.error(name, exc)


# -- churn ----------------------------------------------------------------------------------------
def visit_rdkafka(soak: Soak, topic: str, group: str, shares: int) -> None:
    """A librdkafka consumer that joins ``group``, reads up to VISIT_RECORDS, commits and leaves."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": soak.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "session.timeout.ms": 10000, "fetch.wait.max.ms": 200})
    try:
        consumer.subscribe([topic])
        read = 0
        end = time.monotonic() + 10
        while read < VISIT_RECORDS and time.monotonic() < min(end, soak.hard_deadline):
            messages = consumer.consume(500, 0.5)
            read += sum(1 for m in messages if not m.error())
        soak.ledger.visited[topic] += read
        commit_rdkafka(soak, consumer)
    finally:
        consumer.close()


async def visit_ranges(soak: Soak, group: str) -> None:
    """Three range consumers of one group, a third of the hash space of soak-ranges each,
    read from the group's position until they are near the log end (or VISIT_SECONDS pass),
    committing individually after every poll, then leave. All three shares move together,
    so the group's stable offset follows them and the ranges held above it stay few."""
    from proxy.client import Consumer, TopicPartition, equal_shares

    partitions = [TopicPartition(RANGES_TOPIC, p) for p in range(PARTITIONS[RANGES_TOPIC])]

    async def share(index: int) -> None:
        async with Consumer(soak.bootstrap, group_id=group, client_id=f"visitor-{index}",
                            allow_individual_commit=True, auto_offset_reset="earliest") as consumer:
            consumer.assign({tp: [equal_shares(3)[index]] for tp in partitions})
            with trio.move_on_after(VISIT_SECONDS):
                while True:
                    records = await consumer.poll(0.5)
                    consumer.mark_processed(*records)
                    soak.ledger.visited[RANGES_TOPIC] += len(records)
                    await consumer.commit()
                    lags = [consumer.current_lag(tp) for tp in partitions]
                    if all(lag is not None and lag <= VISIT_NEAR_END for lag in lags):
                        break
            await consumer.commit()

    async with trio.open_nursery() as nursery:
        for index in range(3):
            nursery.start_soon(share, index)


def touch_connections(soak: Soak, host: str, port: int) -> None:
    """A metadata lookup through the proxy, and five connections closed without a request."""
    from confluent_kafka.admin import AdminClient

    AdminClient({"bootstrap.servers": soak.bootstrap}).list_topics(timeout=10)
    for _ in range(5):
        with socket.create_connection((host, port), timeout=5):
            pass


# -- sampling -------------------------------------------------------------------------------------
class Sampler:
    """One sample: the proxy's metrics page, psutil on the processes, the commit log's size."""

    def __init__(self, soak: Soak, metrics_url: str, proxy_pid: int, kafka_pid: int | None, data_dir: Path) -> None:
        import psutil
        from confluent_kafka import Consumer

        self.soak = soak
        self.metrics_url = metrics_url
        self.proxy_pid = proxy_pid
        self.kafka = psutil.Process(kafka_pid) if kafka_pid else None
        self.own = psutil.Process()
        self.data_dir = data_dir
        self.probe = Consumer({"bootstrap.servers": soak.broker, "group.id": "soak-sampler"})
        self.samples: list[dict] = []
        self._previous: dict[str, tuple[float, float]] = {}

    def _cpu_percent(self, name: str, now: float, seconds: float) -> float | None:
        before = self._previous.get(name)
        self._previous[name] = (now, seconds)
        if before is None or now <= before[0]:
            return None
        return round(100 * (seconds - before[1]) / (now - before[0]), 1)

    def log_end_offsets(self) -> int | None:
        from confluent_kafka import TopicPartition

        topics = self.probe.list_topics(LOG_TOPIC, timeout=5).topics
        meta = topics.get(LOG_TOPIC)
        if meta is None or meta.error is not None or not meta.partitions:
            return None
        return sum(self.probe.get_watermark_offsets(TopicPartition(LOG_TOPIC, p), timeout=5)[1]
                   for p in meta.partitions)

    def log_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.data_dir.glob(f"{LOG_TOPIC}-*/*.log"))

    def sample(self, t: float, phase: str) -> dict:
        from harness.processes import open_fds, rss_bytes

        now = time.monotonic()
        row: dict = {"t": round(t, 1), "phase": phase}
        try:
            page = parse_metrics(urllib.request.urlopen(self.metrics_url, timeout=5).read().decode())
        except OSError as exc:
            self.soak.error("sampler", exc)
            page = {}
        for name, metric in SCRAPED.items():
            row[name] = page.get(metric)
        if row["cpu_seconds"] is not None:
            row["proxy_cpu_pct"] = self._cpu_percent("proxy", now, row["cpu_seconds"])
        with contextlib.suppress(Exception):  # summed over the supervisor and its workers
            row["psutil_rss_bytes"] = rss_bytes(self.proxy_pid)
            row["psutil_fds"] = open_fds(self.proxy_pid)
        for name, process in (("kafka", self.kafka), ("harness", self.own)):
            if process is not None:
                with contextlib.suppress(Exception):
                    times = process.cpu_times()
                    row[f"{name}_cpu_pct"] = self._cpu_percent(name, now, times.user + times.system)
                    if name == "harness":
                        row["harness_rss_bytes"] = process.memory_info().rss
        try:
            row["ic_log_end_offsets"] = self.log_end_offsets()
        except Exception as exc:  # noqa: BLE001 - a missed reading, not a failed run
            self.soak.error("sampler", exc)
            row["ic_log_end_offsets"] = None
        row["ic_log_bytes"] = self.log_bytes()
        ledger = self.soak.ledger
        row["acknowledged"] = ledger.acked_count()
        row["failed"] = ledger.failed
        for role in ROLES:
            row[f"delivered_{role}"] = ledger.delivered_count(role)
        row["visited"] = sum(ledger.visited.values())
        self.samples.append(row)
        return row

    def close(self) -> None:
        self.probe.close()


def committed_behind(broker: str, group: str, topic: str) -> int:
    """Records between the group's committed offsets and the log end, over the topic's
    partitions, as the coordinator holds them."""
    from confluent_kafka import Consumer, TopicPartition

    probe = Consumer({"bootstrap.servers": broker, "group.id": group})
    try:
        parts = [TopicPartition(topic, p) for p in range(PARTITIONS[topic])]
        committed = probe.committed(parts, timeout=10)
        ends = [probe.get_watermark_offsets(tp, timeout=10)[1] for tp in parts]
    finally:
        probe.close()
    return sum(end - max(c.offset, 0) for c, end in zip(committed, ends))


# -- the run ----------------------------------------------------------------------------------------
def say(text: str) -> None:
    print(f"  {time.strftime('%H:%M:%S')} {text}", flush=True)


async def run_load(soak: Soak, sampler: Sampler, *, seconds: float, interval: float, churn_seconds: float,
                   proxy_host: str, proxy_port: int) -> dict:
    """The load for ``seconds``, sampled every ``interval``; then the drain. Returns timings."""
    from proxy.client import TopicPartition, equal_shares

    began = time.monotonic()
    threads: list[threading.Thread] = []
    phase = "load"
    timings: dict = {}

    def thread(target: Callable[..., None], *args) -> threading.Thread:
        handle = threading.Thread(target=target, args=args, daemon=True)
        handle.start()
        threads.append(handle)
        return handle

    async def sample_loop() -> None:
        tick = 0
        while time.monotonic() < soak.hard_deadline and phase != "stopped":
            row = await trio.to_thread.run_sync(sampler.sample, time.monotonic() - began, phase)
            if tick % 6 == 0 or phase != "load":
                rss = row.get("rss_bytes")
                say(f"t={row['t']:.0f}s {phase} rss={rss / 2**20 if rss else float('nan'):.1f} MiB "
                    f"fds={row.get('open_fds')} tasks={row.get('trio_tasks')} conns={row.get('connections')} "
                    f"cache={row.get('cache_bytes')} ic_held={row.get('ic_ranges_held')} "
                    f"ic_log={row.get('ic_log_end_offsets')}/{row.get('ic_log_bytes')}B "
                    f"cpu proxy={row.get('proxy_cpu_pct')}% kafka={row.get('kafka_cpu_pct')}% "
                    f"harness={row.get('harness_cpu_pct')}% acked={row['acknowledged']} "
                    + " ".join(f"{r}={row[f'delivered_{r}']}" for r in ROLES))
            tick += 1
            await trio.sleep(max(0.0, began + tick * interval - time.monotonic()))

    group_stops: dict[int, trio.Event] = {}

    async def churn(nursery: trio.Nursery) -> None:
        restarts = itertools.count(GROUP_MEMBERS)
        for n in itertools.count():
            await trio.sleep(max(0.0, began + (n + 1) * churn_seconds - time.monotonic()))
            if phase != "load":
                return
            kind = ("ranges", "virtual", "plain", "connections", "member")[n % 5]
            visitor = n // 5 % 3  # three groups per kind, visited in turn
            try:
                with trio.fail_after(60):
                    if kind == "ranges":
                        await visit_ranges(soak, "soak-visit-ranges")
                    elif kind == "virtual":
                        await trio.to_thread.run_sync(visit_rdkafka, soak, f"{VIRTUAL_TOPIC}.kr2",
                                                      f"soak-visit-virtual-{visitor}", 2)
                    elif kind == "plain":
                        await trio.to_thread.run_sync(visit_rdkafka, soak, GROUP_TOPIC,
                                                      f"soak-visit-plain-{visitor}", 1)
                    elif kind == "connections":
                        await trio.to_thread.run_sync(touch_connections, soak, proxy_host, proxy_port)
                    else:  # one member of the group leaves, a new one joins
                        leaving = min(group_stops)
                        group_stops.pop(leaving).set()
                        start_group_member(nursery, next(restarts))
                soak.churn_done[kind] += 1
            except Exception as exc:  # noqa: BLE001 - reported in the result
                soak.error(f"churn {kind}", exc)

    def start_group_member(nursery: trio.Nursery, index: int) -> None:
        stop = group_stops[index] = trio.Event()
        nursery.start_soon(functools.partial(trio_member, soak, "group", f"group-{index}", ROLES["group"][1], stop,
                                             subscribe=[GROUP_TOPIC]))

    async with trio.open_nursery() as nursery:
        never = trio.Event()
        for i in range(RANGE_MEMBERS):
            assign = {TopicPartition(RANGES_TOPIC, p): [equal_shares(RANGE_MEMBERS)[i]]
                      for p in range(PARTITIONS[RANGES_TOPIC])}
            nursery.start_soon(functools.partial(trio_member, soak, "ranges", f"ranges-{i}", ROLES["ranges"][1], never,
                                                 assign=assign))
        for i in range(GROUP_MEMBERS):
            start_group_member(nursery, i)
        thread(rdkafka_member, soak, "plain", "plain-0", RANGES_TOPIC, ROLES["plain"][1], 1, soak.stop_consumers)
        for i in range(VIRTUAL_MEMBERS):
            thread(rdkafka_member, soak, "virtual", f"virtual-{i}", f"{VIRTUAL_TOPIC}.kr{SHARES}",
                   ROLES["virtual"][1], SHARES, soak.stop_consumers)
        producer_thread = thread(produce, soak)
        nursery.start_soon(sample_loop)
        nursery.start_soon(churn, nursery)
        await trio.sleep(max(0.0, began + seconds - time.monotonic()))
        phase = "drain"
        timings["load_seconds"] = time.monotonic() - began
        say("load over: stopping the producer, waiting for every role to hand out everything")
        soak.stop_producer.set()
        await trio.to_thread.run_sync(producer_thread.join, 90)
        deadline = time.monotonic() + DRAIN_LIMIT
        while time.monotonic() < deadline and any(soak.ledger.missing(r) for r in ROLES):
            await trio.sleep(1.0)
        timings["drain_seconds"] = time.monotonic() - began - timings["load_seconds"]
        say(f"drained in {timings['drain_seconds']:.1f} s; waiting for the commits to reach the log end")
        deadline = time.monotonic() + SETTLE_LIMIT

        def settled() -> bool:
            return all(committed_behind(soak.broker, group, topic) == 0 for topic, group in ROLES.values())

        while time.monotonic() < deadline and not await trio.to_thread.run_sync(settled):
            await trio.sleep(1.0)
        soak.stop_consumers.set()
        for stop in group_stops.values():
            stop.set()
        phase = "stopped"
        nursery.cancel_scope.deadline = trio.current_time() + 30  # members commit and leave
    for handle in threads:
        await trio.to_thread.run_sync(handle.join, 30)
    timings["total_seconds"] = time.monotonic() - began
    return timings


def create_topics(broker: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker})
    futures = admin.create_topics([NewTopic(t, num_partitions=n, replication_factor=1) for t, n in PARTITIONS.items()])
    for future in futures.values():
        future.result(60)


def summarise(report: dict, samples: list[dict], ledger: Ledger, behind: dict[str, int], *, warmup: float,
              load_seconds: float, soak: Soak, proxy_log: str) -> None:
    load = [s for s in samples if s["phase"] == "load"]
    figures = {name: growth(load, name, warmup, load_seconds)
               for name in (*GROWTH_FIELDS, "cache_bytes", "ic_ranges_held", "ic_log_end_offsets", "ic_log_bytes",
                            "readahead_bytes", "connections", "harness_rss_bytes")}
    report["growth"] = figures
    # The same over the second half of that window only: a leak keeps its slope there, a
    # warm-up (the heap reaching its high-water mark) flattens out.
    middle = (warmup + load_seconds) / 2
    report["growth_second_half"] = {name: growth(load, name, middle, load_seconds) for name in GROWTH_FIELDS}
    cpu = {name: statistics.fmean(v) if (v := [s[name] for s in load if s.get(name) is not None]) else None
           for name in ("proxy_cpu_pct", "kafka_cpu_pct", "harness_cpu_pct")}
    report["cpu_mean_pct_of_a_core"] = {k: None if v is None else round(v, 1) for k, v in cpu.items()}
    accounting: dict[str, dict[str, Any]] = {}
    for role, (topic, group) in ROLES.items():
        lost = ledger.lost(role, examples=10)
        accounting[role] = {"topic": topic, "group": group, "acknowledged": ledger.acked_count(topic),
                            "delivered": ledger.delivered_count(role), "lost": sum(n for n, _ in lost.values()),
                            "lost_examples": {f"{t}-{p}": found for (t, p), (_, found) in lost.items()},
                            "redelivered": ledger.redelivered[role], "committed_behind_log_end": behind.get(role)}
    report["accounting"] = accounting
    report["producer_failed"] = ledger.failed
    report["producer_errors"] = ledger.errors[:10]
    report["errors"] = soak.errors
    report["proxy_log_warnings"] = [line[:300] for line in proxy_log.splitlines()
                                    if "level=warning" in line or "level=error" in line][:20]
    report["churn_actions"] = dict(soak.churn_done)
    report["librdkafka_commit_refusals"] = dict(soak.commit_refusals)
    report["visitor_records"] = dict(ledger.visited)
    report["samples"] = samples

    rows = []
    for name, label in GROWTH_FIELDS.items():
        g = figures[name]
        if g["pct_per_hour"] is not None:
            rows.append(Row("growth per hour after warm-up (% of mean)", label, "%/h", [round(g["pct_per_hour"], 3)],
                            note=f"mean {g['mean']:.4g}, spread (max-min) {g['spread']:.4g}, "
                                 f"{g['samples']} samples").as_dict())
    for which, sample in (("first", load[0] if load else {}), ("last", load[-1] if load else {})):
        for name, label, unit, scale in (("rss_bytes", "RSS", "MiB", 2**20), ("open_fds", "open fds", "", 1),
                                         ("trio_tasks", "trio tasks", "", 1),
                                         ("ic_log_bytes", "IC log on disk", "MiB", 2**20),
                                         ("ic_log_end_offsets", "IC log end offsets", "", 1)):
            if sample.get(name) is not None:
                rows.append(Row(f"proxy at the {which} sample of the load (t = {sample['t']:.0f} s)", label, unit,
                                [round(sample[name] / scale, 2)]).as_dict())
    for role, figures_of in accounting.items():
        rows.append(Row("records delivered / acknowledged", role, "x",
                        [figures_of["delivered"] / max(1, figures_of["acknowledged"])],
                        note=f"{figures_of['delivered']}/{figures_of['acknowledged']}, lost {figures_of['lost']}, "
                             f"re-delivered {figures_of['redelivered']}").as_dict())
    report["rows"] = rows
    goals = [goal("proxy RSS growth after warm-up (%/hour)", _rounded(figures["rss_bytes"]["pct_per_hour"]),
                  GOAL_PCT_PER_HOUR, at_least=False, unit="%/h")]
    for role, figures_of in accounting.items():
        goals.append(goal(f"{role}: acknowledged records never handed out", figures_of["lost"], 0, at_least=False))
        goals.append(goal(f"{role}: records committed behind the log end after the drain",
                          figures_of["committed_behind_log_end"], 0, at_least=False))
    goals.append(goal("records the producer gave up on", ledger.failed, 0, at_least=False))
    report["goals"] = goals
    proxy_cpu = cpu["proxy_cpu_pct"]
    report["notes"] += [
        f"Mean CPU over the load, % of one core: proxy {_fmt(proxy_cpu)}, Kafka {_fmt(cpu['kafka_cpu_pct'])}, "
        f"harness (producer and every consumer) {_fmt(cpu['harness_cpu_pct'])}.",
        f"Proxy log: {proxy_log.count('level=error')} error and {proxy_log.count('level=warning')} warning "
        f"lines, {proxy_log.count('Traceback')} tracebacks.",
    ]


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def chart(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = report["samples"]
    warmup = report["sizes"]["warm-up seconds"]
    load_end = max((s["t"] for s in samples if s["phase"] == "load"), default=0)
    minutes = [s["t"] / 60 for s in samples]
    panels = (("rss_bytes", "proxy RSS (MiB)", 2**20), ("open_fds", "open fds", 1), ("trio_tasks", "trio tasks", 1),
              ("cache_bytes", "key-range cache (KiB)", 1024), ("ic_log_bytes", "IC log on disk (MiB)", 2**20),
              ("ic_ranges_held", "IC ranges held", 1))
    figure, grid = plt.subplots(3, 2, figsize=(11, 8.5), sharex=True)
    for axes, (name, label, scale) in zip(grid.flat, panels):
        points = [(m, s[name] / scale) for m, s in zip(minutes, samples) if s.get(name) is not None]
        if points:
            axes.plot(*zip(*points), marker=".", markersize=3, linewidth=1)
        g = report["growth"].get(name)
        if g and g.get("per_hour") is not None and name in GROWTH_FIELDS:
            window = [s for s in samples if warmup <= s["t"] <= load_end and s.get(name) is not None]
            ts = [s["t"] for s in window]
            mean_t = statistics.fmean(ts)
            fit = [(g["mean"] + g["per_hour"] / 3600 * (t - mean_t)) / scale for t in ts]
            axes.plot([t / 60 for t in ts], fit, linestyle="--", color="black", linewidth=1,
                      label=f"fit: {g['pct_per_hour']:+.2f} %/h")
            axes.legend(fontsize=7, loc="lower right")
        if name == "ic_log_bytes":
            offsets = [(m, s["ic_log_end_offsets"]) for m, s in zip(minutes, samples)
                       if s.get("ic_log_end_offsets") is not None]
            if offsets:
                twin = axes.twinx()
                twin.plot(*zip(*offsets), color="tab:orange", linewidth=1)
                twin.set_ylabel("end offsets (sum)", fontsize=8, color="tab:orange")
                twin.tick_params(labelsize=7)
        axes.axvspan(0, warmup / 60, color="grey", alpha=0.15)
        axes.axvline(load_end / 60, color="grey", linestyle=":", linewidth=1)
        axes.set_ylabel(label, fontsize=8)
        axes.tick_params(labelsize=7)
        axes.set_ylim(bottom=0)
    for axes in grid[-1]:
        axes.set_xlabel("minutes (shaded: warm-up; dotted: end of the load, then the drain)", fontsize=8)
    common = settings_text(report.get("settings"))
    figure.suptitle(report["title"] + (f"\n(non-default: {common})" if common else ""), fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0, help="length of the load")
    parser.add_argument("--warmup-minutes", type=float, default=None,
                        help="samples left out of the growth figures (default: 5, at most a quarter of the run)")
    parser.add_argument("--rate", type=float, default=750.0, help="records/s written, all topics together")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--churn-seconds", type=float, default=10.0, help="seconds between churn actions")
    parser.add_argument("--ic-segment-bytes", type=int, default=1 << 20,
                        help="individual.commit.log.segment.bytes (the proxy's default is 10 MiB, which this load "
                             "fills in about an hour: the broker compacts only segments that have rolled)")
    parser.add_argument("--output-dir", type=Path, default=results.RESULTS)
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.rate <= 0 or args.interval <= 0 or args.churn_seconds <= 0:
        parser.error("--minutes, --rate, --interval and --churn-seconds must be positive")
    warmup = 60 * (args.warmup_minutes if args.warmup_minutes is not None else min(5.0, args.minutes / 4))
    seconds = args.minutes * 60
    command = " ".join([".venv/bin/python -m benchmarks.bench_soak", *(sys.argv[1:] if argv is None else argv)])

    from harness.kafka_cluster import KafkaCluster
    from proxy.local_kafka import ProxyProcess, scratch_dir

    report = results.new_report(
        "soak", f"Soak: {args.minutes:g} minutes of mixed load through the proxy, resource use every "
                f"{args.interval:g} s", command,
        f"One-node Kafka, the proxy as its own process (virtual topics and fetch prediction on). A librdkafka producer "
        f"(acks=all, idempotent) writes {args.rate:g} records/s through the proxy, in turn to {RANGES_TOPIC} "
        f"(2 partitions: 4 range consumers in assign mode with individual commit, and one plain librdkafka "
        f"consumer), {GROUP_TOPIC} (3 partitions: 5 group members of proxy.client.Consumer, ranges split) and "
        f"{VIRTUAL_TOPIC} (2 partitions: 4 librdkafka consumers of {VIRTUAL_TOPIC}.kr{SHARES}); every "
        f"{args.churn_seconds:g} s a churn action in turn (3 range consumers of one group catching up with the "
        f"log end; a virtual or a plain consumer reading up to {VISIT_RECORDS} records; connections opened and "
        f"closed; a group member replaced). Growth = least-squares "
        f"slope over the load's samples after the warm-up, per hour, as % of their mean.",
        {"minutes": args.minutes, "warm-up seconds": warmup, "rate": f"{args.rate:g} records/s",
         "value bytes": VALUE_BYTES, "keys": KEYS, "sample interval s": args.interval,
         "churn interval s": args.churn_seconds, "IC log segment bytes": args.ic_segment_bytes})
    # Off by default, on here so that the soak exercises them; small segments so the commit
    # log rolls and compacts within the run. Named in the report.
    report["settings"] = {"virtual.topics.enabled": "true", "fetch.prediction.enabled": "true",
                          "individual.commit.log.segment.bytes": str(args.ic_segment_bytes)}

    with bench_lock(say):
        workdir = scratch_dir("bench-soak-")
        say(f"starting Kafka and the proxy in {workdir}")
        with KafkaCluster.start(1, workdir=workdir / "kafka") as cluster:
            create_topics(cluster.bootstrap_servers)
            proxy = ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / "proxy",
                                       overrides={"metrics.port": "0", **report["settings"]})
            try:
                soak = Soak(proxy.bootstrap_servers, cluster.bootstrap_servers, args.rate)
                soak.hard_deadline = time.monotonic() + seconds + DRAIN_LIMIT + SETTLE_LIMIT + 300
                node = cluster.nodes[0]
                assert proxy.metrics_url is not None
                sampler = Sampler(soak, proxy.metrics_url, proxy.pid, node.pid, node.data_dir)
                try:
                    timings = trio.run(lambda: run_load(soak, sampler, seconds=seconds, interval=args.interval,
                                                        churn_seconds=args.churn_seconds, proxy_host="127.0.0.1",
                                                        proxy_port=proxy.port))
                finally:
                    sampler.close()
                behind = {role: committed_behind(cluster.bootstrap_servers, group, topic)
                          for role, (topic, group) in ROLES.items()}
            finally:
                proxy.stop()
            report["timings"] = {k: round(v, 1) for k, v in timings.items()}
            summarise(report, sampler.samples, soak.ledger, behind, warmup=warmup,
                      load_seconds=timings["load_seconds"], soak=soak, proxy_log=proxy.log_text())
    path = results.finish(report, args.output_dir)
    chart(report, args.output_dir / "soak.png")
    for g in report["goals"]:
        say(f"{'met   ' if g['met'] else 'MISSED'} {g['goal']}: {g['measured']}")
    for name, label in GROWTH_FIELDS.items():
        f, late = report["growth"][name], report["growth_second_half"][name]
        say(f"{label}: {f['first']} -> {f['last']}, {_fmt_pct(f['pct_per_hour'])} %/h "
            f"(second half {_fmt_pct(late['pct_per_hour'])} %/h), spread {f['spread']}")
    say(f"wrote {path} and {args.output_dir / 'soak.png'}")
    return 0 if all(g["met"] for g in report["goals"]) else 1


def _fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}"


BENCHMARK = Benchmark(
    "bench_soak", "Soak: mixed load through the proxy, its resource use sampled as it goes",
    main=main)


if __name__ == "__main__":
    sys.exit(main())
