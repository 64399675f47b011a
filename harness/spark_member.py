"""A Spark streaming driver in a process of its own: the ``keyrange`` source read as a
stream, for the chaos runs that SIGKILL the driver or one of its Python workers.

    python -m harness.spark_member --bootstrap HOST:PORT --group G --topic T \
        --name driver-1 --events /tmp/driver-1.events --stop /tmp/driver-1.stop \
        --status /tmp/driver-1.status --checkpoint /tmp/checkpoint

A local-mode SparkSession (``--master``, by default ``local[2,4]``: two task slots, and a
failed task tried up to four times, which plain ``local[2]`` does not allow) reads ``--topic``
through the proxy as ``--splits`` key-range shares per partition, micro-batches every
``--trigger-ms``, with its state in ``--checkpoint`` (a driver started again on the same
directory resumes where the checkpoint says), and commits the processed offsets for
``--group`` (the source's ``commit.group.id``). ``foreachBatch`` appends the micro-batch's
rows to ``--events`` in ``harness.group_member``'s format: every row as handed out
(one line each, one time for the batch), then each row in the order ``collect`` returns
them (offset order within a share) as finished once its work is done (a random time up to
``--delay-max-ms``), so a driver killed mid-batch leaves rows handed out and not finished:

    H <name> <partition> <offset> <key-hex or -> <time>
    F <name> <partition> <offset> <key-hex or -> <time>

with ``time.monotonic()`` times, the H lines of a batch one ``os.write`` and each F line
one, on an O_APPEND file descriptor. ``--status`` gets ``started <time>`` once the query runs and ``ready <time>``
once its first micro-batch is done (on an empty topic that batch is empty), then
``batch <id> <rows> <time>`` after each ``foreachBatch``. ``--warm-up`` first reads the
topic once as a batch, which starts Spark's Python workers before the stream needs them.

The driver stops the query and the session, and exits 0, once the ``--stop`` file exists; a
query that fails makes it exit 1 with Spark's error on stderr.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import traceback
from typing import Any

from harness.group_member import _Events

READY_TIMEOUT = 600.0  # the query's first micro-batch, on a busy machine
STOP_TIMEOUT = 60.0


def _key(key: bytes | None) -> str:
    return "-" if key is None else bytes(key).hex()


class _Status:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, *cells: object) -> None:
        os.write(self._fd, (" ".join(str(c) for c in cells) + f" {time.monotonic():.6f}\n").encode())


def session(args: argparse.Namespace) -> Any:
    from proxy.spark.session import local_session

    local = os.path.join(os.path.dirname(os.path.abspath(args.checkpoint)), f"{args.name}-spark-local")
    os.makedirs(local, exist_ok=True)
    return local_session(f"keyrange-chaos-{args.name}", master=args.master, shuffle_partitions=2,
                         conf={"spark.driver.memory": "1g", "spark.default.parallelism": "2",
                               "spark.local.dir": local,
                               "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={local}"})


def run(args: argparse.Namespace) -> int:
    events = _Events(args.events, args.name)
    status = _Status(args.status)
    spark = session(args)

    def reader(kind: Any) -> Any:
        return (kind.format("keyrange").option("kafka.bootstrap.servers", args.bootstrap)
                .option("subscribe", args.topic).option("splits.per.partition", str(args.splits)))

    if args.warm_up:
        # the Python workers start (and import the source) for this read, not for the stream's first batch
        reader(spark.read).load().count()

    rng = random.Random(args.seed)

    def record(frame: Any, batch_id: int) -> None:
        rows = frame.collect()
        handed = time.monotonic()
        cells = [(row["partition"], row["offset"], _key(row["key"])) for row in rows]
        events.write([f"H {args.name} {p} {o} {k} {handed:.6f}" for p, o, k in cells])
        # the batch's processing: each row in turn, in the order the batch holds them
        for p, o, k in cells:
            if args.delay_max_ms:
                time.sleep(rng.random() * args.delay_max_ms / 1000)  # the row's work, not a synchronisation
            events.write([f"F {args.name} {p} {o} {k} {time.monotonic():.6f}"])
        status.write("batch", batch_id, len(rows))

    stream = (reader(spark.readStream).option("startingOffsets", "earliest")
              .option("commit.group.id", args.group).load()
              .select("partition", "offset", "key", "keyRangeStart"))
    query = (stream.writeStream.foreachBatch(record).option("checkpointLocation", args.checkpoint)
             .trigger(processingTime=f"{args.trigger_ms} milliseconds").start())
    status.write("started")
    failed = False
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        ready = False
        while not os.path.exists(args.stop):
            if query.awaitTermination(0.2):  # returns (or raises the query's error) once it ended
                print(f"the query stopped by itself: {query.exception()}", file=sys.stderr, flush=True)
                failed = True
                break
            if not ready and query.lastProgress is not None:
                status.write("ready")
                ready = True
            if not ready and time.monotonic() > deadline:
                print(f"the query did not finish a first micro-batch in {READY_TIMEOUT:g} s", file=sys.stderr)
                failed = True
                break
    except Exception:  # the query failed (StreamingQueryException): Spark's error, then exit 1
        traceback.print_exc()
        failed = True
    finally:
        query.stop()
        query.awaitTermination(STOP_TIMEOUT)
        if query.exception() is not None and not failed:
            print(f"the query failed: {query.exception()}", file=sys.stderr)
            failed = True
        spark.stop()
    status.write("stopped", "failed" if failed else "ok")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--bootstrap", required=True, help="the proxy")
    parser.add_argument("--group", required=True, help="the source's commit.group.id")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--name", required=True, help="the member name of the event lines")
    parser.add_argument("--events", required=True)
    parser.add_argument("--stop", required=True)
    parser.add_argument("--status", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--splits", type=int, default=3, help="splits.per.partition")
    parser.add_argument("--master", default="local[2,4]", help="local[N,F]: N task slots, F tries per task")
    parser.add_argument("--trigger-ms", type=int, default=300)
    parser.add_argument("--warm-up", action="store_true", help="read the topic once as a batch first")
    parser.add_argument("--delay-max-ms", type=float, default=0.0,
                        help="work per row in foreachBatch: a random time up to this")
    parser.add_argument("--seed", type=int, default=0, help="of the work times")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
