"""``make demo``: a real Kafka broker, the proxy in front of it, and clients using it.

1. Starts a one-node Apache Kafka (KRaft) and ``keyrange-proxy`` in front of it.
2. A standard producer (kafka-python) writes keyed orders through the proxy; a standard
   consumer group reads them back through the proxy: it cannot tell the proxy from the
   broker, and sees only proxy addresses.
3. Four key-range consumers (``proxy.client.Consumer``) share ONE partition, each fetching
   a quarter of the key-hash space: every order reaches exactly one of them, each
   customer's orders stay in order, the broker is read about once thanks to the proxy's
   result cache, and each consumer commits just the orders it processed (individual
   commit), so the group's committed offset reaches the end as standard tools see it.
4. Three consumers that need no per-key order share the same partition by chunks of
   offsets (cooperative fetch): half of the orders have one customer, yet each consumer
   gets a fair part; every order is processed exactly once and the group's committed
   offset reaches the end.
5. A consumer group of six members subscribes to a topic of TWO partitions: the
   ``keyrange`` assignor gives each a third of a partition; a seventh joins and one
   leaves, and each member's share is printed after every cooperative rebalance.
6. An exactly-once application shares the one-partition topic: two transactional
   consume-transform-produce members (librdkafka) of ``demo-orders.kr2`` each process one
   half of the customers, write a receipt per order and commit their offsets inside their
   transactions; the first transaction is aborted on purpose and redone. Every order gets
   exactly one committed receipt, and the group's committed offset reaches the end.
7. Stops everything it started.

    python -m proxy.demo
"""

from __future__ import annotations

import re
import sys
import time
import urllib.request
from collections import Counter, defaultdict
from typing import Any

import trio
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient

from proxy.client import Consumer, RetriableError, TopicPartition
from proxy.client.group_assignor import UNIT, length, to_intervals
from proxy.local_kafka import LocalKafka, LocalKafkaError, ProxyProcess, ProxyStartError, kafka_version, scratch_dir
from proxy.ranges import equal_shares

TOPIC = "demo-orders"
# Two customers in each quarter of the key-hash space, so each of the four range consumers has some.
CUSTOMERS = ["alice", "bob", "carol", "dave", "erin", "eve", "grace", "olivia"]
RECORDS = 40
SHARES = 4
GROUP = "demo-order-workers"
GROUP_TOPIC = "demo-payments"
SUBSCRIBERS = "demo-payment-workers"
EOS_GROUP = "demo-receipt-writers"
COOP_TOPIC = "demo-clicks"
COOP_GROUP = "demo-click-mailers"
COOP_RECORDS = 600
COOP_MEMBERS = 3
RECEIPTS = "demo-order-receipts"


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def _metric(url: str | None, name: str) -> float:
    if url is None:
        raise RuntimeError("the proxy was started without a metrics port")
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    total = 0.0
    for match in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M):
        total += float(match.group(1))
    return total


async def _range_members(bootstrap: str) -> list[list[tuple[str, str]]]:
    """Four trio consumers, one share each: process every order (a slow call of a few
    milliseconds), mark it processed, commit the processed offsets after each poll."""
    per_consumer: list[list[tuple[str, str]]] = [[] for _ in range(SHARES)]
    tp = TopicPartition(TOPIC, 0)

    async def member(i: int) -> None:
        async with Consumer(bootstrap, group_id=GROUP, client_id=f"range-{i}", auto_offset_reset="earliest",
                            allow_individual_commit=True, max_poll_records=3,
                            max_partition_fetch_bytes=128) as consumer:  # small reads: the cache works
            consumer.assign({tp: [equal_shares(SHARES)[i]]})
            with trio.fail_after(60):
                while consumer.position(tp) != RECORDS or consumer.pending_commit(tp):
                    for record in await consumer.poll(0.5):
                        await trio.sleep(0.005)  # the slow service call
                        per_consumer[i].append((bytes(record.key or b"").decode(), bytes(record.value or b"").decode()))
                        consumer.mark_processed(record)
                    await consumer.commit()

    async with trio.open_nursery() as nursery:
        for i in range(SHARES):
            nursery.start_soon(member, i)
    return per_consumer


