"""The native relay against real brokers: a Produce answered with leader hints (KIP-951)
while the native loop carries the connection comes back to the event loop, which points
the hints at the proxy; the connection goes on natively afterwards."""

from __future__ import annotations

import re
import threading
import urllib.request

from harness import java_tools
from harness.raw_client import RawClient
from harness.wait import wait_until
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import ErrorCode
from proxy.records.builder import build_batch, encode_record

from .conftest import proxy_ports, real_ports
from .test_proxy_failover import _leader

PRODUCE_VERSION = 11


def _metric(proxy, pattern: str) -> float:
    text = urllib.request.urlopen(proxy.metrics_url, timeout=10).read().decode()
    return sum(float(m.group(1)) for m in re.finditer(rf"^{pattern} (\S+)$", text, re.MULTILINE))


def _produce(client: RawClient, topic: str, correlation_hint: int):
    body_class = messages.body_class(ApiKey.PRODUCE, "request")
    record = encode_record(offset_delta=0, key=b"k", value=f"v{correlation_hint}".encode())
    records = build_batch(base_offset=0, last_offset_delta=0, records=record, record_count=1,
                          base_timestamp=1_700_000_000_000, max_timestamp=1_700_000_000_000)
    data = body_class.PartitionProduceData(index=0, records=records)
    body = messages.new_body(ApiKey.PRODUCE, PRODUCE_VERSION, "request", transactional_id=None, acks=1,
                             timeout_ms=30000, topic_data=[body_class.TopicProduceData(name=topic, partition_data=[data])])
    return client.request(ApiKey.PRODUCE, PRODUCE_VERSION, body)


def test_leader_hints_of_a_natively_relayed_produce_point_at_the_proxy(kafka_cluster, proxy_factory, topic_factory):
    proxy = proxy_factory(kafka_cluster, metrics_port="0", virtual_topics_enabled="false")  # else it reads Produce
    topic = topic_factory(kafka_cluster, partitions=1, replication_factor=3)
    leader = _leader(kafka_cluster, topic)
    follower = next(node.node_id for node in kafka_cluster.nodes if node.node_id != leader)
    handed_back = _metric(proxy, r'kafka_proxy_native_relay_runs_total\{ended="response"\}')
    carried = _metric(proxy, "kafka_proxy_native_relay_requests_total")
    with RawClient("127.0.0.1", proxy.node_ports[follower]) as client:
        client.call(ApiKey.API_VERSIONS, 3, client_software_name="raw", client_software_version="1")
        # The first request past ApiVersions ends the connection's setup on the event loop;
        # every later Produce starts a native run, answered with hints and handed back.
        for attempt in range(4):
            response = _produce(client, topic, attempt)
            partition = response.responses[0].partition_responses[0]
            assert partition.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
            assert partition.current_leader.leader_id == leader
            endpoints = {e.node_id: e.port for e in response.node_endpoints}
            assert endpoints.get(leader) == proxy.node_ports[leader]  # rewritten: the proxy's port
            assert set(endpoints.values()) <= proxy_ports(proxy)
            assert not set(endpoints.values()) & real_ports(kafka_cluster)
    assert _metric(proxy, "kafka_proxy_native_relay_requests_total") - carried == 3
    assert _metric(proxy, r'kafka_proxy_native_relay_runs_total\{ended="response"\}') - handed_back == 3
    # and the leader takes the same request natively, answered in the loop itself
    with RawClient("127.0.0.1", proxy.node_ports[leader]) as client:
        client.call(ApiKey.API_VERSIONS, 3, client_software_name="raw", client_software_version="1")
        for attempt in range(5):
            response = _produce(client, topic, attempt)
            assert response.responses[0].partition_responses[0].error_code == ErrorCode.NONE
            assert not response.node_endpoints
    # counted when the run ends (the client closing ends it)
    wait_until(lambda: _metric(proxy, "kafka_proxy_native_relay_requests_total") - carried == 7, timeout=10,
               what="the leader's four natively relayed Produce requests counted")


