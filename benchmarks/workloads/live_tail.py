"""Live tail: consumers read while the records are written, and every record is accounted for.

A throughput figure measured on a log written beforehand says nothing of the live tail,
where two consumers of one partition read the same offset at different moments and get
different data, and where consumers reach the log end and leave it again. This workload
writes keyed records at a steady rate in small bursts with idle gaps (``harness.live``,
acks=all, idempotent, the same seeded schedule for every contender of a round) into a
fresh one-partition topic per run, from the moment every member of the contender holds
its partitions, while the contender reads it:

- ``direct``: one librdkafka consumer of a classic group on the broker (the baseline);
- ``ranges_assign``: 4 ``proxy.client.Consumer`` in assign mode, equal key-hash shares,
  individual commit after every poll, through the proxy;
- ``ranges_group``: 4 ``proxy.client.Consumer`` members of one group (the keyrange
  assignor splits the partition), individual commit after every poll;
- ``virtual``: 4 librdkafka consumers of one group on ``T.kr4`` through the proxy, a commit
  after every batch.

Each run's recorded history (``harness.history``) gives records acknowledged and
processed, lost, re-delivered and per-key order violations; the end-to-end latency of a
record is the time it was handed out minus its CreateTime, and the drain time is how long
after the producer's schedule ended the last record was handed out. Every contender
commits; its group's committed offset at the coordinator must reach the log end.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid

import trio

from benchmarks.benchmark import Benchmark, Progress
from benchmarks.rounds import Row, goal, rotation
from harness import java_tools
from harness.clients import commit_consumed
from harness.history import History, check
from harness.kafka_cluster import KafkaCluster
from harness.live import LiveProducer
from proxy.local_kafka import ProxyProcess, scratch_dir

CONTENDERS = ("direct", "ranges_assign", "ranges_group", "virtual")
MEMBERS = 4
DRAIN_LIMIT = 60.0
READY_LIMIT = 60.0  # seconds for every member to hold its partitions before the writing starts


class Run:
    """What one contender's consumers record: the history, and each delivery's latency."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.history = History()
        self.latencies_ms: list[float] = []
        self.last_delivery = 0.0

    def deliver(self, member: str, partition: int, offset: int, key: bytes | None, timestamp_ms: int) -> None:
        now = time.time()
        self.history.deliver(member, self.topic, partition, offset, key)
        self.latencies_ms.append(now * 1000 - timestamp_ms)
        self.last_delivery = time.monotonic()

    def complete(self, producer: LiveProducer) -> bool:
        return producer.done and self.history.missing() == 0


def _trio_members(run: Run, producer: LiveProducer, bootstrap: str, group: str, settled, *,
                  subscribe: bool) -> None:
    from proxy.client import Consumer, RetriableError, TopicPartition, equal_shares

    stop = trio.Event()
    ready: set[int] = set()

    async def member(i: int) -> None:
        async with Consumer(bootstrap, group_id=group, client_id=f"m{i}", allow_individual_commit=True,
                            auto_offset_reset="earliest", heartbeat_interval_ms=500,
                            session_timeout_ms=10_000) as consumer:
            if subscribe:
                consumer.subscribe([run.topic])
            else:
                consumer.assign({TopicPartition(run.topic, 0): [equal_shares(MEMBERS)[i]]})
            while not stop.is_set():
                records = await consumer.poll(0.2)
                if consumer.assignment():
                    ready.add(i)
                for record in records:
                    run.deliver(f"m{i}", record.partition, record.offset, record.key, record.timestamp)
                    consumer.mark_processed(record)
                try:
                    await consumer.commit()
                except RetriableError:
                    pass  # a rebalance is completing: the marks stay for the next commit

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for i in range(MEMBERS):
                nursery.start_soon(member, i)
            with trio.move_on_after(READY_LIMIT):
                while len(ready) < MEMBERS:
                    await trio.sleep(0.05)
            producer.start()
            deadline = trio.current_time() + producer.seconds + DRAIN_LIMIT
            while trio.current_time() < deadline and not run.complete(producer):
                await trio.sleep(0.05)
            # then until the commits reach the log end, the members still committing
            while trio.current_time() < deadline + 30 and not await trio.to_thread.run_sync(settled):
                await trio.sleep(0.5)
            stop.set()

    trio.run(main)


