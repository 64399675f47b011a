"""Live production with real network faults between the consumers and the proxy.

Group members (``proxy.client.Consumer``) reach the proxy only through Toxiproxy
(consumer -> Toxiproxy -> proxy -> broker). While a producer writes, a seeded schedule
delays their bytes (latency with jitter), resets their connections, swallows everything
for longer than their request timeout (a blackhole), refuses connections for a moment (the
link disabled, then enabled), and cuts the members off for longer than their session
timeout (a partition: the coordinator drops them, and they find out and rejoin when it
heals); seeded extras slow the link down, cut its streams into small pieces or close its
connections after a few kilobytes. The
producer writes straight to the broker, never through the faulty link, so its
acknowledgements are the truth the consumers are held to.

The proxy runs as a sidecar whose node address (``sidecar.node.addresses``) is the
Toxiproxy port: every broker address the proxy hands out (Metadata, FindCoordinator)
leads back through the faulty link, so no connection made after the bootstrap bypasses it.

Once the producer is done and the faults have stopped, ``harness.history`` judges the
run: no acknowledged record lost, none handed out that was never acknowledged, and the
group's committed offsets at the log end. A record handed out twice is at-least-once
re-delivery, legal only when the faults made the group rebalance or cost a member its
partitions or its life (a member that dies is recreated, and logged); the counts are in
every assertion message. Order violations are computed on first deliveries; one whose
records were re-delivered, or were handed out by a member that was later lost or died, is
re-delivery's doing (such a member may hand out what it still had buffered while the new
owner starts again from the group's committed state) and tolerated; any other fails.
"""

from __future__ import annotations

import logging
import os
import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio

from harness.history import History
from harness.live import LiveProducer
from harness.toxiproxy import Proxy, Toxic, ToxiproxyServer
from harness.wait import wait_until
from proxy.client import Consumer, RetriableError
from proxy.client.errors import ConsumerConnectionError
from proxy.local_kafka import ProxyProcess, metadata_brokers
from tests.integration.test_live_tail import _at_log_end, _until, _verdict

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]
log = logging.getLogger(__name__)

RECORDS = 2000
SECONDS = 30.0  # the producer's schedule
FAULT_BUDGET = 36.0  # seconds of fault schedule; the required faults always run
MAX_FAULTS = 9
REQUEST_TIMEOUT_MS = 3000
SESSION_TIMEOUT_MS = 10_000
SETTLE_TIMEOUT = 30.0
DEADLINE = 45.0  # for every acknowledged record to be handed out once producer and faults are done
CONSUMER_SETTINGS: dict[str, Any] = {
    "auto_offset_reset": "earliest", "allow_individual_commit": True, "max_poll_records": 50,
    "heartbeat_interval_ms": 500, "session_timeout_ms": SESSION_TIMEOUT_MS, "request_timeout_ms": REQUEST_TIMEOUT_MS,
    # a rebalance waits for members for at most this long (the rebalance timeout)
    "max_poll_interval_ms": 30_000,
}
# What the consumer may raise while the link is broken, retried by the application: its
# retriable errors (NetworkExceptionError when commit() finds no connection), and
# ConsumerConnectionError when no bootstrap server answers at start.
TOLERATED = (RetriableError, ConsumerConnectionError)
RECREATE_BACKOFF = 0.2  # before a new member replaces one that died (not a synchronisation)


# -- the faulty path ------------------------------------------------------------------------

