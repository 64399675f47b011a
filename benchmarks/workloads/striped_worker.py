"""One standard consumer of ``python -m benchmarks coop`` reading a striped virtual topic
(docs/cooperative-fetch.md#standard-clients-striped-virtual-topics), in a process of its
own: a librdkafka (confluent-kafka) consumer of group ``G`` assigned stripe ``--index`` of
``<topic>.coop<members>`` (the real topic itself when ``--members`` is 1), committing its
positions with librdkafka's own asynchronous commits.

    python -m benchmarks.workloads.striped_worker --bootstrap HOST:PORT --topic T --group G \
        --index 0 --members 4 --work-ms 1 --out /tmp/w

The loop, the paced work, the start signal and the ``<out><index>.progress`` and
``<out><index>.json`` files are those of ``benchmarks.workloads.coop_worker``: ``R <time>`` once connected, a
line on stdin to start, ``P <time> <count> <first>-<last>,...`` after each batch (and every
``--line-every`` records with work), ``E <error>`` on failure; it runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from benchmarks.workloads.coop_worker import _Line


def work(args: argparse.Namespace, stats: dict) -> None:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    progress = os.open(f"{args.out}{args.index}.progress", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    line = _Line(progress)
    pace = args.work_ms / 1000
    topic = args.topic if args.members == 1 else f"{args.topic}.coop{args.members}"
    partition = 0 if args.members == 1 else args.index
    consumer = Consumer({
        "bootstrap.servers": args.bootstrap, "group.id": args.group, "client.id": f"{args.group}-{args.index}",
        "enable.auto.commit": False, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100,
    })
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    try:
        consumer.list_topics(topic, timeout=30)  # connected, metadata known
        os.write(progress, b"R %.6f\n" % time.monotonic())
        sys.stdin.readline()  # the start signal
        stats["started"] = time.monotonic()
        tp = TopicPartition(topic, partition, -2)  # -2: the beginning (nothing committed yet)
        consumer.assign([tp])
        due = time.monotonic()
        committed = -1
        while not stopping:
            began = time.perf_counter()
            batch = consumer.consume(num_messages=500, timeout=0.5)
            polled = time.perf_counter()
            stats["poll_s"] += polled - began
            stats["polls"] += 1
            for i, message in enumerate(batch):
                if message.error() is not None:
                    raise KafkaException(message.error())
                if pace:
                    now = time.monotonic()
                    if now - due > 2 * pace:  # idle (waiting for records): not made up
                        due = now
                    due += pace
                    time.sleep(max(0.0, due - time.monotonic()))  # the slow service call
                    if i % args.line_every == args.line_every - 1:
                        line.flush()
                line.add(message.offset())
            line.flush()
            stats["work_s"] += time.perf_counter() - polled
            # The position, not the last record: control batches move it past the other
            # stripes' batches without a message, up to the log end.
            (position,) = consumer.position([TopicPartition(topic, partition)])
            if position.offset > committed:
                consumer.commit(offsets=[position], asynchronous=True)
                committed = position.offset
                stats["commits"] += 1
    except Exception as exc:
        os.write(progress, b"E %s\n" % repr(exc).encode(errors="replace")[:500])
        raise
    finally:
        consumer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--members", type=int, required=True)
    parser.add_argument("--work-ms", type=float, default=0.0)
    parser.add_argument("--line-every", type=int, default=20, help="with work: a progress line every so many records")
    parser.add_argument("--out", required=True,
                        help="path prefix of the progress and stats files, the index appended")
    args = parser.parse_args(argv)
    stats: dict = {"polls": 0, "commits": 0, "poll_s": 0.0, "commit_s": 0.0, "work_s": 0.0}
    try:
        work(args, stats)
    finally:
        stats["cpu_s"] = sum(os.times()[:2])
        with open(f"{args.out}{args.index}.json", "w") as out:
            json.dump(stats, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
