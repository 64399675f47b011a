"""The Python side of the streams module's line formats (harness/streams_app.py): field
escapes, lines cut by a kill, virtual partition names, and the parsers of each program's
lines, fed from files as the JVMs would write them (no JVM is started)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness import rdkafka_txn_member
from harness.history import History
from harness.rdkafka_txn_member import RdkafkaTxnMemberProcess
from harness.streams_app import (
    PlainConsumerProcess,
    PlainProducerProcess,
    StreamsInstance,
    TxnFleet,
    TxnRange,
    TxnRelayProcess,
    _LineFile,
    escape,
    parse_ranges,
    real_partition,
    unescape,
)


def test_unescape_reverses_the_java_escapes():
    assert unescape("k1") == "k1"
    assert unescape("\\N") is None
    assert unescape("a\\tb\\nc\\rd\\\\e") == "a\tb\nc\rd\\e"
    assert unescape("\\\\N") == "\\N"  # an escaped backslash before N is not null


def test_a_line_cut_by_a_kill_is_read_only_once_complete(tmp_path: Path):
    path = tmp_path / "out"
    reader = _LineFile(path)
    assert reader.read_new() == []  # not created yet
    path.write_bytes(b"ack\t0\t1\tk1\t1\nack\t0\t2")
    assert reader.read_new() == [["ack", "0", "1", "k1", "1"]]
    assert reader.read_new() == []
    with open(path, "ab") as f:
        f.write(b"\tk2\t2\n")
    assert reader.read_new() == [["ack", "0", "2", "k2", "2"]]


def test_real_partition_of_a_virtual_topic():
    assert real_partition("orders.kr4", 5) == ("orders", 1)
    assert real_partition("orders.kr4", 3) == ("orders", 0)
    assert real_partition("orders", 5) == ("orders", 5)
    assert real_partition("orders.kr0", 5) == ("orders.kr0", 5)  # K starts at 1
    assert real_partition("a.v8", 9, suffix=".v") == ("a", 1)


def _launch(process, text: str) -> None:
    """As ``start()`` would, without a JVM: a new launch whose stdout holds ``text``."""
    process.refresh()
    process._launch_started()
    process.launches += 1
    process.stdout_path.write_text(text)
    process._readers.append(_LineFile(process.stdout_path))


def test_producer_lines_feed_the_history(tmp_path: Path):
    producer = PlainProducerProcess("127.0.0.1:1", "t", records=3, workdir=tmp_path)
    _launch(producer, "ack\t1\t0\tk0\t0\nack\t0\t0\tk1\t1\nfail\tk2\t2\tTimeoutException: x\n"
                      "done\t120\t3\t2\t1\n")
    history = History()
    assert producer.feed(history) == 2
    assert producer.feed(history) == 0
    assert [(a.partition, a.offset, a.key, a.value) for a in history.acks] == [(1, 0, b"k0", b"0"), (0, 0, b"k1", b"1")]
    assert producer.failures == [("k2", 2, "TimeoutException: x")]
    assert producer.done == (3, 2, 1)


def test_consumer_lines_across_launches(tmp_path: Path):
    consumer = PlainConsumerProcess("127.0.0.1:1", "t.kr2", "g", workdir=tmp_path, name="c0")
    _launch(consumer, "assigned\t10\tt.kr2:0,t.kr2:3\nrec\tt.kr2\t3\t7\tk\\t1\t\\N\ncommit\tt.kr2\t3\t8\n"
                      "rec\tt.kr2\t0\t9\tk2")  # killed in the middle of this line
    consumer.refresh()
    assert consumer.assignment == {("t.kr2", 0), ("t.kr2", 3)} and consumer.joined
    _launch(consumer, "assigned\t5\t\nrevoked\t9\t\n")
    consumer.refresh()
    assert consumer.assignment == set() and consumer.joined
    assert [(r.partition, r.offset, r.key, r.value, r.launch) for r in consumer.records] == [(3, 7, "k\t1", None, 1)]
    assert consumer.committed == {("t.kr2", 3): 8}
    history = History()
    assert consumer.feed(history, virtual=True) == 1
    (delivery,) = history.deliveries
    assert (delivery.member, delivery.topic, delivery.partition, delivery.offset) == ("c0#1", "t", 1, 7)


def test_streams_instance_state_is_the_current_launchs(tmp_path: Path):
    instance = StreamsInstance("a-0", bootstrap="127.0.0.1:1", input_topic="in", output_topic="out",
                               application_id="a", state_dir=tmp_path / "state", workdir=tmp_path)
    _launch(instance, "start\t0\ta\t1\nstate\t5\tREBALANCING\tCREATED\nstate\t9\tRUNNING\tREBALANCING\n"
                      "progress\t1000\t40\tRUNNING\n")
    instance.refresh()
    assert instance.state == "RUNNING" and instance.processed == 40
    _launch(instance, "state\t5\tREBALANCING\tCREATED\nerror\t7\tStreamThread-1\tX: y\n")
    instance.refresh()
    assert instance.state == "REBALANCING"
    assert instance.processed_total == 40
    assert instance.errors == [(2, "StreamThread-1: X: y")]
    assert instance.states == [(1, "REBALANCING"), (1, "RUNNING"), (2, "REBALANCING")]


def test_escape_is_undone_by_unescape():
    for text in ("k1", "a\tb\nc\rd\\e", "\\N", "", "x\\"):
        assert unescape(escape(text)) == text
    assert escape(None) == "\\N" and unescape(escape(None)) is None
    assert escape("a\tb") == "a\\tb"


def test_txn_relay_lines_across_launches(tmp_path: Path):
    relay = TxnRelayProcess("127.0.0.1:1", "t.kr4", "out", "g", workdir=tmp_path, name="relay-0")
    assert relay.transactional_id == "g-relay-0"
    assert relay.args[relay.args.index("--transactional-id") + 1] == "g-relay-0"
    _launch(relay, "start\t3\tg-relay-0\t4242\nready\t90\nassigned\t120\tt.kr4:1,t.kr4:2\n"
                   "begin\t140\t1\t3\ncommit\t150\t1\t3\tt.kr4:1:0:7,t.kr4:2:5:5\n"
                   "abort\t180\t2\t2\tt.kr4:1:9:12\tplanned\n"
                   "abort\t200\t3\t2\tt.kr4:1:9:12\torg.apache.kafka.clients.consumer.CommitFailedException: x\\ty\n"
                   "error\t210\tTimeoutException: z\n"
                   "begin\t215\t4\t2\ncommit\t220\t4\t2\tt.kr4:1:9")  # killed in the middle of this line
    relay.refresh()
    assert relay.in_transaction() and relay.open_writer() == "g-relay-0/4242/4"
    assert relay.ready and relay.joined and relay.assignment == {("t.kr4", 1), ("t.kr4", 2)}
    assert relay.pids == {1: 4242}
    (commit,) = relay.committed()
    assert (commit.launch, commit.txn, commit.records, commit.writer) == (1, 1, 3, "g-relay-0/4242/1")
    assert commit.ranges == (TxnRange("t.kr4", 1, 0, 7), TxnRange("t.kr4", 2, 5, 5))
    planned, failed = relay.aborted()
    assert planned.planned and not planned.committed and planned.writer == "g-relay-0/4242/2"
    assert not failed.planned and failed.reason == "org.apache.kafka.clients.consumer.CommitFailedException: x\ty"
    assert relay.aborted(planned=False) == [failed]
    assert relay.errors == [(1, "TimeoutException: z")]
    _launch(relay, "start\t2\tg-relay-0\t4343\nassigned\t50\t\nrevoked\t60\t\n"
                   "commit\t70\t1\t1\tt.kr4:3:4:4\nfatal\t80\tProducerFencedException: f\nstopped\t90\t1\t1\t0\t0\n")
    relay.refresh()
    assert not relay.ready and relay.joined and relay.assignment == set()
    assert not relay.in_transaction() and relay.open_writer() is None
    assert [t.writer for t in relay.committed()] == ["g-relay-0/4242/1", "g-relay-0/4343/1"]
    assert relay.fatal == [(2, "ProducerFencedException: f")]
    assert relay.stopped == (1, 1, 0, 0)
    assert "fatal#2: ProducerFencedException: f" in relay.problems()
    fleet = TxnFleet([relay])
    assert fleet.aborted_writers() == {"g-relay-0/4242/2", "g-relay-0/4242/3"}
    assert fleet.aborted_ranges() == [("t.kr4", 1, 9, 12), ("t.kr4", 1, 9, 12)]


def test_parse_ranges():
    assert parse_ranges("") == ()
    assert parse_ranges("a.b-c:0:1:2") == (TxnRange("a.b-c", 0, 1, 2),)


def test_librdkafka_member_is_launched_with_the_relays_arguments(tmp_path: Path):
    member = RdkafkaTxnMemberProcess("127.0.0.1:1", "t.kr4", "out", "g", workdir=tmp_path, name="member-0",
                                     abort_every=3, timeout_ms=7000, configs={"producer.linger.ms": 1})
    command = member.command()
    assert command[:3] == [sys.executable, "-m", "harness.rdkafka_txn_member"]
    args = command[3:]
    assert args[args.index("--transactional-id") + 1] == "g-member-0"
    assert args[args.index("--abort-every") + 1] == "3"
    assert args[args.index("--timeout-ms") + 1] == "7000"
    assert args[args.index("--config") + 1] == "producer.linger.ms=1"
    # the member's own parser takes every argument the launcher passes
    parsed, configs = rdkafka_txn_member.parse_args(args)
    assert (parsed.input, parsed.output, parsed.group, parsed.client_id) == ("t.kr4", "out", "g", "member-0")
    assert (parsed.abort_every, parsed.timeout_ms, parsed.max_poll_records) == (3, 7000, 100)
    assert configs == {"producer.linger.ms": "1"}
    with pytest.raises(SystemExit):
        rdkafka_txn_member.parse_args([*args, "--abort-every", "-1"])