async def _cooperative_members(bootstrap: str) -> list[list[int]]:
    """Three trio consumers share one partition by chunks (cooperative fetch): each
    processes what it gets (a slow call), marks it processed and commits after each poll,
    until every record is processed."""
    per_consumer: list[list[int]] = [[] for _ in range(COOP_MEMBERS)]
    tp = TopicPartition(COOP_TOPIC, 0)

    async def member(i: int) -> None:
        async with Consumer(bootstrap, group_id=COOP_GROUP, client_id=f"mailer-{i}", auto_offset_reset="earliest",
                            allow_individual_commit=True, max_partition_fetch_bytes=1024) as consumer:
            consumer.assign([tp], cooperative=True)
            with trio.fail_after(60):
                # until every record was handed to someone and this member committed its own
                while sum(len(got) for got in per_consumer) < COOP_RECORDS or consumer.pending_commit(tp):
                    for record in await consumer.poll(0.2):
                        await trio.sleep(0.002)  # the slow service call
                        per_consumer[i].append(record.offset)
                        consumer.mark_processed(record)
                    await consumer.commit_processed()

    async with trio.open_nursery() as nursery:
        for i in range(COOP_MEMBERS):
            nursery.start_soon(member, i)
    return per_consumer


def _share(ranges: list) -> float:
    return 1.0 if not ranges else length(to_intervals(ranges)) / UNIT


async def _group_members(bootstrap: str) -> list[str]:
    """Six subscribed members form a group on two partitions; a seventh joins, the first
    leaves; after each cooperative rebalance settles, every member's share is printed."""
    consumers: dict[str, Consumer] = {}
    stops: dict[str, trio.Event] = {}
    lines: list[str] = []

    async def member(name: str) -> None:
        stops[name] = trio.Event()
        async with Consumer(bootstrap, group_id=SUBSCRIBERS, client_id=name, auto_offset_reset="earliest",
                            allow_individual_commit=True, heartbeat_interval_ms=200, session_timeout_ms=10_000,
                            max_poll_records=10) as consumer:
            consumer.subscribe([GROUP_TOPIC])
            consumers[name] = consumer
            while not stops[name].is_set():
                for record in await consumer.poll(0.1):
                    consumer.mark_processed(record)
                try:
                    await consumer.commit()
                except RetriableError:
                    pass  # a rebalance is completing: committed with the next poll
            consumers.pop(name)

    def settled(count: int) -> bool:
        if len(consumers) != count:
            return False
        metas = [c.group_metadata() for c in consumers.values()]
        if any(m["phase"] != "stable" for m in metas) or len({m["generation"] for m in metas}) != 1:
            return False
        totals: dict[TopicPartition, float] = defaultdict(float)
        for c in consumers.values():
            if c.to_be_revoked() or not c.assignment():
                return False
            for tp, ranges in c.assignment().items():
                totals[tp] += _share(ranges)
        return len(totals) == 2 and all(abs(t - 1.0) < 1e-9 for t in totals.values())

    async def report(what: str, count: int) -> None:
        while not settled(count):
            await trio.sleep(0.05)
        lines.append(what)
        print(f"  {what}: generation {next(iter(consumers.values())).group_metadata()['generation']}")
        for name in sorted(consumers):
            shares = ", ".join(f"{tp.topic}-{tp.partition} {_share(r):.2f}"
                               for tp, r in sorted(consumers[name].assignment().items()))
            print(f"    {name}: {shares}")

    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(member, f"member-{i}")
            await report("6 members on 2 partitions", 6)
            nursery.start_soon(member, "member-6")
            await report("a 7th member joined", 7)
            stops["member-0"].set()
            await report("member-0 left", 6)
            for stop in stops.values():
                stop.set()
    return lines


def _exactly_once(bootstrap: str) -> tuple[list[dict], Counter]:
    """Two transactional consume-transform-produce members of ``<TOPIC>.kr2`` (librdkafka),
    polled in turn until every order has a committed receipt; member 0's first transaction
    is aborted on purpose and its orders read again. Returns what each member did and how
    many committed receipts each order got (read_committed)."""
    from confluent_kafka import Consumer as RdConsumer
    from confluent_kafka import Producer as RdProducer

    members: list[dict[str, Any]] = []
    for i in range(2):
        consumer = RdConsumer({"bootstrap.servers": bootstrap, "group.id": EOS_GROUP, "enable.auto.commit": False,
                               "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                               "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000})
        consumer.subscribe([f"{TOPIC}.kr2"])
        producer = RdProducer({"bootstrap.servers": bootstrap, "transactional.id": f"{EOS_GROUP}-{i}"})
        producer.init_transactions(30)
        members.append({"consumer": consumer, "producer": producer, "committed": 0, "aborted": 0, "orders": 0,
                        "position": {}})
    done: Counter = Counter()
    deadline = time.monotonic() + 60
    try:
        while sum(done.values()) < RECORDS and time.monotonic() < deadline:
            for i, member in enumerate(members):
                _eos_turn(member, abort_first=i == 0, done=done)
        _eos_catch_up(members)
    finally:
        for member in members:
            member["consumer"].close()
            member["producer"].flush(10)
    return [{k: v for k, v in m.items() if k in ("committed", "aborted", "orders")} for m in members], \
        _committed_receipts(bootstrap)


