"""Key-range fetch, sans-IO: plan a request, complete its response.

``KeyRangeEngine`` is shared by all client connections of one proxy (it owns the result
cache); ``ConnectionRanges`` is the per-connection part (fetch sessions, and which
partitions the broker has already served this connection without error).

The flow for one FetchRequest carrying ranges:

1. ``plan`` resolves each partition's ranges (validation, sessions, topic settings). For a
   sessionless request, partitions whose share is already cached (and which the broker
   has served this connection before) are taken from the cache and removed from the
   request. What remains goes upstream without any tag-10000 field, or nothing does.
2. ``complete`` filters the broker's answer: each filtered partition's records are split
   once into every range set active on that partition; the requester's share goes into
   the response, the others into the cache. Cached shares are merged in, refused
   partitions get INVALID_REQUEST, and ``KeyRangesApplied`` marks what was filtered.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from proxy.keyrange.cache import ActiveRangeSets, CachedShare, RangeSet, ShareCache, copy_metadata
from proxy.keyrange.native import served_blob, served_entry
from proxy.keyrange.requests import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_REQUEST,
    NO_SESSION,
    FetchRangeSessions,
    PartitionKey,
    RequestRanges,
    TopicKey,
    topic_key,
)
from proxy.keyrange.settings import KeyRangeTopicSettings
from proxy.protocol.constants import ErrorCode
from proxy.protocol.message_types import FetchRequest, FetchResponse
from proxy.protocol.values import strip_extensions
from proxy.ranges import FULL_RANGE, HASH_SPACE, covers, subtract
from proxy.records.batch import cut_after, next_offset_after
from proxy.records.compression import Codec
from proxy.records.plan import RangePlan
from proxy.records.split import SetStats, SplitResult, filter_by_offsets, match_offsets, split_records
from proxy.records.stripes import Stripe, split_stripes

READ_COMMITTED = 1
_SESSION_ERRORS = (ErrorCode.FETCH_SESSION_ID_NOT_FOUND, ErrorCode.INVALID_FETCH_SESSION_EPOCH)
_EMPTY_RECORDS = b""
Blob = bytes | bytearray | memoryview  # a record set as a broker read returns it
# split plans kept (about 1.4 KB each); a partition's active range sets change rarely
MAX_PLANS = 256


def canonical_sets(sets: Iterable[RangeSet]) -> tuple[RangeSet, ...]:
    """``sets`` without repeats, in one order whatever order they came in: a read is split
    with the plan of the set of range sets, not of the order they were last asked for."""
    return tuple(sorted(set(sets)))


@dataclass(slots=True)
class FilterStats:
    """Running totals, exported as metrics by the I/O edge."""

    records_kept: int = 0
    records_dropped: int = 0
    partitions_filtered: int = 0
    partitions_refused: int = 0
    shares_cut: int = 0  # cached shares served in parts (larger than the fetching consumer's limit)
    wider_splits: int = 0  # shares split out of a wider share for a set that joined after its read
    broker_bytes: dict[tuple[str, int], int] = field(default_factory=dict)
    touched: set[tuple[str, int]] = field(default_factory=set)  # since the last export


@dataclass(slots=True)
class FetchPlan:
    """What ``plan`` decided for one request."""

    version: int
    ranges: RequestRanges
    upstream_body: FetchRequest | None  # None: answer entirely from the cache
    request: FetchRequest  # the client's request (``upstream_body`` becomes what goes upstream)
    hits: dict[PartitionKey, CachedShare] = field(default_factory=dict)
    # partitions read from the broker only to learn that it serves them on this connection
    # (``probe_reads``): one batch at most, split for the requester alone
    probes: set[PartitionKey] = field(default_factory=set)
    fetch_offsets: dict[PartitionKey, int] = field(default_factory=dict)
    names: dict[PartitionKey, str] = field(default_factory=dict)
    sessionless: bool = False
    isolation_level: int = 0  # the request's: cached shares serve only reads of the same level
    # the request's own entries, kept as they came: a prefetch copies them
    requested: dict[PartitionKey, tuple[FetchRequest.FetchTopic, FetchRequest.FetchPartition]] = field(
        default_factory=dict)
    # where each partition served from the broker or the cache leaves its consumer, and
    # the end of what there is to read (high watermark, or last stable offset)
    reached: dict[PartitionKey, tuple[int, int]] = field(default_factory=dict)


@dataclass(slots=True)
class Prefetch:
    """Key-range prefetch: a broker read the proxy makes itself, a step ahead of the
    consumers of shared partitions: (topic, partition) -> the position it reads from."""

    version: int
    isolation_level: int
    positions: dict[tuple[str, int], int]
    body: FetchRequest
    read_bytes: int = 0  # the partitions' limits summed: what its answer may hold
    wide: int = 0  # partitions read beyond their consumer's limit
    limits: dict[tuple[str, int], int] = field(default_factory=dict)  # each partition's consumer limit


# Each range set's share of a wide read-ahead is sized at this fraction of its consumer's
# limit: with keys spread evenly the shares of one read differ by a few percent, and a
# share above the limit is served in two answers (``KeyRangeEngine._head``).
SHARE_FILL = 7 / 8
# Until no range set has joined a partition for this long, its reads are split with the
# rest of the hash space as one more set (``_with_rest``), so that a set joining after a
# read takes its records from that rest instead of reading the broker again. 16 consumers
# starting together joined over 65 ms, most within 50 (measured).
SETTLE_SECONDS = 0.05
MAX_EXPECTED_SETS = 64  # ActiveRangeSets' default bound on a partition's sets
# A probe's partition limit: the least the broker accepts, and it returns a whole batch
# anyway when the partition is the first in its answer with any (KIP-74), none otherwise.
PROBE_BYTES = 1


def expected_sets(sets: Iterable[RangeSet]) -> int:
    """How many range sets a partition's consumers will have: as many as it has now, or,
    while they join, as many as sets of their mean size take to cover the hash space (a
    group of N members shares it in N equal ranges), at most ``MAX_EXPECTED_SETS``."""
    sets = list(sets)
    sizes = [sum(r.size for r in ranges) for ranges in sets if ranges]
    if not sizes:
        return len(sets)
    return max(len(sets), min(MAX_EXPECTED_SETS, round(HASH_SPACE * len(sizes) / sum(sizes))))


def _and_rest(sets: tuple[RangeSet, ...], within: RangeSet) -> tuple[RangeSet, ...]:
    """``sets``, and the hashes of ``within`` none of them holds as one more set (if any)."""
    rest = tuple(subtract(within, [r for ranges in sets for r in ranges]))
    return (*sets, rest) if rest else sets


def read_ahead_bytes(limit: int, sets: int, max_read_bytes: int, room: int) -> int:
    """The partition limit of a read-ahead for ``sets`` range sets whose consumer asked for
    ``limit`` bytes: ``limit`` per set (``SHARE_FILL`` of it), at most ``max_read_bytes``
    and ``room``, and never less than ``limit`` (the consumer's own read)."""
    return max(limit, min(int(limit * sets * SHARE_FILL), max_read_bytes, room))


@dataclass(slots=True)
class SplitJob:
    """One partition of a broker answer to split: the pure part of ``complete``, gathered
    by ``split_jobs`` so that the caller may run it elsewhere (a worker thread) before
    ``complete`` uses its result. ``sets`` are the range sets as they were when the job was
    made: a set that becomes active while it runs is served by the next read."""

    blob: Blob
    plan: RangePlan
    sets: tuple[RangeSet, ...]
    codec: Codec | None
    result: SplitResult | None = None

    @property
    def size(self) -> int:
        return len(self.blob)

    def run(self) -> SplitResult:
        """The split, made now unless it was made already (on a worker thread)."""
        if self.result is None:
            self.result = split_records(self.blob, self.plan, codec=self.codec)
        return self.result


# a prefetch answer's partition entry, and the split of its records
PrefetchJob = tuple[FetchResponse.PartitionData, SplitJob]


class ConnectionRanges:
    """Key-range state of one client connection."""

    def __init__(self) -> None:
        self.sessions = FetchRangeSessions()
        self.served: set[tuple[str, int]] = set()
        # the same partitions named by topic id (``native.served_entry``), as the native relay
        # reads them: it answers from the cache only for partitions the broker served here
        self.served_ids: set[bytes] = set()
        self._served_blob = (0, b"")

    def served_blob(self) -> bytes:
        """``served_ids`` as the native relay reads them (``native.served_blob``)."""
        count, blob = self._served_blob
        if count != len(self.served_ids):
            blob = served_blob(self.served_ids)
            self._served_blob = (len(self.served_ids), blob)
        return blob


class KeyRangeEngine:
    def __init__(
        self,
        *,
        cache_bytes: int,
        topic_settings: Callable[[str], KeyRangeTopicSettings],
        topic_name: Callable[[uuid.UUID], str | None],
        recompress: bool = True,
        interest_seconds: float = 30.0,
    ) -> None:
        self.cache = ShareCache(cache_bytes)
        # a set nobody asked for in the interest time takes its cached shares with it
        self.active = ActiveRangeSets(interest_seconds, on_expire=self.cache.drop_set)
        self.topic_settings = topic_settings
        self.topic_name = topic_name
        self.codec = None if recompress else Codec.NONE
        self.stats = FilterStats()
        # keyed by the sets in canonical order: the active sets' recency order changes on
        # every read, and keying by it made one plan per permutation
        self._plans: OrderedDict[tuple[RangeSet, ...], RangePlan] = OrderedDict()

    # -- request -----------------------------------------------------------------------------
    def plan(self, conn: ConnectionRanges, version: int, request: FetchRequest, now: float) -> FetchPlan | None:
        """None when the request asks for no ranges at all (forward it as sent). Call
        ``finish`` before sending ``upstream_body``."""
        ranges = conn.sessions.resolve(request)
        if not ranges.uses_ranges:
            return None
        plan = FetchPlan(version=version, ranges=ranges, upstream_body=request,
                         isolation_level=request.isolation_level, request=request)
        for topic in request.topics:
            key = topic_key(topic)
            name = self._name(key)
            for partition in topic.partitions:
                pk = (key, partition.partition)
                plan.names[pk] = name
                plan.fetch_offsets[pk] = partition.fetch_offset
                plan.requested[pk] = (topic, partition)
        for pk, chosen in list(ranges.filtered.items()):
            name = plan.names.get(pk) or self._name(pk[0])
            plan.names[pk] = name
            if not self.topic_settings(name).fetch_enabled:
                ranges.invalid[pk] = f"topic {name} does not accept range fetches"
                del ranges.filtered[pk]
                continue
            if pk in plan.fetch_offsets:
                self.active.touch((name, pk[1]), chosen, now)
        plan.sessionless = ranges.session_id == NO_SESSION and ranges.epoch == FINAL_EPOCH
        if plan.sessionless:
            self.take_hits(conn, plan, now)
        return plan

    def cacheable_misses(self, conn: ConnectionRanges, plan: FetchPlan) -> list[tuple[str, int, int]]:
        """(topic, partition, fetch offset) of the partitions this sessionless request could
        take from the cache but did not find there. A read of one of them already on its
        way from the broker will fill the cache: the caller may wait for it. Only a read at
        the request's isolation level fills it for this request (``plan.isolation_level``);
        after waiting for one at the other level, the request reads the broker itself."""
        if not plan.sessionless:
            return []
        out = []
        for pk in plan.ranges.filtered:
            if pk in plan.hits or pk not in plan.fetch_offsets:
                continue
            name = plan.names[pk]
            if (name, pk[1]) in conn.served and self.topic_settings(name).cache_records:
                out.append((name, pk[1], plan.fetch_offsets[pk]))
        return out

    def take_hits(self, conn: ConnectionRanges, plan: FetchPlan, now: float) -> None:
        for pk, chosen in plan.ranges.filtered.items():
            if pk in plan.hits:
                continue
            name = plan.names[pk]
            partition_id = (name, pk[1])
            if partition_id not in conn.served or pk not in plan.fetch_offsets:
                continue
            if not self.topic_settings(name).cache_records:
                continue  # offsets-only shares never replace a broker read
            share = self.cache.take(partition_id, chosen, plan.fetch_offsets[pk], plan.isolation_level)
            if share is None:
                share = self._from_wider(partition_id, chosen, plan.fetch_offsets[pk], plan.isolation_level, now)
            if share is not None and share.records is not None:
                requested = plan.requested.get(pk)
                plan.hits[pk] = share if requested is None else self._head(share, requested[1].partition_max_bytes)

    def _from_wider(self, partition_id: tuple[str, int], chosen: RangeSet, position: int, isolation_level: int,
                    now: float) -> CachedShare | None:
        """``chosen``'s share at ``position`` split out of a wider share (``_with_rest``),
        with every other active set it holds, the rest of it cached as a wider share again;
        None when no wider share covers the position."""
        wide = self.cache.take_wider(partition_id, chosen, position, isolation_level)
        if wide is None or wide.records is None:
            return None
        sets = _and_rest(canonical_sets([chosen, *(ranges for ranges in self.active.active(partition_id, now)
                                                   if covers(wide.ranges, ranges))]), wide.ranges)
        result = split_records(wide.records, self._plan_for(sets), codec=self.codec)
        self.stats.wider_splits += 1
        mine = None
        for ranges, output in zip(sets, result.outputs):
            share = dataclasses.replace(wide, ranges=ranges, records=output.records,
                                        aborted_transactions=list(wide.aborted_transactions))
            if ranges == chosen:
                mine = share
            else:
                self.cache.put(share)
        return mine

    def _head(self, share: CachedShare, limit: int) -> CachedShare:
        """What of ``share`` a consumer asking for at most ``limit`` bytes is served: all of
        it, or its first entries up to the limit (at least one), the rest cached again from
        the offset the head leaves the consumer at."""
        assert share.records is not None
        cut = cut_after(share.records, max(limit, 1))
        if cut is None:
            return share
        length, next_offset = cut
        self.stats.shares_cut += 1
        records = memoryview(share.records)
        self.cache.put(dataclasses.replace(share, start_offset=next_offset, records=bytes(records[length:]),
                                           aborted_transactions=list(share.aborted_transactions)))
        return dataclasses.replace(share, next_offset=next_offset, records=bytes(records[:length]))

    def probe_reads(self, conn: ConnectionRanges, plan: FetchPlan,
                    in_flight: Callable[[tuple[str, int, int, int]], bool]) -> None:
        """Mark the partitions of this sessionless request that the broker has not served
        this connection yet, but whose next share is cached or on its way (``plan.probes``).

        The cache serves a connection only partitions the broker served it, so a
        consumer's first Fetch of a partition goes upstream however much of its share is
        cached: with N consumers starting together, N reads of its limit where one would
        do. A probe asks for one byte instead (the broker still returns a whole first
        batch), and the consumer's next Fetch takes its share from the cache."""
        if not plan.sessionless:
            return
        for pk, chosen in plan.ranges.filtered.items():
            position = plan.fetch_offsets.get(pk)
            if position is None or pk in plan.hits or pk in plan.ranges.invalid:
                continue
            name = plan.names[pk]
            partition_id = (name, pk[1])
            if partition_id in conn.served or not self.topic_settings(name).cache_records:
                continue
            if in_flight((name, pk[1], position, plan.isolation_level)) or \
                    self.cache.has_records_of(partition_id, chosen, position, plan.isolation_level):
                plan.probes.add(pk)

    def upstream_reads(self, plan: FetchPlan) -> list[tuple[str, int, int]]:
        """(topic, partition, fetch offset) of the range-filtered partitions that go to the
        broker: their reads will fill the cache for other consumers (probes will not)."""
        return [(plan.names[pk], pk[1], plan.fetch_offsets[pk]) for pk in plan.ranges.filtered
                if pk not in plan.hits and pk not in plan.probes and pk in plan.fetch_offsets]

    def finish(self, plan: FetchPlan) -> None:
        """Build the request for the broker (``plan.upstream_body``; None: no broker read)."""
        plan.upstream_body = self._upstream_request(plan.upstream_body, plan, plan.sessionless)

    def _upstream_request(self, request: FetchRequest | None, plan: FetchPlan, sessionless: bool
                          ) -> FetchRequest | None:
        assert request is not None  # the plan's upstream body until ``finish`` decides
        strip_extensions(request)
        if plan.probes:
            for topic in request.topics:
                key = topic_key(topic)
                for partition in topic.partitions:
                    if (key, partition.partition) in plan.probes:
                        partition.partition_max_bytes = PROBE_BYTES
        if not plan.hits:
            return request
        for topic in request.topics:
            key = topic_key(topic)
            topic.partitions = [p for p in topic.partitions if (key, p.partition) not in plan.hits]
        request.topics = [t for t in request.topics if t.partitions]
        if sessionless and not request.topics:
            return None
        return request

    # -- response -----------------------------------------------------------------------------
    def split_jobs(self, plan: FetchPlan, response: FetchResponse, now: float) -> dict[PartitionKey, SplitJob]:
        """The record splits ``complete`` will need for ``response``, by partition, not yet
        run. Only reads whose shares are cached as records are split this way; the
        offsets-only path keeps its two passes inside ``complete``."""
        jobs: dict[PartitionKey, SplitJob] = {}
        if response.error_code != ErrorCode.NONE:
            return jobs
        ranges = plan.ranges
        for topic in response.responses:
            key = topic_key(topic)
            for partition in topic.partitions:
                pk = (key, partition.partition_index)
                chosen = ranges.filtered.get(pk)
                if chosen is None or pk in ranges.invalid or partition.error_code != ErrorCode.NONE \
                        or not partition.records:
                    continue
                name = plan.names.get(pk) or self._name(key)
                if not self.topic_settings(name).cache_records:
                    continue
                fetch_offset = None if pk in plan.probes else plan.fetch_offsets.get(pk)
                sets = self._sets(chosen, (name, pk[1]), fetch_offset, now)
                if fetch_offset is not None:
                    sets = self._with_rest((name, pk[1]), sets, now)
                jobs[pk] = self._job(partition.records, sets)
        return jobs

    def _job(self, blob: Blob, sets: tuple[RangeSet, ...]) -> SplitJob:
        return SplitJob(blob, self._plan_for(sets), sets, self.codec)

    def complete(self, conn: ConnectionRanges, plan: FetchPlan, response: FetchResponse | None, now: float,
                 splits: dict[PartitionKey, SplitJob] | None = None) -> FetchResponse:
        """The response for the client: ``response`` from the broker (None when the plan
        needed no broker read), filtered, with cached shares and refusals merged in.
        ``splits``: from ``split_jobs`` for this response, run or not (those not run are run
        here)."""
        if response is None:
            response = FetchResponse(session_id=NO_SESSION)
        ranges = plan.ranges
        if response.error_code in _SESSION_ERRORS:
            conn.sessions.forget_session(ranges.session_id)
            return response
        if ranges.session_id == NO_SESSION and ranges.epoch == INITIAL_EPOCH and response.error_code == ErrorCode.NONE:
            conn.sessions.bind_new_session(response.session_id, ranges)
        response_class = FetchResponse
        topics = {topic_key(t): t for t in response.responses}
        for key, topic in topics.items():
            for partition in topic.partitions:
                pk = (key, partition.partition_index)
                name = plan.names.get(pk) or self._name(key)
                if partition.error_code == ErrorCode.NONE:
                    conn.served.add((name, pk[1]))
                    if isinstance(key, uuid.UUID):
                        conn.served_ids.add(served_entry(key, pk[1]))
                if pk in ranges.invalid:
                    self._refuse(partition)
                    continue
                chosen = ranges.filtered.get(pk)
                if chosen is None:
                    continue
                # a probe's batch is the requester's alone: split for others, its shares would
                # replace the larger ones cached at the same offset
                fetch_offset = None if pk in plan.probes else plan.fetch_offsets.get(pk)
                reached = self._filter(partition, name, chosen, fetch_offset, plan.isolation_level,
                                       now, splits.get(pk) if splits else None)
                if reached is not None:
                    plan.reached[pk] = (reached, self._end(partition, plan.isolation_level))
        for pk, share in plan.hits.items():
            plan.reached[pk] = (share.next_offset, self._end(share, plan.isolation_level))
            entry = self._partition_entry(response, topics, pk, response_class)
            entry.records = share.records
            entry.high_watermark = share.high_watermark
            entry.last_stable_offset = share.last_stable_offset
            entry.log_start_offset = share.log_start_offset
            entry.aborted_transactions = list(share.aborted_transactions)
            entry.key_ranges_applied = [response_class.KeyRange(start=r.start, end=r.end) for r in share.ranges]
        for pk, (position, _) in plan.reached.items():
            self.active.reach((plan.names.get(pk) or self._name(pk[0]), pk[1]), position)
        for pk in ranges.invalid:
            entry = self._partition_entry(response, topics, pk, response_class)
            if entry.error_code != INVALID_REQUEST:
                self._refuse(entry)
        return response

    def _refuse(self, partition: FetchResponse.PartitionData) -> None:
        partition.error_code = INVALID_REQUEST
        partition.records = _EMPTY_RECORDS
        partition.aborted_transactions = []
        partition.key_ranges_applied = None
        self.stats.partitions_refused += 1

    def _sets(self, chosen: RangeSet, partition_id: tuple[str, int], fetch_offset: int | None,
              now: float) -> tuple[RangeSet, ...]:
        """The range sets one read of the partition is split into: the requester's, and the
        active ones when the read's position is known (their shares can be cached)."""
        return canonical_sets([chosen, *(self.active.active(partition_id, now) if fetch_offset is not None else ())])

    def _with_rest(self, partition_id: tuple[str, int], sets: tuple[RangeSet, ...],
                   now: float) -> tuple[RangeSet, ...]:
        """``sets``, and while range sets are joining the partition (not ``settled``) the
        rest of the hash space none of them holds, as one more set: its share (a wider
        share) is cached like theirs, and a set that joins later takes its records from it
        (``_from_wider``) instead of reading the broker again."""
        return sets if self.active.settled(partition_id, now, SETTLE_SECONDS) else _and_rest(sets, (FULL_RANGE,))

    def _filter(self, partition: FetchResponse.PartitionData, name: str, chosen: RangeSet, fetch_offset: int | None, isolation_level: int,
                now: float, job: SplitJob | None = None) -> int | None:
        """Filter one partition of a broker response to ``chosen``, caching the other active
        sets' shares; the offset after the read's last whole batch when its records were
        cached (None otherwise). ``KeyRangesApplied`` is set exactly when the partition
        was filtered: not on an error, and not when magic 0/1 entries passed through
        unfiltered (that format cannot be emptied safely; the client filters those
        records itself)."""
        if partition.error_code != ErrorCode.NONE:
            return None
        applied = [FetchResponse.KeyRange(start=r.start, end=r.end) for r in chosen]
        if not partition.records:
            partition.key_ranges_applied = applied
            return None
        blob = partition.records
        partition_id = (name, partition.partition_index)
        read = self.stats.broker_bytes
        read[partition_id] = read.get(partition_id, 0) + len(blob)
        self.stats.touched.add(partition_id)
        if self.topic_settings(name).cache_records:
            if job is None:
                sets = self._sets(chosen, partition_id, fetch_offset, now)
                job = self._job(blob, sets if fetch_offset is None else self._with_rest(partition_id, sets, now))
            sets = job.sets
            index = sets.index(chosen)
            result = job.run()
            mine = result.outputs[index]
            partition.records = mine.records
            self._mark_applied(partition, applied, mine.stats)
            self.stats.records_kept += mine.stats.records_kept
            self.stats.records_dropped += mine.stats.records_dropped
            if fetch_offset is not None and result.next_offset is not None:
                self.active.read(partition_id, result.next_offset)
                metadata = copy_metadata(partition)
                for k, other in enumerate(sets):
                    if k != index:
                        self.cache.put(CachedShare(partition_id, other, fetch_offset, result.next_offset,
                                                   isolation_level, records=result.outputs[k].records, **metadata))
                self.stats.partitions_filtered += 1
                return result.next_offset
        else:
            sets = self._sets(chosen, partition_id, fetch_offset, now)
            index = sets.index(chosen)
            plan = self._plan_for(sets)
            cached = self.cache.take(partition_id, chosen, fetch_offset, isolation_level) \
                if fetch_offset is not None else None
            if cached is not None and cached.offsets is not None and cached.start_offset == fetch_offset:
                # The same read was hashed for another consumer: look offsets up instead,
                # and hash what this read holds beyond that one.
                output = filter_by_offsets(blob, set(cached.offsets), known_below=cached.next_offset,
                                           plan=self._plan_for((chosen,)), codec=self.codec)
                partition.records = output.records
                self._mark_applied(partition, applied, output.stats)
                self.stats.records_kept += output.stats.records_kept
                self.stats.records_dropped += output.stats.records_dropped
                return None
            match = match_offsets(blob, plan)
            mine = filter_by_offsets(blob, set(match.offsets[index]), codec=self.codec)
            partition.records = mine.records
            self._mark_applied(partition, applied, mine.stats)
            self.stats.records_kept += mine.stats.records_kept
            self.stats.records_dropped += mine.stats.records_dropped
            if fetch_offset is not None and match.next_offset is not None:
                for k, other in enumerate(sets):
                    if k != index:
                        self.cache.put(CachedShare(partition_id, other, fetch_offset, match.next_offset,
                                                   isolation_level, offsets=tuple(match.offsets[k])))
        self.stats.partitions_filtered += 1
        return None

    @staticmethod
    def _end(partition: FetchResponse.PartitionData | CachedShare, isolation_level: int) -> int:
        """What there is to read of a partition at ``isolation_level``, as its read saw it."""
        return partition.last_stable_offset if isolation_level == READ_COMMITTED else partition.high_watermark

    # -- key-range prefetch ----------------------------------------------------------------------
    def prefetch(self, plan: FetchPlan, in_flight: Callable[[tuple[str, int, int, int]], bool],
                 now: float, *, max_read_bytes: int = 0, room: int = 0) -> Prefetch | None:
        """The broker read of the next position of every partition this request served
        that others share, before any consumer asks for it, or None.

        Consumers sharing a partition by key range each fetch, take their share, and fetch
        again: without this the broker read of the next position starts only when the
        first of them asks for it, and all of them wait for it and for its split. Read
        one step ahead (only from a position a consumer has reached; ``chain`` adds a
        second), the shares are cached by the time they ask. A partition qualifies when
        its records are cached as such (``reserve.message.value.range.fetch``), at least
        two range sets read it, there is more to read than was served, and no read of
        that position is cached or under way.

        Each partition is read wide (``read_ahead_bytes``): about the requester's limit for
        every range set sharing it, up to ``max_read_bytes`` and the ``room`` the cache has
        for shares on their way, so that each consumer's next answer is about a limit of
        its own records rather than a 1/N part of one.
        """
        if not plan.sessionless or not plan.reached:
            return None
        positions: dict[tuple[str, int], int] = {}
        limits: dict[tuple[str, int], int] = {}
        topics: dict[TopicKey, FetchRequest.FetchTopic] = {}
        total = widened = 0
        for pk, (position, end) in plan.reached.items():
            name = plan.names[pk]
            partition_id = (name, pk[1])
            if position >= end or pk not in plan.requested:
                continue
            if not self.topic_settings(name).cache_records:
                continue
            sets = self.active.active(partition_id, now)
            if len(sets) < 2 or in_flight((name, pk[1], position, plan.isolation_level)):
                continue
            if any(self.cache.holds(partition_id, ranges, position, plan.isolation_level) for ranges in sets):
                continue
            topic, partition = plan.requested[pk]
            entry = topics.get(pk[0])
            if entry is None:
                entry = topics[pk[0]] = dataclasses.replace(topic, partitions=[])
            limit = partition.partition_max_bytes
            # a consumer behind the furthest read catches up through reads made for others:
            # a wide read from there would read most of them again
            wide = limit if position < self.active.frontier(partition_id) \
                else read_ahead_bytes(limit, expected_sets(sets), max_read_bytes, room)
            room -= wide
            widened += wide > limit
            entry.partitions.append(dataclasses.replace(partition, fetch_offset=position, partition_max_bytes=wide))
            positions[partition_id] = position
            limits[partition_id] = limit
            total += wide
        if not positions:
            return None
        # The consumer's own request but for its partitions, positions and sizes: its
        # isolation level and rack; min_bytes 1, as there is more to read than was served.
        body = dataclasses.replace(plan.request, session_id=NO_SESSION, session_epoch=FINAL_EPOCH, min_bytes=1,
                                   max_bytes=max(plan.request.max_bytes, total),
                                   topics=list(topics.values()), forgotten_topics_data=[])
        strip_extensions(body)
        return Prefetch(plan.version, plan.isolation_level, positions, body, total, widened, limits)

    def chain(self, ahead: Prefetch, response: FetchResponse, in_flight: Callable[[tuple[str, int, int, int]], bool],
              now: float, *, room: int = 0) -> Prefetch | None:
        """The read after ``ahead`` of its wide partitions, to send as soon as ``ahead``'s
        answer is here, before it is split; or None.

        Made from a consumer's fetch (``prefetch``), the next read would leave only once the
        first consumer takes its share of this one: after the split. Sent before it, the
        broker's answer is on its way while this one is split and handed out. A partition
        goes on when its read was wide, the answer holds records and stops short of what
        there is, the foremost consumer has reached where this read began (so reads run at
        most two ahead of it), its next position is neither cached nor being read, and the
        ``room`` left for reads on their way takes another of the same size.
        """
        if response.error_code != ErrorCode.NONE:
            return None
        level = ahead.isolation_level
        ends: dict[tuple[str, int], int] = {}
        for topic in response.responses:
            name = self._name(topic_key(topic))
            for partition in topic.partitions:
                partition_id = (name, partition.partition_index)
                start = ahead.positions.get(partition_id)
                if start is None or partition.error_code != ErrorCode.NONE or not partition.records \
                        or self.active.foremost(partition_id) < start:
                    continue
                end = next_offset_after(partition.records)
                if end is not None and start < end < self._end(partition, level):
                    ends[partition_id] = end
        if not ends:
            return None
        positions: dict[tuple[str, int], int] = {}
        topics: list[FetchRequest.FetchTopic] = []
        total = 0
        for asked in ahead.body.topics:
            name = self._name(topic_key(asked))
            partitions = []
            for read in asked.partitions:
                partition_id = (name, read.partition)
                end = ends.get(partition_id)
                width = read.partition_max_bytes
                if end is None or width <= ahead.limits.get(partition_id, width) or width > room \
                        or in_flight((name, read.partition, end, level)):
                    continue
                sets = self.active.active(partition_id, now)
                if len(sets) < 2 or any(self.cache.holds(partition_id, ranges, end, level) for ranges in sets):
                    continue
                room -= width
                total += width
                positions[partition_id] = end
                partitions.append(dataclasses.replace(read, fetch_offset=end))
            if partitions:
                topics.append(dataclasses.replace(asked, partitions=partitions))
        if not positions:
            return None
        body = dataclasses.replace(ahead.body, max_bytes=max(ahead.body.max_bytes, total), topics=topics)
        return Prefetch(ahead.version, level, positions, body, total, len(positions), dict(ahead.limits))

    def prefetch_jobs(self, ahead: Prefetch, response: FetchResponse, now: float) -> dict[tuple[str, int], PrefetchJob]:
        """The splits of a prefetch's answer, each partition (with its entry in the
        answer) into all its active sets."""
        jobs: dict[tuple[str, int], PrefetchJob] = {}
        if response.error_code != ErrorCode.NONE:
            return jobs
        for topic in response.responses:
            name = self._name(topic_key(topic))
            for partition in topic.partitions:
                partition_id = (name, partition.partition_index)
                if partition_id not in ahead.positions or partition.error_code != ErrorCode.NONE \
                        or not partition.records:
                    continue
                sets = canonical_sets(self.active.active(partition_id, now))
                if sets:
                    jobs[partition_id] = (partition, self._job(partition.records, self._with_rest(partition_id, sets, now)))
        return jobs

    def cache_prefetch(self, ahead: Prefetch, jobs: dict[tuple[str, int], PrefetchJob]) -> int:
        """Cache every share of a prefetch's answer (``prefetch_jobs``, run or not); how many."""
        cached = 0
        for partition_id, (partition, job) in jobs.items():
            result = job.run()
            read = self.stats.broker_bytes
            read[partition_id] = read.get(partition_id, 0) + len(job.blob)
            self.stats.touched.add(partition_id)
            if result.next_offset is None:
                continue
            self.active.read(partition_id, result.next_offset)
            metadata = copy_metadata(partition)
            position = ahead.positions[partition_id]
            for ranges, output in zip(job.sets, result.outputs):
                if self.cache.put(CachedShare(partition_id, ranges, position, result.next_offset,
                                              ahead.isolation_level, records=output.records, **metadata)):
                    cached += 1
        return cached

    @staticmethod
    def _mark_applied(partition: FetchResponse.PartitionData, applied: list[FetchResponse.KeyRange],
                      stats: SetStats) -> None:
        if not stats.unfiltered:
            partition.key_ranges_applied = applied

    def _partition_entry(self, response: FetchResponse, topics: dict[TopicKey, FetchResponse.FetchableTopicResponse],
                         pk: PartitionKey, response_class: type[FetchResponse]) -> FetchResponse.PartitionData:
        key, index = pk
        topic = topics.get(key)
        if topic is None:
            if isinstance(key, str):
                topic = response_class.FetchableTopicResponse(topic=key, partitions=[])
            else:
                topic = response_class.FetchableTopicResponse(topic_id=key, partitions=[])
            response.responses.append(topic)
            topics[key] = topic
        for partition in topic.partitions:
            if partition.partition_index == index:
                return partition
        entry = response_class.PartitionData(partition_index=index, records=_EMPTY_RECORDS)
        topic.partitions.append(entry)
        return entry

    def _plan_for(self, sets: tuple[RangeSet, ...]) -> RangePlan:
        """The split plan of ``sets``, least recently used plans beyond ``MAX_PLANS`` dropped."""
        plans = self._plans
        plan = plans.get(sets)
        if plan is None:
            plan = plans[sets] = RangePlan(sets)
            if len(plans) > MAX_PLANS:
                plans.popitem(last=False)
        else:
            plans.move_to_end(sets)
        return plan

    def _name(self, key: TopicKey) -> str:
        if isinstance(key, str):
            return key
        return self.topic_name(key) or str(key)


class SharedReads:
    """The engine's result cache as other features use it (virtual range topics): a
    broker read that feature made is split once into the ranges it needs now and every
    range set active on the partition; the others are cached as records shares for the
    consumers that come next, whichever feature serves them."""

    def __init__(self, engine: KeyRangeEngine) -> None:
        self.engine = engine

    def split(self, partition_id: tuple[str, int], wanted: list[RangeSet], fetch_offset: int, blob,
              metadata: dict, now: float, *, isolation_level: int) -> tuple[list[bytes], int | None]:
        """The records of each of ``wanted`` in ``blob`` (read at ``fetch_offset`` and
        ``isolation_level``), and the offset after the read's last complete batch; other
        active sets' shares are cached, for consumers at that isolation level only."""
        engine = self.engine
        for ranges in wanted:
            engine.active.touch(partition_id, ranges, now)
        sets = canonical_sets([*wanted, *engine.active.active(partition_id, now)])
        read = engine.stats.broker_bytes
        read[partition_id] = read.get(partition_id, 0) + len(blob)
        engine.stats.touched.add(partition_id)
        result = split_records(blob, engine._plan_for(sets), codec=engine.codec)
        mine = [result.outputs[sets.index(ranges)] for ranges in wanted]
        for output in mine:
            engine.stats.records_kept += output.stats.records_kept
            engine.stats.records_dropped += output.stats.records_dropped
        if result.next_offset is not None:
            engine.active.read(partition_id, result.next_offset)
            for ranges, output in zip(sets, result.outputs):
                if ranges not in wanted:
                    engine.cache.put(CachedShare(partition_id, ranges, fetch_offset, result.next_offset,
                                                 isolation_level, records=output.records, **metadata))
        return [output.records for output in mine], result.next_offset

    def split_stripes(self, partition_id: tuple[str, int], counts: list[int], wanted: list[Stripe],
                      fetch_offset: int, blob, metadata: dict, *, isolation_level: int) -> tuple[list[bytes], int | None]:
        """The batches of each stripe of ``wanted`` in ``blob`` (read at ``fetch_offset``), and
        the offset after the read's last complete batch; the other stripes of each K in
        ``counts`` are cached for the consumers that come next. Stripes are not range sets:
        they never join a key-range split, and leave the cache by its byte cap alone."""
        engine = self.engine
        read = engine.stats.broker_bytes
        read[partition_id] = read.get(partition_id, 0) + len(blob)
        engine.stats.touched.add(partition_id)
        mine: dict[Stripe, bytes] = {}
        next_offset: int | None = None
        for count in counts:
            result = split_stripes(blob, count)
            next_offset = result.next_offset
            for index, records in enumerate(result.outputs):
                stripe = Stripe(count, index)
                if stripe in wanted:
                    mine[stripe] = records
                    engine.stats.records_kept += result.records[index]
                elif next_offset is not None:
                    engine.cache.put(CachedShare(partition_id, stripe, fetch_offset, next_offset,  # type: ignore[arg-type]
                                                 isolation_level, records=records, **metadata))
        return [mine.get(stripe, b"") for stripe in wanted], next_offset

    def take_stripe(self, partition_id: tuple[str, int], stripe: Stripe, position: int, *,
                    isolation_level: int) -> CachedShare | None:
        """A cached share of ``stripe`` covering ``position``, read at ``isolation_level``,
        removed from the cache."""
        share = self.engine.cache.take(partition_id, stripe, position, isolation_level)  # type: ignore[arg-type]
        return share if share is not None and share.records is not None else None

    def interest(self, partition_id: tuple[str, int], ranges: RangeSet, now: float) -> None:
        """Count ``ranges`` as active on the partition (its next reads cache a share of it)
        before any consumer of it asked."""
        self.engine.active.touch(partition_id, ranges, now)

    def take(self, partition_id: tuple[str, int], ranges: RangeSet, position: int, now: float, *,
             isolation_level: int) -> CachedShare | None:
        """A cached records share of ``ranges`` covering ``position``, read at
        ``isolation_level``, removed from the cache."""
        self.engine.active.touch(partition_id, ranges, now)
        share = self.engine.cache.take(partition_id, ranges, position, isolation_level)
        return share if share is not None and share.records is not None else None
