"""A librdkafka (confluent-kafka) transactional consume-transform-produce member in a process
of its own: the Python twin of ``TxnRelay`` (``benchmarks/java/streams``), same semantics,
same command line and same stdout lines, so one parser (``TxnRelayProcess``) and one checker
(``harness.txn_output``) serve both.

    python -m harness.rdkafka_txn_member --bootstrap HOST:PORT --input T.kr4 \\
        --output O --group G --transactional-id G-m0 [--abort-every 5] [--config key=value]...

A Consumer of ``--group`` subscribed to ``--input`` (``isolation.level=read_committed``, auto
commit off) and a transactional Producer (``--transactional-id``, one per instance). For each
``consume`` that returns records: ``begin_transaction``, one output record per input record
to ``--output``, ``send_offsets_to_transaction`` of the offsets after them with the
consumer's ``consumer_group_metadata()`` (KIP-447 fencing of members of an older generation),
then ``commit_transaction``; every ``--abort-every``-th transaction (0: never) is aborted on
purpose after that, and the consumer seeks each partition of the aborted batch back to its
first offset there, so the next transaction redoes the work. An error that requires an abort,
or a retriable one (a timeout), aborts and rewinds the same way; a fatal one, or an abort that
fails, ends the program with exit code 1.

Output records: the input key, and the value ``<input topic>:<partition>:<offset> TAB
<transactional id>/<pid>/<transaction> TAB <input value>`` (escaped as the Java programs do).

Lines on stdout (tab-separated, as ``TxnRelay`` writes them; ``ms`` since the start):
``start ms id pid``, ``ready ms``, ``assigned|revoked|lost ms partitions``,
``begin ms txn records``, ``commit ms txn records ranges``, ``abort ms txn records ranges reason``,
``error ms message``, ``fatal ms message``, ``stopped ms committed records aborted records``.
SIGTERM or SIGINT ends the loop after the current transaction; exit code 0.

:class:`RdkafkaTxnMemberProcess` launches it the way ``TxnRelayProcess`` launches the JVM.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness import child_env
from harness.streams_app import TxnRelayProcess, escape

_STARTED = time.monotonic()


def _ms() -> int:
    return int((time.monotonic() - _STARTED) * 1000)


def _line(*fields: object) -> None:
    """One line, one write(2): out of the process when this returns."""
    os.write(1, ("\t".join(map(str, fields)) + "\n").encode())


def _partitions(partitions: Sequence[Any]) -> str:
    return escape(",".join(sorted(f"{p.topic}:{p.partition}" for p in partitions)))


def _describe(exc: BaseException) -> str:
    return escape(f"{type(exc).__name__}: {exc}")


class _Relay:
    def __init__(self, args: argparse.Namespace, configs: Mapping[str, str]) -> None:
        from confluent_kafka import Consumer, Producer

        consumer_configs = {"bootstrap.servers": args.bootstrap, "group.id": args.group,
                            "client.id": f"{args.client_id}-consumer", "enable.auto.commit": False,
                            "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                            "enable.partition.eof": False}
        producer_configs = {"bootstrap.servers": args.bootstrap, "client.id": f"{args.client_id}-producer",
                            "transactional.id": args.transactional_id, "linger.ms": 5}
        for key, value in configs.items():
            if key.startswith("consumer."):
                consumer_configs[key.removeprefix("consumer.")] = value
            elif key.startswith("producer."):
                producer_configs[key.removeprefix("producer.")] = value
            else:  # librdkafka has one configuration for both: it warns about what one ignores
                consumer_configs[key] = value
                producer_configs[key] = value
        self.args = args
        self.writer = f"{args.transactional_id}/{os.getpid()}/"
        self.timeout = args.timeout_ms / 1000
        self.close_timeout = args.close_timeout_ms / 1000
        self.producer = Producer(producer_configs)
        self.consumer = Consumer(consumer_configs)
        self.open: dict[tuple[str, int], list[int]] = {}  # the open transaction's [first, last] per partition
        self.in_transaction = False
        self.open_records = 0
        self.transactions = 0
        self.committed = self.committed_records = 0
        self.aborted = self.aborted_records = 0

    # -- the loop ----------------------------------------------------------------------

    def run(self, stop: list[bool]) -> int:
        self.producer.init_transactions(self.timeout)
        _line("ready", _ms())
        self.consumer.subscribe([self.args.input], on_assign=self._assigned, on_revoke=self._revoked,
                                on_lost=self._lost)
        deadline = time.monotonic() + self.args.max_seconds
        while not stop[0] and time.monotonic() < deadline:
            messages = self.consumer.consume(num_messages=self.args.max_poll_records,
                                             timeout=self.args.poll_ms / 1000)
            records = []
            for message in messages:
                if message.error() is not None:
                    _line("error", _ms(), escape(str(message.error())))
                else:
                    records.append(message)
            if records and not self._relay(records):
                return 1
        return 0

    def _relay(self, records: list[Any]) -> bool:
        from confluent_kafka import KafkaException, TopicPartition

        self.transactions += 1
        txn = self.transactions
        planned = self.args.abort_every > 0 and txn % self.args.abort_every == 0
        self.open.clear()
        prefix = f"{self.writer}{txn}"
        try:
            self.producer.begin_transaction()
            self.in_transaction = True
            self.open_records = len(records)
            _line("begin", _ms(), txn, len(records))
            for message in records:
                topic, partition, offset = message.topic(), message.partition(), message.offset()
                span = self.open.setdefault((topic, partition), [offset, offset])
                span[1] = offset
                raw = message.value()
                value = None if raw is None else raw.decode("utf-8", "replace")
                self.producer.produce(self.args.output, key=message.key(),
                                      value=f"{topic}:{partition}:{offset}\t{prefix}\t{escape(value)}".encode(),
                                      on_delivery=self._delivered)
            self.producer.poll(0)
            if self.args.delay_ms > 0:
                time.sleep(self.args.delay_ms / 1000)  # the transaction's processing time
            offsets = [TopicPartition(topic, partition, last + 1) for (topic, partition), (_, last) in self.open.items()]
            self.producer.send_offsets_to_transaction(offsets, self.consumer.consumer_group_metadata(), self.timeout)
            if planned:
                return self._abort(txn, len(records), "planned")
            self.producer.commit_transaction(self.timeout)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if error is not None and hasattr(error, "fatal") and error.fatal():
                self.in_transaction = False
                _line("fatal", _ms(), _describe(exc))
                return False
            # txn_requires_abort (fenced by a rebalance, ...) or retriable (a timeout): abort, redo
            return self._abort(txn, len(records), _describe(exc))
        self.in_transaction = False
        self.committed += 1
        self.committed_records += len(records)
        _line("commit", _ms(), txn, len(records), self._ranges())
        self.open.clear()
        return True

    def _abort(self, txn: int, count: int, reason: str) -> bool:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            self.producer.abort_transaction(self.timeout)
        except KafkaException as exc:
            self.in_transaction = False
            _line("fatal", _ms(), escape(f"transaction {txn} could not be aborted ({reason}): "
                                         f"{type(exc).__name__}: {exc}"))
            return False
        self.in_transaction = False
        self.aborted += 1
        self.aborted_records += count
        assigned = {(p.topic, p.partition) for p in self.consumer.assignment()}
        for (topic, partition), (first, _) in self.open.items():
            if (topic, partition) in assigned:
                try:
                    self.consumer.seek(TopicPartition(topic, partition, first))
                except KafkaException as exc:  # not fetching it yet: the next rebalance rewinds it
                    _line("error", _ms(), _describe(exc))
        _line("abort", _ms(), txn, count, self._ranges(), reason)
        self.open.clear()
        return True

    def _ranges(self) -> str:
        return escape(",".join(f"{t}:{p}:{first}:{last}" for (t, p), (first, last) in self.open.items()))

    def _delivered(self, err: Any, msg: Any) -> None:
        from confluent_kafka import KafkaError

        # records of an aborted transaction that were not sent yet are purged: expected
        if err is not None and err.code() not in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
            _line("error", _ms(), escape(f"delivery: {err}"))

    # -- rebalances: callbacks run inside consume(), when no transaction is open ---------

    def _abort_open(self, why: str) -> None:
        if not self.in_transaction:
            return
        from confluent_kafka import KafkaException

        try:
            self.producer.abort_transaction(self.timeout)
            self.aborted += 1
            self.aborted_records += self.open_records
            _line("abort", _ms(), self.transactions, self.open_records, self._ranges(), f"partitions {why}")
        except KafkaException as exc:
            _line("error", _ms(), _describe(exc))
        self.in_transaction = False
        self.open.clear()

    def _assigned(self, consumer: Any, partitions: list[Any]) -> None:
        _line("assigned", _ms(), _partitions(partitions))

    def _revoked(self, consumer: Any, partitions: list[Any]) -> None:
        self._abort_open("revoked")
        _line("revoked", _ms(), _partitions(partitions))

    def _lost(self, consumer: Any, partitions: list[Any]) -> None:
        self._abort_open("lost")
        _line("lost", _ms(), _partitions(partitions))

    def close(self) -> None:
        self.consumer.close()
        self.producer.flush(self.close_timeout)


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, dict[str, str]]:
    """The command line (the one ``TxnRelay`` takes, plus ``--timeout-ms``) and the
    ``--config`` settings."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--transactional-id")
    parser.add_argument("--client-id")
    parser.add_argument("--abort-every", type=int, default=5)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--max-poll-records", type=int, default=100)
    parser.add_argument("--poll-ms", type=int, default=200)
    parser.add_argument("--max-seconds", type=float, default=3600.0)
    parser.add_argument("--close-timeout-ms", type=int, default=10_000)
    parser.add_argument("--timeout-ms", type=int, default=30_000,
                        help="timeout of each transactional call (init, send offsets, commit, abort)")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    if args.abort_every < 0:
        parser.error("--abort-every is 0 (never) or more")
    args.transactional_id = args.transactional_id or f"{args.group}-{os.getpid()}"
    args.client_id = args.client_id or args.transactional_id
    configs = {}
    for item in args.config:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--config wants key=value, got {item}")
        configs[key] = value
    return args, configs


