"""Fetch requests and responses, sans I/O.

``fetch_request`` builds one sessionless Fetch for the partitions one leader serves, key
ranges on each ranged partition (docs/wire-contract.md#32-fetch; only over a connection that
advertises ``keyrange.fetch``). ``apply_fetch_response`` takes the answer into the
``AssignmentState``: records are checked against the partition's ranges whether or not
the proxy filtered them, dropped when the group already committed them, buffered for the
fair rotation, and the partition's end offsets are cached for ``current_lag``.

A filtered answer moves the position past batches the filter emptied, which is only sound
when the filter kept every record of this consumer's ranges: an answer whose
``KeyRangesApplied`` does not cover them is discarded (see ``apply_partition``).

A cooperative partition (docs/wire-contract.md#37-cooperative-fetch) carries the member's
identity (``CooperativeMember``) and its token as the fetch offset; its answer is a chunk
of offsets handed to this member, taken in by ``apply_cooperative``. One request never
carries both key ranges and cooperative partitions (``fetch_request`` refuses it): the
proxy serves each kind with a feature of its own.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from proxy.client.assignment import AssignmentState, EndOffsets, PendingReset, narrows, reset_timestamp
from proxy.client.errors import (
    METADATA_REFRESH_CODES,
    CorruptRecordError,
    IllegalGenerationError,
    KafkaError,
    OffsetOutOfRangeError,
)
from proxy.client.records import ConsumerRecord, TopicPartition, parse_partition
from proxy.protocol.constants import FETCH_SESSION_FINAL_EPOCH, FETCH_SESSIONLESS_ID, ErrorCode
from proxy.protocol.message_types import FetchRequest, FetchResponse
from proxy.protocol.message_versions import FETCH_FIRST_TOPIC_ID
from proxy.ranges import KeyRange, normalize

log = logging.getLogger(__name__)

T = TypeVar("T")


class Span(Protocol):
    """A key range as any message or ``proxy.ranges`` holds it."""

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...


@dataclass(frozen=True)
class CooperativeMember:
    """Who fetches a partition cooperatively: the group whose members share it, the member,
    and its generation (-1 outside a group protocol: assign mode)."""

    group_id: str
    member_id: str
    generation_id: int = -1


@dataclass(frozen=True)
class FetchPosition:
    """One partition of a Fetch request. A cooperative one (``cooperative`` set) carries no
    ranges, and its ``offset`` is the member's token."""

    tp: TopicPartition
    leader_epoch: int
    offset: int
    ranges: Sequence[KeyRange]
    cooperative: CooperativeMember | None = None


@dataclass(frozen=True)
class FetchLimits:
    max_wait_ms: int
    max_bytes: int
    partition_max_bytes: int
    isolation_level: int


def rotated(items: Sequence[T], shift: int) -> list[T]:
    """``items`` starting at ``shift`` (modulo its length): the order a Fetch lists its
    partitions in turns with every request, so no partition is always last in the
    response (where the byte limits cut)."""
    if not items:
        return []
    shift %= len(items)
    return list(items[shift:]) + list(items[:shift])


def fetch_request(version: int, positions: Sequence[FetchPosition], topic_ids: Mapping[str, uuid.UUID],
                  limits: FetchLimits) -> FetchRequest:
    """A sessionless Fetch (KIP-227: id 0, final epoch) of ``positions`` in their order.
    Sessionless is also what a cooperative partition needs (section 3.7). ``ValueError``
    for a partition both ranged and cooperative, or a request mixing ranged and cooperative
    partitions (plain whole partitions go with either)."""
    cls = FetchRequest
    ranged = [p.tp for p in positions if p.ranges]
    shared = [p.tp for p in positions if p.cooperative is not None]
    if ranged and shared:
        both = set(ranged) & set(shared)
        raise ValueError(
            f"{_names(both)} cannot be fetched both by key range and cooperatively" if both else
            f"one Fetch cannot carry key ranges ({_names(ranged)}) and cooperative partitions ({_names(shared)}): "
            f"send them in separate requests")
    topics: dict[str, list[FetchRequest.FetchPartition]] = {}
    for p in positions:
        member = p.cooperative
        topics.setdefault(p.tp.topic, []).append(cls.FetchPartition(
            partition=p.tp.partition, current_leader_epoch=p.leader_epoch, fetch_offset=p.offset,
            partition_max_bytes=limits.partition_max_bytes,
            key_ranges=[cls.KeyRange(start=r.start, end=r.end) for r in p.ranges] if p.ranges else None,
            cooperative=None if member is None else cls.CooperativeMember(
                group_id=member.group_id, member_id=member.member_id, generation_id=member.generation_id)))
    return cls(
        replica_id=-1, max_wait_ms=limits.max_wait_ms, min_bytes=1,
        max_bytes=limits.max_bytes, isolation_level=limits.isolation_level,
        session_id=FETCH_SESSIONLESS_ID, session_epoch=FETCH_SESSION_FINAL_EPOCH, rack_id="",
        topics=[cls.FetchTopic(topic=name, topic_id=topic_ids[name], partitions=parts)
                for name, parts in topics.items()])


