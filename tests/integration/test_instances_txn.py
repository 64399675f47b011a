"""Exactly-once members of a virtual range topic across several proxy instances
(docs/high-availability.md): two port-per-broker replicas behind a load balancer, so every
connection of every member (bootstrap, broker, group and transaction coordinators) lands on
either replica: a member fetches ``T.kr4`` through one instance and commits its offsets in
a transaction (TxnOffsetCommit of virtual partitions) through the other, and the group's
next member reads what they committed through either.

librdkafka members (``harness.rdkafka_txn_member``) relay ``T.kr4`` (T of one partition) to
an output topic while a producer writes records straight to the broker, each transaction
one output record per input record plus the offsets, every fifth aborted on purpose and
redone. The committed output, read with read_committed once every member stopped, holds
every acknowledged input exactly once and nothing of an aborted transaction
(``harness.txn_output``):

- with both replicas running;
- with one replica killed -9 mid-stream (inside the members' transactions): the members'
  connections through it close and reconnect through the balancer to the other.
"""

from __future__ import annotations

import time
import uuid

import pytest

from harness.history import History
from harness.live import LiveProducer
from harness.rdkafka_txn_member import RdkafkaTxnMemberProcess
from harness.streams_app import TxnFleet
from harness.txn_output import TxnVerdict, check_output, read_output
from tests.integration.replicas import Replicas, replicas_behind_balancer
from tests.integration.test_live_tail import _committed, _log_end
from tests.integration.test_txn_virtual import (
    ABORT_EVERY,
    FIRST_COMMIT_TIMEOUT,
    JOIN_TIMEOUT,
    KEYS,
    OUTPUT_PARTITIONS,
    OUTPUT_TIMEOUT,
    RDKAFKA_CONFIGS,
    SHARES,
    _alive_check,
    _until,
)

pytestmark = [pytest.mark.kafka]

RECORDS = 1500
SECONDS = 10.0
MEMBERS = 4  # one virtual partition of T.kr4 each
SEED = 31
# librdkafka 2.16 starts its re-bootstrap as soon as every connection of a client is down (a
# member whose producer had its one broker connection through the killed replica), and its
# transactional producer then waits forever in send_offsets_to_transaction: the broker handle
# the group-coordinator request holds is decommissioned and never terminates ("Handle is
# terminating in state TRY_CONNECT", past the call's timeout). Without re-bootstrap the
# client reconnects to the address it knows, the balancer's, as Kafka clients do.
CONFIGS = {**RDKAFKA_CONFIGS, "metadata.recovery.strategy": "none"}


def _virtual_committed(bootstrap: str, group: str, source: str) -> dict[int, int]:
    """The group's committed offset of each partition of ``source`` (a virtual topic), as
    OffsetFetch through the proxy answers it."""
    from confluent_kafka import Consumer, TopicPartition

    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        found = probe.committed([TopicPartition(source, v) for v in range(SHARES)], timeout=10)
        return {tp.partition: tp.offset for tp in found}
    finally:
        probe.close()