def _eos_turn(member: dict[str, Any], *, abort_first: bool, done: Counter) -> None:
    """One member's batch in one transaction: a receipt per order and the offsets; the
    first transaction of ``abort_first`` is aborted on purpose and its orders sought back."""
    from confluent_kafka import TopicPartition as RdTopicPartition

    consumer, producer = member["consumer"], member["producer"]
    batch = [m for m in consumer.consume(20, 0.3) if m.error() is None]
    if not batch:
        return
    producer.begin_transaction()
    for message in batch:
        producer.produce(RECEIPTS, key=message.key(), value=b"receipt for " + (message.value() or b""))
    positions = {}
    for message in batch:
        positions[message.partition()] = message.offset() + 1
    producer.send_offsets_to_transaction(
        [RdTopicPartition(f"{TOPIC}.kr2", p, o) for p, o in positions.items()],
        consumer.consumer_group_metadata(), 30)
    if abort_first and member["committed"] + member["aborted"] == 0:
        producer.abort_transaction(30)  # on purpose: the orders are read again
        member["aborted"] += 1
        for p in positions:
            first = min(m.offset() for m in batch if m.partition() == p)
            consumer.seek(RdTopicPartition(f"{TOPIC}.kr2", p, first))
        return
    producer.commit_transaction(30)
    member["committed"] += 1
    member["orders"] += len(batch)
    member["position"].update(positions)
    for message in batch:
        done[(message.value() or b"").decode()] += 1


def _eos_catch_up(members: list[dict[str, Any]]) -> None:
    """The members keep polling at the end of the partition: their positions move past the
    other member's last orders, and a transaction of offsets alone commits that."""
    from confluent_kafka import TopicPartition as RdTopicPartition

    catch_up = time.monotonic() + 15
    while time.monotonic() < catch_up and any(m["position"] != {0: RECORDS, 1: RECORDS} for m in members):
        for member in members:
            consumer, producer = member["consumer"], member["producer"]
            consumer.consume(20, 0.3)
            positions = {tp.partition: tp.offset for tp in consumer.position(consumer.assignment())
                         if tp.offset >= 0}
            moved = {p: o for p, o in positions.items() if member["position"].get(p) != o}
            if moved:
                producer.begin_transaction()
                producer.send_offsets_to_transaction(
                    [RdTopicPartition(f"{TOPIC}.kr2", p, o) for p, o in moved.items()],
                    consumer.consumer_group_metadata(), 30)
                producer.commit_transaction(30)
                member["position"].update(moved)
                member["committed"] += 1
            for p in (0, 1):
                if p not in positions:  # not this member's: the other one commits it
                    member["position"][p] = RECORDS


