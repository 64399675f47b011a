"""Spark's own Kafka source (spark-sql-kafka-0-10) reads a virtual range topic through the
proxy (docs/wire-contract.md#9-virtual-range-topics), batch and stream, unmodified.

Each of the K x P virtual partitions becomes one Spark partition; together they hold every
record of the real topic exactly once, at its real offset, record ``(p, o)`` of the real
topic showing up in virtual partition ``p * K + share(key)``.
"""

from __future__ import annotations

import uuid

from tests.conftest import create_topic
from tests.integration.spark_fixtures import spark  # noqa: F401 - the shared session fixture
from tests.integration.virtual_checks import PARTITIONS, SHARES, produce

COLUMNS = ("key", "value", "partition", "offset")
RECORDS = 1200


def _real(spark, bootstrap: str, topic: str) -> dict[tuple[bytes, bytes], tuple[int, int]]:  # noqa: F811
    rows = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
            .load().select(*COLUMNS).collect())
    return {(bytes(r["key"]), bytes(r["value"])): (r["partition"], r["offset"]) for r in rows}


def _check(rows, real: dict[tuple[bytes, bytes], tuple[int, int]]) -> None:
    from proxy.ranges import contains
    from proxy.records.keyhash import key_hash
    from proxy.virtual.names import share_ranges

    got = [(bytes(r["key"]), bytes(r["value"]), r["partition"], r["offset"]) for r in rows]
    assert len(got) == len(real), f"{len(got)} rows for {len(real)} records: duplicates or losses"
    assert {(k, v) for k, v, _, _ in got} == set(real)
    ranges = share_ranges(SHARES)
    last: dict[bytes, int] = {}
    for key, value, partition, offset in sorted(got, key=lambda row: (row[2], row[3])):
        real_partition, real_offset = real[(key, value)]
        assert (partition // SHARES, offset) == (real_partition, real_offset)
        assert contains([ranges[partition % SHARES]], key_hash(key, 0))
        assert offset > last.get(key, -1)
        last[key] = offset


def test_spark_batch_reads_a_virtual_topic(spark, kafka, proxy):  # noqa: F811
    topic = f"spark-virtual-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, PARTITIONS)
    produce(proxy.bootstrap_servers, topic, RECORDS)
    real = _real(spark, kafka.bootstrap_servers, topic)
    df = (spark.read.format("kafka").option("kafka.bootstrap.servers", proxy.bootstrap_servers)
          .option("subscribe", f"{topic}.kr{SHARES}").load())
    assert df.rdd.getNumPartitions() == SHARES * PARTITIONS
    _check(df.select(*COLUMNS).collect(), real)


def test_spark_stream_reads_a_virtual_topic(spark, kafka, proxy, tmp_path):  # noqa: F811
    topic = f"spark-virtual-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, PARTITIONS)
    produce(proxy.bootstrap_servers, topic, RECORDS)
    real = _real(spark, kafka.bootstrap_servers, topic)
    name = f"virtual_{uuid.uuid4().hex[:6]}"
    query = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", proxy.bootstrap_servers)
             .option("subscribe", f"{topic}.kr{SHARES}").option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", "500").load().select(*COLUMNS)
             .writeStream.format("memory").queryName(name)
             .option("checkpointLocation", str(tmp_path / name)).trigger(availableNow=True).start())
    assert query.awaitTermination(240)
    assert query.exception() is None
    assert len([p for p in query.recentProgress if p["numInputRows"]]) >= 2  # the trigger limit held
    _check(spark.sql(f"select * from {name}").collect(), real)
