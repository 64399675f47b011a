"""Virtual topics read by unmodified standard clients across several proxy instances
(docs/high-availability.md): virtual range topics (``<topic>.kr4``: each key's records on
one virtual partition, in order) and striped virtual topics (``<topic>.coop4``: stripes of
whole batches, no key order), read by Java KafkaConsumers (``PlainConsumer``, commitSync
after each poll) and by librdkafka (confluent-kafka, a synchronous commit after each
batch), the members of one group spread over two or three proxy instances behind a TCP
balancer (``instance_checks``).

Two members settle, then records are written while they read, and the third joins meanwhile:
virtual partitions move between members of different instances under live traffic. Each
test counts
acknowledged against handed out: every record once, each key's records in offset order
where the topic promises it, and the real topic's committed offsets (at the coordinator)
at the log end. With one instance killed -9 mid-stream, its members reconnect through the
balancer to another, as they would to a broker that went away: nothing is lost, and what
is handed out twice is only what they had been handed and had not got committed when it
died.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest

from harness import streams_app
from harness.history import History, check
from harness.live import LiveProducer, default_key
from harness.streams_app import PlainConsumerProcess, real_partition
from harness.wait import wait_until
from tests.integration.coop_members import hot_key
from tests.integration.instance_checks import (
    Ledger,
    assert_kill_bound,
    assert_order_explained,
    member_names,
    spread,
    start_replicas,
)
from tests.integration.test_live_tail import _at_log_end, _committed, _log_end

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]

RECORDS = 3000
SECONDS = {"java": 12.0, "rdkafka": 8.0}  # a JVM joins seconds after it starts: a longer stream for it
DEADLINE = 90.0  # for the members to catch up once the producer is done
SETTLE_TIMEOUT = 90.0
BUSY_TIMEOUT = 10.0  # for the kill to find a member of the doomed instance holding records uncommitted
MEMBERS = 3
SHARES = 4
PARTITIONS = 2
SEEDS = {"kr": 81, "coop": 83}
WORK = 0.0005  # seconds each record takes in a librdkafka member, before the batch's commit


class RdkafkaMembers:
    """librdkafka consumers of one group, a thread each: every batch ``consume`` returns is
    handed out, processed, then committed synchronously (also when idle, so positions moved
    past other shares' records reach the coordinator); what a rebalance revokes is committed
    on the way out."""

    def __init__(self, bootstrap: str, virtual: str, group: str, topic: str, names: list[str], history: History,
                 ledger: Ledger, workdir: Path) -> None:
        self.bootstrap, self.virtual, self.group, self.topic = bootstrap, virtual, group, topic
        self.names, self.history, self.ledger = names, history, ledger
        self.assigned: dict[str, int] = {}
        self.errors: list[str] = []
        self.tolerated: dict[str, int] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self, names: list[str]) -> None:
        for name in names:
            self._threads.append(threading.Thread(target=self._member, args=(name,), daemon=True))
            self._threads[-1].start()

    def sizes(self) -> list[int]:
        return list(self.assigned.values())

    def delivered(self) -> set[tuple[int, int]]:
        return {(d.partition, d.offset) for d in list(self.history.deliveries)}

    def holding(self, names: list[str]) -> bool:
        now = time.monotonic()
        return any(self.ledger.uncommitted_at(name, now) for name in names)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def feed(self) -> None:
        """Deliveries went into the history as they happened."""

    def _tolerate(self, name: str, exc: BaseException) -> None:
        key = f"{name} {exc}"
        self.tolerated[key] = self.tolerated.get(key, 0) + 1

    def _member(self, name: str) -> None:
        from confluent_kafka import Consumer, KafkaError, KafkaException

        def commit(consumer) -> bool:
            try:
                consumer.commit(asynchronous=False)
            except KafkaException as exc:
                if exc.args[0].code() == KafkaError._NO_OFFSET:
                    return True
                self._tolerate(name, exc)  # left uncommitted: at-least-once for this client
                return False
            return True

        def on_assign(consumer, partitions) -> None:
            self.assigned[name] = len(consumer.assignment())

        def on_revoke(consumer, partitions) -> None:
            covered = self.ledger.count(name)
            if commit(consumer):
                self.ledger.committed(name, covered)
            self.assigned[name] = 0

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group, "client.id": name,
                             "auto.offset.reset": "earliest", "enable.auto.commit": False,
                             "session.timeout.ms": 10000, "heartbeat.interval.ms": 500, "fetch.wait.max.ms": 300})
        consumer.subscribe([self.virtual], on_assign=on_assign, on_revoke=on_revoke)
        last_commit = time.monotonic()
        try:
            while not self._stop.is_set():
                messages = consumer.consume(100, 0.3)
                records = [m for m in messages if m.error() is None]
                self.errors += [f"{name}: {m.error()}" for m in messages if m.error() is not None]
                for m in records:
                    virtual, virtual_partition, offset = m.topic(), m.partition(), m.offset()
                    assert virtual is not None and virtual_partition is not None and offset is not None  # a record's
                    topic, partition = real_partition(virtual, virtual_partition)
                    self.history.deliver(name, topic, partition, offset, m.key())
                    self.ledger.hand(name, (topic, partition, offset))
                for _ in records:
                    time.sleep(WORK)  # the record's processing
                if records or time.monotonic() - last_commit > 1.0:
                    covered = self.ledger.count(name)
                    if commit(consumer):
                        self.ledger.committed(name, covered)
                    last_commit = time.monotonic()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(f"{name}: {exc!r}")
        finally:
            consumer.close()


class JavaMember(PlainConsumerProcess):
    """``PlainConsumer`` whose lines are also kept in order: which records each commit covers."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sequence: list[tuple[str, float, tuple[str, int, int]] | tuple[str]] = []

    def _on_line(self, fields: list[str], launch: int) -> None:
        super()._on_line(fields, launch)
        if fields[0] == "rec" and len(fields) >= 7:
            record = self.records[-1]
            topic, partition = real_partition(record.topic, record.partition)
            self.sequence.append(("rec", float(fields[6]), (topic, partition, record.offset)))
        elif fields[0] == "commit":
            self.sequence.append(("commit",))

    def holding(self) -> bool:
        """Its last poll's records are printed and their commit is not (yet)."""
        self.refresh()
        return bool(self.sequence) and self.sequence[-1][0] == "rec"

    def fill(self, ledger: Ledger) -> None:
        """Its hand-outs and commits into ``ledger``. A commit line has no time of its own:
        it was done before the next poll returned, so it counts as done then (or never, if
        no poll followed): never earlier than it was."""
        pending: list[int] = []
        for entry in self.sequence:
            if entry[0] == "commit":
                pending.append(ledger.count(self.name))
                continue
            _, at, record = entry  # type: ignore[misc]
            for covered in pending:
                ledger.committed(self.name, covered, at)
            pending = []
            ledger.hand(self.name, record, at)
        for covered in pending:
            ledger.committed(self.name, covered, math.inf)


class JavaMembers:
    """Java KafkaConsumers (``PlainConsumer``) of one group, a JVM each."""

    def __init__(self, bootstrap: str, virtual: str, group: str, topic: str, names: list[str], history: History,
                 ledger: Ledger, workdir: Path) -> None:
        streams_app.build()
        self.history, self.ledger = history, ledger
        configs = {**streams_app.FAST_FAILOVER, "fetch.max.wait.ms": "300"}
        self.members = [JavaMember(bootstrap, virtual, group, workdir=workdir / "java", name=name,
                                   max_poll_records=100, configs=configs) for name in names]
        self.tolerated: dict[str, int] = {}
        self.errors: list[str] = []

    def start(self, names: list[str]) -> None:
        for member in self.members:
            if member.name in names:
                member.start()

    def sizes(self) -> list[int]:
        for member in self.members:
            member.check_alive()
            member.refresh()
        return [len(member.assignment) for member in self.members if member.joined]

    def delivered(self) -> set[tuple[int, int]]:
        out = set()
        for member in self.members:
            member.refresh()
            out |= {(real_partition(r.topic, r.partition)[1], r.offset) for r in member.records}
        return out

    def holding(self, names: list[str]) -> bool:
        return any(member.holding() for member in self.members if member.name in names)

    def stop(self) -> None:
        for member in self.members:
            if member.process is None:
                continue
            code = member.stop(30)
            if code not in (0, None):
                self.errors.append(f"{member.name} exited with {code}: {member.stderr_tail(5)}")
            member.close()

    def feed(self) -> None:
        """Every member's records into the history, in the order of their polls' times (a
        poll's records keep their order), and its commits into the ledger."""
        entries = []
        for member in self.members:
            member.refresh()
            member.fill(self.ledger)
            for error in member.errors:
                what = f"{member.name} {error}"
                self.tolerated[what] = self.tolerated.get(what, 0) + 1
            for record in member.records:
                topic, partition = real_partition(record.topic, record.partition)
                key = None if record.key is None else record.key.encode()
                entries.append((record.time or 0.0, member.name, topic, partition, record.offset, key))
        for _, name, topic, partition, offset, key in sorted(entries, key=lambda e: e[0]):
            self.history.deliver(name, topic, partition, offset, key)


FLEETS = {"java": JavaMembers, "rdkafka": RdkafkaMembers}

CASES = [pytest.param(2, kind, client, False, id=f"{kind}-{client}-2-instances")
         for kind in ("kr", "coop") for client in ("java", "rdkafka")] + [
    pytest.param(3, "kr", "rdkafka", False, id="kr-rdkafka-3-instances"),
    pytest.param(3, "coop", "java", False, id="coop-java-3-instances"),
    pytest.param(2, "kr", "java", True, id="kr-java-2-instances-one-killed"),
    pytest.param(2, "kr", "rdkafka", True, id="kr-rdkafka-2-instances-one-killed"),
    pytest.param(2, "coop", "rdkafka", True, id="coop-rdkafka-2-instances-one-killed"),
]


@pytest.mark.parametrize(("instances", "kind", "client", "kill"), CASES)
def test_standard_members_of_virtual_topics_spread_over_instances(kafka, proxy_factory, topic_factory, tmp_path,
                                                                   instances, kind, client, kill):
    from confluent_kafka.admin import AdminClient

    names = member_names(MEMBERS)
    replicas = start_replicas(kafka, proxy_factory, tmp_path, instances, spread(names, instances))
    producer: LiveProducer | None = None
    try:
        topic = topic_factory(kafka, partitions=PARTITIONS)
        virtual = f"{topic}.{kind}{SHARES}"
        group = f"ha-{kind}-{client}-{topic}"
        history = History()
        ledger = Ledger()
        fleet = FLEETS[client](replicas.bootstrap, virtual, group, topic, names, history, ledger, tmp_path)
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})

        def settled(members: int) -> bool:  # each member holds virtual partitions, all of them held
            description = admin.describe_consumer_groups([group])[group].result(10)
            sizes = [len(m.assignment.topic_partitions) for m in description.members]
            return len(sizes) == members and all(sizes) and sum(sizes) == SHARES * PARTITIONS

        def acknowledged_delivered() -> bool:
            assert producer is not None
            delivered = fleet.delivered()
            return producer.done and all((a.partition, a.offset) in delivered for a in history.acks)

        busy = False
        killed_at = 0  # records handed out when the instance was killed
        try:
            fleet.start(names[:-1])
            wait_until(lambda: settled(MEMBERS - 1), timeout=SETTLE_TIMEOUT, interval=0.5,
                       what=lambda: f"{MEMBERS - 1} members sharing {virtual} (sizes {fleet.sizes()})")
            producer = LiveProducer(kafka.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS[client],
                                    seed=SEEDS[kind] + 3 * instances + 10 * kill + (client == "java"),
                                    key_of=hot_key if kind == "coop" else default_key)
            producer.start()
            # the last member joins while records are written: virtual partitions move between
            # members of different instances under live traffic
            wait_until(lambda: len(fleet.delivered()) > RECORDS // 10, timeout=60, interval=0.1,
                       what="records handed out before the last member joins")
            fleet.start(names[-1:])
            wait_until(lambda: settled(MEMBERS), timeout=SETTLE_TIMEOUT, interval=0.5,
                       what=lambda: f"{MEMBERS} members sharing {virtual} (sizes {fleet.sizes()})")
            if kill:
                wait_until(lambda: len(fleet.delivered()) > RECORDS // 3, timeout=60, interval=0.1,
                           what="a third of the records handed out before the kill")
                deadline = time.monotonic() + BUSY_TIMEOUT
                while not (busy := fleet.holding(replicas.members_of(0))) and time.monotonic() < deadline:
                    time.sleep(0.001)
                replicas.kill(0)
                killed_at = len(fleet.delivered())
            delivered = _wait(acknowledged_delivered, SECONDS[client] + DEADLINE)
            committed = delivered and _wait(lambda: _at_log_end(kafka, group, topic, PARTITIONS), 60)
        finally:
            fleet.stop()
        producer.join()
        fleet.feed()
        assert producer.failed == 0, producer.errors
        verdict = check(history, keyed_order=kind == "kr",  # stripes promise no key order
                        committed=_committed(kafka.bootstrap_servers, group, topic, PARTITIONS),
                        log_end=_log_end(kafka.bootstrap_servers, topic, PARTITIONS))
        handed = {name: ledger.count(name) for name in names}
        message = (f"{verdict.summary()}\nhanded out per member {handed}; delivered in time {delivered}, committed "
                   f"at the end in time {committed}; tolerated {fleet.tolerated}; errors {fleet.errors[:5]}")
        print(f"\n{kind}{SHARES} by {client}, {instances} instances{', one killed' if kill else ''}: {verdict.summary()}; "
              f"handed out per member {handed}")
        assert not fleet.errors, message
        assert verdict.acknowledged == RECORDS
        assert not verdict.lost and not verdict.strays, message
        assert not verdict.committed_behind, message
        assert all(handed.values()), message
        if kind == "coop":  # by stripes, not by key: the hot key's records went to several members
            hot = {d.member for d in history.deliveries if d.key == b"hot"}
            assert len(hot) > 1, f"the hot key was handed only to {hot}; {message}"
        replicas.check_spread()
        if not kill:
            assert verdict.ok(), message
            return
        replicas.check_reconnected(0)
        assert busy, f"no member of the killed instance held records uncommitted within {BUSY_TIMEOUT:g} s; {message}"
        allowed = assert_kill_bound(verdict, ledger, dict.fromkeys(replicas.members_of(0), replicas.killed[0]), message)
        assert_order_explained(verdict, message)
        print(f"killed with {killed_at} of {RECORDS} records handed out; handed out twice {verdict.redelivered} "
              f"({len(verdict.duplicates)} records), allowed at most {allowed}: what {replicas.members_of(0)} held "
              f"uncommitted when their instance died")
    finally:
        if producer is not None:
            producer.stop()
        replicas.close()


def _wait(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True
