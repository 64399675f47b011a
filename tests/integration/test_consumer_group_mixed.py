"""A group mixing our consumer with a standard Java consumer (ConsoleConsumer, assignor
``cooperative-sticky``): the only protocol both offer is ``cooperative-sticky``, so the
group forms on it and shares whole partitions; every record is read once."""

from __future__ import annotations

import trio

from harness.java_tools import console_consumer
from proxy.client import Consumer

from .test_consumer_group import DEADLINE, _commit, _produce

COOPERATIVE_STICKY = "org.apache.kafka.clients.consumer.CooperativeStickyAssignor"


async def test_group_with_a_java_member_falls_back_to_cooperative_sticky(kafka, proxy, topic_factory):
    topic = topic_factory(kafka, partitions=4)
    group = f"g-{topic}"
    total = 2000
    java: dict[str, object] = {}

    def run_java() -> None:
        java["result"] = console_consumer(
            proxy.bootstrap_servers, topic, group=group, timeout_ms=20_000, timeout=150,
            consumer_config={"partition.assignment.strategy": COOPERATIVE_STICKY, "fetch.max.wait.ms": "200"},
            extra_args=["--formatter-property", "print.partition=true"])

    ours: dict[int, list[str]] = {}
    with trio.fail_after(DEADLINE + 60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, run_java)
            async with Consumer(proxy.bootstrap_servers, group_id=group, client_id="ours", allow_individual_commit=True,
                                auto_offset_reset="earliest", heartbeat_interval_ms=500, session_timeout_ms=10_000,
                                max_poll_records=100) as consumer:
                consumer.subscribe([topic])
                # the group formed with both members: two whole partitions each
                while not (consumer.group_metadata()["protocol"] == "cooperative-sticky"
                           and len(consumer.assignment()) == 2 and consumer.group_metadata()["phase"] == "stable"):
                    for record in await consumer.poll(0.2):
                        consumer.mark_processed(record)  # nothing is produced yet
                    await _commit(consumer)
                mine = sorted(tp.partition for tp in consumer.assignment())
                assert all(ranges == [] for ranges in consumer.assignment().values())
                await trio.to_thread.run_sync(lambda: _produce(kafka.bootstrap_servers, topic, 4, total))
                while sum(len(v) for v in ours.values()) < total // 2:  # our two partitions' records
                    for record in await consumer.poll(0.2):
                        ours.setdefault(record.partition, []).append(record.value.decode())
                        consumer.mark_processed(record)
                    await _commit(consumer)
                await consumer.commit()
                assert sorted(tp.partition for tp in consumer.assignment()) == mine, "a rebalance moved partitions"
            # leaving: the Java member takes our partitions over at our committed end and
            # exits once idle

    theirs: dict[int, list[str]] = {}
    for line in java["result"].stdout.splitlines():  # type: ignore[attr-defined]
        partition, _, value = line.partition("\t")
        theirs.setdefault(int(partition.removeprefix("Partition:")), []).append(value)
    assert sorted(ours) == mine
    assert not set(ours) & set(theirs), f"a partition was read by both: ours {sorted(ours)}, theirs {sorted(theirs)}"
    values = [v for vs in ours.values() for v in vs] + [v for vs in theirs.values() for v in vs]
    assert sorted(values, key=int) == [str(i) for i in range(total)], "a record was lost or read twice"