def apply_fetch_response(state: AssignmentState, response: FetchResponse, *, version: int, node_id: int,
                         offsets: Mapping[TopicPartition, int], topic_names: Mapping[uuid.UUID, str],
                         received_time: float, received: set[TopicPartition], auto_offset_reset: str,
                         metrics: Counter[str], cooperative: Mapping[TopicPartition, CooperativeMember] | None = None,
                         fenced: list[TopicPartition] | None = None) -> bool:
    """Take a Fetch response for the partitions at ``offsets`` into ``state``. True when
    metadata must be refreshed before the next fetch (a leader moved).

    ``cooperative``: the partitions the request fetched cooperatively, with the member it
    named; a partition whose mode changed since is stale like one sought meanwhile. A
    cooperative partition of a group member answered ILLEGAL_GENERATION is appended to
    ``fenced`` (the caller rejoins the group); in assign mode it raises.

    A partition filtered for key ranges that do not cover the consumer's is discarded
    (``apply_partition``) and, once every other partition of the answer is taken in,
    reported as ``CorruptRecordError``: raised from ``poll`` (a background fetch's at the
    next one) every time such an answer comes, so a proxy that breaks the filter contract
    stops the application visibly instead of making it refetch forever in silence. The
    position stays, so records are neither lost nor skipped; ``seek`` past it is the
    application's call."""
    if response.error_code != ErrorCode.NONE:
        if response.error_code in METADATA_REFRESH_CODES:
            return True
        raise KafkaError.for_code(response.error_code, f"Fetch from node {node_id}")
    refresh = False
    discarded: list[str] = []
    shared = cooperative or {}
    for topic in response.responses:
        name = topic.topic if version < FETCH_FIRST_TOPIC_ID else topic_names.get(topic.topic_id)
        if name is None:
            continue  # a topic id this consumer no longer knows: not one it asked for
        for part in topic.partitions:
            tp = TopicPartition(name, part.partition_index)
            if tp not in offsets or state.positions.get(tp) != offsets[tp] or state.buffers.has_buffered(tp) \
                    or (tp in shared) != (tp in state.cooperative):
                # reassigned, moved by seek or switched to or from cooperative meanwhile: the
                # data is stale (a chunk dropped here comes back when its lease expires)
                continue
            if tp in shared:
                refresh = apply_cooperative(state, tp, part, offsets[tp], shared[tp], received_time=received_time,
                                            received=received, metrics=metrics, fenced=fenced,
                                            auto_offset_reset=auto_offset_reset) or refresh
                continue
            refresh = apply_partition(state, tp, part, offsets[tp], received_time=received_time,
                                      received=received, auto_offset_reset=auto_offset_reset,
                                      metrics=metrics, discarded=discarded) or refresh
    if discarded:
        raise CorruptRecordError(f"Fetch from node {node_id}: {'; '.join(discarded)}")
    return refresh


def covers_held_ranges(applied: Sequence[Span] | None, held: Sequence[KeyRange]) -> bool:
    """Whether a partition answered with ``KeyRangesApplied`` = ``applied`` (None: the proxy
    did not filter it) still holds every record of the ranges ``held`` ([] = the whole
    partition; an empty ``applied`` is the whole partition too, docs/wire-contract.md
    section 2)."""
    if applied is None:
        return True
    return narrows([KeyRange(r.start, r.end) for r in applied], held)


