"""Transactional consume-transform-produce on virtual range topics through the proxy
(docs/individual-commit.md, "Transactional commits"): standard clients that read ``T.kr4``
(each real partition p of T seen as virtual partitions 4p..4p+3, one key-hash quarter each)
commit their offsets inside Kafka transactions (TxnOffsetCommit, ``sendOffsetsToTransaction``
with the consumer's group metadata), and the output is exactly once.

Records are written live by a producer straight to the broker (acks=all, idempotent), so its
acknowledgements are the truth. The relays (``TxnRelay`` in Java, the librdkafka member
``harness.rdkafka_txn_member``) write one output record per input record naming it,
and abort every fifth transaction on purpose after producing and adding their offsets, then
rewind and redo the work. The committed output, read with read_committed straight from the
broker once every member stopped, must hold every acknowledged input record exactly once
(none lost, none twice, nothing else), nothing written by an aborted transaction, and the
records of the aborted transactions redone (``harness.txn_output``).

- Java ``TxnRelay``, 4 instances on ``T.kr4`` of a 1-partition topic: on one node, and on the
  three-node cluster; with one instance killed (SIGKILL) inside a transaction and restarted.
- librdkafka members, 3 on ``T.kr4``.
- Kafka Streams ``exactly_once_v2`` (``KeyCountApp``), 4 instances on ``T.kr4``: per-key
  counts exact with one instance killed and restarted, and with the proxy killed and
  restarted on its port.
- The control: Java ``TxnRelay`` on the real topic through the proxy (4 partitions, 4
  instances), which works without the proxy knowing transactions.

Until the proxy rewrites TxnOffsetCommit of virtual partitions, the broker answers
UNKNOWN_TOPIC_OR_PARTITION for ``T.kr4`` and the clients retry until their own timeout
(``max.block.ms`` in Java, the call's timeout in librdkafka): the virtual tests then fail
within their deadlines, with the clients' errors in the message.
"""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.history import History
from harness.kafka_cluster import KafkaCluster
from harness.live import LiveProducer
from harness.rdkafka_txn_member import RdkafkaTxnMemberProcess
from harness.streams_app import FAST_FAILOVER, StreamsAppError, StreamsFleet, TxnFleet, build, read_counts
from harness.txn_output import TxnVerdict, check_output, read_output
from proxy.local_kafka import ProxyProcess
from tests.integration.conftest import free_ports
from tests.integration.test_live_tail import _committed, _log_end
from tests.integration.test_live_tail_kills import _restart

pytestmark = [pytest.mark.kafka]

SHARES = 4
RECORDS = 1500
SECONDS = 10.0
KEYS = 200
ABORT_EVERY = 5
OUTPUT_PARTITIONS = 2
SEED = 11

# Every transactional call gives up after 10 s (the Java client retries a refused
# TxnOffsetCommit until max.block.ms), a transaction left open by a killed member ends
# within 10 s, and a dead member leaves the group within 6 s.
JAVA_CONFIGS = {**FAST_FAILOVER, "max.block.ms": "10000", "transaction.timeout.ms": "10000",
                "default.api.timeout.ms": "15000"}
RDKAFKA_CONFIGS = {"consumer.session.timeout.ms": "6000", "consumer.heartbeat.interval.ms": "1500",
                   "producer.transaction.timeout.ms": "10000"}
STREAMS_CONFIGS = {**FAST_FAILOVER, "max.block.ms": "10000", "task.timeout.ms": "20000"}

JOIN_TIMEOUT = 60.0  # the JVMs start and the group settles
FIRST_COMMIT_TIMEOUT = 30.0  # every member commits a transaction once records flow
OUTPUT_TIMEOUT = 45.0  # after the producer finished, until the committed output holds every record
COMMITTED_TIMEOUT = 15.0  # after the output is complete, until T's committed offsets reach its log end


@pytest.fixture(scope="module")
def streams_jars() -> None:
    try:
        build()
    except StreamsAppError as exc:
        pytest.fail(str(exc), pytrace=False)


