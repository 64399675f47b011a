"""Workloads of unmodified Java clients (``benchmarks/java/streams``, built with Maven on
first use): plain KafkaConsumers in a group, on the real topic and on its virtual range
topic, and a Kafka Streams exactly-once application whose output is checked exactly.

Registered with ``chaos.workloads.register`` when this module is imported (``python -m
chaos`` imports it); the Java programs are built on the first cell that needs them.
"""

from __future__ import annotations

import math
import time
from collections import Counter

from chaos.verdict import Handed
from chaos.workloads import CellContext, Outcome, Workload, register
from harness import streams_app
from harness.streams_app import PlainConsumerProcess, StreamsFleet, real_partition


class JavaConsumers(Workload):
    """``count`` PlainConsumers (commitSync after each poll, positions committed when idle)
    in one group; a killed one is started again (a new launch: a new member)."""

    count = 2

    def __init__(self) -> None:
        self.consumers: list[PlainConsumerProcess] = []
        self.killed: dict[str, float] = {}

    def start(self, ctx: CellContext) -> None:
        streams_app.build()
        topic = self.topic_to_read(ctx)
        configs = {**streams_app.FAST_FAILOVER, "metadata.max.age.ms": "5000"}
        self.consumers = [PlainConsumerProcess(ctx.bootstrap, topic, ctx.group, workdir=ctx.tmp, name=f"c{i}",
                                               max_poll_records=50, configs=configs) for i in range(self.count)]
        for consumer in self.consumers:
            consumer.start()

    def _member(self, consumer: PlainConsumerProcess, launch: int | None = None) -> str:
        return f"{consumer.name}#{launch or consumer.launches}"

    def members(self) -> list[str]:
        return [self._member(c) for c in self.consumers if c.alive]

    def kill_member(self, name: str) -> None:
        consumer = next(c for c in self.consumers if self._member(c) == name)
        consumer.kill()
        self.killed[name] = time.monotonic()
        consumer.start()

    def _handed(self) -> list[Handed]:
        out = []
        for consumer in self.consumers:
            consumer.refresh()
            for r in consumer.records:
                _, partition = real_partition(r.topic, r.partition)
                at = r.time if r.time is not None else 0.0
                out.append(Handed(self._member(consumer, r.launch), partition, r.offset,
                                  None if r.key is None else r.key.encode(), at, at))
        return out

    def handed_count(self) -> int:
        return len({(h.partition, h.offset) for h in self._handed()})

    def check_running(self) -> None:
        for consumer in self.consumers:
            consumer.check_alive()

    def finish(self, timeout: float) -> Outcome:
        notes = []
        for consumer in self.consumers:
            code = consumer.stop(timeout)
            if code not in (0, None):
                notes.append(f"{consumer.name} exited with {code}: {consumer.stderr_tail(5)}")
        return Outcome(self._handed(), killed=dict(self.killed), lost_members=self._lost_members(), notes=notes)

    def _lost_members(self) -> dict[str, float]:
        """The launches that wrote a ``lost`` line: their partitions were taken away
        without a chance to commit (a session timeout, a fencing), so what they were
        handed comes again to the next owner. The time is not known on this clock (the
        line's is the JVM's elapsed milliseconds): NaN."""
        lost: dict[str, float] = {}
        for consumer in self.consumers:
            for launch in range(1, consumer.launches + 1):
                try:
                    lines = (consumer.workdir / f"{consumer.name}-{launch}.out").read_text(errors="replace")
                except FileNotFoundError:
                    continue
                if any(line.split("\t", 1)[0] == "lost" for line in lines.splitlines()):
                    lost[self._member(consumer, launch)] = math.nan
        return lost

    def close(self) -> None:
        for consumer in self.consumers:
            consumer.close()


class JavaPlain(JavaConsumers):
    name = "java-plain"
    description = "2 Java KafkaConsumers (kafka-clients 4.3) in a group on the real topic of 2 partitions"


class VirtualJava(JavaConsumers):
    name = "virtual-java"
    description = "3 Java KafkaConsumers in a group on T.kr4 of 2 partitions (8 virtual)"
    count = 3
    shares = 4


class StripedJava(JavaConsumers):
    name = "striped-java"
    description = "3 Java KafkaConsumers in a group on T.coop4 of 2 partitions (8 virtual): stripes, no key order"
    count = 3
    shares = 4
    striped = True
    keyed_order = False


class StreamsEos(Workload):
    """2 KeyCountApp instances (``exactly_once_v2``, record cache off, one RocksDB state
    directory each) on the real topic through the proxy. Nothing is handed out one record at
    a time: the verdict is the output, the last count of each key read with read_committed,
    against the acknowledged records of each key; a killed instance is started again on its
    state directory (its transactional ids with it)."""

    name = "streams-eos"
    description = ("Kafka Streams exactly_once_v2 (2 instances, per-key counts) on the real topic; output "
                   "checked exactly")
    keyed_order = False
    commits = True
    exactly_once = True
    instances = 2

    def __init__(self) -> None:
        self.fleet: StreamsFleet | None = None
        self.killed: dict[str, float] = {}
        self.output = ""
        self.direct = ""

    def start(self, ctx: CellContext) -> None:
        streams_app.build()
        self.output = f"{ctx.topic}-counts"
        self.direct = ctx.direct
        # the application's group is the cell's, so the runner's committed-offset check applies
        self.fleet = StreamsFleet(self.instances, bootstrap=ctx.bootstrap, input_topic=ctx.topic,
                                  output_topic=self.output, workdir=ctx.tmp, application_id=ctx.group,
                                  replication_factor=3, cache_max_bytes=0, configs=streams_app.FAST_FAILOVER)
        self.fleet.start()
        self.fleet.wait_running(120)

    def members(self) -> list[str]:
        assert self.fleet is not None
        return [i.name for i in self.fleet if i.alive]

    def kill_member(self, name: str) -> None:
        assert self.fleet is not None
        instance = next(i for i in self.fleet if i.name == name)
        instance.kill()
        self.killed[f"{name}#{instance.launches}"] = time.monotonic()
        instance.start()

    def handed_count(self) -> int:
        """Input records counted, as the application's output says (one read of it)."""
        return sum(streams_app.read_counts(self.direct, self.output, timeout=20).values())

    def check_running(self) -> None:
        assert self.fleet is not None
        self.fleet.check_alive()

    def finish(self, timeout: float) -> Outcome:
        assert self.fleet is not None
        codes = self.fleet.stop(timeout)
        notes = [f"{i.name} exited with {code}" for i, code in zip(self.fleet, codes) if code not in (0, None)]
        return Outcome([], killed=dict(self.killed), notes=notes)

    def exact(self, acked_keys: Counter[bytes]) -> dict:
        """The output against the acknowledged input, key by key."""
        counts = streams_app.read_counts(self.direct, self.output, timeout=30)
        expected = {key.decode(): n for key, n in acked_keys.items()}
        under = {k: (counts.get(k, 0), n) for k, n in expected.items() if counts.get(k, 0) < n}
        over = {k: (counts[k], expected.get(k, 0)) for k in counts if counts[k] > expected.get(k, 0)}
        return {"keys": len(expected), "exact": not under and not over, "under": len(under), "over": len(over),
                "records_expected": sum(expected.values()), "records_counted": sum(counts.values()),
                "examples": [f"{k}: {got} for {want}" for k, (got, want) in list({**under, **over}.items())[:5]]}

    def close(self) -> None:
        if self.fleet is not None:
            self.fleet.close()


for _workload in (JavaPlain, VirtualJava, StripedJava, StreamsEos):
    register(_workload, _workload.name)
