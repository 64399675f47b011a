"""What every virtual-topic client test checks, whatever the client
(docs/wire-contract.md#9-virtual-range-topics): the union of what the members received is
exactly what was sent, each key's records arrive in offset order at one virtual partition,
every virtual partition's lag is 0 in kafka-consumer-groups, and the real topic's committed
offset at the coordinator is its end."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable

from harness import java_tools
from harness.wait import wait_until

SHARES = 4
PARTITIONS = 2

Received = list[tuple[int, int, bytes, bytes]]  # (virtual partition, offset, key, value)


def produce(bootstrap: str, topic: str, count: int, *, keys: int = 97, start: int = 0,
            key_of: Callable[[int], bytes] | None = None) -> list[tuple[bytes, bytes]]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "lz4"})
    sent = []
    for i in range(start, start + count):
        key = key_of(i) if key_of else f"key-{i % keys}".encode()
        value = f"value-{i}".encode()
        producer.produce(topic, key=key, value=value)
        sent.append((key, value))
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    return sent


def check_order(received: Received) -> None:
    """Each key's records arrive in offset order."""
    last: dict[bytes, int] = {}
    for _, offset, key, _ in received:
        assert offset > last.get(key, -1), f"key {key!r} went back to {offset}"
        last[key] = offset


def check_delivery(sent: list[tuple[bytes, bytes]], results: list[Received]) -> None:
    """Every record reached exactly one member, in per-key order, and a key stays on the
    virtual partition that holds its share."""
    received = [record for member in results for record in member]
    assert len(received) == len(sent), f"{len(received)} received of {len(sent)} sent: duplicates or losses"
    assert sorted((k, v) for _, _, k, v in received) == sorted(sent)
    for member in results:
        check_order(member)
    owners: dict[bytes, set[int]] = defaultdict(set)
    for partition, _, key, _ in received:
        owners[key].add(partition)
    assert all(len(parts) == 1 for parts in owners.values())


def check_group_at_end(bootstrap: str, topic: str, group: str, *, timeout: float = 30.0,
                       virtual_name: str | None = None) -> None:
    """kafka-consumer-groups --describe through the proxy: every virtual partition's lag
    is 0 and the real topic is committed at its end. Commits on close may land a moment
    after the client returned, so the check is retried until ``timeout``. ``virtual_name``:
    the virtual topic read (``<topic>.kr4`` unless given)."""
    state: dict[str, list[dict[str, str]]] = {"rows": []}
    name = virtual_name or f"{topic}.kr{SHARES}"

    def done() -> bool:
        rows = state["rows"] = java_tools.describe_group(bootstrap, group)
        virtual = [row for row in rows if row["TOPIC"] == name]
        real = [row for row in rows if row["TOPIC"] == topic]
        return (sorted(int(row["PARTITION"]) for row in virtual) == list(range(SHARES * PARTITIONS))
                and all(row["LAG"] == "0" for row in virtual)
                and sorted(int(row["PARTITION"]) for row in real) == list(range(PARTITIONS))
                and all(row["CURRENT-OFFSET"] == row["LOG-END-OFFSET"] for row in real))

    wait_until(done, timeout=timeout, interval=1.0, what=lambda: f"group {group} at the end: {state['rows']}")


def wait_assigned(assigned: Callable[[], list[int]], members: int, *, timeout: float = 60.0) -> None:
    """Wait until ``members`` members together hold all K x P virtual partitions, each
    one some, so records produced afterwards meet no rebalance."""
    deadline = time.monotonic() + timeout
    wait_until(lambda: _settled(assigned(), members), timeout=max(1.0, deadline - time.monotonic()),
               what=lambda: f"assignment sizes {assigned()} for {members} members")


def _settled(sizes: list[int], members: int) -> bool:
    return len(sizes) == members and all(size > 0 for size in sizes) and sum(sizes) == SHARES * PARTITIONS


def wait_until_count(count: Callable[[], int], total: int, deadline: float) -> None:
    """Wait until ``count()`` reaches ``total`` or the monotonic ``deadline`` passes."""
    wait_until(lambda: count() >= total, timeout=max(1.0, deadline - time.monotonic()),
               what=lambda: f"{count()} of {total} records received")


def console_member(bootstrap: str, topic: str, group: str, *, idle_ms: int) -> Received:
    """Kafka's console consumer as one group member of ``topic`` (auto-commit on, committed
    on close); it exits once no record came for ``idle_ms``. What it printed, parsed."""
    output = java_tools.console_consumer(
        bootstrap, topic, group=group, timeout_ms=idle_ms, print_key=True,
        extra_args=["--formatter-property", "print.partition=true", "--formatter-property", "print.offset=true"],
        consumer_config={"session.timeout.ms": "10000", "heartbeat.interval.ms": "1000"}, timeout=180).stdout
    return parse_console(output)


def parse_console(output: str) -> Received:
    """Lines of ``Partition:P<TAB>Offset:O<TAB>key<TAB>value``."""
    received = []
    for line in output.splitlines():
        cells = line.split("\t")
        if len(cells) != 4 or not cells[0].startswith("Partition:"):
            continue
        received.append((int(cells[0].split(":")[1]), int(cells[1].split(":")[1]), cells[2].encode(),
                         cells[3].encode()))
    return received


class KafkaPythonGroup:
    """``members`` kafka-python consumers of ``topic`` in ``group``, a thread each, that
    record what they receive until told to stop, then stop once their positions reach the
    log end. The first member joins alone and holds every partition before the others
    start (kafka-python's lost-sync race: test_virtual_clients.py)."""

    def __init__(self, bootstrap: str, topic: str, group: str, members: int, *, deadline: float,
                 poll_ms: int = 1000, max_poll_records: int = 200, commit_each_poll: bool = False) -> None:
        self.bootstrap, self.topic, self.group = bootstrap, topic, group
        self.members, self.deadline = members, deadline
        self.poll_ms, self.max_poll_records, self.commit_each_poll = poll_ms, max_poll_records, commit_each_poll
        self.results: list[Received] = [[] for _ in range(members)]
        self.sizes: dict[int, int] = {}
        self.failures: list[BaseException] = []
        self._seen = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._member, args=(i,), daemon=True) for i in range(members)]

    @property
    def seen(self) -> int:
        return self._seen

    def start(self) -> None:
        """Start the members and wait until together they hold every virtual partition."""
        self._threads[0].start()
        wait_assigned(lambda: [self.sizes.get(0, 0)], 1)
        for thread in self._threads[1:]:
            thread.start()
        wait_assigned(lambda: list(self.sizes.values()), self.members)

    def stop(self, timeout: float = 60.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)

    def _member(self, index: int) -> None:
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(self.topic, bootstrap_servers=self.bootstrap, group_id=self.group,
                                 auto_offset_reset="earliest", enable_auto_commit=False, session_timeout_ms=10000,
                                 heartbeat_interval_ms=500, max_poll_records=self.max_poll_records)
        try:
            while time.monotonic() < self.deadline:
                batches = consumer.poll(timeout_ms=self.poll_ms)
                assignment = consumer.assignment()
                self.sizes[index] = len(assignment)
                for tp, records in batches.items():
                    for record in records:
                        self.results[index].append((tp.partition, record.offset, record.key, record.value))
                    with self._lock:
                        self._seen += len(records)
                if batches and self.commit_each_poll:
                    consumer.commit()
                if self._stop.is_set() and assignment:
                    ends = consumer.end_offsets(list(assignment))
                    if all(consumer.position(tp) == ends[tp] for tp in assignment):
                        break
            consumer.commit()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.failures.append(exc)
        finally:
            consumer.close()