def main(argv: Sequence[str] | None = None) -> int:
    args, configs = parse_args(argv)
    stop = [False]

    def on_signal(*_: object) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    _line("start", _ms(), escape(args.transactional_id), os.getpid())
    from confluent_kafka import KafkaException

    relay = None
    code = 0
    try:
        relay = _Relay(args, configs)
        code = relay.run(stop)
    except KafkaException as exc:
        _line("fatal", _ms(), _describe(exc))
        code = 1
    finally:
        # a second SIGTERM while closing is ignored: the interpreter's shutdown would put the
        # default action back (death by the signal) before the exit code is out
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if relay is not None:
            relay.close()
    counts = (relay.committed, relay.committed_records, relay.aborted, relay.aborted_records) if relay else (0,) * 4
    _line("stopped", _ms(), *counts)
    return code


class RdkafkaTxnMemberProcess(TxnRelayProcess):
    """This program launched like a ``TxnRelay`` JVM (same arguments, same lines parsed);
    ``timeout_ms`` bounds each transactional call (librdkafka has no ``max.block.ms``)."""

    def __init__(self, bootstrap: str, input_topic: str, output_topic: str, group: str, *, workdir: Path,
                 name: str = "member", timeout_ms: int = 30_000, configs: Mapping[str, object] | None = None,
                 **options: Any) -> None:
        super().__init__(bootstrap, input_topic, output_topic, group, workdir=workdir, name=name, configs=configs,
                         **options)
        self.args += ["--timeout-ms", str(timeout_ms)]

    def command(self) -> list[str]:
        return [sys.executable, "-m", "harness.rdkafka_txn_member", *self.args]

    def environment(self) -> dict[str, str]:
        return child_env()  # it runs in its work directory, not in the checkout


if __name__ == "__main__":
    sys.exit(main())