def _run(kafka, replicas: Replicas, topic_factory, tmp_path, *, kill: bool) -> TxnVerdict:
    topic = topic_factory(kafka, partitions=1)
    output = topic_factory(kafka, partitions=OUTPUT_PARTITIONS)
    source = f"{topic}.kr{SHARES}"
    owned = {(source, v) for v in range(SHARES)}
    group = f"txn-ha-{uuid.uuid4().hex[:8]}"
    history = History()
    producer = LiveProducer(kafka.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS, seed=SEED,
                            keys=KEYS)
    fleet = TxnFleet([RdkafkaTxnMemberProcess(replicas.bootstrap_servers, source, output, group, workdir=tmp_path,
                                              name=f"member-{i}", timeout_ms=10_000, configs=CONFIGS,
                                              abort_every=ABORT_EVERY, delay_ms=5) for i in range(MEMBERS)])
    began = time.monotonic()
    timeline: list[str] = []
    last: list[TxnVerdict] = []

    def context() -> str:
        return (f"{len(history.acks)} acknowledged; connections per replica {replicas.connections()}; "
                f"{fleet.summary()}; errors: {fleet.problems()}" + (f"; {'; '.join(timeline)}" if timeline else ""))

    alive = _alive_check(fleet, group, source, context)

    try:
        fleet.start()
        fleet.wait_assigned(owned, JOIN_TIMEOUT)
        timeline.append(f"group settled at {time.monotonic() - began:.1f}s")
        producer.start()
        _until(lambda: all(m.committed() for m in fleet), FIRST_COMMIT_TIMEOUT,
               lambda: f"every member committing a transaction ({context()})", alive)
        timeline.append(f"every member committed at {time.monotonic() - began:.1f}s")
        assert all(replicas.connections()), f"a replica served no connection: {context()}"
        if kill:
            _until(lambda: len(history.acks) >= RECORDS // 3, SECONDS,
                   lambda: f"a third of the input acknowledged ({context()})", alive)
            before = replicas.connections()
            # the kill comes while a member is inside a transaction, when that happens within a moment
            deadline = time.monotonic() + 3.0
            while not any(m.in_transaction() for m in fleet) and time.monotonic() < deadline:
                time.sleep(0.005)
            assert not producer.done, "the producer finished before the kill: not mid-stream"
            inside = [m.name for m in fleet if m.in_transaction()]
            replicas.kill(0)
            timeline.append(f"replica 0 killed at {time.monotonic() - began:.1f}s with {inside} inside a "
                            f"transaction; connections per replica before {before}")
            _until(lambda: replicas.connections()[1] > before[1], 30,
                   lambda: f"members reconnecting to the surviving replica ({context()})", alive)
        producer.join(SECONDS + 60)
        assert producer.failed == 0, producer.errors
        assert len(history.acks) == RECORDS

        def complete() -> bool:
            last[:] = [check_output(history.acks, read_output(kafka.bootstrap_servers, output, timeout=20))]
            return not last[0].lost or bool(last[0].duplicated or last[0].stray)  # a duplicate stays

        _until(complete, OUTPUT_TIMEOUT,
               lambda: f"the committed output holding every acknowledged record "
                       f"({last[0].summary() if last else 'not read'}; {context()})",
               alive, interval=1.0)
        timeline.append(f"output complete at {time.monotonic() - began:.1f}s")
        # The members keep polling, caught up: each share's committed offset is lifted to the
        # log end by whichever replica sees the group's commits, reading the partition's tail
        # where another replica served the share's fetches (docs/virtual-topics.md#lag).
        (log_end,) = _log_end(kafka.bootstrap_servers, topic, 1).values()
        at_end: list[int] = []

        def committed_at_end() -> bool:
            at_end[:] = [_committed(kafka.bootstrap_servers, group, topic, 1)[(topic, 0)]]
            return at_end[0] == log_end

        _until(committed_at_end, 30, lambda: f"{topic} committed at its log end {log_end} at the coordinator "
                                             f"(committed {at_end}; {context()})", alive, interval=1.0)
        timeline.append(f"log end {log_end}, committed through the proxy "
                        f"{_virtual_committed(replicas.bootstrap_servers, group, source)}, {topic} at the "
                        f"coordinator {at_end[0]} at {time.monotonic() - began:.1f}s")
        codes = fleet.stop()
        assert codes == [0] * len(fleet), f"exit codes on SIGTERM {codes}: {context()}"
    finally:
        producer.stop()
        fleet.close()
    # every member stopped: every transaction ended; the final, committed output
    verdict = check_output(history.acks, read_output(kafka.bootstrap_servers, output, timeout=30),
                           aborted_writers=fleet.aborted_writers(), aborted_ranges=fleet.aborted_ranges())
    planned = [t for m in fleet for t in m.aborted(planned=True)]
    print(f"\n{'one replica killed' if kill else 'two replicas'}: {verdict.summary()}; {len(planned)} transactions "
          f"aborted on purpose; {context()}")
    assert verdict.acknowledged == RECORDS
    assert verdict.ok(), f"{verdict.summary()}; {context()}"
    assert planned, f"no transaction was aborted on purpose: {context()}"
    assert verdict.redone > 0, f"no record of an aborted transaction was redone: {verdict.summary()}; {context()}"
    return verdict


@pytest.mark.timeout(200)
@pytest.mark.parametrize("kill", [pytest.param(False, id="two-replicas"),
                                  pytest.param(True, id="one-killed-mid-stream")])
def test_transactional_members_on_two_instances_write_each_record_once(kafka, proxy_factory, topic_factory,
                                                                       tmp_path, kill):
    with replicas_behind_balancer(kafka, proxy_factory, 2) as replicas:
        _run(kafka, replicas, topic_factory, tmp_path, kill=kill)
