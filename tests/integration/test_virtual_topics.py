"""Unmodified clients read virtual range topics through the proxy (docs/wire-contract.md#9-virtual-range-topics).

A 2-partition topic is read as ``<topic>.kr4`` by the members of one group: every record
reaches exactly one member, each key's records in offset order, and once everything is
consumed and committed every virtual partition's lag is 0 in kafka-consumer-groups and
the real topic's committed offset at the coordinator is its end.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict

import pytest

from harness import java_tools
from harness.clients import commit_consumed
from harness.wait import wait_until

from .virtual_checks import check_order, produce

pytestmark = pytest.mark.kafka

SHARES = 4
PARTITIONS = 2


def _at_end(consumer) -> bool:
    """Every assigned partition's position is its high watermark (control batches moved
    it past the other shares' records). A partition handed over after its previous owner
    read and committed all of it has no position (nothing is left to consume): its
    committed offset stands in."""
    assigned = consumer.assignment()
    if not assigned:
        return False
    positions = consumer.position(assigned)
    unread = [tp for tp in positions if tp.offset < 0]
    committed = {tp.partition: tp.offset for tp in consumer.committed(unread, timeout=5)} if unread else {}
    for tp in positions:
        offset = tp.offset if tp.offset >= 0 else committed[tp.partition]
        if offset != consumer.get_watermark_offsets(tp, timeout=5)[1]:
            return False
    return True


def _run_confluent_members(proxy, topic: str, group: str, members: int, total: int,
                           deadline: float) -> list[list[tuple[int, int, bytes, bytes]]]:
    from confluent_kafka import Consumer

    results: list[list] = [[] for _ in range(members)]
    seen = [0]
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[str] = []

    def member(index: int) -> None:
        consumer = Consumer({"bootstrap.servers": proxy.bootstrap_servers, "group.id": group,
                             "auto.offset.reset": "earliest", "enable.auto.commit": False,
                             "session.timeout.ms": 10000, "heartbeat.interval.ms": 500,
                             "partition.assignment.strategy": "range"})
        # Members join one by one and the first ones start reading at once: a virtual
        # partition handed on in a rebalance must carry its position, or its next owner
        # reads it again from the start (the usual commit-on-revoke of a manual-commit app).
        consumer.subscribe([f"{topic}.kr{SHARES}"], on_revoke=lambda c, _partitions: commit_consumed(c))
        try:
            while time.monotonic() < deadline:
                if stop.is_set() and _at_end(consumer):
                    break
                message = consumer.poll(0.2)
                if message is None:
                    continue
                if message.error():
                    errors.append(str(message.error()))
                    continue
                results[index].append((message.partition(), message.offset(), message.key(), message.value()))
                with lock:
                    seen[0] += 1
            commit_consumed(consumer)
        finally:
            consumer.close()

    threads = [threading.Thread(target=member, args=(i,), daemon=True) for i in range(members)]
    for thread in threads:
        thread.start()
    wait_until(lambda: seen[0] >= total, timeout=max(1.0, deadline - time.monotonic()),
               what=lambda: f"{seen[0]} of {total} records received")
    # Each member goes on polling until its positions reach the log end (control batches
    # move them past the other shares' records), then commits them.
    stop.set()
    for thread in threads:
        thread.join(60)
    assert not errors, errors[:5]
    return results


@pytest.mark.parametrize("members", [1, 3, 8])
def test_librdkafka_group_reads_each_record_once(kafka, proxy, topic_factory, members):
    topic = topic_factory(kafka, partitions=PARTITIONS)
    sent = produce(proxy.bootstrap_servers, topic, 4000)
    group = f"vg-{uuid.uuid4().hex[:8]}"
    results = _run_confluent_members(proxy, topic, group, members, len(sent), time.monotonic() + 90)
    received = [record for member in results for record in member]
    assert len(received) == len(sent), "duplicates or losses"
    assert sorted((k, v) for _, _, k, v in received) == sorted(sent)
    for member in results:
        check_order(member)
    # Virtual partition v holds share v % K of real partition v // K: keys never cross.
    owners = defaultdict(set)
    for partition, _, key, _ in received:
        owners[key].add(partition)
    assert all(len(parts) == 1 for parts in owners.values())

    rows = java_tools.describe_group(proxy.bootstrap_servers, group)
    virtual = [row for row in rows if row["TOPIC"] == f"{topic}.kr{SHARES}"]
    assert sorted(int(row["PARTITION"]) for row in virtual) == list(range(SHARES * PARTITIONS)), rows
    assert all(row["LAG"] == "0" for row in virtual), rows
    real = {int(row["PARTITION"]): row for row in rows if row["TOPIC"] == topic}
    assert sorted(real) == list(range(PARTITIONS)), rows
    assert all(row["CURRENT-OFFSET"] == row["LOG-END-OFFSET"] for row in real.values()), rows


def test_librdkafka_long_empty_share_no_fetch_growth(kafka, proxy, topic_factory):
    """One share gets nothing for thousands of records: its member sees no error (no
    MSG_SIZE_TOO_LARGE), and its position reaches the end."""
    from confluent_kafka import Consumer, TopicPartition

    from proxy.ranges import contains, equal_shares
    from proxy.records.keyhash import key_hash

    topic = topic_factory(kafka, partitions=1)
    shares = equal_shares(SHARES)
    other = [f"k{i}".encode() for i in range(2000) if not contains([shares[0]], key_hash(f"k{i}".encode(), 0))]
    mine = [f"k{i}".encode() for i in range(2000) if contains([shares[0]], key_hash(f"k{i}".encode(), 0))]
    sent = produce(proxy.bootstrap_servers, topic, 6000, key_of=lambda i: other[i % len(other)])
    sent += produce(proxy.bootstrap_servers, topic, 3, key_of=lambda i: mine[i])
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap_servers, "group.id": f"e-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "fetch.max.bytes": 1000000, "message.max.bytes": 65536, "max.partition.fetch.bytes": 2048})
    consumer.assign([TopicPartition(f"{topic}.kr{SHARES}", 0, 0)])
    got, errors = [], []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(got) < 3:
        message = consumer.poll(0.2)
        if message is None:
            continue
        if message.error():
            errors.append(str(message.error()))
        else:
            got.append(message.key())
    position = consumer.position([TopicPartition(f"{topic}.kr{SHARES}", 0)])[0].offset
    consumer.close()
    assert not errors, errors[:3]
    assert got == mine[:3]
    assert position == 6003
