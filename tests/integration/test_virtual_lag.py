"""Lag that tells the truth on virtual topics (docs/virtual-topics.md#lag).

Most applications commit the offset after the last record they processed, not their
position. On a virtual partition the share's last record is usually before the log end
(the rest of the log is other shares'), so such a commit alone leaves lag that never goes
away. The proxy lifts a share's committed offset past the offsets it has proven hold none
of the share's records (the stretches its control batches moved the share's consumers
past), so a group that is caught up shows lag 0 on every virtual partition and the real
partition's committed offset at the broker is its log end.

Members of a group on ``<topic>.kr4`` (2 partitions: 8 virtual partitions) commit
``offset + 1`` explicitly, after each record or after each poll's records, while the
records are written; every commit is counted as acknowledged only once it returned.
Once every record is delivered and acknowledged, and the members just keep polling:
``kafka-consumer-groups --describe`` through the proxy shows lag 0 on every virtual
partition, and the real partitions' committed offsets read from the broker itself are
their log ends.

Then records of one share only are written to partition 0, and that share's member holds
their commit back: the other shares of the partition get no record and commit nothing, so
only the proxy's own lift can bring their lag to 0 (it does); the held share shows its
records as lag until its member commits them, and then the partition is at its end.

The same with franz-go (Go) members committing as franz-go does by default (autocommit of
the offset after the last record polled), when a ``go`` toolchain can build
``harness/franz_member``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import pytest

from harness import franz_member, java_tools
from harness.wait import wait_until
from proxy.records.keyhash import key_hash
from proxy.virtual.names import share_ranges
from tests.integration import virtual_checks as checks
from tests.integration.virtual_checks import PARTITIONS, SHARES

pytestmark = pytest.mark.kafka

RECORDS = 1200
TAIL = 7  # records of one share written once the group is caught up
CHUNKS = 12  # written while the members read, a chunk every CHUNK_PAUSE seconds
CHUNK_PAUSE = 0.3
MEMBERS = 3


class ExplicitCommitters:
    """``members`` kafka-python consumers of ``topic`` in ``group``, a thread each, with
    auto-commit off, each committing ``offset + 1`` of what it processed: after each
    record (``per_record``) or after each poll's records of a partition. They poll until
    told to stop (heartbeating as members do), so the group stays as it is while checked.
    ``delivered``: records handed to the application; ``acknowledged``: records whose
    commit returned without error."""

    def __init__(self, bootstrap: str, topic: str, group: str, members: int, *, per_record: bool,
                 deadline: float) -> None:
        self.bootstrap, self.topic, self.group = bootstrap, topic, group
        self.members, self.per_record, self.deadline = members, per_record, deadline
        # virtual partitions whose records are processed but not committed until released
        self.held: set[int] = set()
        self.results: list[checks.Received] = [[] for _ in range(members)]
        self.sizes: dict[int, int] = {}
        self.failures: list[BaseException] = []
        self.delivered = 0
        self.acknowledged = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._member, args=(i,), daemon=True) for i in range(members)]

    def start(self) -> None:
        """The first member joins alone (kafka-python's lost-sync race:
        test_virtual_clients.py), then the others; returns once they hold every virtual
        partition, so the records written afterwards meet no rebalance."""
        self._threads[0].start()
        checks.wait_assigned(lambda: [self.sizes.get(0, 0)], 1)
        for thread in self._threads[1:]:
            thread.start()
        checks.wait_assigned(lambda: list(self.sizes.values()), self.members)

    def stop(self, timeout: float = 60.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)

    def _member(self, index: int) -> None:
        from kafka import KafkaConsumer
        from kafka.structs import OffsetAndMetadata

        consumer = KafkaConsumer(self.topic, bootstrap_servers=self.bootstrap, group_id=self.group,
                                 auto_offset_reset="earliest", enable_auto_commit=False, session_timeout_ms=10000,
                                 heartbeat_interval_ms=500, max_poll_records=50)
        pending: dict = {}  # held partition -> (offset after its last record, records not committed)

        def commit(tp, offset: int, count: int) -> None:
            if tp.partition in self.held:
                pending[tp] = (offset, pending.get(tp, (0, 0))[1] + count)
                return
            consumer.commit({tp: OffsetAndMetadata(offset, "", -1)})
            with self._lock:
                self.acknowledged += count

        try:
            while not self._stop.is_set() and time.monotonic() < self.deadline:
                batches = consumer.poll(timeout_ms=200)
                self.sizes[index] = len(consumer.assignment())
                for tp, records in batches.items():
                    for record in records:
                        self.results[index].append((tp.partition, record.offset, record.key, record.value))
                        with self._lock:
                            self.delivered += 1
                        if self.per_record:
                            commit(tp, record.offset + 1, 1)
                    if not self.per_record and records:
                        commit(tp, records[-1].offset + 1, len(records))
                for tp in [tp for tp in pending if tp.partition not in self.held]:
                    commit(tp, *pending.pop(tp))  # released
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.failures.append(exc)
        finally:
            consumer.close(autocommit=False)


def _produce_while_reading(bootstrap: str, topic: str) -> list[tuple[bytes, bytes]]:
    sent: list[tuple[bytes, bytes]] = []
    per_chunk = RECORDS // CHUNKS
    for chunk in range(CHUNKS):
        sent += checks.produce(bootstrap, topic, per_chunk, start=chunk * per_chunk)
        time.sleep(CHUNK_PAUSE)  # pacing the writer, not waiting for a condition
    return sent


def _produce_to_one_share(bootstrap: str, topic: str, share: int, count: int) -> list[tuple[bytes, bytes]]:
    """``count`` records to partition 0 of ``topic``, every key in ``share`` of ``SHARES``."""
    from confluent_kafka import Producer

    wanted = share_ranges(SHARES)[share]
    keys = [key for key in (f"tail-{i}".encode() for i in range(10_000))
            if wanted.start <= key_hash(key, 0) <= wanted.end][:count]
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    sent = []
    for i, key in enumerate(keys):
        value = f"tail-value-{i}".encode()
        producer.produce(topic, key=key, value=value, partition=0)
        sent.append((key, value))
    assert producer.flush(30) == 0
    return sent


def _lifts(proxy, topic: str) -> float:
    """The proxy's own lifts of ``topic`` (kafka_proxy_virtual_lifts)."""
    return proxy.metric("kafka_proxy_virtual_lifts_total", topic=topic)