def _librdkafka_members(run: Run, producer: LiveProducer, bootstrap: str, group: str, topic: str,
                        members: int, shares: int, settled) -> None:
    from confluent_kafka import Consumer

    stop = threading.Event()
    errors: list[str] = []
    ready: set[int] = set()

    def member(index: int) -> None:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                             "enable.auto.commit": False, "session.timeout.ms": 10000,
                             "heartbeat.interval.ms": 500, "fetch.wait.max.ms": 100})
        consumer.subscribe([topic], on_revoke=lambda c, _partitions: commit_consumed(c))
        last_commit = time.monotonic()
        try:
            while not stop.is_set():
                # the first message as soon as one is there, then only what is queued already
                # (consume(n, timeout) would wait for n messages or the timeout: added latency)
                first = consumer.poll(0.2)
                messages = [] if first is None else [first, *consumer.consume(499, 0)]
                if consumer.assignment():
                    ready.add(index)
                for message in messages:
                    if message.error():
                        errors.append(str(message.error()))
                        continue
                    run.deliver(f"m{index}", message.partition() // shares, message.offset(), message.key(),
                                message.timestamp()[1])
                if messages or time.monotonic() - last_commit > 1.0:
                    # also when idle: positions moved past other shares' records are committed too
                    commit_consumed(consumer)
                    last_commit = time.monotonic()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            consumer.close()

    threads = [threading.Thread(target=member, args=(i,), daemon=True) for i in range(members)]
    for thread in threads:
        thread.start()
    limit = time.monotonic() + READY_LIMIT
    while len(ready) < members and time.monotonic() < limit:
        time.sleep(0.05)
    producer.start()
    deadline = time.monotonic() + producer.seconds + DRAIN_LIMIT
    while time.monotonic() < deadline and not run.complete(producer):
        time.sleep(0.05)
    while time.monotonic() < deadline + 30 and not settled():
        time.sleep(0.5)
    stop.set()
    for thread in threads:
        thread.join(30)
    if errors:
        raise RuntimeError(f"librdkafka members failed: {errors[:3]}")


def _committed_behind(bootstrap: str, group: str, topic: str) -> int:
    """Records between the group's committed offset and the log end (at the coordinator)."""
    from confluent_kafka import Consumer, TopicPartition

    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        committed = probe.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
        end = probe.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        probe.close()
    return end - max(committed, 0)


def measure(contender: str, cluster: KafkaCluster, proxy: ProxyProcess, *, records: int, seconds: float,
            seed: int, keys: int) -> dict:
    topic = f"live-{contender}-{uuid.uuid4().hex[:6]}"
    group = f"g-{topic}"
    java_tools.create_topic(cluster.bootstrap_servers, topic, partitions=1)
    run = Run(topic)
    producer = LiveProducer(proxy.bootstrap_servers, topic, run.history, records=records, seconds=seconds,
                            seed=seed, keys=keys, config={"linger.ms": 2})
    def settled() -> bool:
        return _committed_behind(cluster.bootstrap_servers, group, topic) == 0

    began = time.monotonic()
    if contender == "direct":
        _librdkafka_members(run, producer, cluster.bootstrap_servers, group, topic, 1, 1, settled)
    elif contender == "virtual":
        _librdkafka_members(run, producer, proxy.bootstrap_servers, group, f"{topic}.kr{MEMBERS}", MEMBERS, MEMBERS,
                            settled)
    else:
        _trio_members(run, producer, proxy.bootstrap_servers, group, settled, subscribe=contender == "ranges_group")
    producer.join()
    produced_until = began + producer.seconds
    behind = _committed_behind(cluster.bootstrap_servers, group, topic)
    verdict = check(run.history)
    latencies = sorted(run.latencies_ms)
    return {
        "contender": contender, "topic": topic, "acknowledged": verdict.acknowledged, "processed": verdict.delivered,
        "lost": len(verdict.lost), "redelivered": verdict.redelivered,
        "order_violations": len(verdict.order_violations), "producer_failed": producer.failed,
        "latency_ms_p50": round(_quantile(latencies, 0.50), 1), "latency_ms_p99": round(_quantile(latencies, 0.99), 1),
        "drain_s": round(max(0.0, run.last_delivery - produced_until), 3),
        "committed_behind_log_end": behind, "summary": verdict.summary() if not verdict.ok() else "",
    }


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


