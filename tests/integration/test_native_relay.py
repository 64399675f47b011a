"""The native relay against real brokers: a Produce answered with leader hints (KIP-951)
while the native loop carries the connection comes back to the event loop, which points
the hints at the proxy; the connection goes on natively afterwards. Consumers' plain
Fetches are carried too (librdkafka, Kafka's Java consumer), their responses' leader hints
handed back likewise, and Fetches with the proxy's extensions still reach their features."""

from __future__ import annotations

import re
import threading
import uuid

from harness import java_tools
from harness.raw_client import RawClient, records_of
from harness.threads import in_threads
from harness.wait import wait_until
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import ErrorCode
from proxy.ranges import KeyRange
from proxy.records.builder import build_batch, encode_record

from .conftest import proxy_ports, real_ports
from .test_proxy_failover import _leader

PRODUCE_VERSION = 11
_FETCH = messages.body_class(ApiKey.FETCH, "request")


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
    handed_back = proxy.metric("kafka_proxy_native_relay_runs_total", ended="response")
    carried = proxy.metric("kafka_proxy_native_relay_requests_total")
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
    assert proxy.metric("kafka_proxy_native_relay_requests_total") - carried == 3
    assert proxy.metric("kafka_proxy_native_relay_runs_total", ended="response") - handed_back == 3
    # and the leader takes the same request natively, answered in the loop itself
    with RawClient("127.0.0.1", proxy.node_ports[leader]) as client:
        client.call(ApiKey.API_VERSIONS, 3, client_software_name="raw", client_software_version="1")
        for attempt in range(5):
            response = _produce(client, topic, attempt)
            assert response.responses[0].partition_responses[0].error_code == ErrorCode.NONE
            assert not response.node_endpoints
    # counted when the run ends (the client closing ends it)
    wait_until(lambda: proxy.metric("kafka_proxy_native_relay_requests_total") - carried == 7, timeout=10,
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
    carried = proxy.metric("kafka_proxy_native_relay_requests_total")
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
        wait_until(lambda: proxy.metric("kafka_proxy_native_relay_requests_total") - carried >= 20, timeout=60,
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
    carried = proxy.metric("kafka_proxy_native_relay_requests_total")
    refused = proxy.metric("kafka_proxy_virtual_refused_total", api="Produce")
    with RawClient("127.0.0.1", proxy.node_ports[node]) as client:
        client.call(ApiKey.API_VERSIONS, 3, client_software_name="raw", client_software_version="1")
        outcomes = [_produce(client, name, attempt).responses[0].partition_responses[0]
                    for attempt, name in enumerate([topic] * 4 + [f"{topic}.kr4"] + [topic] * 2)]
    assert [p.error_code for p in outcomes] == [ErrorCode.NONE] * 4 + [ErrorCode.INVALID_TOPIC_EXCEPTION] + [
        ErrorCode.NONE] * 2
    assert topic in outcomes[4].error_message
    assert proxy.metric("kafka_proxy_virtual_refused_total", api="Produce") - refused == 1
    # the first Produce ends the connection's setup on the event loop (see above); the other
    # five clean ones were carried natively, counted when their runs ended
    wait_until(lambda: proxy.metric("kafka_proxy_native_relay_requests_total") - carried == 5, timeout=10,
               what="five Produce requests to the real topic carried natively")
    assert _log_end(kafka, topic) == 6


# -- consumers' Fetch ---------------------------------------------------------------------------
def _produce_direct(cluster, topic: str, count: int, partitions: int) -> list[tuple[bytes, bytes]]:
    """``count`` keyed records written to the brokers directly (no Produce through the proxy),
    acknowledged every one."""
    from confluent_kafka import Producer

    sent = [(f"k{i}".encode(), f"v{i}-".encode() + b"x" * 200) for i in range(count)]
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 5, "acks": "all",
                         "batch.size": 32768})  # batches of ~150 records: many Fetches to read them
    failures: list = []
    for i, (key, value) in enumerate(sent):
        producer.produce(topic, key=key, value=value, partition=i % partitions,
                         on_delivery=lambda err, msg: err and failures.append(err))
        producer.poll(0)
    assert producer.flush(60) == 0 and not failures
    return sent


def _fetches(proxy) -> float:
    return proxy.metric("kafka_proxy_requests_total", api="Fetch")