def _broker_committed_and_ends(bootstrap: str, topic: str, group: str) -> dict[int, tuple[int, int]]:
    """partition -> (committed offset, log end) of the real topic, asked of the broker
    itself (not through the proxy)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        asked = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        committed = {tp.partition: tp.offset for tp in consumer.committed(asked, timeout=10)}
        return {p: (committed[p], consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1])
                for p in range(PARTITIONS)}
    finally:
        consumer.close()


def _lag_table(rows: list[dict[str, str]]) -> str:
    return "\n".join(f"{row['TOPIC']:>48} {row['PARTITION']:>3} {row['CURRENT-OFFSET']:>6} "
                     f"{row['LOG-END-OFFSET']:>6} {row['LAG']:>4}" for row in rows)


@pytest.mark.parametrize("per_record", [True, False], ids=["commit-each-record", "commit-each-poll"])
def test_group_committing_offset_plus_one_shows_no_lag_when_caught_up(kafka, proxy, topic_factory, per_record):
    topic = topic_factory(kafka, partitions=PARTITIONS)
    virtual = f"{topic}.kr{SHARES}"
    group = f"vlag-{uuid.uuid4().hex[:8]}"
    deadline = time.monotonic() + 240
    fleet = ExplicitCommitters(proxy.bootstrap_servers, virtual, group, MEMBERS, per_record=per_record,
                               deadline=deadline)
    fleet.start()
    try:
        sent = _produce_while_reading(proxy.bootstrap_servers, topic)
        checks.wait_until_count(lambda: fleet.acknowledged, len(sent), deadline)
        assert not fleet.failures, fleet.failures
        assert fleet.delivered == fleet.acknowledged == len(sent)
        checks.check_delivery(sent, fleet.results)

        seen: dict[str, object] = {}

        def lags_are(expected: dict[int, int], *, at_end: bool) -> Callable[[], bool]:
            """Describe through the proxy shows ``expected`` lag per virtual partition; and
            (``at_end``) the broker itself holds each real partition committed at its end."""
            def check() -> bool:
                rows = seen["rows"] = java_tools.describe_group(proxy.bootstrap_servers, group)
                at_broker = seen["broker"] = _broker_committed_and_ends(kafka.bootstrap_servers, topic, group)
                lags = {int(row["PARTITION"]): row["LAG"] for row in rows if row["TOPIC"] == virtual}
                return (lags == {p: str(lag) for p, lag in expected.items()}
                        and (not at_end or all(committed == end for committed, end in at_broker.values())))
            return check

        def report() -> str:
            return (f"group {group}:\n{_lag_table(seen.get('rows', []))}\n"  # type: ignore[arg-type]
                    f"at the broker (committed, log end): {seen.get('broker')}")

        every = range(SHARES * PARTITIONS)
        wait_until(lags_are({p: 0 for p in every}, at_end=True), timeout=30, interval=1.0, what=report)
        print(f"\ncaught up: {report()}\nlifted by the proxy itself: {_lifts(proxy, topic):g}")

        # Records of share 0 of partition 0 only, their commit held back by their member:
        # shares 1-3 of the partition get nothing and commit nothing; only the proxy's own
        # lift moves them.
        fleet.held = {0}
        lifted = _lifts(proxy, topic)
        tail = _produce_to_one_share(proxy.bootstrap_servers, topic, 0, TAIL)
        checks.wait_until_count(lambda: fleet.delivered, len(sent) + len(tail), deadline)
        wait_until(lambda: _lifts(proxy, topic) > lifted, timeout=30, what="the proxy's own lift of partition 0")
        wait_until(lags_are({p: TAIL if p == 0 else 0 for p in every}, at_end=False), timeout=30, interval=1.0,
                   what=report)
        print(f"\nshare 0 held: {report()}")
        fleet.held = set()
        checks.wait_until_count(lambda: fleet.acknowledged, len(sent) + len(tail), deadline)
        wait_until(lags_are({p: 0 for p in every}, at_end=True), timeout=30, interval=1.0, what=report)
        print(f"\nreleased: {report()}\nlifted by the proxy itself: {_lifts(proxy, topic):g}")
        assert not fleet.failures, fleet.failures
        assert fleet.delivered == fleet.acknowledged == len(sent) + len(tail)
        checks.check_delivery(sent + tail, fleet.results)
    finally:
        fleet.stop()


def test_franz_go_group_shows_no_lag_when_caught_up(kafka, proxy, topic_factory):
    program, why = franz_member.build()
    if program is None:
        pytest.skip(f"franz-go member not built: {why}")
    from confluent_kafka.admin import AdminClient

    topic = topic_factory(kafka, partitions=PARTITIONS)
    virtual = f"{topic}.kr{SHARES}"
    group = f"vlag-go-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})

    def sizes() -> list[int]:
        description = admin.describe_consumer_groups([group])[group].result(10)
        return [len(m.assignment.topic_partitions) for m in description.members]

    members = [franz_member.FranzMember(program, proxy.bootstrap_servers, virtual, group)]
    try:
        checks.wait_assigned(sizes, 1)
        members += [franz_member.FranzMember(program, proxy.bootstrap_servers, virtual, group)
                    for _ in range(MEMBERS - 1)]
        checks.wait_assigned(sizes, MEMBERS)
        sent = _produce_while_reading(proxy.bootstrap_servers, topic)
        deadline = time.monotonic() + 120
        checks.wait_until_count(lambda: sum(len(m.received) for m in members), len(sent), deadline)
        seen: dict[str, object] = {}

        def caught_up() -> bool:
            rows = seen["rows"] = java_tools.describe_group(proxy.bootstrap_servers, group)
            at_broker = seen["broker"] = _broker_committed_and_ends(kafka.bootstrap_servers, topic, group)
            lags = {int(row["PARTITION"]): row["LAG"] for row in rows if row["TOPIC"] == virtual}
            return (lags == {p: "0" for p in range(SHARES * PARTITIONS)}
                    and all(committed == end for committed, end in at_broker.values()))

        wait_until(caught_up, timeout=30, interval=1.0,
                   what=lambda: f"group {group}:\n{_lag_table(seen.get('rows', []))}\n"  # type: ignore[arg-type]
                                f"at the broker (committed, log end): {seen.get('broker')}")
        print(f"\nfranz-go caught up:\n{_lag_table(seen['rows'])}\n"  # type: ignore[arg-type]
              f"at the broker (committed, log end): {seen['broker']}\nlifted by the proxy itself: "
              f"{_lifts(proxy, topic):g}")
        # Acknowledged: delivered below its virtual partition's committed offset.
        committed = {int(row["PARTITION"]): int(row["CURRENT-OFFSET"])
                     for row in seen["rows"] if row["TOPIC"] == virtual}  # type: ignore[union-attr]
        delivered = [record for member in members for record in member.received]
        acknowledged = [r for r in delivered if r[1] < committed[r[0]]]
        assert len(delivered) == len(acknowledged) == len(sent)
    finally:
        codes = [member.stop() for member in members]
    assert codes == [0] * len(members), [member.errors[-5:] for member in members]
    checks.check_delivery(sent, [member.received for member in members])


def _group_coordinated_away_from(bootstrap: str, leader: int) -> str:
    """A new group's name whose coordinator is not broker ``leader`` (FindCoordinator,
    asked again while ``__consumer_offsets`` is being created)."""
    from harness.raw_client import RawClient
    from proxy.protocol.api_keys import ApiKey

    found: list[str] = []

    def away() -> bool:
        group = f"vlag-side-{uuid.uuid4().hex[:8]}"
        (answer,) = client.call(ApiKey.FIND_COORDINATOR, 4, key_type=0, coordinator_keys=[group]).coordinators
        if answer.error_code == 0 and answer.node_id != leader:
            found.append(group)
        return bool(found)

    with RawClient.connect(bootstrap) as client:
        wait_until(away, timeout=30, interval=0.2, what=f"a group coordinated by another broker than {leader}")
    return found[0]


def test_sidecars_lift_the_shares_another_sidecar_served(kafka_cluster, proxy_factory, topic_factory):
    """A sidecar per broker: the members fetch partition 0 through its leader's sidecar and
    commit through the group coordinator's, another one. The coordinator's sidecar never
    sees a Fetch of the partition, so it reads the partition's tail itself once the commits
    go quiet: a caught-up group shows lag 0 and the partition is committed at its log end."""
    from confluent_kafka.admin import AdminClient

    from .conftest import free_ports

    nodes = sorted(kafka_cluster.nodes, key=lambda node: node.node_id)
    ports = free_ports(len(nodes))
    mapping = ",".join(f"{node.node_id}@127.0.0.1:{port}" for node, port in zip(nodes, ports))
    sidecars = [proxy_factory(kafka_cluster, bootstrap=f"127.0.0.1:{node.port}", listen_port=port,
                              topology="sidecar", sidecar_node_addresses=mapping, metrics_port="0")
                for node, port in zip(nodes, ports)]
    topic = topic_factory(kafka_cluster, partitions=PARTITIONS, replication_factor=3)
    virtual = f"{topic}.kr{SHARES}"
    metadata = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap_servers}).list_topics(topic, timeout=10)
    leader = metadata.topics[topic].partitions[0].leader
    group = _group_coordinated_away_from(kafka_cluster.bootstrap_servers, leader)
    bootstrap = sidecars[0].bootstrap_servers
    # every broker knows the new topic (its sidecar answers the virtual topic's metadata)
    # before a member asks: kafka-python does not ask again for minutes
    for sidecar in sidecars:
        admin = AdminClient({"bootstrap.servers": sidecar.bootstrap_servers})
        wait_until(lambda admin=admin: len(admin.list_topics(virtual, timeout=10).topics[virtual].partitions)
                   == SHARES * PARTITIONS, timeout=30, interval=0.2, what=f"{virtual} through {sidecar.port}")
    deadline = time.monotonic() + 240
    fleet = ExplicitCommitters(bootstrap, virtual, group, MEMBERS, per_record=False, deadline=deadline)
    fleet.start()
    try:
        sent = _produce_while_reading(bootstrap, topic)
        checks.wait_until_count(lambda: fleet.acknowledged, len(sent), deadline)
        assert not fleet.failures, fleet.failures
        assert fleet.delivered == fleet.acknowledged == len(sent)
        checks.check_delivery(sent, fleet.results)
        seen: dict[str, object] = {}

        def caught_up() -> bool:
            rows = seen["rows"] = java_tools.describe_group(bootstrap, group)
            at_broker = seen["broker"] = _broker_committed_and_ends(kafka_cluster.bootstrap_servers, topic, group)
            lags = {int(row["PARTITION"]): row["LAG"] for row in rows if row["TOPIC"] == virtual}
            return (lags == {p: "0" for p in range(SHARES * PARTITIONS)}
                    and all(committed == end for committed, end in at_broker.values()))

        wait_until(caught_up, timeout=30, interval=1.0,
                   what=lambda: f"group {group} (partition 0 led by broker {leader}):\n"
                                f"{_lag_table(seen.get('rows', []))}\n"  # type: ignore[arg-type]
                                f"at the broker (committed, log end): {seen.get('broker')}")
        lifted = {sidecar.port: _lifts(sidecar, topic) for sidecar in sidecars}
        print(f"\nsidecars caught up:\n{_lag_table(seen['rows'])}\n"  # type: ignore[arg-type]
              f"at the broker (committed, log end): {seen['broker']}\nlifts per sidecar: {lifted}")
    finally:
        fleet.stop()
    assert not fleet.failures, fleet.failures