def apply_partition(state: AssignmentState, tp: TopicPartition, part: FetchResponse.PartitionData, fetch_offset: int, *,
                    received_time: float, received: set[TopicPartition], auto_offset_reset: str,
                    metrics: Counter[str], discarded: list[str] | None = None) -> bool:
    """Take one partition of a Fetch response into ``state``. True when metadata must be
    refreshed; raises the partition's error when it cannot be retried.

    A filtered partition (``KeyRangesApplied`` present) moves the position past every batch,
    emptied ones included, so its records count as all there are of the consumer's ranges
    only when the applied ranges cover the ranges it holds. When they do not (a proxy that
    filtered for another member's or narrower ranges), records of its own ranges may have
    been removed and nothing in the answer tells which: it is discarded whole (no record,
    gap, end offset or position taken), counted in ``range_responses_discarded`` and
    described in ``discarded`` for the caller to raise. Keeping the position rather than
    handing out the records it did get keeps every key's order and loses nothing. Without
    ``KeyRangesApplied`` nothing was removed (magic 0/1, a plain broker): the records are
    filtered here, as always."""
    code = part.error_code
    if code in METADATA_REFRESH_CODES:
        metrics["retriable_errors"] += 1
        return True
    if code == ErrorCode.OFFSET_OUT_OF_RANGE:
        _reset_out_of_range(state, tp, auto_offset_reset, f"offset {fetch_offset}")
        return False
    if code != ErrorCode.NONE:
        raise KafkaError.for_code(code, f"Fetch {tp.topic}-{tp.partition} at offset {fetch_offset}")
    ranges = state.ranges[tp]
    applied = part.key_ranges_applied
    if ranges and (applied is None or normalize(KeyRange(r.start, r.end) for r in applied) != normalize(ranges)):
        # not filtered (or filtered differently): the local check below decides
        metrics["unfiltered_range_responses"] += 1
    if applied is not None and not covers_held_ranges(applied, ranges):
        metrics["range_responses_discarded"] += 1
        reason = (f"{tp.topic}-{tp.partition} at offset {fetch_offset} was filtered for key ranges "
                  f"{_describe(applied)} (KeyRangesApplied), which do not cover this consumer's "
                  f"{_describe(ranges)}: records of them may be missing, so the answer was discarded "
                  f"and the position stays at {fetch_offset}")
        log.warning("consumer: %s", reason)
        if discarded is not None:
            discarded.append(reason)
        return False
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
        kept = state.take_reset_skips(tp, parsed.records, parsed.next_offset)
        metrics["records_skipped_by_reset"] += len(parsed.records) - len(kept)
        parsed.records = kept
    state.ends[tp] = EndOffsets(received_time, part.high_watermark, part.last_stable_offset, part.log_start_offset)
    received.add(tp)
    if parsed.records:
        state.buffers.add(tp, parsed.records, parsed.next_offset)
    else:
        state.positions[tp] = parsed.next_offset
    return False


def _reset_out_of_range(state: AssignmentState, tp: TopicPartition, auto_offset_reset: str, where: str) -> None:
    """OFFSET_OUT_OF_RANGE at ``where``: reset by ``auto_offset_reset`` on the next poll."""
    if auto_offset_reset == "none":
        raise OffsetOutOfRangeError(f"{tp.topic}-{tp.partition}: {where} is out of range and auto_offset_reset "
                                    f"is 'none'")
    log.info("consumer: %s-%s: %s out of range; resetting to %s", tp.topic, tp.partition, where, auto_offset_reset)
    state.positions[tp] = PendingReset(reset_timestamp(auto_offset_reset, tp))


def _cooperative_error(state: AssignmentState, tp: TopicPartition, code: int, member: CooperativeMember,
                       metrics: Counter[str], fenced: list[TopicPartition] | None, auto_offset_reset: str) -> bool:
    """``apply_cooperative`` of a partition answered with an error.

    OFFSET_OUT_OF_RANGE (the records at the proxy's marker were deleted, or the log
    truncated) follows ``auto_offset_reset`` as for any partition: the reset position is the
    next token, which the proxy takes as its new marker (section 3.7); no gap is amended for
    it (the proxy's next chunk claims the skipped offsets). ILLEGAL_GENERATION: this member's
    generation is older than one the proxy has seen; a group member's partition is appended
    to ``fenced`` (the caller rejoins), in assign mode (generation -1, never fenced by the
    proxy) it is raised."""
    if code in METADATA_REFRESH_CODES:
        metrics["retriable_errors"] += 1
        return True
    if code == ErrorCode.OFFSET_OUT_OF_RANGE:
        _reset_out_of_range(state, tp, auto_offset_reset, f"the proxy's marker for group {member.group_id!r}")
        return False
    if code == ErrorCode.ILLEGAL_GENERATION and member.generation_id >= 0 and fenced is not None:
        log.info("consumer: %s-%s fetched cooperatively with generation %d of group %r: ILLEGAL_GENERATION; "
                 "rejoining", tp.topic, tp.partition, member.generation_id, member.group_id)
        metrics["retriable_errors"] += 1
        fenced.append(tp)
        return False
    if code == ErrorCode.ILLEGAL_GENERATION:
        raise IllegalGenerationError(f"Fetch {tp.topic}-{tp.partition} cooperatively as member "
                                     f"{member.member_id!r} (generation {member.generation_id}) of group "
                                     f"{member.group_id!r}")
    raise KafkaError.for_code(code, f"Fetch {tp.topic}-{tp.partition} cooperatively as member "
                                    f"{member.member_id!r} of group {member.group_id!r}")


