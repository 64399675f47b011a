"""An example Spark pipeline through the proxy: per-customer running totals of orders.

    python -m proxy.spark.pipeline                      # starts Kafka and the proxy itself
    python -m proxy.spark.pipeline --bootstrap HOST:PORT   # a keyrange-proxy already running

1. Orders keyed by customer are written to ``orders`` (2 partitions) through the proxy.
2. They stream in through the ``keyrange`` source with ``splits.per.partition`` = 4: eight
   tasks, each reading one hash share of one partition, in offset order.
3. A stateful per-customer step keeps each customer's running total. It needs no
   shuffle: a customer's orders all sit in one share, so one task sees them all, in the
   order they were written; the task checks that, and counts any violation.
4. Every order's running total goes out through Spark's Kafka sink to
   ``customer-totals``, through the proxy; the source commits each micro-batch for the
   group ``customer-totals-pipeline``, so standard tools see the pipeline's lag.
5. ``availableNow``: the query reads what is there in micro-batches of at most
   ``--batch-orders`` orders, printing one line per micro-batch, stops by itself, and a
   summary follows.

The totals live on the driver between micro-batches (a few hundred customers); they are
saved with the batch id next to the checkpoint, so a micro-batch Spark replays after a
crash is not counted twice.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from proxy.local_kafka import LocalKafka, LocalKafkaError, ProxyProcess, ProxyStartError, scratch_dir

TOPIC = "orders"
TOTALS_TOPIC = "customer-totals"
GROUP = "customer-totals-pipeline"
PARTITIONS = 2
SHARES = 4


def produce_orders(bootstrap: str, count: int, customers: int, seed: int = 7) -> dict[str, int]:
    """Write ``count`` orders keyed by customer; returns each customer's expected total."""
    from kafka import KafkaProducer

    rng = random.Random(seed)
    totals: dict[str, int] = {}
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=10, compression_type="lz4")
    for n in range(count):
        customer = f"customer-{rng.randrange(customers):04d}"
        amount = rng.randrange(1, 500)
        totals[customer] = totals.get(customer, 0) + amount
        producer.send(TOPIC, key=customer.encode(), value=json.dumps({"order": n, "amount": amount}).encode())
    producer.flush(60)
    producer.close()
    return totals


def running_totals(rows, start_totals: dict[str, int]):
    """One task's step over its share, in offset order: each order's running total, then
    per customer the last total and the number of out-of-order offsets seen (0 expected).
    Rows out: (kind, customer, value bytes, total, order violations)."""
    totals = dict(start_totals)
    last_offset: dict[tuple[int, str], int] = {}
    violations = 0
    for row in rows:
        customer = row["key"].decode()
        order = json.loads(row["value"])
        where = (row["partition"], customer)
        if last_offset.get(where, -1) >= row["offset"]:
            violations += 1
        last_offset[where] = row["offset"]
        totals[customer] = totals.get(customer, 0) + order["amount"]
        out = {"customer": customer, "order": order["order"], "total": totals[customer]}
        yield ("record", customer, json.dumps(out).encode(), totals[customer], 0)
    for customer in {c for _p, c in last_offset}:
        yield ("state", customer, None, totals[customer], 0)
    yield ("violations", "", None, 0, violations)


def run(bootstrap: str, orders: int, customers: int, batch_orders: int, workdir: Path) -> int:
    from proxy.spark.session import local_session

    print(f"producing {orders} orders of {customers} customers to {TOPIC} through {bootstrap}", flush=True)
    expected = produce_orders(bootstrap, orders, customers)
    spark = local_session("keyrange-pipeline", shuffle_partitions=2)
    state_path = workdir / "totals.json"
    state: dict[str, Any] = (json.loads(state_path.read_text()) if state_path.exists()
                             else {"batch": -1, "totals": {}, "violations": 0})
    started = time.monotonic()

    def each_batch(batch, batch_id: int) -> None:
        if batch_id <= state["batch"]:
            print(f"batch {batch_id}: already applied, skipped", flush=True)
            return
        t0 = time.monotonic()
        before = state["totals"]
        out = batch.rdd.mapPartitions(lambda rows: running_totals(rows, before)).toDF(
            "kind string, customer string, value binary, total long, violations long").cache()
        try:
            records = out.where("kind = 'record'").selectExpr("cast(customer as binary) as key", "value")
            written = records.count()
            (records.write.format("kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("topic", TOTALS_TOPIC).save())
            tail = out.where("kind != 'record'").select("kind", "customer", "total", "violations").collect()
        finally:
            out.unpersist()
        totals = dict(before)
        violations = 0
        for row in tail:
            if row["kind"] == "state":
                totals[row["customer"]] = row["total"]
            else:
                violations += row["violations"]
        state.update(batch=batch_id, totals=totals, violations=state["violations"] + violations)
        state_path.write_text(json.dumps(state))
        print(f"batch {batch_id}: {written} orders in {batch.rdd.getNumPartitions()} tasks, "
              f"{len(totals)} customers so far, {violations} order violations, "
              f"{time.monotonic() - t0:.1f} s", flush=True)

    stream = (spark.readStream.format("keyrange").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", TOPIC).option("splits.per.partition", str(SHARES))
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(batch_orders))
              .option("commit.group.id", GROUP).load())
    query = (stream.writeStream.foreachBatch(each_batch).option("checkpointLocation", str(workdir / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        print(f"error: the query failed: {query.exception()}", file=sys.stderr)
        return 1
    seconds = time.monotonic() - started
    written = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
               .option("subscribe", TOTALS_TOPIC).load().count())
    totals = state["totals"]
    right = sum(1 for c, t in expected.items() if totals.get(c) == t)
    print(f"\nsummary: {sum(p['numInputRows'] for p in query.recentProgress)} orders in "
          f"{len([p for p in query.recentProgress if p['numInputRows']])} micro-batches, {seconds:.1f} s; "
          f"{written} running totals in {TOTALS_TOPIC}; {right}/{len(expected)} customer totals right; "
          f"{state['violations']} order violations; offsets committed for group {GROUP}", flush=True)
    spark.stop()
    return 0 if right == len(expected) and state["violations"] == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proxy.spark.pipeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", help="a running keyrange-proxy (default: start Kafka and a proxy)")
    parser.add_argument("--orders", type=int, default=4000)
    parser.add_argument("--customers", type=int, default=200)
    parser.add_argument("--batch-orders", type=int, default=1000, help="maxOffsetsPerTrigger")
    args = parser.parse_args(argv)

    workdir = scratch_dir("keyrange-pipeline-")
    try:
        if args.bootstrap:
            _create_topics(args.bootstrap)
            return run(args.bootstrap, args.orders, args.customers, args.batch_orders, workdir)
        print("starting a one-node Kafka and keyrange-proxy in front of it", flush=True)
        with LocalKafka.start(workdir / "kafka") as cluster:
            with ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / "proxy") as proxy:
                _create_topics(cluster.bootstrap_servers)
                return run(proxy.bootstrap_servers, args.orders, args.customers, args.batch_orders, workdir)
    except (LocalKafkaError, ProxyStartError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _create_topics(bootstrap: str) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="keyrange-pipeline")
    try:
        for name in (TOPIC, TOTALS_TOPIC):
            try:
                admin.create_topics([NewTopic(name, PARTITIONS, 1)], timeout_ms=30000)
            except TopicAlreadyExistsError:
                pass
        admin.wait_for_topics([TOPIC, TOTALS_TOPIC], timeout_ms=30000)
    finally:
        admin.close()


if __name__ == "__main__":
    sys.exit(main())