@pytest.fixture
def faulty_proxy(kafka, proxy_factory, toxiproxy: ToxiproxyServer, request) -> Iterator[tuple[Proxy, ProxyProcess]]:
    """A sidecar proxy in front of ``kafka`` reached only through a Toxiproxy link.

    Each must know the other's port: the proxy advertises the link's port for its node, and
    the link relays to the proxy's. The link is made first (its port is fixed from then on)
    with an upstream nobody listens on, and pointed at the proxy once the proxy is up."""
    toxiproxy.reset()
    name = "kr-" + "".join(c if c.isalnum() else "-" for c in request.node.name)[-60:]
    link = toxiproxy.create_proxy(name, upstream=("127.0.0.1", 9))
    try:
        nodes = ",".join(f"{node.node_id}@{link.address}" for node in kafka.nodes)
        proxy = proxy_factory(kafka, topology="sidecar", sidecar_node_addresses=nodes)
        link.set_upstream(("127.0.0.1", proxy.port))
        brokers, _ = wait_until(lambda: metadata_brokers(*link.listen), timeout=30,
                                what="Metadata through the Toxiproxy link")
        assert brokers == {node.node_id: link.listen for node in kafka.nodes}, (
            f"the proxy advertises {brokers}, not the link {link.address}: clients would bypass the faults")
        yield link, proxy
        proxy.stop(timeout=10)
    finally:
        link.delete()


# -- the fault schedule -----------------------------------------------------------------------

@dataclass(frozen=True)
class Fault:
    kind: str  # one of REQUIRED or EXTRA
    gap: float  # seconds of calm before it
    duration: float
    stream: str = "both"
    attributes: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        detail = " ".join(f"{k}={v}" for k, v in self.attributes.items())
        return f"{self.kind}[{self.stream}{' ' + detail if detail else ''}] {self.duration:.1f}s"


REQUIRED = ("latency", "reset", "blackhole", "refusal", "partition")
EXTRA = ("latency", "reset", "refusal", "blackhole", "slicer", "slow", "cut")