def apply_cooperative(state: AssignmentState, tp: TopicPartition, part: FetchResponse.PartitionData, token: int,
                      member: CooperativeMember,
                      *, received_time: float, received: set[TopicPartition], metrics: Counter[str],
                      fenced: list[TopicPartition] | None = None, auto_offset_reset: str = "earliest") -> bool:
    """Take one cooperatively fetched partition (fetched with ``token`` as its offset) into
    ``state``. True when metadata must be refreshed; raises the partition's error when it
    cannot be retried.

    With ``CooperativeChunk`` [a, b] the offsets a..b are this member's (section 3.7):

    * its data records in [a, b] are handed out, in offset order; a record outside the chunk
      (which the proxy must not send) is dropped and counted in
      ``cooperative_records_outside_chunk``; records the group already committed (S, R) are
      dropped as for any partition;
    * every other offset of [a, b] (control records, aborted transactions, offsets compaction
      removed) is marked as a gap right away, so that the member's commit carries it and S
      can pass it: the proxy hands each offset to one member only, so nobody else will;
      the records handed out are committed once the application marks them processed;
    * the token becomes b + 1, even below the previous one: a chunk handed out again after
      another member's lease expired may lie below earlier chunks. The token is only the
      proxy's retry detector, so records handed out never move it.

    Without a chunk (no records at the marker yet, the fetch lost its turn, or this member
    holds its maximum of uncommitted chunks) nothing is handed out (any record is dropped
    and counted) and the token stays. A chunk the answer holds only in part (a batch cut
    by the response size, which the proxy must not send) is handed out as far as its whole
    batches reach, and only that far marked: the rest comes back when its lease expires.
    Errors: see ``_cooperative_error``."""
    if part.error_code != ErrorCode.NONE:
        return _cooperative_error(state, tp, part.error_code, member, metrics, fenced, auto_offset_reset)
    chunk = part.cooperative_chunk
    if chunk is not None and not 0 <= chunk.chunk_start <= chunk.chunk_end:
        raise CorruptRecordError(f"Fetch {tp.topic}-{tp.partition}: the proxy handed out the chunk "
                                 f"[{chunk.chunk_start}, {chunk.chunk_end}], which is no offset range")
    state.ends[tp] = EndOffsets(received_time, part.high_watermark, part.last_stable_offset, part.log_start_offset)
    received.add(tp)
    # every record of the answer, whatever its offset: those outside the chunk are counted
    parsed = parse_partition(
        tp, part.records, 0,
        aborted_transactions=[(a.producer_id, a.first_offset) for a in part.aborted_transactions or ()],
        read_committed=state.read_committed, amend_gaps=False)
    metrics["aborted_records_dropped"] += parsed.aborted
    if chunk is None:
        if parsed.records:
            metrics["cooperative_records_outside_chunk"] += len(parsed.records)
            log.warning("consumer: %s-%s: %d records without a chunk dropped", tp.topic, tp.partition,
                        len(parsed.records))
        return False
    start, end = chunk.chunk_start, chunk.chunk_end
    if parsed.truncated:
        # a cut batch: the chunk reaches only as far as the whole batches before it
        end = min(end, parsed.next_offset - 1)
        log.warning("consumer: %s-%s: the chunk [%d, %d] came with a cut batch; taken up to %d", tp.topic,
                    tp.partition, chunk.chunk_start, chunk.chunk_end, end)
    records = [r for r in parsed.records if start <= r.offset <= end]
    outside = len(parsed.records) - len(records)
    if outside:
        metrics["cooperative_records_outside_chunk"] += outside
        log.warning("consumer: %s-%s: %d records outside the chunk [%d, %d] dropped", tp.topic, tp.partition,
                    outside, start, end)
    metrics["cooperative_chunks"] += 1
    progress = state.progress.get(tp)
    if progress is not None:
        for gap_start, gap_end in _gaps(start, end, records):
            progress.mark(gap_start, gap_end)
        if progress.covers_from(start):
            fresh = [r for r in records if not progress.already_committed(r.offset)]
            metrics["records_already_committed"] += len(records) - len(fresh)
            records = fresh
    metrics["cooperative_records"] += len(records)
    state.positions[tp] = chunk.chunk_end + 1
    state.chunks_reached[tp] = max(state.chunks_reached.get(tp, 0), chunk.chunk_end + 1)
    if records:
        state.buffers.add(tp, records, chunk.chunk_end + 1)
    return False


def _gaps(start: int, end: int, records: Sequence[ConsumerRecord]) -> list[tuple[int, int]]:
    """The offsets of [start, end] that hold none of ``records`` (in offset order)."""
    out = []
    cursor = start
    for record in records:
        if record.offset > cursor:
            out.append((cursor, record.offset - 1))
        cursor = record.offset + 1
    if end >= cursor:
        out.append((cursor, end))
    return out


def _names(tps: Sequence[TopicPartition] | set[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(tps))


def _describe(ranges: Sequence[Span]) -> str:
    return ", ".join(f"[{r.start}, {r.end}]" for r in ranges) or "(the whole partition)"
