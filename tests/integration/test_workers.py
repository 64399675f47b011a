"""``workers``: one proxy command, several processes: the bootstrap port shared
(SO_REUSEPORT), node N's port served by worker N mod workers.

Unmodified librdkafka members of a virtual range topic read through a proxy of two workers
while records are written; one worker is killed -9 mid-stream, the supervisor starts it
again and the members reconnect. Every acknowledged record is handed out and the group's
committed offsets reach the log end. The members of key-range groups and cooperative
members read a three-node cluster through two workers, their connections spread over both;
every consumer of one partition reaches the one worker of the partition's leader. The
supervisor's metrics are its workers' added up. SIGTERM to the supervisor stops every
worker."""

from __future__ import annotations

import os
import signal
import socket
import struct
import threading
import urllib.request

import pytest
import trio

from harness.clients import rdkafka_virtual_member
from harness.history import History, check
from harness.live import LiveProducer
from harness.wait import wait_until
from proxy.client import TopicPartition
from proxy.local_kafka import running
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from tests.integration import test_instances_keyranges as ha
from tests.integration.coop_members import cooperative_member, hot_key
from tests.integration.instance_checks import Ledger, member_names
from tests.integration.test_live_tail import _at_log_end, _until, _verdict

pytestmark = pytest.mark.kafka

RECORDS = 3000
SECONDS = 8.0
DEADLINE = 120.0
SHARES = 4
PARTITIONS = 2


def _metric(metrics_port: int, series: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(f"{series} "):
            return float(line.split()[1])
    return 0.0


def _connections(metrics_port: int) -> float:
    return _metric(metrics_port, "kafka_proxy_client_connections")


def _fetches(metrics_port: int) -> float:
    return _metric(metrics_port, 'kafka_proxy_requests_total{api="Fetch"}')


def _api_versions(port: int) -> socket.socket:
    header = messages.new_request_header(ApiKey.API_VERSIONS, 3, 1, "workers-test")
    body = messages.encode_request(header, messages.new_body(ApiKey.API_VERSIONS, 3, "request",
                                                             client_software_name="t", client_software_version="1"))
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(struct.pack(">i", len(body)) + body)
    assert len(sock.recv(4)) == 4  # answered
    return sock


def test_connections_are_spread_over_the_workers(kafka, proxy_factory):
    proxy = proxy_factory(kafka, workers="2", metrics_port="0")
    workers = proxy.info["workers"]
    assert len(workers) == 2 and len({w["pid"] for w in workers}) == 2
    held = [_api_versions(proxy.port) for _ in range(24)]
    try:
        counts = [_connections(w["metrics_port"]) for w in workers]
        assert sum(counts) == 24 and min(counts) > 0, counts  # all on one: a chance of 2**-23
        assert _connections(proxy.info["metrics_port"]) == 24  # the supervisor's: the workers' added up
        assert _metric(proxy.info["metrics_port"], "kafka_proxy_workers") == 2
    finally:
        for sock in held:
            sock.close()
    (node_id, node_port), = proxy.info["node_ports"].items()
    held = [_api_versions(node_port) for _ in range(8)]
    try:
        owner = int(node_id) % 2
        # node N's port: worker N mod 2 alone (the bootstrap connections above close meanwhile)
        wait_until(lambda: [_connections(w["metrics_port"]) for w in workers] == [8 * (i == owner) for i in range(2)],
                   timeout=10, interval=0.05, what="node connections on its worker alone")
    finally:
        for sock in held:
            sock.close()
    proxy.process.send_signal(signal.SIGTERM)
    assert proxy.process.wait(timeout=60) == 0
    for worker in workers:
        wait_until(lambda pid=worker["pid"]: not running(pid), timeout=10, interval=0.05,
                   what=f"worker {worker['pid']} stopped with the supervisor")


def test_a_virtual_topic_group_through_two_workers_one_killed_loses_nothing(kafka, proxy_factory, topic_factory):
    proxy = proxy_factory(kafka, workers="2", metrics_port="0")
    victim = proxy.info["workers"][1]["pid"]
    topic = topic_factory(kafka, partitions=PARTITIONS)
    virtual = f"{topic}.kr{SHARES}"
    group = f"workers-{topic}"
    history = History()
    producer = LiveProducer(kafka.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS, seed=37)
    stop = threading.Event()
    errors: list[str] = []

    threads = [threading.Thread(target=rdkafka_virtual_member, daemon=True,
                                args=(proxy.bootstrap_servers, group, virtual, topic, SHARES, history, f"m{index}",
                                      stop, errors), kwargs={"skip_errors": True})  # the kill breaks connections
               for index in range(3)]
    producer.start()
    for thread in threads:
        thread.start()
    wait_until(lambda: history.delivered_count() >= RECORDS // 4, timeout=SECONDS + 60, interval=0.1,
               what="a quarter handed out before the kill")
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: "worker exited worker=1" in proxy.log_text(), timeout=10, interval=0.1,
               what="the supervisor saw the worker die")
    wait_until(lambda: proxy.log_text().count("worker started worker=1") >= 2, timeout=20, interval=0.1,
               what="the supervisor started it again")
    wait_until(lambda: producer.done and history.missing() == 0, timeout=SECONDS + DEADLINE, interval=0.2,
               what="every acknowledged record handed out")
    wait_until(lambda: _at_log_end(kafka, group, topic, PARTITIONS), timeout=60, interval=0.5,
               what="committed offsets at the log end")
    stop.set()
    for thread in threads:
        thread.join(60)
    producer.join()
    assert producer.failed == 0, producer.errors
    assert not errors, errors[:5]
    verdict = _verdict(kafka, history, topic, PARTITIONS, group)
    assert verdict.acknowledged == RECORDS
    assert verdict.ok(allow_duplicates=True), verdict.summary()  # a killed worker's members get theirs again


