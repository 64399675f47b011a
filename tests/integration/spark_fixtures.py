"""One local SparkSession for every Spark test module (`local[2]`, no UI, small shuffles).

Imported by the ``test_spark_*`` modules (``from tests.integration.spark_fixtures import
spark``): a session takes tens of seconds to start on a shared 2-core machine, so the
modules share it, and it stops at the end of the run.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install -e '.[spark]')")


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from proxy.spark.session import local_session

    session = local_session("keyrange-tests", master="local[2]", shuffle_partitions=2,
                            conf={"spark.driver.memory": "1g", "spark.default.parallelism": "2"})
    # Errors only. The JVM's stderr is pytest's capture file (it was started inside a test),
    # and what lands there after the last test's teardown (Kafka clients in the JVM whose
    # brokers and proxies are gone, the JVM's own shutdown) pytest prints after its summary.
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