def _fault(rng: random.Random, kind: str) -> Fault:
    gap = rng.uniform(0.5, 2.0)
    if kind == "latency":
        latency = rng.randrange(50, 300)
        return Fault(kind, gap, rng.uniform(1.5, 3.0), rng.choice(("downstream", "upstream", "both")),
                     {"latency": latency, "jitter": rng.randrange(0, latency // 2 + 1)})
    if kind == "reset":
        return Fault(kind, gap, rng.uniform(0.5, 1.5), rng.choice(("downstream", "upstream")),
                     {"timeout": rng.randrange(0, 300)})
    if kind == "blackhole":  # longer than a request may take, well within a session
        return Fault(kind, gap, REQUEST_TIMEOUT_MS / 1000 + rng.uniform(1.0, 2.5),
                     rng.choice(("both", "downstream", "upstream")), {"timeout": 0})
    if kind == "partition":  # longer than a session: the coordinator drops every member
        return Fault(kind, gap, SESSION_TIMEOUT_MS / 1000 + rng.uniform(2.0, 3.0), "both", {"timeout": 0})
    if kind == "refusal":
        return Fault(kind, gap, rng.uniform(0.5, 1.5))
    if kind == "slicer":
        return Fault(kind, gap, rng.uniform(1.0, 2.0), "both",
                     {"average_size": rng.randrange(8, 64), "size_variation": 4, "delay": rng.randrange(0, 200)})
    if kind == "slow":
        return Fault(kind, gap, rng.uniform(1.0, 2.5), rng.choice(("downstream", "both")),
                     {"rate": rng.randrange(8, 64)})
    if kind == "cut":  # every connection closed after a few kilobytes
        return Fault(kind, gap, rng.uniform(0.5, 1.5), rng.choice(("downstream", "upstream")),
                     {"bytes": rng.randrange(512, 16384)})
    raise ValueError(kind)


def fault_schedule(seed: int, budget: float = FAULT_BUDGET) -> list[Fault]:
    """Each required fault once in a seeded order, then seeded extras while the budget lasts."""
    rng = random.Random(seed)
    kinds = list(REQUIRED)
    rng.shuffle(kinds)
    faults = [_fault(rng, kind) for kind in kinds]
    used = sum(f.gap + f.duration for f in faults)
    while len(faults) < MAX_FAULTS:
        extra = _fault(rng, rng.choice(EXTRA))
        if used + extra.gap + extra.duration > budget:
            break
        faults.append(extra)
        used += extra.gap + extra.duration
    return faults


TOXIC_TYPES = {"latency": "latency", "reset": "reset_peer", "blackhole": "timeout", "partition": "timeout",
               "slicer": "slicer", "slow": "bandwidth", "cut": "limit_data"}


async def inject(link: Proxy, faults: list[Fault], timeline: list[str], began: float) -> None:
    """Run the schedule on ``link``; every fault is undone after its duration, also when
    the test is cancelled meanwhile."""
    for fault in faults:
        await trio.sleep(fault.gap)
        start = trio.current_time() - began
        placed: list[Toxic] = []
        try:
            if fault.kind == "refusal":
                await trio.to_thread.run_sync(link.disable)
            else:
                placed = await trio.to_thread.run_sync(
                    lambda f=fault: link.add_toxic(TOXIC_TYPES[f.kind], f.attributes, stream=f.stream))
            await trio.sleep(fault.duration)
        finally:
            with trio.CancelScope(shield=True):
                if fault.kind == "refusal":
                    await trio.to_thread.run_sync(link.enable)
                for toxic in placed:
                    await trio.to_thread.run_sync(toxic.remove)
        timeline.append(f"{start:.1f}-{trio.current_time() - began:.1f}s {fault.describe()}")


# -- the members ----------------------------------------------------------------------------

@dataclass
class Members:
    """What the group's members went through, for the verdict and its message."""

    live: dict[int, Consumer] = field(default_factory=dict)
    tolerated: Counter[str] = field(default_factory=Counter)  # "commit RequestTimedOutError" -> times
    start_failures: Counter[str] = field(default_factory=Counter)
    deaths: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    tainted: set[str] = field(default_factory=set)  # members that died or lost partitions
    metrics: Counter[str] = field(default_factory=Counter)  # summed over finished members

    def settled(self, expected: int) -> bool:
        """Every member in, one generation, each holding a share and revoking nothing."""
        consumers = list(self.live.values())
        if len(consumers) < expected:
            return False
        generations = {c.group_metadata().get("generation") for c in consumers}
        return len(generations) == 1 and all(c.assignment() and not c.to_be_revoked() for c in consumers)

    def generation(self) -> int:
        return max((int(c.group_metadata().get("generation") or -1) for c in self.live.values()), default=-1)

    def report(self) -> str:
        keep = ("reconnects", "retriable_errors", "partitions_lost", "revocations", "records_already_committed")
        return (f"deaths {self.deaths or 'none'}; lost {self.lost or 'none'}; tolerated errors "
                f"{dict(self.tolerated) or 'none'}; failed starts {dict(self.start_failures) or 'none'}; "
                f"consumer metrics {({k: self.metrics[k] for k in keep})}")


async def member(index: int, address: str, group: str, topic: str, history: History, members: Members,
                 stop: trio.Event, began: float) -> None:
    """A group member that records what it hands out, marks and commits after every poll,
    goes on through retriable failures, and is replaced by a new one if it dies."""
    incarnation = 0
    while not stop.is_set():
        name = f"m{index}.{incarnation}"
        incarnation += 1
        started = False
        try:
            async with Consumer(address, group_id=group, client_id=name, **CONSUMER_SETTINGS) as consumer:
                started = True
                consumer.subscribe([topic])
                members.live[index] = consumer
                try:
                    await _consume(consumer, name, history, members, stop)
                finally:
                    members.live.pop(index, None)
                    members.metrics.update(consumer.metrics())
        except Exception as exc:  # noqa: BLE001 - recorded, and the member is replaced
            if not started:
                members.start_failures[type(exc).__name__] += 1
                log.info("member %s could not start (%r); trying again", name, exc)
            else:
                members.deaths.append(f"{name} at {trio.current_time() - began:.1f}s: {exc!r}")
                members.tainted.add(name)
                log.warning("member %s died (%r); starting a new one", name, exc)
            await trio.sleep(RECREATE_BACKOFF)


async def _consume(consumer: Consumer, name: str, history: History, members: Members, stop: trio.Event) -> None:
    while not stop.is_set():
        try:
            records = await consumer.poll(0.3)
        except TOLERATED as exc:
            members.tolerated[f"poll {type(exc).__name__}"] += 1
            continue
        for record in records:
            history.deliver(name, record.topic, record.partition, record.offset, record.key)
            consumer.mark_processed(record)
        try:
            await consumer.commit()
        except TOLERATED as exc:  # the marks stay pending for the next commit
            members.tolerated[f"commit {type(exc).__name__}"] += 1
        if consumer.lost():
            members.lost.append(f"{name}: {sorted((tp.topic[-6:], tp.partition) for tp in consumer.lost())}")
            members.tainted.add(name)


# -- the tests ------------------------------------------------------------------------------

GROUPS = {
    # members, partitions, seed (KEYRANGE_FAULT_SEED=n replays or explores another)
    "whole-partitions": (3, 3, 31),
    "ranges-split": (4, 3, 32),
}


@pytest.mark.parametrize("variant", list(GROUPS))
async def test_group_members_behind_a_faulty_network_hand_out_every_record_written_while_they_read(
        kafka, faulty_proxy, topic_factory, variant, caplog):
    caplog.set_level(logging.INFO, logger="proxy.client")
    caplog.set_level(logging.INFO, logger=__name__)
    link, _proxy = faulty_proxy
    count, partitions, seed = GROUPS[variant]
    seed = int(os.environ.get("KEYRANGE_FAULT_SEED", seed))
    topic = topic_factory(kafka, partitions=partitions)
    group = f"faults-{topic}"
    history = History()
    producer = LiveProducer(kafka.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS, seed=seed)
    schedule = fault_schedule(seed)
    members = Members()
    timeline: list[str] = []
    stop = trio.Event()
    began = trio.current_time()
    generations: dict[str, int] = {}

    def context() -> str:
        return f"seed {seed}; faults {timeline}; {members.report()}; generations {generations}"

    async with trio.open_nursery() as nursery:
        producer.start()
        for i in range(count):
            nursery.start_soon(member, i, link.address, group, topic, history, members, stop, began)
        settled = await _wait(lambda: members.settled(count), SETTLE_TIMEOUT)
        generations["settled"] = members.generation()
        if settled:
            await inject(link, schedule, timeline, began)
            generations["faults over"] = members.generation()
            delivered = await _until(lambda: producer.done and history.missing() == 0, DEADLINE)
            committed = delivered and await _until(lambda: _at_log_end(kafka, group, topic, partitions), 30)
            generations["end"] = members.generation()
            log.info("faults run %s: delivered %s, committed %s; %s", variant, delivered, committed, context())
        stop.set()
    producer.join()
    assert settled, f"the {count} members did not settle into one generation within {SETTLE_TIMEOUT:g} s; {context()}"
    assert producer.failed == 0, producer.errors
    verdict = _verdict(kafka, history, topic, partitions, group)
    assert verdict.acknowledged == RECORDS
    message = f"{verdict.summary()}\n{context()}"
    assert members.metrics["reconnects"] > 0, f"the faults never reached the members' connections: {message}"
    assert not verdict.lost, message
    assert not verdict.strays, message
    assert not verdict.committed_behind, message
    disrupted = bool(members.deaths or members.lost or generations["end"] > generations["settled"])
    if verdict.duplicates:
        assert disrupted, f"records handed out twice though no fault cost the group a member or a rebalance: {message}"
    unexplained = [(key, earlier, later) for key, earlier, later in verdict.order_violations
                   if not ({earlier.record, later.record} & verdict.duplicates.keys()
                           or {earlier.member, later.member} & members.tainted)]
    assert not unexplained, (f"{len(unexplained)} order violations not due to re-delivery, e.g. "
                             f"{[(k, e.offset, e.member, x.offset, x.member) for k, e, x in unexplained[:5]]}; "
                             f"{message}")
    print(f"{variant}: {verdict.redelivered} re-delivered ({len(verdict.duplicates)} records), "
          f"{len(verdict.order_violations)} order violations (all due to re-delivery); {context()}")


async def _wait(condition: Callable[[], bool], timeout: float) -> bool:
    """Check ``condition`` (cheap, on this thread) until true or ``timeout``."""
    with trio.move_on_after(timeout):
        while not condition():
            await trio.sleep(0.1)
        return True
    return False