def _log_end(cluster, topic: str) -> int:
    leader = _leader(cluster, topic)
    node = next(n for n in cluster.nodes if n.node_id == leader)
    with RawClient(node.host, node.port) as client:
        response = client.call(ApiKey.LIST_OFFSETS, 7, replica_id=-1, isolation_level=0, topics=[
            messages.body_class(ApiKey.LIST_OFFSETS, "request").ListOffsetsTopic(name=topic, partitions=[
                messages.body_class(ApiKey.LIST_OFFSETS, "request").ListOffsetsPartition(
                    partition_index=0, timestamp=-1)])])
    return response.topics[0].partitions[0].offset


def test_a_java_producer_on_the_native_relay_rides_out_a_leader_stop(kafka_cluster, proxy_factory, topic_factory):
    """Produce requests carried natively while the leader stops: the producer's requests
    fail over through the proxy (leader hints handed back, broken runs closed), and every
    record it reports sent is in the log exactly once (idempotent, acks=all)."""
    proxy = proxy_factory(kafka_cluster, metrics_port="0", virtual_topics_enabled="false")
    topic = topic_factory(kafka_cluster, partitions=1, replication_factor=3, configs={"min.insync.replicas": "2"})
    carried = _metric(proxy, "kafka_proxy_native_relay_requests_total")
    records = 24_000
    outcome: list = []

    def produce() -> None:
        outcome.append(java_tools.producer_performance(
            proxy.bootstrap_servers, topic, records, record_size=200, throughput=2000, timeout=180,
            producer_props={"acks": "all", "enable.idempotence": "true", "linger.ms": "5",
                            "delivery.timeout.ms": "120000"}))

    producing = threading.Thread(target=produce)
    producing.start()
    try:
        wait_until(lambda: _metric(proxy, "kafka_proxy_native_relay_requests_total") - carried >= 20, timeout=60,
                   what="Produce requests carried by the native relay")
        kafka_cluster.stop_node(_leader(kafka_cluster, topic))
    finally:
        producing.join(timeout=200)
    assert not producing.is_alive() and outcome, "ProducerPerformance did not finish"
    assert f"{records} records sent" in outcome[0].stdout
    assert _log_end(kafka_cluster, topic) == records  # each record once: nothing lost, nothing twice


def test_with_virtual_topics_on_produce_stays_native_and_only_a_virtual_name_reaches_the_event_loop(
        kafka, proxy_factory, topic_factory):
    """Virtual topics on: the loop checks each Produce's topic names against the virtual
    suffixes, carries those naming real topics, and leaves one naming ``<topic>.kr4`` in
    the socket for the event loop, which refuses it; the next clean one is native again."""
    proxy = proxy_factory(kafka, metrics_port="0", virtual_topics_enabled="true")
    topic = topic_factory(kafka, partitions=1)
    node = kafka.nodes[0].node_id
    carried = _metric(proxy, "kafka_proxy_native_relay_requests_total")
    refused = _metric(proxy, r'kafka_proxy_virtual_refused_total\{api="Produce"\}')
    with RawClient("127.0.0.1", proxy.node_ports[node]) as client:
        client.call(ApiKey.API_VERSIONS, 3, client_software_name="raw", client_software_version="1")
        outcomes = [_produce(client, name, attempt).responses[0].partition_responses[0]
                    for attempt, name in enumerate([topic] * 4 + [f"{topic}.kr4"] + [topic] * 2)]
    assert [p.error_code for p in outcomes] == [ErrorCode.NONE] * 4 + [ErrorCode.INVALID_TOPIC_EXCEPTION] + [
        ErrorCode.NONE] * 2
    assert topic in outcomes[4].error_message
    assert _metric(proxy, r'kafka_proxy_virtual_refused_total\{api="Produce"\}') - refused == 1
    # the first Produce ends the connection's setup on the event loop (see above); the other
    # five clean ones were carried natively, counted when their runs ended
    wait_until(lambda: _metric(proxy, "kafka_proxy_native_relay_requests_total") - carried == 5, timeout=10,
               what="five Produce requests to the real topic carried natively")
    assert _log_end(kafka, topic) == 6