def _committed_receipts(bootstrap: str) -> Counter:
    """How many committed receipts each order got (read_committed)."""
    from confluent_kafka import Consumer as RdConsumer

    reader = RdConsumer({"bootstrap.servers": bootstrap, "group.id": f"{EOS_GROUP}-reader",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    receipts: Counter = Counter()
    try:
        reader.subscribe([RECEIPTS])
        quiet_until = time.monotonic() + 5
        while time.monotonic() < quiet_until and sum(receipts.values()) < RECORDS:
            for message in reader.consume(100, 0.5):
                if message.error() is None:
                    receipts[(message.value() or b"").decode().removeprefix("receipt for ")] += 1
    finally:
        reader.close()
    return receipts


def _standard_committed(bootstrap: str, group: str = GROUP, topic: str = TOPIC) -> int | None:
    from kafka.structs import TopicPartition as KafkaTopicPartition

    reader = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return reader.committed(KafkaTopicPartition(topic, 0))
    finally:
        reader.close()


def _create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics({name: {"num_partitions": partitions, "replication_factor": 1}}, wait_for_metadata=True)
    finally:
        admin.close()


def _write_orders(proxy: ProxyProcess, kafka: LocalKafka) -> None:
    step(f"A standard producer writes {RECORDS} orders keyed by customer, through the proxy")
    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap_servers, acks="all", linger_ms=5)
    try:
        for i in range(RECORDS):
            customer = CUSTOMERS[i % len(CUSTOMERS)]
            producer.send(TOPIC, key=customer.encode(), value=f"order-{i:02d}".encode())
            if i % 4 == 3:
                producer.flush(30)  # several small batches, so the cache has work to do
        brokers = sorted(f"{b.host}:{b.port}" for b in producer._metadata.brokers())
    finally:
        producer.close()
    print(f"the producer only ever saw proxy addresses: {brokers} (the broker is {kafka.bootstrap_servers})")


def _read_standard(proxy: ProxyProcess) -> list[tuple[str, str]]:
    step("A standard consumer group reads everything back through the proxy")
    consumer = KafkaConsumer(TOPIC, bootstrap_servers=proxy.bootstrap_servers, group_id="demo",
                             auto_offset_reset="earliest", consumer_timeout_ms=10000)
    try:
        standard = [(m.key.decode(), m.value.decode()) for m in consumer]
    finally:
        consumer.close()
    print(f"consumed {len(standard)} orders, unfiltered, as from the broker itself")
    return standard


def _share_by_ranges(proxy: ProxyProcess, kafka: LocalKafka, standard: list[tuple[str, str]]) -> None:
    step(f"{SHARES} key-range consumers share that one partition, a quarter of the key space each, "
         f"and commit individually")
    per_consumer = trio.run(_range_members, proxy.bootstrap_servers)
    owners: dict[str, set[int]] = defaultdict(set)
    for i, got in enumerate(per_consumer):
        for key, _ in got:
            owners[key].add(i)
        customers = sorted({key for key, _ in got})
        print(f"  consumer {i}: {len(got):2d} orders, customers {', '.join(customers) or '-'}")
    total = sum(len(got) for got in per_consumer)
    print(f"together: {total} of {RECORDS} orders; every customer handled by exactly one consumer: "
          f"{all(len(o) == 1 for o in owners.values())}")
    for customer in CUSTOMERS[:3]:
        mine = [value for got in per_consumer for key, value in got if key == customer]
        print(f"  {customer:>5}'s orders, in produce order: {' '.join(mine)}")
    committed = _standard_committed(kafka.bootstrap_servers)
    print(f"group {GROUP!r} as standard tools see it at the broker: committed offset {committed} "
          f"of {RECORDS} (every order processed, though out of order across consumers)")
    hits = _metric(proxy.metrics_url, "kafka_proxy_keyrange_cache_hits_total")
    read = _metric(proxy.metrics_url, "kafka_proxy_keyrange_broker_bytes_total")
    print(f"proxy result cache: {hits:.0f} shares served without reading the broker; "
          f"{read / 1024:.1f} KiB read from the broker for the range consumers")
    if total != RECORDS or sorted(standard) != sorted(v for got in per_consumer for v in got):
        raise SystemExit("demo failed: the range consumers did not receive exactly the topic's records")
    if committed != RECORDS:
        raise SystemExit(f"demo failed: the group's committed offset is {committed}, not {RECORDS}")


def _committed_within(bootstrap: str, group: str, topic: str, expected: int, seconds: float = 15) -> int | None:
    """The group's committed offset, read until it is ``expected`` or ``seconds`` passed."""
    committed = None
    deadline = time.monotonic() + seconds
    while committed != expected and time.monotonic() < deadline:
        committed = _standard_committed(bootstrap, group, topic)
    return committed


def _share_by_chunks(proxy: ProxyProcess, kafka: LocalKafka) -> None:
    step(f"{COOP_MEMBERS} consumers that need no per-key order share ONE partition by chunks of offsets "
         f"(cooperative fetch); half of the records have one key")
    _create_topic(proxy.bootstrap_servers, COOP_TOPIC, 1)
    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap_servers, acks="all", linger_ms=5)
    try:
        for i in range(COOP_RECORDS):
            click_key = b"hot-customer" if i % 2 else f"customer-{i % 50}".encode()
            producer.send(COOP_TOPIC, key=click_key, value=f"click-{i}".encode())
            if i % 10 == 9:
                producer.flush(30)  # batches of 10: a chunk is whole batches, at least one
        producer.flush(30)
    finally:
        producer.close()
    per_member = trio.run(_cooperative_members, proxy.bootstrap_servers)
    for i, offsets in enumerate(per_member):
        print(f"  consumer {i}: {len(offsets):3d} records")
    handed = [offset for offsets in per_member for offset in offsets]
    exact = sorted(handed) == list(range(COOP_RECORDS))
    chunks = _metric(proxy.metrics_url, "kafka_proxy_coop_chunks_leased_total")
    committed = _committed_within(kafka.bootstrap_servers, COOP_GROUP, COOP_TOPIC, COOP_RECORDS)
    print(f"together: {len(handed)} of {COOP_RECORDS} records in {chunks:.0f} chunks, every record exactly "
          f"once: {exact}; group {COOP_GROUP!r} committed offset at the broker: {committed}")
    if not exact or committed != COOP_RECORDS:
        raise SystemExit("demo failed: the cooperative consumers did not process every record exactly once")