def steps(args) -> int:
    return 1 + args.rounds * len(CONTENDERS)


# The virtual-topic contender needs them, off by default: every proxy of the run has them on, and
# the report says so.
SETTINGS = {"virtual.topics.enabled": "true"}


def run(report: dict, progress, *, rounds: int, records: int, seconds: float, keys: int = 2_000) -> None:
    report["settings"] = dict(SETTINGS)
    report["sizes"] = {"records per run": records, "seconds of writing": seconds,
                       "rate": f"{records / seconds:,.0f} records/s", "keys": keys, "members": MEMBERS,
                       "rounds": rounds}
    workdir = scratch_dir("bench-live-tail-")
    progress.step("starting Kafka and the proxy")
    runs: dict[str, list[dict]] = {c: [] for c in CONTENDERS}
    with KafkaCluster.start(1, workdir=workdir / "kafka") as cluster:
        proxy = ProxyProcess.start(cluster.bootstrap_servers, overrides=SETTINGS, workdir=workdir / "proxy")
        try:
            for number in range(rounds):
                for contender in rotation(CONTENDERS, number):
                    progress.step(f"round {number + 1}/{rounds}: {contender}")
                    runs[contender].append(measure(contender, cluster, proxy, records=records, seconds=seconds,
                                                   seed=100 + number, keys=keys))
        finally:
            proxy.stop()

    def values(contender: str, field: str) -> list[float]:
        return [float(r[field]) for r in runs[contender]]

    rows = []
    for contender in CONTENDERS[1:]:
        counts = [f"{r['processed']}/{r['acknowledged']}" for r in runs[contender]]
        rows.append(Row("records processed / acknowledged", contender, "x",
                        [r["processed"] / max(1, r["acknowledged"]) for r in runs[contender]], "direct",
                        [r["processed"] / max(1, r["acknowledged"]) for r in runs["direct"]],
                        note=f"per round: {counts}; lost {[r['lost'] for r in runs[contender]]}; "
                             f"re-delivered {[r['redelivered'] for r in runs[contender]]}"))
    for field, label in (("latency_ms_p50", "end-to-end latency p50"), ("latency_ms_p99", "end-to-end latency p99")):
        for contender in CONTENDERS[1:]:
            rows.append(Row(f"{label} (lower is better)", contender, "ms", values(contender, field), "direct",
                            values("direct", field), higher_is_better=False))
    report["rows"] = [row.as_dict() for row in rows]
    goals = []
    for contender in CONTENDERS:
        goals.append(goal(f"{contender}: acknowledged records never handed out",
                          sum(r["lost"] for r in runs[contender]), 0, at_least=False))
        goals.append(goal(f"{contender}: per-key order violations",
                          sum(r["order_violations"] for r in runs[contender]), 0, at_least=False))
        goals.append(goal(f"{contender}: records committed behind the log end after the drain",
                          max(r["committed_behind_log_end"] for r in runs[contender]), 0, at_least=False))
    report["goals"] = goals
    report["runs"] = runs
    report["notes"].append(
        "Every contender reads a fresh one-partition topic while the same seeded schedule writes it; "
        "median drain after the last write (s): "
        + ", ".join(f"{c} {statistics.median(values(c, 'drain_s')):.2f}" for c in CONTENDERS) + ".")


def _from_args(report: dict, progress: Progress, args: argparse.Namespace) -> None:
    run(report, progress, rounds=args.rounds, records=args.live_records, seconds=args.live_seconds)


BENCHMARK = Benchmark(
    "live_tail", "Live tail: key-range, group and virtual-topic consumers read while records are written",
    method="A fresh one-partition topic per run, written at a steady rate in small bursts with idle gaps "
           "(acks=all, idempotent, one seeded schedule per round) while the contender reads it: one direct "
           "librdkafka consumer (baseline), 4 range consumers in assign mode, 4 group members splitting the "
           "partition, 4 librdkafka consumers of T.kr4. Every acknowledged record is accounted for; latency is "
           "hand-out time minus CreateTime.",
    steps=lambda args: 1 + args.rounds * 4, run=_from_args, default=True)