def test_a_librdkafka_consumer_fetches_on_the_native_relay(kafka, proxy_factory, topic_factory):
    """A plain consumer (virtual topics on: its Fetches by topic id are checked against the
    ids the proxy knows) has its Fetches carried by the native loop, and gets every record."""
    from confluent_kafka import Consumer

    proxy = proxy_factory(kafka, metrics_port="0")
    topic = topic_factory(kafka, partitions=2)
    sent = _produce_direct(kafka, topic, 20_000, 2)
    carried, fetches = proxy.metric("kafka_proxy_native_relay_requests_total"), _fetches(proxy)
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap_servers, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "max.partition.fetch.bytes": 65536})
    consumer.subscribe([topic])
    received: list[tuple[bytes, bytes]] = []

    def drained() -> bool:
        for message in consumer.consume(1000, 0.5):
            if not message.error():
                received.append((message.key(), message.value()))
        return len(received) >= len(sent)

    try:
        wait_until(drained, timeout=90, interval=0, what="every record consumed through the proxy")
    finally:
        consumer.close()
    assert sorted(received) == sorted(sent)  # each record once
    wait_until(lambda: _fetches(proxy) - fetches >= 20, timeout=10,
               what=lambda: f"the consumer's Fetches counted (so far {_fetches(proxy) - fetches})")
    # counted when its runs end (the consumer closing ends them); most Fetches were native
    wait_until(lambda: proxy.metric("kafka_proxy_native_relay_requests_total") - carried
               >= (_fetches(proxy) - fetches) / 2, timeout=10, what="most Fetches carried by the native relay")


def test_a_java_consumer_fetches_on_the_native_relay(kafka, proxy_factory, topic_factory):
    """ConsumerPerformance (Kafka 4's consumer: Fetch v17+, whose responses may carry leader
    hints: the loop walks each one) reads every record through the native relay."""
    proxy = proxy_factory(kafka, metrics_port="0")
    topic = topic_factory(kafka, partitions=2)
    records = 30_000
    _produce_direct(kafka, topic, records, 2)
    carried, fetches = proxy.metric("kafka_proxy_native_relay_requests_total"), _fetches(proxy)
    result = java_tools.consumer_performance(proxy.bootstrap_servers, topic, records, timeout=120,
                                             consumer_config={"max.partition.fetch.bytes": "65536"})
    line = [row for row in result.stdout.splitlines() if re.match(r"^\d{4}-", row)][-1]
    assert int(line.split(",")[4].strip()) == records  # data.consumed.in.nMsg
    wait_until(lambda: proxy.metric("kafka_proxy_native_relay_requests_total") - carried
               >= (_fetches(proxy) - fetches) / 2 >= 2, timeout=10,
               what=lambda: "most Fetches carried by the native relay (native "
                            f"{proxy.metric('kafka_proxy_native_relay_requests_total') - carried:g}, Fetches "
                            f"{_fetches(proxy) - fetches:g})")


def test_key_range_fetches_go_to_the_event_loop_between_native_plain_ones(kafka, proxy_factory, topic_factory):
    """On one connection: plain Fetches are carried natively; a Fetch with key ranges (a
    tagged field) stops the run and is filtered on the event loop; the next plain one is
    native again."""
    proxy = proxy_factory(kafka, metrics_port="0")
    topic = topic_factory(kafka, partitions=1)
    _produce_direct(kafka, topic, 200, 1)
    node = kafka.nodes[0].node_id
    carried = proxy.metric("kafka_proxy_native_relay_requests_total")
    with RawClient("127.0.0.1", proxy.node_ports[node]) as client:
        client.call(ApiKey.API_VERSIONS, 3, client_software_name="raw", client_software_version="1")
        topic_id = client.topic_id(topic)  # ends the setup; the proxy learns the topic's id
        outcomes = []
        for ranges in (None, None, [KeyRange(0, (1 << 62) - 1)], None, None):
            partition = client.range_fetch(topic_id, 0, 0, ranges)
            delivered, _ = records_of(partition.records)
            outcomes.append((partition.error_code, partition.key_ranges_applied is not None, len(delivered)))
    half = [o for o in outcomes if o[1]]
    assert [o[:2] for o in outcomes] == [(0, False), (0, False), (0, True), (0, False), (0, False)]
    assert all(o[2] == 200 for o in outcomes if not o[1]) and 0 < half[0][2] < 200  # filtered: about half
    wait_until(lambda: proxy.metric("kafka_proxy_native_relay_requests_total") - carried == 4, timeout=10,
               what="the four plain Fetches carried natively")


