"""The ``keyrange`` source's schema: Spark's Kafka source columns plus the share's range.

``keyRangeStart`` / ``keyRangeEnd`` say which hash share a row was read in (docs/wire-contract.md
section 10), so a job can check or group by it. Rows leave a task as Arrow record batches
built column by column from ``decode.Columns``: no Python tuple per row, and Spark takes
them without a conversion of its own.
"""

from __future__ import annotations

import pyarrow as pa

from proxy.spark.decode import Columns

_HEADER = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])

SCHEMA_DDL = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
              "timestampType int")
HEADERS_DDL = "headers array<struct<key: string, value: binary>>"
RANGE_DDL = "keyRangeStart long, keyRangeEnd long"


def schema_ddl(include_headers: bool) -> str:
    """The source's schema as Spark DDL (the column order of Spark's Kafka source)."""
    parts = [SCHEMA_DDL, HEADERS_DDL] if include_headers else [SCHEMA_DDL]
    return ", ".join([*parts, RANGE_DDL])


def arrow_schema(include_headers: bool) -> pa.Schema:
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", pa.list_(_HEADER)))
    fields += [pa.field("keyRangeStart", pa.int64()), pa.field("keyRangeEnd", pa.int64())]
    return pa.schema(fields)


def to_record_batch(columns: Columns, *, topic: str, partition: int, range_start: int, range_end: int,
                    include_headers: bool) -> pa.RecordBatch:
    n = len(columns)
    arrays = [
        pa.array(columns.keys, pa.binary()),
        pa.array(columns.values, pa.binary()),
        pa.array([topic] * n, pa.string()),
        pa.array([partition] * n, pa.int32()),
        pa.array(columns.offsets, pa.int64()),
        pa.array([ms * 1000 for ms in columns.timestamps], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        pa.array(columns.timestamp_types, pa.int32()),
    ]
    if include_headers and columns.headers is not None:
        arrays.append(pa.array([[{"key": k, "value": v} for k, v in row] for row in columns.headers],
                               pa.list_(_HEADER)))
    arrays += [pa.array([range_start] * n, pa.int64()), pa.array([range_end] * n, pa.int64())]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(include_headers))
