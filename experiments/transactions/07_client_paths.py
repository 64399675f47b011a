"""Which requests real transactional clients send for consumed offsets, and why a Kafka
Streams exactly_once_v2 application on a virtual topic hangs behind today's proxy.

A one-node Kafka whose advertised address is a recording tap (``proxy.testing.tap``), so
every request crossing it is listed with its version and the broker's error code.

Observed:
  1. librdkafka (confluent-kafka): AddOffsetsToTxn, then TxnOffsetCommit (its version
     printed), then EndTxn: the transaction version 1 path.
  2. The Java client of the pinned Kafka version against a transaction.version=2 cluster:
     no AddOffsetsToTxn at all; TxnOffsetCommit v5 joins the group's partition to the
     transaction; EndTxn v5.
  3. The same Java producer through the proxy (virtual topics on), committing offsets of
     ``T.kr4``: the proxy forwards TxnOffsetCommit naming ``T.kr4``, the broker answers
     UNKNOWN_TOPIC_OR_PARTITION (3), which the Java client retries (a RetriableException)
     until max.block.ms: Kafka Streams' hang.

    .venv/bin/python experiments/transactions/07_client_paths.py
"""

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import Conn, check, err, say

from proxy.protocol import messages
from proxy.protocol.messages import ApiKey
from proxy.testing.kafka_cluster import find_java, libs_dir
from proxy.testing.proxy_process import ProxyProcess
from proxy.testing.tap import TappedKafka

NAMES = {0: "Produce", 3: "Metadata", 10: "FindCoordinator", 22: "InitProducerId", 24: "AddPartitionsToTxn",
         25: "AddOffsetsToTxn", 26: "EndTxn", 28: "TxnOffsetCommit"}
T = "orders"
G = "billing"


def error_of(api: int, version: int, frame: bytes) -> str:
    try:
        _, body = messages.decode_response(api, version, frame)
    except Exception as exc:  # noqa: BLE001 - show what could not be decoded
        return f"(undecoded: {exc})"
    if api == ApiKey.TXN_OFFSET_COMMIT:
        return ", ".join(f"{t.name}-{p.partition_index}: {err(p.error_code)}" for t in body.topics for p in t.partitions)
    if api == ApiKey.ADD_PARTITIONS_TO_TXN and version >= 4:  # broker to broker (KIP-890)
        return "; ".join(f"{t.transactional_id}: " + ", ".join(
            f"{r.name}-{p.partition_index} {err(p.partition_error_code)}" for r in t.topic_results
            for p in r.results_by_partition) for t in body.results_by_transaction)
    if api == ApiKey.ADD_PARTITIONS_TO_TXN:
        return ", ".join(f"{t.name}: {[err(p.partition_error_code) for p in t.results_by_partition]}"
                         for t in body.results_by_topic_v3_and_below or ())
    if api == ApiKey.PRODUCE:
        return ", ".join(err(p.error_code) for r in body.responses for p in r.partition_responses)
    if api == ApiKey.FIND_COORDINATOR:
        return ", ".join(f"{c.key}: {err(c.error_code)}" for c in body.coordinators or ())
    return err(getattr(body, "error_code", 0))


def show(tap, since: int, clients: tuple[str, ...] = ()) -> list:
    rows = []
    for ex in tap.exchanges(since):
        if ex.api_key not in (22, 24, 25, 26, 28) and not (ex.api_key == 0 and ex.request.client_id in clients):
            continue
        answer = error_of(ex.api_key, ex.api_version, ex.response.frame) if ex.response and ex.response.frame else "-"
        if ex.api_key == ApiKey.ADD_PARTITIONS_TO_TXN and ex.api_version >= 4 and ex.request.frame:
            _, request = messages.decode_request(ex.request.frame)
            answer = ("VerifyOnly " + ",".join(str(t.verify_only).lower() for t in request.transactions)
                      + " -> " + answer)
        rows.append((ex.api_key, ex.api_version))
        say(f"    {ex.request.client_id or '':>24}  {NAMES.get(ex.api_key, ex.api_key)} v{ex.api_version}: {answer}")
    return rows


