"""What the ``keyrange`` source asks the cluster on the Spark driver: the checks of its
options, the partitions and offsets a read covers, and the commits after micro-batches.

Each call is one short ``trio.run`` with its own connection: Spark calls the source's
driver side from a plain thread, between which no trio state can live.
"""

from __future__ import annotations

from collections.abc import Mapping

import trio

from proxy.protocol.constants import ErrorCode
from proxy.spark.cluster import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    RANGE_FETCH_FEATURE,
    RETRIABLE,
    ProxyNodes,
    Retry,
)
from proxy.spark.offsets import TopicPartitionKey, Unit, partition_minimums
from proxy.spark.options import KeyRangeSourceError, SourceOptions
from proxy.spark.reader import ShareRead

_TIMESTAMPS = {"earliest": EARLIEST_TIMESTAMP, "latest": LATEST_TIMESTAMP}


async def _describe(options: SourceOptions) -> ProxyNodes:
    """Connect and check what the options name: the topics exist, and the bootstrap is a
    keyrange-proxy when shares are asked for. The caller closes the returned cluster."""
    cluster = await ProxyNodes.connect(options.bootstrap_servers, timeout=min(options.request_timeout_ms / 1000, 30.0))
    try:
        if options.splits > 1 and RANGE_FETCH_FEATURE not in cluster.features:
            raise KeyRangeSourceError(
                f"splits.per.partition={options.splits} needs a keyrange-proxy, but "
                f"{options.bootstrap_servers} does not advertise {RANGE_FETCH_FEATURE} (is it a broker "
                "rather than the proxy?)")

        async def refresh() -> None:
            errors = await cluster.refresh(options.topics)
            for topic in options.topics:
                code = errors.get(topic)
                if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    raise KeyRangeSourceError(
                        f"subscribe: topic {topic!r} does not exist at {options.bootstrap_servers}")
                if code in RETRIABLE:
                    raise Retry(f"metadata of {topic!r}: {ErrorCode.name_of(code)}")
                if code:
                    raise KeyRangeSourceError(f"subscribe: topic {topic!r}: {ErrorCode.name_of(code)} ({code})")

        await cluster.retrying(refresh, options.topics)
    except BaseException:
        await cluster.aclose()
        raise
    return cluster


def _partitions(cluster: ProxyNodes, options: SourceOptions) -> list[TopicPartitionKey]:
    return [(topic, p) for topic in options.topics for p in cluster.partitions.get(topic, [])]


def check(options: SourceOptions) -> None:
    """Raise ``KeyRangeSourceError`` unless the options can be read from."""

    async def run() -> None:
        cluster = await _describe(options)
        await cluster.aclose()

    trio.run(run)


def plan_batch(options: SourceOptions) -> list[ShareRead]:
    """One ``ShareRead`` per (topic, partition, share), each from ``startingOffsets`` to
    ``endingOffsets`` as the partition's offsets are now."""

    async def run() -> list[ShareRead]:
        async with await _describe(options) as cluster:
            tps = _partitions(cluster, options)
            starts = await cluster.list_offsets(tps, _TIMESTAMPS[options.starting_offsets], options.isolation_level)
            ends = await cluster.list_offsets(tps, _TIMESTAMPS[options.ending_offsets], options.isolation_level)
        return [ShareRead(topic, partition, share, options.splits, starts[(topic, partition)],
                          max(starts[(topic, partition)], ends[(topic, partition)]))
                for topic, partition in tps for share in range(options.splits)]

    return trio.run(run)


def partition_offsets(options: SourceOptions, spec: str) -> dict[TopicPartitionKey, int]:
    """Every subscribed partition's ``earliest`` or ``latest`` offset (the last stable
    offset under read_committed)."""

    async def run() -> dict[TopicPartitionKey, int]:
        async with await _describe(options) as cluster:
            return await cluster.list_offsets(_partitions(cluster, options), _TIMESTAMPS[spec],
                                              options.isolation_level)

    return trio.run(run)


def latest_and_earliest(options: SourceOptions, known: set[TopicPartitionKey]
                        ) -> tuple[dict[TopicPartitionKey, int], dict[TopicPartitionKey, int]]:
    """The latest offsets of all subscribed partitions, and the earliest of those not in
    ``known`` (partitions added since the query started)."""

    async def run():
        async with await _describe(options) as cluster:
            tps = _partitions(cluster, options)
            latest = await cluster.list_offsets(tps, LATEST_TIMESTAMP, options.isolation_level)
            new = [tp for tp in tps if tp not in known]
            earliest = await cluster.list_offsets(new, EARLIEST_TIMESTAMP, options.isolation_level) if new else {}
        return latest, earliest

    return trio.run(run)


def commit(options: SourceOptions, end: Mapping[Unit, int]) -> dict[TopicPartitionKey, int]:
    """Commit a finished micro-batch for ``commit.group.id``: per partition, everything below
    the lowest of its shares' end offsets is processed (the shares above it have read some
    records past it, but which ones only their own tasks knew). Returns the stable offsets."""
    minimums = partition_minimums(end)

    async def run():
        async with await ProxyNodes.connect(options.bootstrap_servers,
                                         timeout=options.request_timeout_ms / 1000) as cluster:
            return await cluster.commit(options.commit_group_id, minimums)

    return trio.run(run)
