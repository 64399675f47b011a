"""Fetch requests and responses, sans I/O.

``fetch_request`` builds one sessionless Fetch for the partitions one leader serves, key
ranges on each ranged partition (docs/wire-contract.md#32-fetch; only over a connection that
advertises ``keyrange.fetch``). ``apply_fetch_response`` takes the answer into the
``AssignmentState``: records are checked against the partition's ranges whether or not
the proxy filtered them, dropped when the group already committed them, buffered for the
fair rotation, and the partition's end offsets are cached for ``current_lag``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.client.assignment import AssignmentState, EndOffsets, PendingReset, reset_timestamp
from proxy.client.errors import METADATA_REFRESH_CODES, KafkaError, OffsetOutOfRangeError
from proxy.client.records import TopicPartition, parse_partition
from proxy.protocol import messages
from proxy.protocol.constants import FETCH_SESSION_FINAL_EPOCH, FETCH_SESSIONLESS_ID, ErrorCode
from proxy.protocol.messages import ApiKey
from proxy.ranges import KeyRange, normalize

log = logging.getLogger(__name__)

TOPIC_IDS_VERSION = 13  # Fetch names topics by id from this version on


@dataclass(frozen=True)
class FetchPosition:
    """One partition of a Fetch request."""

    tp: TopicPartition
    leader_epoch: int
    offset: int
    ranges: Sequence[KeyRange]


@dataclass(frozen=True)
class FetchLimits:
    max_wait_ms: int
    max_bytes: int
    partition_max_bytes: int
    isolation_level: int


def rotated(items: Sequence[Any], shift: int) -> list[Any]:
    """``items`` starting at ``shift`` (modulo its length): the order a Fetch lists its
    partitions in turns with every request, so no partition is always last in the
    response (where the byte limits cut)."""
    if not items:
        return []
    shift %= len(items)
    return list(items[shift:]) + list(items[:shift])


def fetch_request(version: int, positions: Sequence[FetchPosition], topic_ids: Mapping[str, Any],
                  limits: FetchLimits) -> Any:
    """A sessionless Fetch (KIP-227: id 0, final epoch) of ``positions`` in their order."""
    cls: Any = messages.body_class(ApiKey.FETCH, "request")
    topics: dict[str, list[Any]] = {}
    for p in positions:
        topics.setdefault(p.tp.topic, []).append(cls.FetchPartition(
            partition=p.tp.partition, current_leader_epoch=p.leader_epoch, fetch_offset=p.offset,
            partition_max_bytes=limits.partition_max_bytes,
            key_ranges=[cls.KeyRange(start=r.start, end=r.end) for r in p.ranges] if p.ranges else None))
    return messages.new_body(
        ApiKey.FETCH, version, "request", replica_id=-1, max_wait_ms=limits.max_wait_ms, min_bytes=1,
        max_bytes=limits.max_bytes, isolation_level=limits.isolation_level,
        session_id=FETCH_SESSIONLESS_ID, session_epoch=FETCH_SESSION_FINAL_EPOCH, rack_id="",
        topics=[cls.FetchTopic(topic=name, topic_id=topic_ids[name], partitions=parts)
                for name, parts in topics.items()])


def apply_fetch_response(state: AssignmentState, response: Any, *, version: int, node_id: int,
                         offsets: Mapping[TopicPartition, int], topic_names: Mapping[Any, str],
                         received_time: float, received: set[TopicPartition], auto_offset_reset: str,
                         metrics: Counter[str]) -> bool:
    """Take a Fetch response for the partitions at ``offsets`` into ``state``. True when
    metadata must be refreshed before the next fetch (a leader moved)."""
    if response.error_code != ErrorCode.NONE:
        if response.error_code in METADATA_REFRESH_CODES:
            return True
        raise KafkaError.for_code(response.error_code, f"Fetch from node {node_id}")
    refresh = False
    for topic in response.responses:
        name = topic.topic if version < TOPIC_IDS_VERSION else topic_names.get(topic.topic_id)
        if name is None:
            continue  # a topic id this consumer no longer knows: not one it asked for
        for part in topic.partitions:
            tp = TopicPartition(name, part.partition_index)
            if tp not in offsets or state.positions.get(tp) != offsets[tp] or state.buffers.has_buffered(tp):
                continue  # reassigned or moved by seek meanwhile: the data is stale
            refresh = apply_partition(state, tp, part, offsets[tp], received_time=received_time,
                                      received=received, auto_offset_reset=auto_offset_reset,
                                      metrics=metrics) or refresh
    return refresh


def apply_partition(state: AssignmentState, tp: TopicPartition, part: Any, fetch_offset: int, *,
                    received_time: float, received: set[TopicPartition], auto_offset_reset: str,
                    metrics: Counter[str]) -> bool:
    """Take one partition of a Fetch response into ``state``. True when metadata must be
    refreshed; raises the partition's error when it cannot be retried."""
    code = part.error_code
    if code in METADATA_REFRESH_CODES:
        metrics["retriable_errors"] += 1
        return True
    if code == ErrorCode.OFFSET_OUT_OF_RANGE:
        if auto_offset_reset == "none":
            raise OffsetOutOfRangeError(f"{tp.topic}-{tp.partition} offset {fetch_offset} is out of range "
                                        f"and auto_offset_reset is 'none'")
        log.info("consumer: %s-%s offset %s out of range; resetting to %s", tp.topic, tp.partition,
                 fetch_offset, auto_offset_reset)
        state.positions[tp] = PendingReset(reset_timestamp(auto_offset_reset, tp))
        return False
    if code != ErrorCode.NONE:
        raise KafkaError.for_code(code, f"Fetch {tp.topic}-{tp.partition} at offset {fetch_offset}")
    ranges = state.ranges[tp]
    if ranges:
        applied = part.key_ranges_applied
        if applied is None or normalize(KeyRange(r.start, r.end) for r in applied) != normalize(ranges):
            # not filtered (or filtered differently): the local check below decides
            metrics["unfiltered_range_responses"] += 1
    progress = state.progress.get(tp)
    parsed = parse_partition(
        tp, part.records, fetch_offset,
        aborted_transactions=[(a.producer_id, a.first_offset) for a in part.aborted_transactions or ()],
        read_committed=state.read_committed, ranges=ranges or None, amend_gaps=progress is not None)
    metrics["records_outside_ranges"] += parsed.outside_ranges
    metrics["aborted_records_dropped"] += parsed.aborted
    if progress is not None:
        for start, end in parsed.gaps:
            progress.mark(start, end)
        if progress.covers_from(fetch_offset):  # else no record can be committed already
            fresh = [r for r in parsed.records if not progress.already_committed(r.offset)]
            metrics["records_already_committed"] += len(parsed.records) - len(fresh)
            parsed.records = fresh
    state.ends[tp] = EndOffsets(received_time, part.high_watermark, part.last_stable_offset, part.log_start_offset)
    received.add(tp)
    if parsed.records:
        state.buffers.add(tp, parsed.records, parsed.next_offset)
    else:
        state.positions[tp] = parsed.next_offset
    return False