def java_probe(bootstrap: str, txn: str, offsets_topic: str, partition: int, max_block_ms: int, build: Path) -> str:
    classpath = f"{build}:{libs_dir()}/*"
    result = subprocess.run([find_java(), "-Xmx128m", "-XX:+UseSerialGC", "-cp", classpath, "TxnOffsetsProbe",
                             bootstrap, txn, T, offsets_topic, str(partition), "5", G, str(max_block_ms)],
                            capture_output=True, text=True, timeout=90)
    return result.stdout.strip() + ("\n" + result.stderr.strip()[-800:] if result.returncode else "")


def main() -> None:
    build = Path(tempfile.mkdtemp(prefix="txn-probe-"))
    try:
        run(build)
    finally:
        shutil.rmtree(build, ignore_errors=True)


def run(build: Path) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    subprocess.run(["javac", "-nowarn", "-Xlint:-removal", "-cp", f"{libs_dir()}/*", "-d", str(build),
                    str(Path(__file__).with_name("TxnOffsetsProbe.java"))], check=True, timeout=120)
    with TappedKafka.start() as tapped:
        say(f"# Kafka (one node) behind a recording tap at {tapped.bootstrap_servers}")
        admin = Conn(tapped.bootstrap_servers, "admin")
        admin.create_topic(T, 2)

        say("\n## 1. librdkafka (confluent-kafka) send_offsets_to_transaction")
        mark = tapped.tap.mark()
        producer = Producer({"bootstrap.servers": tapped.bootstrap_servers, "transactional.id": "rdkafka-app",
                             "client.id": "rdkafka-producer"})
        consumer = Consumer({"bootstrap.servers": tapped.bootstrap_servers, "group.id": G})
        producer.init_transactions(30)
        for round_ in range(2):
            producer.begin_transaction()
            producer.produce(T, key=b"k", value=b"v", partition=0)
            producer.flush(30)
            producer.send_offsets_to_transaction([TopicPartition(T, 0, 5 + round_)],
                                                 consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(30)
        consumer.close()
        producer.flush(5)
        del producer
        time.sleep(0.5)
        rows = show(tapped.tap, mark, ("rdkafka-producer",))
        check("librdkafka sends AddOffsetsToTxn (transaction version 1 path)", any(k == 25 for k, _ in rows))

        say("\n## 2. Java producer (kafka-clients of the pinned version), sendOffsetsToTransaction")
        mark = tapped.tap.mark()
        say("    " + java_probe(tapped.bootstrap_servers, "java-app", T, 0, 30000, build).replace("\n", "\n    "))
        time.sleep(0.5)
        rows = show(tapped.tap, mark, ("producer-java-app",))
        check("no AddOffsetsToTxn; TxnOffsetCommit v5 and EndTxn v5 (transaction version 2)",
              not any(k == 25 for k, _ in rows) and (28, 5) in rows and (26, 5) in rows)

        say("\n## 3. the same Java producer through the proxy, offsets of the virtual topic orders.kr4")
        proxy = ProxyProcess.start(tapped.bootstrap_servers, overrides={"virtual.topics.enabled": "true"})
        try:
            mark = tapped.tap.mark()
            began = time.monotonic()
            out = java_probe(proxy.bootstrap_servers, "java-app-virtual", f"{T}.kr4", 1, 6000, build)
            say("    " + out.replace("\n", "\n    "))
            say(f"    (the Java program ended after {time.monotonic() - began:.1f} s, max.block.ms 6000)")
            time.sleep(0.5)
            exchanges = [ex for ex in tapped.tap.exchanges(mark) if ex.api_key == ApiKey.TXN_OFFSET_COMMIT]
            say(f"    the proxy forwarded {len(exchanges)} TxnOffsetCommit requests to the broker in 6 s; the first:")
            show_rows = tapped.tap.exchanges(mark)
            first = next(ex for ex in show_rows if ex.api_key == ApiKey.TXN_OFFSET_COMMIT)
            say(f"      TxnOffsetCommit v{first.api_version}: "
                f"{error_of(first.api_key, first.api_version, first.response.frame)}")
            check("UNKNOWN_TOPIC_OR_PARTITION, retried by the client until max.block.ms", len(exchanges) > 3)
        finally:
            proxy.stop()
        admin.close()


if __name__ == "__main__":
    sys.exit(main())
