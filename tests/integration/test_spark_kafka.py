"""Spark's own Kafka source and sink (the connector jars from the cache) through the proxy:
what Spark writes through the proxy is what the broker holds, and what it reads through the
proxy, batch or stream, is byte for byte what it reads from the broker directly."""

from __future__ import annotations

import uuid

from tests.conftest import create_topic
from tests.integration.spark_fixtures import spark  # noqa: F401 - the shared session fixture

COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType")


def _read(spark, bootstrap: str, topic: str):  # noqa: F811
    return (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
            .load().select(*COLUMNS).orderBy("partition", "offset").collect())


def test_write_and_batch_read_through_the_proxy_equal_direct(spark, kafka, proxy):  # noqa: F811
    topic = f"spark-kafka-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, 2)
    rows = [(None if i % 7 == 0 else f"k{i % 13}".encode(), f"value-{i}".encode(), i % 2) for i in range(400)]
    df = spark.createDataFrame(rows, "key binary, value binary, partition int")
    (df.write.format("kafka").option("kafka.bootstrap.servers", proxy.bootstrap_servers).option("topic", topic)
     .save())

    direct = _read(spark, kafka.bootstrap_servers, topic)
    via_proxy = _read(spark, proxy.bootstrap_servers, topic)
    assert len(direct) == 400
    assert via_proxy == direct
    assert sorted(((r["key"], r["value"], r["partition"]) for r in direct), key=repr) == sorted(rows, key=repr)


def test_stream_read_through_the_proxy_equals_direct(spark, kafka, proxy, tmp_path):  # noqa: F811
    from kafka import KafkaProducer

    topic = f"spark-kafka-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, 2)
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all", compression_type="lz4",
                             linger_ms=5)
    for i in range(300):
        producer.send(topic, key=f"k{i % 11}".encode(), value=f"v{i}".encode(), partition=i % 2)
    producer.flush(30)
    producer.close()

    def stream(bootstrap: str, name: str):
        query = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                 .option("subscribe", topic).option("startingOffsets", "earliest")
                 .option("maxOffsetsPerTrigger", "120").load().select(*COLUMNS)
                 .writeStream.format("memory").queryName(name)
                 .option("checkpointLocation", str(tmp_path / name)).trigger(availableNow=True).start())
        assert query.awaitTermination(180)
        assert query.exception() is None
        batches = [p for p in query.recentProgress if p["numInputRows"]]
        assert len(batches) >= 3  # maxOffsetsPerTrigger was honoured through the proxy too
        return spark.sql(f"select * from {name} order by partition, offset").collect()

    direct = stream(kafka.bootstrap_servers, f"direct_{uuid.uuid4().hex[:6]}")
    via_proxy = stream(proxy.bootstrap_servers, f"proxied_{uuid.uuid4().hex[:6]}")
    assert len(direct) == 300
    assert via_proxy == direct
