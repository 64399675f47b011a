"""Smoke tests of the benchmark peers (benchmarks/peers), a few hundred records each, so
the comparison harness cannot rot: each peer starts from its Maven Central artifacts,
reads every record of a small keyed topic on the shared broker, and reports what the
benchmarks read from it."""

from __future__ import annotations

import uuid

import pytest

from benchmarks.peers import bare_relay, kroxylicious, parallel_consumer, share_groups
from benchmarks.workloads import data, key_ordered, passthrough
from harness.raw_client import RawClient, records_of
from proxy.local_kafka import free_port
from tests.conftest import create_topic

RECORDS = 300
KEYS = 20


@pytest.fixture(scope="module")
def keyed_topic(kafka) -> str:
    topic = f"bench-smoke-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, partitions=1)
    data.produce_keyed(kafka.bootstrap_servers, topic, RECORDS, keys=KEYS, value_size=64)
    return topic


def _group() -> str:
    return f"smoke-{uuid.uuid4().hex[:8]}"


def test_share_group_workers_read_every_record(kafka, keyed_topic):
    result = share_groups.key_ordered(kafka.bootstrap_servers, keyed_topic, _group(), 2, work_ms=0.1,
                                      records=RECORDS, timeout=90)
    assert result["peer"] == "share_group"
    assert result["records"] >= RECORDS
    assert result["keys_seen"] == KEYS


def test_plain_group_reads_in_key_order(kafka, keyed_topic):
    result = share_groups.key_ordered(kafka.bootstrap_servers, keyed_topic, _group(), 2, mode="plain",
                                      work_ms=0.1, records=RECORDS, timeout=90)
    assert result["records"] == RECORDS
    assert result["order_violations"] == 0


def test_share_consumer_performance_reads_the_topic(kafka, keyed_topic):
    result = share_groups.consumer_performance(kafka.bootstrap_servers, keyed_topic, _group(), RECORDS,
                                               threads=2, timeout=120)
    assert result["records"] >= RECORDS


def test_parallel_consumer_keeps_key_order(kafka, keyed_topic):
    result = parallel_consumer.key_ordered(kafka.bootstrap_servers, keyed_topic, _group(), 4, work_ms=0.1,
                                           records=RECORDS, timeout=90)
    assert result["peer"] == "parallel_consumer"
    assert result["records"] >= RECORDS
    assert result["order_violations"] == 0
    assert result["keys_seen"] == KEYS


def test_our_range_consumers_keep_key_order(kafka, proxy, keyed_topic):
    result = key_ordered.ours(proxy.bootstrap_servers, keyed_topic, 4, work_ms=0.1, records=RECORDS,
                              timeout=90)
    assert result["records"] == RECORDS
    assert result["order_violations"] == 0
    assert result["keys_seen"] == KEYS


def test_kroxylicious_passes_a_consumer_through(kafka, keyed_topic):
    with kroxylicious.running(kafka.bootstrap_servers) as (bootstrap, process):
        run = passthrough.consume(bootstrap, keyed_topic, RECORDS, timeout=120)
        assert process.cpu_times().user > 0
    assert run["records"] == RECORDS


def test_bare_relay_moves_a_fetch(kafka, keyed_topic):
    port = free_port()
    node = kafka.nodes[0]
    with bare_relay.running(port, f"{node.host}:{node.port}"):
        # The raw client keeps its one connection, so no advertised listener is needed.
        with RawClient.connect(f"127.0.0.1:{port}") as client:
            entry = client.range_fetch(client.topic_id(keyed_topic), 0, 0, None, max_bytes=1 << 20)
    records, _ = records_of(entry.records)
    assert len(records) == RECORDS


def test_our_group_members_keep_key_order(kafka, proxy, keyed_topic):
    result = key_ordered.ours(proxy.bootstrap_servers, keyed_topic, 3, work_ms=0.1, records=RECORDS,
                              timeout=90, subscribe=True)
    assert result["peer"] == "ours_subscribe"
    assert result["records"] >= RECORDS
    assert result["order_violations"] == 0