def _connections_on_each(workers: list[dict]) -> list[float]:
    return [_connections(worker["metrics_port"]) for worker in workers]


async def test_key_range_group_members_through_two_workers_lose_nothing(kafka_cluster, proxy_factory, topic_factory):
    """The high-availability test of key-range groups (test_instances_keyranges.py, ranges
    split: 4 members on 3 partitions) through one proxy of two workers in front of three
    brokers: each member's connections reach the worker of the node they go to (bootstrap:
    either), so a member's fetches, its coordinator and its commits may be on different
    workers."""
    kafka = kafka_cluster
    proxy = proxy_factory(kafka, workers="2", metrics_port="0")
    workers = proxy.info["workers"]
    partitions = ha.PARTITIONS["group"]
    topic = topic_factory(kafka, partitions=partitions)
    group = f"workers-ranges-{topic}"
    names = member_names(ha.MEMBERS)
    history, ledger, members = History(), Ledger(), ha.Members()
    producer = LiveProducer(kafka.bootstrap_servers, topic, history, records=ha.RECORDS, seconds=ha.SECONDS, seed=79)
    stop = trio.Event()
    spread: list[float] = []
    async with trio.open_nursery() as nursery:
        producer.start()
        for index, name in enumerate(names):
            nursery.start_soon(ha.member, name, index, "group", proxy.bootstrap_servers, group, topic, history,
                               ledger, members, stop)
            await trio.sleep(0.5)  # members join one by one, while the producer writes
        spread = await trio.to_thread.run_sync(_connections_on_each, workers)
        assert await _until(lambda: producer.done and history.missing() == 0, ha.SECONDS + ha.DEADLINE)
        assert await _until(lambda: _at_log_end(kafka, group, topic, partitions), 60)
        stop.set()
    producer.join()
    assert producer.failed == 0, producer.errors
    verdict = _verdict(kafka, history, topic, partitions, group)
    handed = {name: ledger.count(name) for name in names}
    message = f"{verdict.summary()}; handed out per member {handed}; connections per worker {spread}"
    print(f"\nkey-range group through 2 workers: {message}")
    assert verdict.acknowledged == ha.RECORDS
    assert min(spread) > 0, f"every connection on one worker: {message}"
    assert verdict.ok(), message
    assert all(handed.values()), message


async def test_cooperative_members_through_two_workers_get_no_record_twice(kafka_cluster, proxy_factory,
                                                                         topic_factory):
    """Cooperative members of one partition (half its records under one key) through one
    proxy of two workers in front of three brokers: every member's fetches reach the worker
    of the partition's leader, and no record is handed out twice."""
    kafka = kafka_cluster
    proxy = proxy_factory(kafka, workers="2", metrics_port="0")
    workers = proxy.info["workers"]
    topic = topic_factory(kafka, partitions=1)
    tp = TopicPartition(topic, 0)
    group = f"workers-coop-{topic}"
    history = History()
    producer = LiveProducer(kafka.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS, seed=83,
                            key_of=hot_key)
    stop = trio.Event()
    handed: dict[str, int] = {}
    fetches: list[float] = []
    async with trio.open_nursery() as nursery:
        for number in range(4):
            nursery.start_soon(cooperative_member, proxy.bootstrap_servers, group, tp, f"m{number}", history, handed,
                               stop)
        producer.start()
        assert await _until(lambda: len(handed) == 4, 30)
        assert await _until(lambda: producer.done and history.missing() == 0, SECONDS + DEADLINE)
        assert await _until(lambda: _at_log_end(kafka, group, topic, 1), 60)
        stop.set()
        fetches = await trio.to_thread.run_sync(lambda: [_fetches(w["metrics_port"]) for w in workers])
    producer.join()
    assert producer.failed == 0, producer.errors
    verdict = check(history, keyed_order=False)
    message = f"{verdict.summary()}; handed out per member {handed}; fetches per worker {fetches}"
    print(f"\ncooperative members through 2 workers: {message}")
    assert verdict.acknowledged == RECORDS
    assert sorted(fetches)[0] == 0 and sorted(fetches)[1] > 0, f"one partition's fetches on both workers: {message}"
    assert not verdict.lost and not verdict.strays, message
    assert verdict.redelivered == 0, message


def test_a_broker_that_joins_later_gets_its_port_from_the_worker_that_serves_it(kafka_cluster, proxy_factory):
    """Node 3 is down while the proxy starts; once it is back, worker 3 mod 2 = 1 listens on
    its port within a few of its reads of the cluster, though no client's Metadata passed
    through that worker to tell it (another worker may already advertise the port)."""
    kafka_cluster.stop_node(3)
    try:
        proxy = proxy_factory(kafka_cluster, workers="2", metrics_port="0")
        assert "3" not in proxy.info["node_ports"]
        port = proxy.port + 1 + 3  # node.port.base defaults to listen.port + 1
        kafka_cluster.start_node(3)

        def answers() -> bool:
            try:
                _api_versions(port).close()
            except OSError:
                return False
            return True

        wait_until(answers, timeout=60, interval=0.5, what="node 3's port answers")
        sock = _api_versions(port)
        try:
            counts = [_connections(w["metrics_port"]) for w in proxy.info["workers"]]
            assert counts[0] == 0 and counts[1] >= 1, counts  # earlier probes may still be closing
        finally:
            sock.close()
    finally:
        if not any(node.node_id == 3 for node in kafka_cluster.running_nodes):
            kafka_cluster.start_node(3)
