"""A task's read: one share of one partition, from a start offset to an end offset.

Spark calls ``read()`` in a Python worker and pulls the batches from a plain iterator,
while the fetching is trio code. So the fetch loop runs in ``trio.run`` on a thread of its
own and hands column chunks over a small bounded queue: the next Fetch is in flight while
Spark converts and processes the previous chunk, and at most ``QUEUE_CHUNKS`` answers are
held in memory. Closing the iterator early (a ``limit``, a failed task) stops the thread.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import trio

from proxy.protocol.constants import ErrorCode
from proxy.ranges import FULL_RANGE, KeyRange, equal_share
from proxy.spark.cluster import (
    EARLIEST_TIMESTAMP,
    RANGE_FETCH_FEATURE,
    RETRIABLE,
    ProxyNodes,
    Retry,
    SourceReadError,
)
from proxy.spark.decode import Columns, decode_partition
from proxy.spark.offsets import EARLIEST
from proxy.spark.options import SourceOptions

QUEUE_CHUNKS = 4
FIRST_FETCH_MAX_BYTES = 64 << 10  # the task's work starts after a small first answer ...
FETCH_MAX_BYTES = 1 << 20  # ... and the answers grow to this, doubling each time
FETCH_MAX_BYTES_CAP = 64 << 20  # a single batch larger than this cannot be read
FETCH_WAIT_MS = 500


@dataclass(frozen=True)
class ShareRead:
    """One Spark input partition: records of share ``share`` of ``splits`` of a partition at
    offsets in ``[start, end)``. ``start`` may be ``offsets.EARLIEST`` (the log start)."""

    topic: str
    partition: int
    share: int
    splits: int
    start: int
    end: int

    @property
    def key_range(self) -> KeyRange:
        return FULL_RANGE if self.splits == 1 else equal_share(self.share, self.splits)


_DONE = object()


class _Stopped(Exception):
    """The consumer of the chunks went away."""


def iter_share(options: SourceOptions, task: ShareRead) -> Iterator[Columns]:
    """The share's rows in offset order, as column chunks (none when the range is empty)."""
    if task.start != EARLIEST and task.start >= task.end:
        return
    chunks: queue.Queue = queue.Queue(maxsize=QUEUE_CHUNKS)
    stop = threading.Event()

    def put(item) -> None:
        while not stop.is_set():
            try:
                chunks.put(item, timeout=0.1)
                return
            except queue.Full:
                continue
        raise _Stopped

    def run() -> None:
        try:
            trio.run(fetch_share, options, task, put)
            put(_DONE)
        except _Stopped:
            pass
        except BaseException as exc:  # handed to the consuming thread, raised there
            try:
                put(exc)
            except _Stopped:
                pass

    thread = threading.Thread(target=run, name=f"keyrange-{task.topic}-{task.partition}-{task.share}", daemon=True)
    thread.start()
    try:
        while True:
            item = chunks.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=60)


async def fetch_share(options: SourceOptions, task: ShareRead, emit) -> None:
    """Fetch the share through the proxy until ``end``; ``emit(columns)`` each non-empty chunk."""
    tp = (task.topic, task.partition)
    share = task.key_range
    async with await ProxyNodes.connect(options.bootstrap_servers, timeout=options.request_timeout_ms / 1000,
                                     client_id=f"keyrange-spark-{task.topic}-{task.partition}-{task.share}") as cluster:
        if task.splits > 1 and RANGE_FETCH_FEATURE not in cluster.features:
            raise SourceReadError(f"{options.bootstrap_servers} does not advertise {RANGE_FETCH_FEATURE}: "
                                  "splits.per.partition > 1 needs a keyrange-proxy")
        await cluster.retrying(lambda: _refresh(cluster, task.topic), [task.topic])
        position = task.start
        if position == EARLIEST:
            position = (await cluster.list_offsets([tp], EARLIEST_TIMESTAMP, options.isolation_level))[tp]
        max_bytes = FIRST_FETCH_MAX_BYTES
        stalled_since = trio.current_time()
        while position < task.end:
            part = await cluster.retrying(
                functools.partial(cluster.fetch, tp, position, None if task.splits == 1 else share,
                                  isolation_level=options.isolation_level, max_bytes=max_bytes,
                                  wait_ms=FETCH_WAIT_MS),
                [task.topic])
            if part.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
                raise SourceReadError(
                    f"{task.topic}-{task.partition} no longer holds offset {position} (log start "
                    f"{part.log_start_offset}): records of [{task.start}, {task.end}) were deleted before "
                    "this task read them", part.error_code)
            if part.error_code:
                raise SourceReadError(f"Fetch {task.topic}-{task.partition} at {position}", part.error_code)
            decoded = decode_partition(
                part.records, fetch_offset=position, end_offset=task.end, share=share,
                read_committed=options.read_committed,
                aborted_transactions=[(a.producer_id, a.first_offset) for a in part.aborted_transactions or ()],
                include_headers=options.include_headers)
            if decoded.columns:
                emit(decoded.columns)
            if decoded.next_offset > position:
                position = decoded.next_offset
                stalled_since = trio.current_time()
                max_bytes = max(max_bytes, min(2 * max_bytes, FETCH_MAX_BYTES))
                continue
            if decoded.truncated:
                if max_bytes >= FETCH_MAX_BYTES_CAP:
                    raise SourceReadError(f"{task.topic}-{task.partition} holds a batch at offset {position} "
                                          f"larger than {FETCH_MAX_BYTES_CAP} bytes")
                max_bytes *= 2
            elif trio.current_time() - stalled_since > options.request_timeout_ms / 1000:
                end = part.last_stable_offset if options.read_committed else part.high_watermark
                raise SourceReadError(f"{task.topic}-{task.partition} stays at offset {position} (its end is "
                                      f"now {end}) although this task reads to {task.end}")


async def _refresh(cluster: ProxyNodes, topic: str) -> None:
    errors = await cluster.refresh([topic])
    if topic in errors:
        if errors[topic] in RETRIABLE:
            raise Retry(f"metadata of topic {topic!r}: {ErrorCode.name_of(errors[topic])}")
        raise SourceReadError(f"metadata of topic {topic!r}", errors[topic])
