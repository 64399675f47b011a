"""The Spark ``keyrange`` source in streaming mode, with records written while it reads.

A stream of 2 partitions x 3 shares runs micro-batches every 300 ms while a producer
writes small bursts with idle gaps (after a few records that warm the stream up). ``foreachBatch`` hands each micro-batch's rows to the
driver in input-partition order, which is offset order within each share, so the recorded
history checks per-key order across micro-batches as well as loss and duplicates; the
pipeline's commit group must reach the log end at the coordinator.
"""

from __future__ import annotations

import uuid

from harness.history import History, check
from harness.live import LiveProducer
from harness.wait import wait_until
from tests.integration.spark_fixtures import spark  # noqa: F401 - the shared session fixture
from tests.integration.test_live_tail import _committed, _log_end

RECORDS = 2000
WARM_UP = 20
SECONDS = 8.0
PARTITIONS = 2


def test_keyrange_stream_hands_out_every_record_written_while_it_reads(spark, kafka, proxy, topic_factory,  # noqa: F811
                                                                      tmp_path):
    topic = topic_factory(kafka, partitions=PARTITIONS)
    group = f"live-spark-{uuid.uuid4().hex[:8]}"
    history = History()
    batches: list[int] = []  # rows per micro-batch

    def record(frame, batch_id: int) -> None:
        rows = frame.collect()
        batches.append(len(rows))
        for row in rows:
            history.deliver(f"share-{row['keyRangeStart']}", topic, row["partition"], row["offset"], row["key"])

    stream = (spark.readStream.format("keyrange").option("kafka.bootstrap.servers", proxy.bootstrap_servers)
              .option("subscribe", topic).option("splits.per.partition", "3")
              .option("startingOffsets", "earliest").option("commit.group.id", group).load()
              .select("partition", "offset", "key", "keyRangeStart"))
    query = (stream.writeStream.foreachBatch(record).option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(processingTime="300 milliseconds").start())
    try:
        # A few records first: the stream's first micro-batch starts Spark's Python workers,
        # which takes longer than the live writing below on 2 cores.
        LiveProducer(proxy.bootstrap_servers, topic, history, records=WARM_UP, seconds=0.2, seed=27).start().join()
        wait_until(lambda: history.missing() == 0, timeout=120, interval=0.5, what="the warm-up records read")
        producer = LiveProducer(proxy.bootstrap_servers, topic, history, records=RECORDS, seconds=SECONDS,
                                seed=26).start()
        producer.join()
        wait_until(lambda: history.missing() == 0, timeout=120, interval=0.5,
                   what=lambda: f"{history.missing()} acknowledged records not yet read by the stream")
        # the commit of a micro-batch's end comes with the planning of the next one
        wait_until(lambda: _committed(kafka.bootstrap_servers, group, topic, PARTITIONS)
                   == _log_end(kafka.bootstrap_servers, topic, PARTITIONS), timeout=60, interval=0.5,
                   what=lambda: f"pipeline group committed "
                                f"{_committed(kafka.bootstrap_servers, group, topic, PARTITIONS)} at the log end")
    finally:
        query.stop()
    assert query.exception() is None
    assert producer.failed == 0, producer.errors
    assert len([n for n in batches if n]) >= 5, f"the live tail read in several micro-batches, not {batches}"
    verdict = check(history, committed=_committed(kafka.bootstrap_servers, group, topic, PARTITIONS),
                    log_end=_log_end(kafka.bootstrap_servers, topic, PARTITIONS))
    assert verdict.acknowledged == WARM_UP + RECORDS
    assert verdict.ok(), verdict.summary()
