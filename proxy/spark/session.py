"""A local SparkSession with Spark's Kafka connector, for the pipeline, tests and benchmarks.

Spark's ``spark.jars.packages`` resolves the connector from Maven at every session start;
here the four jars come from the cache ``fetch-jars`` fills once (``kafka-dist/
spark-connector.pom.xml``), so sessions start offline. Python workers run this
interpreter, so they import this project and its dependencies; everything listens on
loopback only.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from proxy.local_kafka import fetch_spark_jars


def connector_jars() -> list[Path]:
    """The connector, its token provider, the kafka-clients it names and commons-pool2."""
    return sorted(fetch_spark_jars().glob("*.jar"))


def local_session(
    app_name: str = "keyrange",
    *,
    master: str = "local[*]",
    kafka_connector: bool = True,
    shuffle_partitions: int = 4,
    conf: Mapping[str, str] | None = None,
):
    """A new (or the running) SparkSession on the embedded local master, with the
    ``keyrange`` source registered."""
    from pyspark.sql import SparkSession

    from proxy.spark import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(master).appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
    )
    if kafka_connector:
        builder = builder.config("spark.jars", ",".join(str(jar) for jar in connector_jars()))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark
