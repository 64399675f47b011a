"""Striped virtual topics: unmodified standard clients share a partition by stripes of
whole batches (``orders.coop4``, docs/cooperative-fetch.md#standard-clients), with their
own commits, against real brokers.

- kafka-python and the Java console consumer in a group on ``T.coop4`` while a producer
  writes with idle gaps, one key holding half the records: every acknowledged record is
  delivered exactly once, the hot key spreads over every stripe of its partition (a key
  range would hold it on one), and the group ends committed at the log end;
- librdkafka and Java KafkaConsumer members on the three-node cluster with sidecar
  proxies, through the chaos harness (a producer writing throughout, acknowledged vs
  delivered counted): without faults each record once; with a member killed, a proxy
  killed, nothing acknowledged lost and the group committed at the log end.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

import pytest

from chaos.env import ChaosEnv
from chaos.runner import run_cell
from tests.integration import virtual_checks as checks
from tests.integration.virtual_checks import PARTITIONS, SHARES

pytestmark = pytest.mark.kafka

RECORDS = 1600
HOT_KEY = b"hot"


def _key(i: int) -> bytes:
    return HOT_KEY if i % 2 == 0 else f"key-{i % 97}".encode()


def _produce_live(bootstrap: str, topic: str, sent: list, done: threading.Event, failures: list) -> None:
    """Small batches with idle gaps, so consumers reach the log end and leave it again."""
    try:
        for start in range(0, RECORDS, 25):
            sent.extend(checks.produce(bootstrap, topic, 25, start=start, key_of=_key))
            time.sleep(0.05)  # an idle gap at the live tail, not a synchronisation
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        failures.append(exc)
    finally:
        done.set()


def _check_exactly_once_and_spread(sent: list, results: list[checks.Received]) -> None:
    received = [record for member in results for record in member]
    assert len(received) == len(sent), f"{len(received)} received of {len(sent)} acknowledged"
    assert sorted((k, v) for _, _, k, v in received) == sorted(sent)
    # With key ranges every record of the hot key is on one virtual partition; stripes
    # spread it over the K virtual partitions of its real partition (64 batches of it).
    hot = Counter(partition for partition, _, key, _ in received if key == HOT_KEY)
    assert len(hot) == SHARES, f"hot key per virtual partition {dict(hot)}"
    assert max(hot.values()) < 0.5 * sum(hot.values()), f"hot key per virtual partition {dict(hot)}"


def test_kafka_python_group_shares_a_hot_key_by_stripes(kafka, proxy, topic_factory):
    topic = topic_factory(kafka, partitions=PARTITIONS)
    name = f"{topic}.coop{SHARES}"
    group = f"coop-{uuid.uuid4().hex[:8]}"
    deadline = time.monotonic() + 150
    fleet = checks.KafkaPythonGroup(proxy.bootstrap_servers, name, group, 3, deadline=deadline, poll_ms=500,
                                    max_poll_records=100, commit_each_poll=True)
    fleet.start()
    sent: list = []
    produced = threading.Event()
    producer = threading.Thread(target=_produce_live, args=(proxy.bootstrap_servers, topic, sent, produced,
                                                            fleet.failures), daemon=True)
    producer.start()
    produced.wait(120)
    checks.wait_until_count(lambda: fleet.seen, len(sent), deadline)
    fleet.stop()
    assert not fleet.failures, fleet.failures
    _check_exactly_once_and_spread(sent, fleet.results)
    checks.check_group_at_end(proxy.bootstrap_servers, topic, group, virtual_name=name)


def test_java_console_consumers_share_a_hot_key_by_stripes(kafka, proxy, topic_factory):
    from confluent_kafka.admin import AdminClient

    members = 2
    topic = topic_factory(kafka, partitions=PARTITIONS)
    name = f"{topic}.coop{SHARES}"
    group = f"coop-{uuid.uuid4().hex[:8]}"
    outputs: list[checks.Received | BaseException] = [[] for _ in range(members)]

    def member(index: int) -> None:
        try:
            outputs[index] = checks.console_member(proxy.bootstrap_servers, name, group, idle_ms=20000)
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
    sent: list = []
    failures: list[BaseException] = []
    produced = threading.Event()
    _produce_live(proxy.bootstrap_servers, topic, sent, produced, failures)
    for thread in threads:
        thread.join(200)
    failures += [o for o in outputs if isinstance(o, BaseException)]
    assert not failures, failures
    results = [out for out in outputs if not isinstance(out, BaseException)]
    _check_exactly_once_and_spread(sent, results)
    checks.check_group_at_end(proxy.bootstrap_servers, topic, group, virtual_name=name)


# -- the three-node cluster, sidecar proxies, a producer writing throughout --------------------


@pytest.fixture(scope="module")
def chaos_env(kafka_cluster, tmp_path_factory):
    with ChaosEnv(tmp_path_factory.mktemp("coop-chaos"), 20261125, cluster=kafka_cluster) as env:
        yield env


@pytest.mark.cluster
@pytest.mark.timeout(600)
@pytest.mark.parametrize("cell", ["striped-rdkafka:none", "striped-rdkafka:member-kill", "striped-java:proxy-kill"])
def test_striped_members_lose_nothing_acknowledged(chaos_env, tmp_path, cell):
    from chaos import matrix, report

    matrix.load_optional()  # the Java workloads register themselves
    workload, fault = cell.split(":")
    result = run_cell(chaos_env, workload, fault, 20261125, workdir=tmp_path)
    summary = report.one_line(result)
    assert "error" not in result, f"{summary}\n{result.get('traceback', '')}"
    assert result["lost"] == 0, f"{summary}; lost {result['lost_examples']}"
    assert result["strays"] == 0, summary
    assert not result["committed_behind"], f"{summary}; {result['committed_behind']}"
    assert result["ok"], f"{summary}; notes {result['notes']}"
    if fault == "none":
        assert result["delivered"] == result["acknowledged"], summary
        assert result["redelivered_total"] == 0, summary
    else:
        assert result["actions"], f"the fault never struck: {summary}"
