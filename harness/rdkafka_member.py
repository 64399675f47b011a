"""A librdkafka (confluent-kafka) group member in a process of its own, for fault runs.

    python -m harness.rdkafka_member --bootstrap HOST:PORT --group G --topic T.kr4 \
        --shares 4 --name m1 --events /tmp/m1.events --stop /tmp/m1.stop

An unmodified consumer of the kind users run against virtual range topics: it subscribes,
processes what each ``consume`` returns (a random time per record), then commits the
next offset of every partition it processed, synchronously, and writes the same event lines
as ``harness.group_member`` (H handed out, F finished; A/R on assignment changes), so
one reader and one checker serve both. With ``--shares K`` the partition written is the
real one (virtual partition v is share v mod K of real partition v div K); the offsets of
a virtual partition are the real partition's.

A failed commit (a rebalance, a coordinator that moved, a broken connection) is logged and
left: the records stay uncommitted and are handed out again to whoever owns them next,
which is what at-least-once means for this client. Stops cleanly (last commit, close) once
the ``--stop`` file exists.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

from harness.group_member import _Events


def run(args: argparse.Namespace) -> None:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    events = _Events(args.events, args.name)
    rng = random.Random(args.seed)
    shares = max(1, args.shares)

    def on_assign(consumer, partitions) -> None:
        events.write([f"A {args.name} {time.monotonic():.6f} {sorted(p.partition for p in partitions)}"])

    def on_revoke(consumer, partitions) -> None:
        events.write([f"R {args.name} {time.monotonic():.6f} {sorted(p.partition for p in partitions)}"])
        # Every record consume() handed out is processed and committed before the next call,
        # inside which this runs: the positions are safe to commit, and with them the moves
        # past other shares' records that no processed record's offset shows. Left to the
        # loop's end, a member stopped in a rebalance would leave them to an owner that may
        # never fetch (the group's committed offset then stays behind the log end).
        positions = [tp for tp in consumer.position(partitions) if tp.offset >= 0]
        if positions:
            try:
                consumer.commit(offsets=positions, asynchronous=False)
            except KafkaException as exc:
                print(f"commit on revoke failed: {exc}", file=sys.stderr, flush=True)

    def on_lost(consumer, partitions) -> None:
        events.write([f"L {args.name} {time.monotonic():.6f} {sorted(p.partition for p in partitions)}"])

    consumer = Consumer({
        "bootstrap.servers": args.bootstrap, "group.id": args.group, "client.id": args.name,
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "session.timeout.ms": args.session_timeout_ms, "heartbeat.interval.ms": args.heartbeat_interval_ms,
        "max.poll.interval.ms": 30000, "fetch.wait.max.ms": 200,
        "topic.metadata.refresh.interval.ms": 5000,
    })
    consumer.subscribe([args.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)

    def commit(done: dict[int, int]) -> bool:
        if not done:
            return True
        try:
            consumer.commit(offsets=[TopicPartition(args.topic, p, o) for p, o in done.items()], asynchronous=False)
            return True
        except KafkaException as exc:
            print(f"commit failed: {exc}", file=sys.stderr, flush=True)
            return False

    try:
        while not os.path.exists(args.stop):
            messages = consumer.consume(num_messages=args.max_poll_records, timeout=0.2)
            records = [m for m in messages if m.error() is None]
            for m in messages:
                if m.error() is not None:
                    print(f"consume error: {m.error()}", file=sys.stderr, flush=True)
            now = time.monotonic()
            events.write([f"H {args.name} {m.partition() // shares} {m.offset()} {(m.key() or b'').hex()} {now:.6f}"
                          for m in records])
            done: dict[int, int] = {}
            for m in records:
                time.sleep(rng.random() * args.delay_max_ms / 1000)  # the record's processing
                events.write([f"F {args.name} {m.partition() // shares} {m.offset()} {(m.key() or b'').hex()} "
                              f"{time.monotonic():.6f}"])
                partition, offset = m.partition(), m.offset()
                assert partition is not None and offset is not None  # set on every record consumed
                done[partition] = offset + 1
            commit(done)
        # positions moved past other shares' records (empty reads) are committed too
        positions = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
        if positions:
            try:
                consumer.commit(offsets=positions, asynchronous=False)
            except KafkaException as exc:
                print(f"final commit failed: {exc}", file=sys.stderr, flush=True)
    finally:
        consumer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--shares", type=int, default=1, help="K of a virtual topic T.krK (1: a real topic)")
    parser.add_argument("--name", required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--stop", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--delay-max-ms", type=float, default=2.0)
    parser.add_argument("--max-poll-records", type=int, default=20)
    parser.add_argument("--heartbeat-interval-ms", type=int, default=1000)
    parser.add_argument("--session-timeout-ms", type=int, default=10000)
    run(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
