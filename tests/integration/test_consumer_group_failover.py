"""The group coordinator's node stops while the group rebalances (three brokers behind the
proxy): the members find the new coordinator, the rebalance completes, every record is
processed, per-key order holds, and the committed offsets reach the end."""

from __future__ import annotations

import time

import trio

from harness.group_member import Event, order_violations
from harness.java_tools import describe_group
from proxy.client import Consumer

from .test_consumer_group import _commit, _produce


def _coordinator(bootstrap: str, group: str) -> int:
    """The real node id of ``group``'s coordinator, asked of the brokers directly."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    description = admin.describe_consumer_groups([group])[group].result(timeout=30)
    return description.coordinator.id


async def test_coordinator_stops_during_a_rebalance(kafka_cluster, cluster_proxy, topic_factory):
    topic = topic_factory(kafka_cluster, partitions=2, replication_factor=3, configs={"min.insync.replicas": "2"})
    group = f"g-{topic}"
    total = 3000
    _produce(kafka_cluster.bootstrap_servers, topic, 2, total, keys=40)
    events: list[Event] = []
    consumers: dict[str, Consumer] = {}
    done = trio.Event()

    def finished() -> int:
        return len({(e.partition, e.offset) for e in events if e.kind == "F"})

    async def member(name: str) -> None:
        async with Consumer(cluster_proxy.bootstrap_servers, group_id=group, client_id=name,
                            allow_individual_commit=True, auto_offset_reset="earliest", heartbeat_interval_ms=500,
                            session_timeout_ms=10_000, max_poll_interval_ms=60_000, max_poll_records=10) as consumer:
            consumers[name] = consumer
            consumer.subscribe([topic])
            while not done.is_set():
                records = await consumer.poll(0.2)
                now = time.monotonic()
                events.extend(Event("H", name, r.partition, r.offset, (r.key or b"").hex(), now) for r in records)
                for r in records:
                    await trio.sleep(0.004)
                    events.append(Event("F", name, r.partition, r.offset, (r.key or b"").hex(), time.monotonic()))
                    consumer.mark_processed(r)
                await _commit(consumer)
            with trio.fail_after(30):
                while any(consumer.pending_commit(tp) for tp in consumer.assignment()):
                    await _commit(consumer)
                    await trio.sleep(0.1)

    stopped = None
    with trio.fail_after(240):
        async with trio.open_nursery() as nursery:
            for name in ("a", "b"):
                nursery.start_soon(member, name)
            while finished() < total // 5:
                await trio.sleep(0.05)
            coordinator = await trio.to_thread.run_sync(_coordinator, kafka_cluster.bootstrap_servers, group)
            nursery.start_soon(member, "c")
            # a rebalance is under way once the newcomer's JoinGroup is out
            while "c" not in consumers or consumers["c"].group_metadata()["phase"] not in ("joining", "syncing"):
                await trio.sleep(0.01)
            await trio.to_thread.run_sync(kafka_cluster.stop_node, coordinator)
            stopped = coordinator
            while finished() < total or not all(c.assignment() for c in consumers.values()):
                await trio.sleep(0.1)
            done.set()

    assert stopped is not None
    problems = order_violations(events, {0: total // 2, 1: total // 2}, killed=set())
    assert not problems, "\n".join(problems[:20])
    assert await trio.to_thread.run_sync(_coordinator, kafka_cluster.bootstrap_servers, group) != stopped
    rows = await trio.to_thread.run_sync(lambda: describe_group(kafka_cluster.bootstrap_servers, group))
    committed = {int(r["PARTITION"]): r["CURRENT-OFFSET"] for r in rows if r.get("TOPIC") == topic}
    assert committed == {0: str(total // 2), 1: str(total // 2)}, rows