def _until(condition: Callable[[], bool], timeout: float, what: Callable[[], str],
           check: Callable[[], None] = lambda: None, interval: float = 0.2) -> None:
    """``condition`` until true, at most ``timeout`` s; ``check`` first each time raises at
    once (a member exited). Fails with ``what()`` (evaluated late: it reports progress)."""
    deadline = time.monotonic() + timeout
    while True:
        check()
        if condition():
            return
        if time.monotonic() >= deadline:
            pytest.fail(f"{what()} did not happen within {timeout:g} s", pytrace=False)
        time.sleep(interval)


def _alive_check(fleet, group: str, source: str, context: Callable[[], str]) -> Callable[[], None]:
    """A ``check`` for ``_until``: fails the test at once, with ``context()``, when a member
    of ``fleet`` has exited."""

    def alive() -> None:
        try:
            fleet.check_alive()
        except StreamsAppError as exc:
            failure = f"a member of {group} reading {source} exited: {exc}\n{context()}"
        else:
            return
        pytest.fail(failure, pytrace=False)

    return alive


def _input_partitions(topic: str, partitions: int, virtual: bool) -> tuple[str, set[tuple[str, int]]]:
    if virtual:
        name = f"{topic}.kr{SHARES}"
        return name, {(name, v) for v in range(partitions * SHARES)}
    return topic, {(topic, p) for p in range(partitions)}


