"""The Spark data pipeline: the ``keyrange`` PySpark data source, and helpers to run Spark
(with its Kafka connector) against the proxy. Needs the ``spark`` extra.

    from proxy.spark import register
    register(spark)
    df = (spark.read.format("keyrange")
          .option("kafka.bootstrap.servers", "127.0.0.1:9192")
          .option("subscribe", "orders").option("splits.per.partition", 4).load())

``docs/spark.md`` describes the options, the schema and the guarantees.
"""

from __future__ import annotations

from proxy.spark.options import KeyRangeSourceError, SourceOptions, parse_options

NAME = "keyrange"

__all__ = ["NAME", "KeyRangeSourceError", "SourceOptions", "parse_options", "register"]


def register(spark) -> None:
    """Register the ``keyrange`` format with ``spark`` (a SparkSession); one call per session."""
    from proxy.spark.source import register as _register

    _register(spark)
