"""``make demo``: a real Kafka broker, a topic, keyed records in and out.

Starts a one-node Kafka, creates a topic with three partitions, produces keyed records with
kafka-python and consumes them back as a consumer group, printing each step, then stops the
broker.  (The proxy will be put between the clients and the broker here.)

    python -m proxy.demo
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict

from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient

from proxy.testing.kafka_cluster import KafkaCluster, KafkaHarnessError, kafka_version

TOPIC = "demo-orders"
CUSTOMERS = ["alice", "bob", "carol", "dave", "erin"]
RECORDS = 20


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def run() -> None:
    step(f"Starting a one-node Apache Kafka {kafka_version()} (KRaft)")
    with KafkaCluster.start(nodes=1) as kafka:
        node = kafka.nodes[0]
        print(f"broker ready in {kafka.start_seconds:.1f} s at {kafka.bootstrap_servers} "
              f"(pid {node.pid}, log {node.log_path})")

        step(f"Creating topic {TOPIC!r} with 3 partitions")
        admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
        try:
            admin.create_topics(
                {TOPIC: {"num_partitions": 3, "replication_factor": 1}}, wait_for_metadata=True
            )
        finally:
            admin.close()
        print("created")

        step(f"Producing {RECORDS} records keyed by customer (acks=all)")
        producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
        try:
            for i in range(RECORDS):
                customer = CUSTOMERS[i % len(CUSTOMERS)]
                meta = producer.send(
                    TOPIC, key=customer.encode(), value=f"order-{i:02d}".encode()
                ).get(timeout=30)
                print(f"  {customer:>5} -> order-{i:02d}  partition {meta.partition} "
                      f"offset {meta.offset}")
        finally:
            producer.close()

        step("Consuming them back as consumer group 'demo'")
        consumer = KafkaConsumer(
            TOPIC,
            bootstrap_servers=kafka.bootstrap_servers,
            group_id="demo",
            auto_offset_reset="earliest",
        )
        by_customer: dict[str, list[str]] = defaultdict(list)
        try:
            received = 0
            deadline = time.monotonic() + 60
            while received < RECORDS and time.monotonic() < deadline:
                for tp, records in consumer.poll(timeout_ms=500).items():
                    for r in records:
                        received += 1
                        by_customer[r.key.decode()].append(r.value.decode())
                        print(f"  partition {tp.partition} offset {r.offset}: "
                              f"{r.key.decode()} {r.value.decode()}")
            consumer.commit()
        finally:
            consumer.close()

        step("Per customer, orders arrive in the order they were produced")
        for customer in CUSTOMERS:
            print(f"  {customer:>5}: {' '.join(by_customer[customer])}")
        if received != RECORDS:
            raise SystemExit(f"demo failed: consumed {received} of {RECORDS} records")

        step("Stopping the broker")
    print("done: every record produced was consumed; no Kafka process left running")


def main() -> int:
    try:
        run()
    except KafkaHarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