def _relay_run(cluster: KafkaCluster, proxy: ProxyProcess, topic_factory, tmp_path: Path, *,
               make: Callable[..., TxnFleet], virtual: bool, partitions: int = 1, replication: int = 1,
               kill: bool = False, delay_ms: int = 0, at_end: bool = False) -> TxnVerdict:
    """Members of one group relay ``T`` (``T.kr4`` when ``virtual``) to an output topic while
    a producer writes ``RECORDS`` records live; with ``kill``, the busiest member is killed
    inside a transaction mid-stream and started again with the same transactional id. The
    verdict of the committed output against the acknowledged input, after every member
    stopped cleanly. With ``at_end``, ``T``'s committed offsets at the coordinator reach its
    log end while the members are still in the group (their last shares lifted)."""
    configs = {"min.insync.replicas": "2"} if replication >= 3 else None
    topic = topic_factory(cluster, partitions=partitions, replication_factor=replication, configs=configs)
    output = topic_factory(cluster, partitions=OUTPUT_PARTITIONS, replication_factor=replication, configs=configs)
    source, owned = _input_partitions(topic, partitions, virtual)
    group = f"txn-{uuid.uuid4().hex[:8]}"
    history = History()
    producer = LiveProducer(cluster.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS, seed=SEED,
                            keys=KEYS)
    fleet = make(proxy.bootstrap_servers, source, output, group, workdir=tmp_path, abort_every=ABORT_EVERY,
                 delay_ms=delay_ms)
    began = time.monotonic()
    timeline: list[str] = []
    last: list[TxnVerdict] = []

    def context() -> str:
        return (f"{len(history.acks)} acknowledged; {fleet.summary()}; errors: {fleet.problems()}"
                + (f"; {'; '.join(timeline)}" if timeline else ""))

    alive = _alive_check(fleet, group, source, context)

    try:
        fleet.start()
        fleet.wait_assigned(owned, JOIN_TIMEOUT)
        timeline.append(f"group settled at {time.monotonic() - began:.1f}s")
        producer.start()
        owners = [m for m in fleet if m.assignment]
        _until(lambda: all(m.committed() for m in owners), FIRST_COMMIT_TIMEOUT,
               lambda: f"every member owning partitions of {source} committing a transaction ({context()})",
               alive)
        timeline.append(f"every owner committed at {time.monotonic() - began:.1f}s")
        if kill:
            _until(lambda: len(history.acks) >= RECORDS // 3, SECONDS,
                   lambda: f"a third of the input acknowledged ({context()})", alive)
            victim = max(owners, key=lambda m: len(m.committed()))
            # inside a transaction (records sent, offsets not yet) when that comes within a moment
            deadline = time.monotonic() + 3.0
            while not victim.in_transaction() and time.monotonic() < deadline:
                time.sleep(0.005)
            assert not producer.done, "the producer finished before the kill: not mid-stream"
            victim.kill()
            # begun and not ended by its lines once dead: the restart aborts it, unless the
            # kill came while commitTransaction was on its way (EndTxn sent), when the broker
            # commits it. Either way its records must be in the output exactly once: none
            # lost, none twice (it is not counted as aborted)
            writer = victim.open_writer()
            timeline.append(f"{victim.name} killed at {time.monotonic() - began:.1f}s "
                            f"{'inside transaction ' + str(victim.begun) if writer else 'between transactions'}")
            victim.start()
            victim.wait_ready(JOIN_TIMEOUT)
            timeline.append(f"{victim.name} ready again at {time.monotonic() - began:.1f}s")
        producer.join(SECONDS + 60)
        assert producer.failed == 0, producer.errors
        assert len(history.acks) == RECORDS

        def complete() -> bool:
            last[:] = [check_output(history.acks, read_output(cluster.bootstrap_servers, output, timeout=20))]
            return not last[0].lost or bool(last[0].duplicated or last[0].stray)  # a duplicate stays

        _until(complete, OUTPUT_TIMEOUT,
               lambda: f"the committed output holding every acknowledged record "
                       f"({last[0].summary() if last else 'not read'}; {context()})",
               alive, interval=1.0)
        timeline.append(f"output complete at {time.monotonic() - began:.1f}s")
        if at_end:
            log_end = _log_end(cluster.bootstrap_servers, topic, partitions)
            seen: list[dict[tuple[str, int], int]] = []

            def at_log_end() -> bool:
                seen[:] = [_committed(cluster.bootstrap_servers, group, topic, partitions)]
                return seen[0] == log_end

            _until(at_log_end, COMMITTED_TIMEOUT,
                   lambda: f"{topic}'s committed offsets at the coordinator {seen[0] if seen else 'unread'} "
                           f"at its log end {log_end} ({context()})", alive, interval=0.5)
            timeline.append(f"{topic} committed at its log end {log_end} at {time.monotonic() - began:.1f}s")
        codes = fleet.stop()
        assert codes == [0] * len(fleet), f"exit codes on SIGTERM {codes}: {context()}"
    finally:
        producer.stop()
        fleet.close()
    # every member stopped: every transaction ended; the final, committed output
    verdict = check_output(history.acks, read_output(cluster.bootstrap_servers, output, timeout=30),
                           aborted_writers=fleet.aborted_writers(),
                           aborted_ranges=fleet.aborted_ranges())
    assert verdict.acknowledged == RECORDS
    assert verdict.ok(), f"{verdict.summary()}; {context()}"
    planned = [t for m in fleet for t in m.aborted(planned=True)]
    assert planned, f"no transaction was aborted on purpose: {context()}"
    assert verdict.redone > 0, f"no record of an aborted transaction was redone: {verdict.summary()}; {context()}"
    raw = len(read_output(cluster.bootstrap_servers, output, isolation="read_uncommitted", timeout=30))
    print(f"{verdict.summary()}; {len(planned)} transactions aborted on purpose, {raw} output records in the log "
          f"with the aborted ones; {context()}")
    return verdict


def _java(size: int) -> Callable[..., TxnFleet]:
    def make(bootstrap: str, source: str, output: str, group: str, **options) -> TxnFleet:
        return TxnFleet.relays(size, bootstrap, source, output, group, configs=JAVA_CONFIGS, **options)
    return make


def _rdkafka(size: int) -> Callable[..., TxnFleet]:
    def make(bootstrap: str, source: str, output: str, group: str, *, workdir: Path, **options) -> TxnFleet:
        return TxnFleet([RdkafkaTxnMemberProcess(bootstrap, source, output, group, workdir=workdir, name=f"member-{i}",
                                                 timeout_ms=10_000, configs=RDKAFKA_CONFIGS, **options)
                         for i in range(size)])
    return make


# -- Java TxnRelay ----------------------------------------------------------------------------


@pytest.mark.timeout(150)
def test_java_relays_on_a_virtual_topic_write_each_record_once(kafka, proxy, topic_factory, streams_jars,
                                                               tmp_path):
    _relay_run(kafka, proxy, topic_factory, tmp_path, make=_java(4), virtual=True)


