"""kafka-python, aiokafka and the Java console consumer read a virtual range topic in a
group through the proxy (docs/wire-contract.md#9-virtual-range-topics), unmodified.

A 2-partition topic is read as ``<topic>.kr4`` by 1, 3 and 8 members of one group. The
members join first (records produced afterwards meet no rebalance), then: every record
reaches exactly one member, each key's records in offset order, and once each member's
positions reach the log end (control batches move them past the other shares' records)
and are committed, every virtual partition's lag is 0 in kafka-consumer-groups and the
real topic's committed offset at the coordinator is its end.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

from tests.integration import virtual_checks as checks
from tests.integration.virtual_checks import PARTITIONS, SHARES

pytestmark = pytest.mark.kafka

RECORDS = 1500
MEMBERS = [1, 3, 8]


def _group() -> str:
    return f"vg-{uuid.uuid4().hex[:8]}"


# kafka-python 3.0 can lose a group leader's assignment for good, against a broker as well
# as through the proxy: a leader that joined before its metadata knew the topic rejoins when
# the metadata arrives; if a poll's timeout ends after that JoinGroup's answer and before
# the SyncGroup's, the client stops retrying (its rejoin condition already reads as met)
# and never applies the SyncGroup's result, so it holds no partition and sends no
# heartbeat. Eight members polling every 200 ms hit it about once in fifteen runs. The test
# narrows it to the first member's own join (it joins alone, before the others) and to
# polls of a second, and one rerun covers what remains.
_KAFKA_PYTHON_LOST_SYNC = pytest.mark.flaky(reruns=1)


@_KAFKA_PYTHON_LOST_SYNC
@pytest.mark.parametrize("members", MEMBERS)
def test_kafka_python_group_reads_each_record_once(kafka, proxy, topic_factory, members):
    topic = topic_factory(kafka, partitions=PARTITIONS)
    group = _group()
    deadline = time.monotonic() + 120
    fleet = checks.KafkaPythonGroup(proxy.bootstrap_servers, f"{topic}.kr{SHARES}", group, members, deadline=deadline)
    fleet.start()
    sent = checks.produce(proxy.bootstrap_servers, topic, RECORDS)
    checks.wait_until_count(lambda: fleet.seen, len(sent), deadline)
    fleet.stop()
    assert not fleet.failures, fleet.failures
    checks.check_delivery(sent, fleet.results)
    checks.check_group_at_end(proxy.bootstrap_servers, topic, group)


@pytest.mark.parametrize("members", MEMBERS)
def test_aiokafka_group_reads_each_record_once(kafka, proxy, topic_factory, members):
    from aiokafka import AIOKafkaConsumer

    topic = topic_factory(kafka, partitions=PARTITIONS)
    group = _group()
    results: list[checks.Received] = [[] for _ in range(members)]
    sizes: dict[int, int] = {}
    seen = [0]
    deadline = time.monotonic() + 120

    async def member(index: int, stop: asyncio.Event) -> None:
        consumer = AIOKafkaConsumer(f"{topic}.kr{SHARES}", bootstrap_servers=proxy.bootstrap_servers,
                                    group_id=group, auto_offset_reset="earliest", enable_auto_commit=False,
                                    session_timeout_ms=10000, heartbeat_interval_ms=500)
        await consumer.start()
        try:
            while time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=200, max_records=200)
                assignment = consumer.assignment()
                sizes[index] = len(assignment)
                for tp, records in batches.items():
                    for record in records:
                        results[index].append((tp.partition, record.offset, record.key, record.value))
                    seen[0] += len(records)
                if stop.is_set() and assignment:
                    ends = await consumer.end_offsets(list(assignment))
                    positions = [await consumer.position(tp) for tp in assignment]
                    if positions == [ends[tp] for tp in assignment]:
                        break
            await consumer.commit()
        finally:
            await consumer.stop()

    async def main() -> list[checks.Received | BaseException | None]:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(member(i, stop)) for i in range(members)]
        while not _settled(list(sizes.values()), members):
            assert time.monotonic() < deadline, f"assignment sizes {sizes}"
            await asyncio.sleep(0.1)
        sent[:] = await asyncio.to_thread(checks.produce, proxy.bootstrap_servers, topic, RECORDS)
        while seen[0] < len(sent) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        stop.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    sent: list[tuple[bytes, bytes]] = []
    outcomes = asyncio.run(main())
    assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
    checks.check_delivery(sent, results)
    checks.check_group_at_end(proxy.bootstrap_servers, topic, group)


def _settled(sizes: list[int], members: int) -> bool:
    return len(sizes) == members and all(sizes) and sum(sizes) == SHARES * PARTITIONS


@pytest.mark.parametrize("members", MEMBERS)
def test_java_console_consumers_in_a_group_read_each_record_once(kafka, proxy, topic_factory, members):
    """Kafka's own console consumer, one JVM per member, auto-commit on (committed on
    close): each exits once no record came for a while, its positions at the log end."""
    from confluent_kafka.admin import AdminClient

    topic = topic_factory(kafka, partitions=PARTITIONS)
    group = _group()
    outputs: list[checks.Received | BaseException] = [[] for _ in range(members)]

    def member(index: int) -> None:
        try:
            outputs[index] = checks.console_member(proxy.bootstrap_servers, f"{topic}.kr{SHARES}", group,
                                                   idle_ms=25000)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            outputs[index] = exc

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})

    def sizes() -> list[int]:
        description = admin.describe_consumer_groups([group])[group].result(10)
        return [len(m.assignment.topic_partitions) for m in description.members]

    threads = [threading.Thread(target=member, args=(i,), daemon=True) for i in range(members)]
    for thread in threads:
        thread.start()
    checks.wait_assigned(sizes, members, timeout=120)
    sent = checks.produce(proxy.bootstrap_servers, topic, RECORDS)
    for thread in threads:
        thread.join(200)
    failures = [o for o in outputs if isinstance(o, BaseException)]
    assert not failures, failures
    results = [out for out in outputs if not isinstance(out, BaseException)]
    checks.check_delivery(sent, results)
    checks.check_group_at_end(proxy.bootstrap_servers, topic, group)

