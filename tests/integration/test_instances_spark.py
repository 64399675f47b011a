"""The Spark ``keyrange`` stream through two proxy instances (docs/high-availability.md,
docs/spark.md): two port-per-broker replicas behind a load balancer, so the driver's
requests and each task's connections (its seed and its leader: ``ProxyNodes``) land on
either replica, and one share's successive tasks read through different ones.

A stream of 2 partitions x 3 shares runs micro-batches every 300 ms while a producer writes
straight to the broker (several micro-batches with records come while it writes). Every acknowledged record is handed out once, each key's records in
offset order within its share (``foreachBatch`` hands rows over in input-partition order),
both replicas served key-range fetches, and the progress reaches the log end: the
pipeline's commit group at the coordinator and every share's offset in the checkpoint.
"""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

from harness.history import History, check
from harness.live import LiveProducer
from harness.wait import wait_until
from tests.integration.replicas import replicas_behind_balancer
from tests.integration.spark_fixtures import spark  # noqa: F401 - the shared session fixture
from tests.integration.test_live_tail import _committed, _log_end

RECORDS = 2000
WARM_UP = 20
SECONDS = 8.0
PARTITIONS = 2
SPLITS = 3


def _checkpointed(checkpoint: Path, topic: str) -> dict[tuple[str, int], list[int]]:
    """Each partition's share offsets in the newest micro-batch the checkpoint planned
    (``offsets/<batch>``: version, metadata, then the source's offsets as JSON)."""
    newest = max((path for path in (checkpoint / "offsets").iterdir() if path.name.isdigit()),
                 key=lambda path: int(path.name))
    planned = json.loads(newest.read_text().splitlines()[-1])
    return {(topic, int(partition)): [shares[str(share)] for share in range(SPLITS)]
            for partition, shares in planned[topic].items()}


def test_keyrange_stream_through_two_instances_hands_out_every_record(spark, kafka, proxy_factory,  # noqa: F811
                                                                      topic_factory, tmp_path):
    topic = topic_factory(kafka, partitions=PARTITIONS)
    group = f"ha-spark-{uuid.uuid4().hex[:8]}"
    checkpoint = tmp_path / "checkpoint"
    history = History()
    batches: list[tuple[int, bool]] = []  # rows per micro-batch, and whether the producer was still writing
    writing = threading.Event()

    def record(frame, batch_id: int) -> None:
        rows = frame.collect()
        batches.append((len(rows), writing.is_set()))
        for row in rows:
            history.deliver(f"share-{row['keyRangeStart']}", topic, row["partition"], row["offset"], row["key"])

    with replicas_behind_balancer(kafka, proxy_factory, 2) as replicas:
        stream = (spark.readStream.format("keyrange").option("kafka.bootstrap.servers", replicas.bootstrap_servers)
                  .option("subscribe", topic).option("splits.per.partition", str(SPLITS))
                  .option("startingOffsets", "earliest").option("commit.group.id", group).load()
                  .select("partition", "offset", "key", "keyRangeStart"))
        query = (stream.writeStream.foreachBatch(record).option("checkpointLocation", str(checkpoint))
                 .trigger(processingTime="300 milliseconds").start())
        try:
            # A few records first: the stream's first micro-batch starts Spark's Python
            # workers, which takes longer than the live writing below on 2 cores.
            LiveProducer(kafka.bootstrap_servers, topic, history, records=WARM_UP, seconds=0.2, seed=36).start().join()
            wait_until(lambda: history.missing() == 0, timeout=120, interval=0.5, what="the warm-up records read")
            writing.set()
            producer = LiveProducer(kafka.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS,
                                    seed=37).start()
            producer.join()
            writing.clear()
            wait_until(lambda: history.missing() == 0, timeout=120, interval=0.5,
                       what=lambda: f"{history.missing()} acknowledged records not yet read by the stream")
            log_end = _log_end(kafka.bootstrap_servers, topic, PARTITIONS)
            # the commit of a micro-batch's end comes with the planning of the next one
            wait_until(lambda: _committed(kafka.bootstrap_servers, group, topic, PARTITIONS) == log_end,
                       timeout=60, interval=0.5,
                       what=lambda: f"pipeline group committed "
                                    f"{_committed(kafka.bootstrap_servers, group, topic, PARTITIONS)} at {log_end}")
            fetched = [replicas.metric(i, "kafka_proxy_keyrange_records_kept_total") for i in range(2)]
            connections = replicas.connections()
        finally:
            query.stop()
    assert query.exception() is None
    assert producer.failed == 0, producer.errors
    checkpointed = _checkpointed(checkpoint, topic)
    verdict = check(history, committed=_committed(kafka.bootstrap_servers, group, topic, PARTITIONS),
                    log_end=log_end)
    print(f"\nkeyrange stream through two instances: {verdict.summary()}; micro-batches (rows, while writing) "
          f"{batches}; records kept by the key filter per replica {fetched}, connections per "
          f"replica {connections}; checkpointed {checkpointed}, log end {log_end}")
    assert verdict.acknowledged == WARM_UP + RECORDS
    assert verdict.ok(), verdict.summary()
    assert len([n for n, during in batches if n and during]) >= 2, \
        f"the stream did not read records in several micro-batches while they were written: {batches}"
    assert all(fetched), f"a replica served no key-range fetch of the stream: records kept per replica {fetched}"
    assert checkpointed == {tp: [end] * SPLITS for tp, end in log_end.items()}, \
        f"checkpointed share offsets {checkpointed}, log end {log_end}"