@pytest.mark.timeout(150)
def test_java_relays_on_a_virtual_topic_of_three_nodes_write_each_record_once(kafka_cluster, cluster_proxy,
                                                                              topic_factory, streams_jars,
                                                                              tmp_path):
    _relay_run(kafka_cluster, cluster_proxy, topic_factory, tmp_path, make=_java(4), virtual=True, replication=3)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("virtual", [pytest.param(True, id="virtual"), pytest.param(False, id="real")])
def test_java_relay_killed_inside_a_transaction_and_restarted(kafka, proxy, topic_factory, streams_jars,
                                                              tmp_path, virtual):
    """With ``real``, the control: the same kill on the real topic (4 partitions)."""
    _relay_run(kafka, proxy, topic_factory, tmp_path, make=_java(4), virtual=virtual,
               partitions=1 if virtual else SHARES, kill=True, delay_ms=50)


@pytest.mark.timeout(150)
def test_java_relays_on_the_real_topic_write_each_record_once(kafka, proxy, topic_factory, streams_jars, tmp_path):
    """The control: the same relays on the real topic (4 partitions for the 4 instances, as
    ``T.kr4`` of one partition has), which needs nothing of the proxy's transactions."""
    _relay_run(kafka, proxy, topic_factory, tmp_path, make=_java(4), virtual=False, partitions=SHARES)


# -- librdkafka -------------------------------------------------------------------------------


@pytest.mark.timeout(150)
def test_librdkafka_members_on_a_virtual_topic_write_each_record_once(kafka, proxy, topic_factory, tmp_path):
    _relay_run(kafka, proxy, topic_factory, tmp_path, make=_rdkafka(3), virtual=True, at_end=True)


# -- Kafka Streams exactly_once_v2 ------------------------------------------------------------


def _difference(expected: Counter[str], counts: dict[str, int], limit: int = 6) -> str:
    wrong = sorted(k for k in set(expected) | set(counts) if counts.get(k, 0) != expected.get(k, 0))
    shown = ", ".join(f"{k}: {counts.get(k, 0)} counted, {expected.get(k, 0)} acknowledged" for k in wrong[:limit])
    return (f"{len(wrong)} of {len(expected)} keys wrong ({sum(counts.values())} counted, "
            f"{sum(expected.values())} acknowledged){': ' + shown if shown else ''}")


def _causes(fleet: StreamsFleet, limit: int = 3) -> list[str]:
    """The distinct client exceptions the instances logged (their stderr, every launch)."""
    seen: dict[str, None] = {}
    for path in sorted(fleet.workdir.glob("*.err")):
        for line in path.read_text(errors="replace").splitlines():
            text = line.strip().removeprefix("Caused by: ")
            if text.startswith("org.apache.kafka.common.errors.") and "Exception" in text:
                seen.setdefault(text[:300], None)
    return list(seen)[:limit]