def test_leader_hints_of_a_natively_relayed_fetch_point_at_the_proxy(kafka_cluster, proxy_factory, topic_factory):
    """A Fetch v17 to a broker holding no replica of the partition (a follower would serve
    it) is answered NOT_LEADER_OR_FOLLOWER with leader hints in the response's top-level
    tagged fields: the loop passes the response on up to them and hands them back to the
    event loop, which rewrites them in as many bytes."""
    proxy = proxy_factory(kafka_cluster, metrics_port="0")
    topic = topic_factory(kafka_cluster, partitions=1, replication_factor=1)
    leader = _leader(kafka_cluster, topic)
    other = next(node.node_id for node in kafka_cluster.nodes if node.node_id != leader)
    handed_back = proxy.metric("kafka_proxy_native_relay_runs_total", ended="response")
    carried = proxy.metric("kafka_proxy_native_relay_requests_total")
    with RawClient("127.0.0.1", proxy.node_ports[other]) as client:
        client.call(ApiKey.API_VERSIONS, 3, client_software_name="raw", client_software_version="1")
        topic_id = client.topic_id(topic)
        for _ in range(3):
            body = messages.new_body(ApiKey.FETCH, 17, "request", max_wait_ms=10, min_bytes=1, max_bytes=1 << 20,
                                     isolation_level=0, session_id=0, session_epoch=-1, topics=[
                                         _FETCH.FetchTopic(topic_id=topic_id, partitions=[_FETCH.FetchPartition(
                                             partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])])
            response = client.request(ApiKey.FETCH, 17, body)
            partition = response.responses[0].partitions[0]
            assert partition.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
            assert partition.current_leader.leader_id == leader
            endpoints = {e.node_id: e.port for e in response.node_endpoints}
            assert endpoints.get(leader) == proxy.node_ports[leader]  # rewritten: the proxy's port
            assert not set(endpoints.values()) & real_ports(kafka_cluster)
    wait_until(lambda: proxy.metric("kafka_proxy_native_relay_requests_total") - carried == 3, timeout=10,
               what="the three Fetches carried natively")
    assert proxy.metric("kafka_proxy_native_relay_runs_total", ended="response") - handed_back == 3


def _range_consumers(proxy, topic: str, end: int, count: int) -> list[list[tuple[int, bytes]]]:
    """``count`` raw clients of equal key ranges, one thread and connection each, reading
    offsets [0, end) of partition 0 sessionless as the range benchmark's clients do: what
    each was delivered, (offset, key) in order."""
    from proxy.ranges import contains, equal_shares
    from proxy.records.keyhash import key_hash

    shares = equal_shares(count)
    delivered: list[list[tuple[int, bytes]]] = [[] for _ in shares]
    start = threading.Barrier(count, timeout=60)  # every range set known before anyone reads on

    def read(slot: int) -> None:
        with RawClient.connect(proxy.bootstrap_servers, client_id=f"range-{slot}") as client:
            topic_id = client.topic_id(topic)
            client.range_fetch(topic_id, 0, 0, [shares[slot]], max_bytes=1, max_wait_ms=0)
            start.wait()
            position = 0
            for _ in range(10_000):  # bounded: a few hundred fetches read it all
                if position >= end:
                    return
                entry = client.range_fetch(topic_id, 0, position, [shares[slot]], max_bytes=16384,
                                           max_wait_ms=100)
                assert entry.error_code == 0, entry.error_code
                assert [(r.start, r.end) for r in entry.key_ranges_applied] == \
                    [(shares[slot].start, shares[slot].end)]
                records, next_offset = records_of(entry.records)
                for record in records:
                    if record.offset >= position:
                        assert record.key is not None and contains([shares[slot]], key_hash(record.key, record.offset))
                        delivered[slot].append((record.offset, record.key))
                if next_offset is not None:
                    position = max(position, next_offset)
            raise AssertionError(f"consumer {slot} stopped at {position} of {end}")

    in_threads(read, count)
    return delivered


def test_range_consumers_get_their_cached_shares_from_the_native_relay(kafka, proxy_factory, topic_factory):
    """Four range consumers share one partition: with read-ahead, most of their Fetches find
    their share cached, and the native relay answers those itself. Every acknowledged record
    reaches the one consumer whose range holds its key, once and in offset order, exactly as
    through a proxy whose event loop answers every Fetch (the default); the relay's answers
    are counted as the cache's hits."""
    topic = topic_factory(kafka, partitions=1)
    sent = _produce_direct(kafka, topic, 6000, 1)
    native = proxy_factory(kafka, metrics_port="0", key_range_native_answers_enabled="true")
    plain = proxy_factory(kafka, metrics_port="0")  # the default: every key-range Fetch on the event loop
    through_native = _range_consumers(native, topic, len(sent), 4)
    through_plain = _range_consumers(plain, topic, len(sent), 4)
    assert through_native == through_plain
    for delivered in through_native:
        offsets = [offset for offset, _ in delivered]
        assert offsets == sorted(set(offsets))  # once each, in order
    got = sorted(offset for delivered in through_native for offset, _ in delivered)
    assert got == list(range(len(sent)))  # every acknowledged record, by exactly one consumer
    assert {key for delivered in through_native for _, key in delivered} == {key for key, _ in sent}
    wait_until(lambda: native.metric("kafka_proxy_keyrange_native_answers_total") > 0, timeout=10,
               what="answers the native relay sent")
    answers = native.metric("kafka_proxy_keyrange_native_answers_total")
    fetches = native.metric("kafka_proxy_requests_total", api="Fetch")
    assert answers > fetches / 4, (answers, fetches)  # most of them
    assert native.metric("kafka_proxy_keyrange_cache_hits_total") >= answers
    assert plain.metric("kafka_proxy_keyrange_native_answers_total") == 0
