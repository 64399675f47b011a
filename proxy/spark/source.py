"""The ``keyrange`` PySpark data source (docs/wire-contract.md#10-the-spark-source), batch and micro-batch.

Each subscribed partition is read as ``splits.per.partition`` = K equal hash shares, one
Spark input partition (one task) each, through the proxy's key-range Fetch. A task sees
every record of its share between its offsets, in offset order, so each key's records
keep their order inside one task; the tasks of one read together hold every record
exactly once. Spark's Kafka source can only split a partition by offsets
(``minPartitions``), which hands one key's records to several tasks.

Planning, option checks and commits run on the driver (``proxy.spark.driver``); the tasks
fetch (``proxy.spark.reader``). The reader objects Spark pickles to its workers hold only
the parsed options and plain offsets, never a connection.
"""

from __future__ import annotations

from collections.abc import Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from proxy.spark import driver, offsets
from proxy.spark.arrow import schema_ddl, to_record_batch
from proxy.spark.options import SourceOptions, parse_options
from proxy.spark.reader import ShareRead, iter_share

NAME = "keyrange"


class ShareInputPartition(InputPartition):
    """One task's read; ``value`` is a ``ShareRead``."""

    def __init__(self, value: ShareRead) -> None:
        super().__init__(value)


class KeyRangeDataSource(DataSource):
    """``spark.read.format("keyrange")`` and ``spark.readStream.format("keyrange")``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        headers = str(self.options.get("includeHeaders", "false")).strip().lower() == "true"
        return schema_ddl(headers)

    def reader(self, schema) -> DataSourceReader:
        return KeyRangeBatchReader(parse_options(self.options, streaming=False))

    def streamReader(self, schema) -> DataSourceStreamReader:
        return KeyRangeStreamReader(parse_options(self.options, streaming=True))


def _read(options: SourceOptions, task: ShareRead) -> Iterator:
    key_range = task.key_range
    for columns in iter_share(options, task):
        yield to_record_batch(columns, topic=task.topic, partition=task.partition, range_start=key_range.start,
                              range_end=key_range.end, include_headers=options.include_headers)


class KeyRangeBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        # planned here, on the driver: a bad option or an unreachable proxy fails the query
        # before any task starts, and every task reads the offsets of one moment
        self.plan = driver.plan_batch(options)

    def partitions(self) -> list[InputPartition]:
        return [ShareInputPartition(task) for task in self.plan]

    def read(self, partition: InputPartition) -> Iterator:
        return _read(self.options, partition.value)


class KeyRangeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets per (topic, partition, share) (see ``proxy.spark.offsets``)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._target: dict[offsets.TopicPartitionKey, int] | None = None
        self._initial: dict | None = None
        self._committed: dict[offsets.TopicPartitionKey, int] = {}
        driver.check(options)

    def initialOffset(self) -> dict:
        start = driver.partition_offsets(self.options, self.options.starting_offsets)
        self._initial = offsets.to_json(offsets.spread(start, self.options.splits))
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        # availableNow: read what exists now (in as many micro-batches as the read limit
        # makes), then stop; records produced later wait for the next run
        self._target = driver.partition_offsets(self.options, "latest")

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = offsets.from_json(start, self.options.splits)
        if start != self._initial:
            # Spark asks for the next batch's end only once the previous batch is written
            # out, but tells the source (commit) only when it plans the batch after that:
            # the last batch of a run would never be committed
            self._commit(begin)
        latest, earliest = driver.latest_and_earliest(self.options, {unit[:2] for unit in begin})
        if self._target is not None:
            latest = {tp: min(offset, self._target[tp]) for tp, offset in latest.items() if tp in self._target}
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return offsets.to_json(offsets.advance(begin, latest, self.options.splits, max_rows, earliest))

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        begin = offsets.from_json(start, self.options.splits)
        out: list[InputPartition] = []
        for unit, stop in sorted(offsets.from_json(end, self.options.splits).items()):
            first = begin.get(unit, offsets.EARLIEST)
            if first == offsets.EARLIEST or first < stop:
                out.append(ShareInputPartition(ShareRead(unit[0], unit[1], unit[2], self.options.splits, first, stop)))
        return out

    def read(self, partition: InputPartition) -> Iterator:
        return _read(self.options, partition.value)

    def commit(self, end: dict) -> None:
        self._commit(offsets.from_json(end, self.options.splits))

    def _commit(self, end: dict[offsets.Unit, int]) -> None:
        if self.options.commit_group_id is None:
            return
        minimums = offsets.partition_minimums(end)
        if all(self._committed.get(tp, -1) >= offset for tp, offset in minimums.items()):
            return
        driver.commit(self.options, end)
        for tp, offset in minimums.items():
            self._committed[tp] = max(offset, self._committed.get(tp, -1))


def register(spark) -> None:
    """Make ``format("keyrange")`` available in ``spark`` (a SparkSession)."""
    spark.dataSource.register(KeyRangeDataSource)