def _streams_run(kafka: KafkaCluster, proxy: ProxyProcess, topic_factory, tmp_path: Path, *,
                 fault: Callable[[StreamsFleet], str]) -> None:
    """4 ``KeyCountApp`` instances count the keys of ``T.kr4`` (T of one partition) while a
    producer writes live; ``fault`` strikes once a third is acknowledged and says what it
    did. The last count of every key in the committed output must equal its acknowledged
    records."""
    topic = topic_factory(kafka, partitions=1)
    output = f"{topic}-counts"
    history = History()
    producer = LiveProducer(kafka.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS, seed=SEED,
                            keys=KEYS)
    began = time.monotonic()
    timeline: list[str] = []
    last: dict[str, int] = {}
    with StreamsFleet(4, bootstrap=proxy.bootstrap_servers, input_topic=f"{topic}.kr{SHARES}", output_topic=output,
                      workdir=tmp_path, application_id=f"keycount-{uuid.uuid4().hex[:8]}", progress_ms=250,
                      cache_max_bytes=0, close_timeout_ms=10_000, configs=STREAMS_CONFIGS) as fleet:

        def context() -> str:
            states = ", ".join(f"{i.name} {i.state} {i.processed_total} processed" for i in fleet)
            return (f"{len(history.acks)} acknowledged; {states}; errors {fleet.errors()[-3:]}; causes in the logs "
                    f"{_causes(fleet)}; {'; '.join(timeline)}")

        def alive() -> None:
            try:
                fleet.check_alive()
            except StreamsAppError as exc:
                failure = f"an instance reading {topic}.kr{SHARES} exited: {exc}\n{context()}"
            else:
                return
            pytest.fail(failure, pytrace=False)

        try:
            fleet.start()
            fleet.wait_running(JOIN_TIMEOUT)
            timeline.append(f"RUNNING at {time.monotonic() - began:.1f}s")
            producer.start()

            def busy() -> bool:
                fleet.processed()
                if len(history.acks) < RECORDS // 3 or not all(i.processed > 0 for i in fleet):
                    return False
                last.clear()
                last.update(read_counts(kafka.bootstrap_servers, output, timeout=10))
                return bool(last)

            # the fault comes once counts were committed (transactions work) and records still flow
            _until(busy, FIRST_COMMIT_TIMEOUT, lambda: f"every instance processing records and counts committed "
                                                       f"({sum(last.values())} counted; {context()})", alive,
                   interval=0.5)
            assert not producer.done, "the producer finished before the fault: not mid-stream"
            timeline.append(f"{fault(fleet)} at {time.monotonic() - began:.1f}s")
            producer.join(SECONDS + 60)
            assert producer.failed == 0, producer.errors
            expected = Counter(ack.key.decode() for ack in history.acks if ack.key is not None)
            assert sum(expected.values()) == RECORDS

            def settled() -> bool:
                last.clear()
                last.update(read_counts(kafka.bootstrap_servers, output, timeout=20))
                return last == expected or any(n > expected.get(k, 0) for k, n in last.items())

            _until(settled, OUTPUT_TIMEOUT,
                   lambda: f"the counts reaching the acknowledged ones ({_difference(expected, last)}; {context()})",
                   alive, interval=1.0)
            codes = fleet.stop()
            errors = fleet.errors()
        finally:
            producer.stop()
    assert codes == [0] * 4, f"exit codes on SIGTERM {codes}: {context()}"
    final = read_counts(kafka.bootstrap_servers, output, timeout=30)
    assert final == expected, f"{_difference(expected, final)}; {context()}"
    print(f"{RECORDS} acknowledged, {sum(final.values())} counted over {len(final)} keys, exact; "
          f"{fleet.processed()} processed in all; errors {errors[-4:]}; {'; '.join(timeline)}")


@pytest.mark.timeout(150)
def test_streams_counts_on_a_virtual_topic_are_exact_after_an_instance_is_killed(kafka, proxy, topic_factory,
                                                                                  streams_jars, tmp_path):
    rng = random.Random(SEED)

    def kill_one(fleet: StreamsFleet) -> str:
        victim = max(fleet, key=lambda i: (i.processed, rng.random()))
        victim.kill()
        victim.start()
        victim.wait_running(JOIN_TIMEOUT)
        return f"{victim.name} killed after {victim.processed_before} records and RUNNING again"

    _streams_run(kafka, proxy, topic_factory, tmp_path, fault=kill_one)


@pytest.mark.timeout(150)
def test_streams_counts_on_a_virtual_topic_are_exact_after_the_proxy_is_killed(kafka, proxy_factory, topic_factory,
                                                                                streams_jars, tmp_path):
    (port,) = free_ports(1)
    # a sidecar that advertises its own port for the node: every address the clients learn
    # is this port, which the restarted proxy takes over
    settings = {"topology": "sidecar",
                "sidecar_node_addresses": ",".join(f"{node.node_id}@127.0.0.1:{port}" for node in kafka.nodes)}
    proxies = [proxy_factory(kafka, listen_port=port, **settings)]

    def kill_proxy(fleet: StreamsFleet) -> str:
        proxies[-1].kill()
        proxies.append(_restart(proxy_factory, kafka, port, settings))
        return f"proxy killed (pid {proxies[-2].pid}) and restarted on port {port} (pid {proxies[-1].pid})"

    _streams_run(kafka, proxies[0], topic_factory, tmp_path, fault=kill_proxy)