def _group_on_two_partitions(proxy: ProxyProcess) -> None:
    step("A consumer group on TWO partitions: six members, then a seventh joins, then one leaves")
    _create_topic(proxy.bootstrap_servers, GROUP_TOPIC, 2)
    settled = trio.run(_group_members, proxy.bootstrap_servers)
    print(f"every rebalance settled with the whole of both partitions shared out: {len(settled) == 3}")


def _exactly_once_step(proxy: ProxyProcess, kafka: LocalKafka) -> None:
    step(f"An exactly-once application shares the ONE partition of {TOPIC!r}: two transactional members "
         f"of {TOPIC + '.kr2'!r} write a receipt per order")
    members, receipts = _exactly_once(proxy.bootstrap_servers)
    for i, member in enumerate(members):
        print(f"  member {i}: {member['committed']} transactions committed, {member['aborted']} aborted on "
              f"purpose and redone, {member['orders']} orders")
    exact = len(receipts) == RECORDS and set(receipts.values()) == {1}
    print(f"committed receipts: {sum(receipts.values())} for {len(receipts)} of {RECORDS} orders; "
          f"every order exactly once: {exact}")
    committed = _committed_within(kafka.bootstrap_servers, EOS_GROUP, TOPIC, RECORDS)
    print(f"group {EOS_GROUP!r} at the broker: committed offset {committed} of {RECORDS}")
    if not exact or committed != RECORDS:
        raise SystemExit("demo failed: the exactly-once members did not process every order exactly once")


def run() -> None:
    workdir = scratch_dir("keyrange-demo-")
    step(f"Starting a one-node Apache Kafka {kafka_version()} (KRaft)")
    with LocalKafka.start(workdir / "kafka") as kafka:
        print(f"broker ready in {kafka.start_seconds:.1f} s at {kafka.bootstrap_servers}")

        step("Starting keyrange-proxy in front of it")
        # The defaults, but for the two features this demo shows that are off unless asked
        # for: virtual topics (T.kr4) and the metrics it reads the cache's counters from.
        proxy = ProxyProcess.start(
            kafka.bootstrap_servers, workdir=workdir / "proxy",
            overrides={"metrics.port": "0", "virtual.topics.enabled": "true"},
        )
        try:
            print(f"proxy listening at {proxy.bootstrap_servers} (node ports {proxy.node_ports}), "
                  f"metrics at {proxy.metrics_url}")
            _create_topic(proxy.bootstrap_servers, TOPIC, 1)
            print(f"created topic {TOPIC!r} with ONE partition, through the proxy")
            _write_orders(proxy, kafka)
            standard = _read_standard(proxy)
            _share_by_ranges(proxy, kafka, standard)
            _share_by_chunks(proxy, kafka)
            _group_on_two_partitions(proxy)
            _exactly_once_step(proxy, kafka)
        finally:
            step("Stopping the proxy and the broker")
            proxy.stop()
    print("done: every order reached exactly one range consumer and got exactly one receipt, every click one "
          "cooperative consumer; nothing left running")


def main() -> int:
    try:
        run()
    except (LocalKafkaError, ProxyStartError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
