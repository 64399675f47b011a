"""A standalone (assign-mode) Kafka consumer on trio that speaks the key-range extension.

    async with Consumer("127.0.0.1:9092", auto_offset_reset="earliest") as consumer:
        consumer.assign({TopicPartition("orders", 0): [equal_shares(4)[i]]})
        while True:
            for record in await consumer.poll(1.0):
                ...

Each assigned partition may carry key ranges (DESIGN.md section 2); an empty list means
the whole partition. Ranges go on the wire only where the proxy advertises
``keyrange.fetch``; every record of a ranged partition is still checked against the
assignment, and any record outside it is dropped and counted
(``metrics()["records_outside_ranges"]``), so an unfiltering connection can never hand the
application another consumer's keys.

Fetching happens inside ``poll``: partitions with nothing buffered are fetched from their
leaders (one sessionless Fetch per leader, concurrently); buffered records are handed out
in a fair rotation (KIP-387); every fetch response refreshes the partition's cached
metadata, from which ``current_lag`` answers without a network call (KIP-695).

With a ``group_id`` the consumer starts each partition at the group's committed offset
(then ``auto_offset_reset``), and ``commit`` stores plain contiguous offsets for
whole-partition assignments as a simple group (generation -1).

With ``allow_individual_commit`` the application marks records processed in any order
(``mark_processed``) and ``commit`` sends exactly those offsets as OffsetRanges (DESIGN.md
section 3), together with the offsets nobody will process (control batches, aborted
transactions, and for a whole partition the offsets compaction removed: gap amending). On
start the consumer reads the group's stable offset S and ranges R and never hands out a
record they already cover. Where the proxy does not advertise ``individual.commit`` it
falls back to plain commits of the contiguous processed prefix.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import trio

from proxy.client.config import ConsumerConfig
from proxy.client.progress import PartitionProgress
from proxy.client.errors import (
    COORDINATOR_RETRY_CODES,
    METADATA_REFRESH_CODES,
    ConsumerError,
    IllegalStateError,
    KafkaError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    RangeFetchNotSupportedError,
    RequestTimedOutError,
    RetriableError,
    UnsupportedVersionError,
)
from proxy.client.records import (
    ConsumerRecord,
    ConsumerRecords,
    FairBuffers,
    FetchMetadata,
    TopicPartition,
    lag,
    parse_partition,
)
from proxy.net.broker_connection import BrokerConnection, BrokerConnectionError
from proxy.protocol import messages
from proxy.protocol.errors import ProtocolError
from proxy.protocol.messages import ApiKey
from proxy.ranges import KeyRange, normalize, validate_ranges

log = logging.getLogger(__name__)

RANGE_FETCH_FEATURE = "keyrange.fetch"
INDIVIDUAL_COMMIT_FEATURE = "individual.commit"
RANGE_FETCH_MIN_VERSION = 12  # the first flexible Fetch version: tag 10000 fields
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
# The oldest versions this client speaks, and the newest it asks for.
_VERSION_FLOOR = {ApiKey.FETCH: 4, ApiKey.LIST_OFFSETS: 2, ApiKey.METADATA: 4}
_VERSION_CEILING = {ApiKey.FETCH: 17, ApiKey.LIST_OFFSETS: 9, ApiKey.METADATA: 12}
# Group requests, needed only with a group_id: negotiated where the node serves them.
_GROUP_VERSIONS = {ApiKey.FIND_COORDINATOR: (4, 4), ApiKey.OFFSET_COMMIT: (8, 9), ApiKey.OFFSET_FETCH: (8, 9)}
_NETWORK_ERRORS = (BrokerConnectionError, OSError, trio.TooSlowError, ProtocolError)


class ConsumerConnectionError(ConsumerError):
    """No bootstrap server answered within the request timeout."""


@dataclass
class _Connection:
    conn: BrokerConnection
    versions: dict[int, int]
    features: frozenset[str]

    @property
    def filters_ranges(self) -> bool:
        return RANGE_FETCH_FEATURE in self.features and self.versions[ApiKey.FETCH] >= RANGE_FETCH_MIN_VERSION


@dataclass
class _PartitionMeta:
    leader: int
    leader_epoch: int


@dataclass
class _TopicMeta:
    topic_id: Any
    partitions: dict[int, _PartitionMeta] = field(default_factory=dict)


@dataclass
class _EndOffsets:
    received_time: float
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int


class Consumer:
    """See the module documentation. Settings are Kafka's consumer settings in snake case;
    see ``ConsumerConfig`` for the defaults."""

    def __init__(self, bootstrap_servers: str | Sequence[str], **settings: Any) -> None:
        if not isinstance(bootstrap_servers, str) and isinstance(bootstrap_servers, Sequence):
            bootstrap_servers = list(bootstrap_servers)
        self.config = ConsumerConfig(bootstrap_servers, **settings)
        self._read_committed = self.config.isolation_code == 1
        self._bootstrap: _Connection | None = None
        self._coordinator_connection: _Connection | None = None
        self._connections: dict[int, _Connection] = {}
        self._nodes_opened: set[int] = set()
        self._nodes: dict[int, tuple[str, int]] = {}
        self._topics: dict[str, _TopicMeta] = {}
        self._metadata_stale = True
        self._assignment: dict[TopicPartition, list[KeyRange]] = {}
        self._positions: dict[TopicPartition, int | None] = {}
        self._ends: dict[TopicPartition, _EndOffsets] = {}
        self._buffers = FairBuffers()
        self._tracking = self.config.allow_individual_commit
        self._progress: dict[TopicPartition, PartitionProgress] = {}
        self._commit_lock = trio.Lock()
        self._metrics: Counter[str] = Counter()
        self._request_order = itertools.count()
        self._started = False
        self._closed = False
        self._polling = False
        # the background fetch exists only under `async with`, which owns its nursery
        self._nursery_manager = None
        self._nursery: trio.Nursery | None = None
        self._prefetch: trio.Event | None = None
        self._prefetch_received: set[TopicPartition] = set()
        self._prefetch_error: BaseException | None = None

    # -- lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> "Consumer":
        manager = trio.open_nursery()
        self._nursery = await manager.__aenter__()
        self._nursery_manager = manager
        try:
            await self.start()
        except BaseException:
            await self._close_nursery()
            raise
        return self

    async def __aexit__(self, *exc_info) -> None:
        try:
            await self._close_nursery()
        finally:
            await self.close()

    async def _close_nursery(self) -> None:
        """Cancel the background fetch and wait for it. The block's own exception is not
        passed in: it propagates from ``async with`` as it was raised, not grouped."""
        manager, self._nursery_manager = self._nursery_manager, None
        if manager is None:
            return
        self._nursery.cancel_scope.cancel()
        self._nursery = None
        await manager.__aexit__(None, None, None)

    async def start(self) -> None:
        """Connect to a bootstrap server and learn its versions and features."""
        if self._closed:
            raise IllegalStateError("the consumer is closed")
        if self._started:
            return
        errors = []
        for host, port in self.config.bootstrap_addresses:
            try:
                self._bootstrap = await self._open(host, port)
                break
            except (*_NETWORK_ERRORS, KafkaError) as exc:
                errors.append(f"{host}:{port}: {exc!r}")
        else:
            raise ConsumerConnectionError("no bootstrap server answered: " + "; ".join(errors))
        self._started = True

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        connections = [c.conn for c in self._connections.values()]
        for extra in (self._bootstrap, self._coordinator_connection):
            if extra is not None:
                connections.append(extra.conn)
        self._coordinator_connection = None
        self._connections.clear()
        self._bootstrap = None
        for conn in connections:
            with trio.CancelScope(shield=True):
                await conn.aclose()

    @property
    def range_fetch_supported(self) -> bool:
        """Whether the bootstrap connection advertises ``keyrange.fetch``."""
        self._require_started()
        return self._bootstrap.filters_ranges

    @property
    def individual_commit_supported(self) -> bool:
        """Whether the bootstrap connection advertises ``individual.commit``."""
        self._require_started()
        return INDIVIDUAL_COMMIT_FEATURE in self._bootstrap.features

    # -- assignment and positions ---------------------------------------------------------
    def assign(self, assignment: Mapping[TopicPartition, Sequence[KeyRange]] | Sequence[TopicPartition]) -> None:
        """Replace the assignment. A mapping gives each partition its key ranges (an empty
        list: the whole partition); a plain sequence of partitions assigns them whole.
        Ranges must be sorted, disjoint and within [0, 2^63 - 1]."""
        self._require_started()
        if not isinstance(assignment, Mapping):
            assignment = {tp: [] for tp in assignment}
        new: dict[TopicPartition, list[KeyRange]] = {}
        for tp, ranges in assignment.items():
            if not (isinstance(tp, tuple) and len(tp) == 2 and isinstance(tp[0], str) and isinstance(tp[1], int)
                    and tp[0] and tp[1] >= 0):
                raise ValueError(f"not a TopicPartition(topic, partition): {tp!r}")
            tp = TopicPartition(*tp)
            ranges = list(ranges or [])
            for r in ranges:
                if not isinstance(r, KeyRange):
                    raise ValueError(f"{tp.topic}-{tp.partition}: ranges must be KeyRange values, got {r!r}")
            reason = validate_ranges(ranges)
            if reason:
                raise ValueError(f"{tp.topic}-{tp.partition}: {reason}")
            if ranges and not self._bootstrap.filters_ranges:
                raise RangeFetchNotSupportedError(
                    f"{tp.topic}-{tp.partition} is assigned key ranges, but the cluster at "
                    f"{self.config.bootstrap_servers} does not advertise {RANGE_FETCH_FEATURE} "
                    f"(connect through a keyrange-proxy)")
            new[tp] = ranges
        for tp in list(self._positions):
            if tp not in new or new[tp] != self._assignment.get(tp):
                # a partition whose ranges change starts over from a fresh buffer
                self._buffers.clear(tp)
            if tp not in new:
                del self._positions[tp]
                self._ends.pop(tp, None)
                self._progress.pop(tp, None)  # marks not committed yet are given up with it
        for tp in new:
            self._positions.setdefault(tp, None)
        self._assignment = new
        self._buffers.set_partitions(list(new))
        if any(tp.topic not in self._topics for tp in new):
            self._metadata_stale = True

    def assignment(self) -> dict[TopicPartition, list[KeyRange]]:
        return {tp: list(ranges) for tp, ranges in self._assignment.items()}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Fetch ``tp`` from ``offset`` on the next poll (buffered records are dropped)."""
        self._require_assigned(tp)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be a non-negative int, got {offset!r}")
        self._positions[tp] = offset
        self._buffers.clear(tp)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._reset_later(partitions, EARLIEST_TIMESTAMP)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._reset_later(partitions, LATEST_TIMESTAMP)

    def position(self, tp: TopicPartition) -> int | None:
        """The offset of the next record ``poll`` will return for ``tp``; None while it
        waits for an offset reset."""
        self._require_assigned(tp)
        position = self._positions[tp]
        return position if isinstance(position, int) else None

    def current_lag(self, tp: TopicPartition) -> int | None:
        """End offset (high watermark, or last stable offset under read_committed) from the
        latest fetch response minus the position; None while either is unknown. Answers
        from the local cache only, never the network (KIP-695)."""
        self._require_assigned(tp)
        ends = self._ends.get(tp)
        return lag(self._end_of(ends) if ends else None, self.position(tp))

    def metrics(self) -> dict[str, int]:
        """Counters: ``records_outside_ranges`` (dropped: key hash outside the assignment),
        ``unfiltered_range_responses`` (a ranged partition answered without
        KeyRangesApplied), ``aborted_records_dropped``, ``records_returned``,
        ``fetch_requests``, ``metadata_refreshes``, ``offset_resets``, ``reconnects``,
        ``retriable_errors``, ``records_already_committed`` (skipped: the group's S or R
        covers them), ``range_commits`` and ``plain_commits`` (acknowledged partitions)."""
        keys = ("records_outside_ranges", "unfiltered_range_responses", "aborted_records_dropped",
                "records_returned", "fetch_requests", "metadata_refreshes", "offset_resets", "reconnects",
                "retriable_errors", "records_already_committed", "range_commits", "plain_commits")
        return {key: self._metrics[key] for key in keys} | dict(self._metrics)

    # -- committed offsets (plain, contiguous; a simple group: generation -1) --------------
    async def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """Commit ``offsets`` (default: the position of every assigned partition) for
        ``group_id`` with OffsetCommit v8+ as a simple group (generation -1, no member id).
        A committed offset means every record below it is processed, so a partition
        assigned key ranges is refused: its position says nothing about the other ranges.

        With ``allow_individual_commit`` and no ``offsets``, commits what ``mark_processed``
        marked instead (see ``commit_processed``)."""
        self._require_started()
        group = self._require_group()
        if offsets is None and self._tracking:
            await self.commit_processed()
            return
        if offsets is None:
            offsets = {tp: self.position(tp) for tp in self._assignment if self.position(tp) is not None}
        offsets = dict(offsets)
        for tp, offset in offsets.items():
            self._require_assigned(tp)
            if self._assignment[tp]:
                raise IllegalStateError(
                    f"{tp[0]}-{tp[1]} is assigned key ranges: a plain committed offset covers every key of the "
                    f"partition, so a range member cannot commit its own position")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise ValueError(f"{tp[0]}-{tp[1]}: offset must be a non-negative int, got {offset!r}")
        if not offsets:
            return
        async with self._commit_lock:
            accepted, failed = await self._send_commit(group, offsets)
            for tp in accepted:
                if tp in self._progress:
                    self._progress[tp].acknowledged_plain(offsets[tp])
        if failed is not None:
            raise failed

    # -- individual commit -----------------------------------------------------------------
    def mark_processed(self, *records: ConsumerRecord) -> None:
        """Mark records processed, in any order; the next ``commit`` carries them. Needs
        ``allow_individual_commit``."""
        self._require_started()
        if not self._tracking:
            raise IllegalStateError("mark_processed needs allow_individual_commit=True (and a group_id)")
        for record in records:
            tp = TopicPartition(record.topic, record.partition)
            self._require_assigned(tp)
            progress = self._progress.get(tp)
            if progress is None:
                raise IllegalStateError(f"{tp.topic}-{tp.partition} offset {record.offset} was not handed out by "
                                        f"this consumer's poll")
            progress.mark(record.offset)

    def pending_commit(self, tp: TopicPartition) -> list[tuple[int, int]]:
        """Offset ranges of ``tp`` marked processed (or amended gaps) that no acknowledged
        commit has carried yet."""
        self._require_assigned(tp)
        progress = self._progress.get(tp)
        return list(progress.pending) if progress else []

    async def commit_processed(self) -> None:
        """Send every marked range with OffsetCommit v8+ (``individual.commit``), as many
        requests as ``individual_commit_max_ranges`` needs; a range leaves the pending set
        only once acknowledged, so a failed commit loses nothing and may simply be retried.
        Without the feature, whole partitions fall back to a plain commit of the contiguous
        processed prefix; a partition assigned key ranges cannot and raises."""
        self._require_started()
        group = self._require_group()
        if not self._tracking:
            raise IllegalStateError("commit_processed needs allow_individual_commit=True")
        async with self._commit_lock:
            if INDIVIDUAL_COMMIT_FEATURE in (await self._any_connection()).features:
                await self._commit_ranges(group)
            else:
                await self._commit_contiguous(group)

    async def _commit_ranges(self, group: str) -> None:
        limit = self.config.individual_commit_max_ranges
        # each round sends the lowest `limit` pending ranges of every partition; bounded by
        # the largest pending set (an acknowledged round always removes what it sent)
        rounds = max((len(p.pending) for p in self._progress.values()), default=0) // limit + 1
        for _ in range(rounds):
            sent = {tp: progress.to_commit(limit) for tp, progress in self._progress.items()
                    if tp in self._assignment and progress.pending}
            if not sent:
                return
            accepted, failed = await self._send_commit(group, sent)
            for tp, part in accepted.items():
                if tp in self._progress:
                    self._progress[tp].acknowledged(sent[tp], part.stable_offset)
                    self._metrics["range_commits"] += 1
            if failed is not None:
                raise failed

    async def _commit_contiguous(self, group: str) -> None:
        ranged = [tp for tp, progress in self._progress.items()
                  if self._assignment.get(tp) and progress.pending]
        if ranged:
            raise IllegalStateError(
                f"the cluster does not advertise {INDIVIDUAL_COMMIT_FEATURE}, and "
                f"{', '.join(f'{tp.topic}-{tp.partition}' for tp in ranged)} is assigned key ranges: a plain "
                f"committed offset would cover the other ranges' records too")
        offsets = {}
        for tp, progress in self._progress.items():
            offset = progress.contiguous() if tp in self._assignment else None
            if offset is not None:
                offsets[tp] = offset
        if not offsets:
            return
        accepted, failed = await self._send_commit(group, offsets)
        for tp in accepted:
            self._progress[tp].acknowledged_plain(offsets[tp])
            self._metrics["plain_commits"] += 1
        if failed is not None:
            raise failed

    async def _send_commit(self, group: str, entries: Mapping[TopicPartition, int | list[tuple[int, int]]]
                           ) -> tuple[dict[TopicPartition, Any], KafkaError | None]:
        """One OffsetCommit v8+ as a simple group (generation -1, no member id): a partition
        given an int commits that offset, one given ranges commits them as OffsetRanges
        (CommittedOffset -1). Returns the accepted partitions' responses and the first
        partition error, if any."""
        cls = messages.body_class(ApiKey.OFFSET_COMMIT, "request")

        def body(version: int):
            topics: dict[str, list] = {}
            for tp, what in entries.items():
                if isinstance(what, int):
                    meta = self._leader(tp)
                    part = cls.OffsetCommitRequestPartition(
                        partition_index=tp.partition, committed_offset=what,
                        committed_leader_epoch=meta.leader_epoch if meta else -1, committed_metadata="")
                else:
                    part = cls.OffsetCommitRequestPartition(
                        partition_index=tp.partition, committed_offset=-1, committed_leader_epoch=-1,
                        committed_metadata="", offset_ranges=[cls.OffsetRange(start=a, end=b) for a, b in what])
                topics.setdefault(tp.topic, []).append(part)
            return messages.new_body(
                ApiKey.OFFSET_COMMIT, version, "request", group_id=group, generation_id_or_member_epoch=-1,
                member_id="", group_instance_id=None,
                topics=[cls.OffsetCommitRequestTopic(name=name, partitions=parts) for name, parts in topics.items()])

        response = await self._coordinator_request(ApiKey.OFFSET_COMMIT, body)
        accepted = {}
        for topic in response.topics:
            for part in topic.partitions:
                tp = TopicPartition(topic.name, part.partition_index)
                if part.error_code == 0 and tp in entries:
                    accepted[tp] = part
        return accepted, _first_error(response, group)

    async def committed(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The group's committed offset of each partition (None where nothing is committed),
        read with OffsetFetch v8+."""
        return {tp: stable for tp, (stable, _) in (await self.committed_ranges(partitions)).items()}

    async def committed_ranges(self, partitions: Sequence[TopicPartition]
                               ) -> dict[TopicPartition, tuple[int | None, list[tuple[int, int]]]]:
        """The group's state of each partition: (S, R), the committed (stable) offset (None
        where nothing is committed) and the ranges processed above it (empty unless the
        proxy holds individual commits), read with OffsetFetch v8+."""
        self._require_started()
        group = self._require_group()
        partitions = [TopicPartition(*tp) for tp in partitions]
        if not partitions:
            return {}
        cls = messages.body_class(ApiKey.OFFSET_FETCH, "request")

        def body(version: int):
            topics: dict[str, list[int]] = {}
            for tp in partitions:
                topics.setdefault(tp.topic, []).append(tp.partition)
            return messages.new_body(ApiKey.OFFSET_FETCH, version, "request", require_stable=True, groups=[
                cls.OffsetFetchRequestGroup(group_id=group, topics=[
                    cls.OffsetFetchRequestTopics(name=name, partition_indexes=indexes)
                    for name, indexes in topics.items()])])

        response = await self._coordinator_request(ApiKey.OFFSET_FETCH, body)
        out: dict[TopicPartition, tuple[int | None, list]] = {tp: (None, []) for tp in partitions}
        for entry in response.groups:
            if entry.error_code:
                raise KafkaError.for_code(entry.error_code, f"OffsetFetch for group {group!r}")
            for topic in entry.topics:
                for part in topic.partitions:
                    if part.error_code:
                        raise KafkaError.for_code(part.error_code,
                                                  f"OffsetFetch {topic.name}-{part.partition_index}")
                    tp = TopicPartition(topic.name, part.partition_index)
                    if tp in out:
                        ranges = [(r.start, r.end) for r in part.committed_range_offsets or ()]
                        out[tp] = (part.committed_offset if part.committed_offset >= 0 else None, ranges)
        return out

    async def _coordinator_request(self, api_key: int, build) -> Any:
        """Send a group request to the coordinator, finding it (again) while the cluster
        answers that it is loading, moving or not available, within the request timeout."""
        try:
            return await self._coordinator_loop(api_key, build)
        except trio.TooSlowError:
            raise RequestTimedOutError(f"{ApiKey(api_key).name} for group {self.config.group_id!r} got no answer "
                                       f"within request_timeout_ms={self.config.request_timeout_ms}") from None

    async def _coordinator_loop(self, api_key: int, build) -> Any:
        with trio.fail_after(self._timeout()):
            while True:
                try:
                    connection = await self._coordinator()
                    version = connection.versions.get(api_key)
                    if version is None:
                        raise UnsupportedVersionError(f"the coordinator serves no {ApiKey(api_key).name} v8+")
                    response = await self._request(connection, api_key, version, build(version),
                                                   timeout=self._timeout())
                except _NETWORK_ERRORS as exc:
                    log.info("consumer: coordinator request failed (%r); finding it again", exc)
                    await self._drop_coordinator()
                    await trio.sleep(self.config.retry_backoff_ms / 1000)
                    continue
                codes = {p.error_code for t in getattr(response, "topics", ()) for p in t.partitions}
                codes |= {g.error_code for g in getattr(response, "groups", ())}
                if codes & COORDINATOR_RETRY_CODES:
                    self._metrics["retriable_errors"] += 1
                    await self._drop_coordinator()
                    await trio.sleep(self.config.retry_backoff_ms / 1000)
                    continue
                return response

    async def _coordinator(self) -> _Connection:
        if self._coordinator_connection is not None and not self._coordinator_connection.conn.closed:
            return self._coordinator_connection
        connection = await self._any_connection()
        version = connection.versions.get(ApiKey.FIND_COORDINATOR)
        if version is None:
            raise UnsupportedVersionError("the cluster serves no FindCoordinator v4")
        body = messages.new_body(ApiKey.FIND_COORDINATOR, version, "request", key_type=0,
                                 coordinator_keys=[self.config.group_id])
        response = await self._request(connection, ApiKey.FIND_COORDINATOR, version, body, timeout=self._timeout())
        (entry,) = response.coordinators
        if entry.error_code:
            if entry.error_code in COORDINATOR_RETRY_CODES:
                raise BrokerConnectionError(f"coordinator of {self.config.group_id!r} not available yet "
                                            f"(error {entry.error_code})")
            raise KafkaError.for_code(entry.error_code, f"FindCoordinator for group {self.config.group_id!r}")
        self._coordinator_connection = await self._open(entry.host, entry.port)
        return self._coordinator_connection

    async def _drop_coordinator(self) -> None:
        if self._coordinator_connection is not None:
            await self._drop(self._coordinator_connection)
            self._coordinator_connection = None

    def _require_group(self) -> str:
        if self.config.group_id is None:
            raise IllegalStateError("committed offsets belong to a group: set group_id")
        return self.config.group_id

    # -- poll ------------------------------------------------------------------------------
    async def poll(self, timeout: float = 0.0) -> ConsumerRecords:
        """Records of the assigned partitions, at most ``max_poll_records``, waiting up to
        ``timeout`` seconds for some; with fetch metadata for every partition that returned
        records or got a fetch response meanwhile."""
        self._require_started()
        if self._polling:
            raise IllegalStateError("poll is already running in another task")
        if not (isinstance(timeout, (int, float)) and timeout >= 0 and math.isfinite(timeout)):
            raise ValueError(f"timeout must be a finite number of seconds >= 0, got {timeout!r}")
        self._polling = True
        try:
            return await self._poll(trio.current_time() + timeout)
        finally:
            self._polling = False

    async def _poll(self, deadline: float) -> ConsumerRecords:
        received: set[TopicPartition] = set()
        while True:
            retry = False
            fetchable: list[TopicPartition] = []
            if self._prefetch is not None:
                # A fetch runs in the background: serve what is buffered, or wait for it.
                # Nothing else touches the connections meanwhile.
                if not any(self._buffers.has_buffered(tp) for tp in self._assignment):
                    with trio.move_on_at(deadline):
                        await self._prefetch.wait()
                if self._prefetch.is_set():
                    self._finish_prefetch(received)
            if self._prefetch is None:
                try:
                    retry = await self._prepare()
                    fetchable = self._fetchable()
                    if fetchable:
                        buffered = any(self._buffers.has_buffered(tp) for tp in self._assignment)
                        remaining_ms = max(0, int((deadline - trio.current_time()) * 1000))
                        wait_ms = 0 if buffered else min(self.config.fetch_max_wait_ms, remaining_ms)
                        retry = await self._fetch(fetchable, wait_ms, received) or retry
                except (*_NETWORK_ERRORS, RetriableError) as exc:
                    log.info("consumer: metadata or offsets request failed (%r); retrying", exc)
                    self._metadata_stale = True
                    retry = True
            result = self._drain(received)
            now = trio.current_time()
            if result or now >= deadline:
                self._start_prefetch()
                return result
            if self._prefetch is None and (retry or not fetchable):
                await trio.sleep(min(self.config.retry_backoff_ms / 1000, deadline - now))

    # -- background fetch ------------------------------------------------------------------
    def _start_prefetch(self) -> None:
        """Fetch the partitions ``poll`` just emptied while the application processes what
        it returned, so the next poll finds records waiting (one fetch in flight at most,
        only for partitions with nothing buffered: memory stays one fetch deep)."""
        if self._nursery is None or self._prefetch is not None or self._closed or self._metadata_stale:
            return
        if not self._fetchable():
            return
        done = trio.Event()
        self._prefetch = done
        self._nursery.start_soon(self._run_prefetch, done)

    async def _run_prefetch(self, done: trio.Event) -> None:
        received: set[TopicPartition] = set()
        try:
            fetchable = self._fetchable()  # again: assign or seek may have run since
            if fetchable:
                await self._fetch(fetchable, self.config.fetch_max_wait_ms, received)
        except (*_NETWORK_ERRORS, RetriableError) as exc:
            log.info("consumer: background fetch failed (%r); retrying", exc)
            self._metadata_stale = True
        except (ConsumerError, ProtocolError) as exc:
            self._prefetch_error = exc  # raised by the next poll
        finally:
            self._prefetch_received |= received
            done.set()

    def _finish_prefetch(self, received: set[TopicPartition]) -> None:
        self._prefetch = None
        received |= self._prefetch_received
        self._prefetch_received = set()
        error, self._prefetch_error = self._prefetch_error, None
        if error is not None:
            raise error

    def _drain(self, received: set[TopicPartition]) -> ConsumerRecords:
        records, positions = self._buffers.drain(self.config.max_poll_records)
        self._positions.update(positions)
        count = sum(len(r) for r in records.values())
        self._metrics["records_returned"] += count
        metadata = {}
        for tp in itertools.chain(records, received):
            ends = self._ends.get(tp)
            position = self._positions.get(tp)
            if ends is None or not isinstance(position, int) or tp in metadata:
                continue
            end = self._end_of(ends)
            metadata[tp] = FetchMetadata(ends.received_time, position, lag(end, position) or 0,
                                         ends.log_start_offset, end)
        return ConsumerRecords(records, metadata)

    def _end_of(self, ends: _EndOffsets) -> int:
        return ends.last_stable_offset if self._read_committed and ends.last_stable_offset >= 0 \
            else ends.high_watermark

    def _fetchable(self) -> list[TopicPartition]:
        out = []
        for tp in self._assignment:
            if not isinstance(self._positions.get(tp), int) or self._buffers.has_buffered(tp):
                continue
            if self._leader(tp) is not None:
                out.append(tp)
        return out

    def _leader(self, tp: TopicPartition) -> _PartitionMeta | None:
        topic = self._topics.get(tp.topic)
        meta = topic.partitions.get(tp.partition) if topic else None
        return meta if meta is not None and meta.leader >= 0 and meta.leader in self._nodes else None

    # -- metadata and offset resets -------------------------------------------------------
    async def _prepare(self) -> bool:
        """Refresh metadata when stale and resolve positions awaiting a reset. True when
        something is still missing (the caller backs off)."""
        retry = False
        if self._metadata_stale or any(self._leader(tp) is None for tp in self._assignment):
            retry = await self._refresh_metadata()
        # the group's offsets: where to start, and with individual commit what is done
        wanted = [tp for tp in self._assignment
                  if self._positions.get(tp) is None or (self._tracking and tp not in self._progress)]
        if wanted and self.config.group_id is not None:
            for tp, (offset, ranges) in (await self.committed_ranges(wanted)).items():
                if self._positions.get(tp) is None:
                    self._positions[tp] = offset if offset is not None else ("reset", self._policy_timestamp(tp))
                if self._tracking and tp not in self._progress:
                    self._progress[tp] = PartitionProgress(offset, ranges)
        pending = [tp for tp in self._assignment if not isinstance(self._positions.get(tp), int)]
        if pending:
            retry = await self._reset_offsets(pending) or retry
        return retry

    async def _any_connection(self) -> _Connection:
        if self._bootstrap is not None and not self._bootstrap.conn.closed:
            return self._bootstrap
        for node_id in list(self._connections):
            if not self._connections[node_id].conn.closed:
                return self._connections[node_id]
        errors = []
        for host, port in self.config.bootstrap_addresses:
            try:
                self._bootstrap = await self._open(host, port)
                self._metrics["reconnects"] += 1
                return self._bootstrap
            except _NETWORK_ERRORS as exc:
                errors.append(f"{host}:{port}: {exc!r}")
        raise BrokerConnectionError("no bootstrap server answered: " + "; ".join(errors))

    async def _refresh_metadata(self) -> bool:
        topics = sorted({tp.topic for tp in self._assignment})
        if not topics:
            self._metadata_stale = False
            return False
        connection = await self._any_connection()
        version = connection.versions[ApiKey.METADATA]
        cls = messages.body_class(ApiKey.METADATA, "request")
        body = messages.new_body(ApiKey.METADATA, version, "request",
                                 topics=[cls.MetadataRequestTopic(name=name) for name in topics],
                                 allow_auto_topic_creation=False)
        response = await self._request(connection, ApiKey.METADATA, version, body, timeout=self._timeout())
        self._metrics["metadata_refreshes"] += 1
        self._nodes = {b.node_id: (b.host, b.port) for b in response.brokers}
        for node_id in list(self._connections):
            if self._connections[node_id].conn.closed or node_id not in self._nodes:
                await self._drop(self._connections.pop(node_id))
        missing = False
        for entry in response.topics:
            if entry.error_code:
                if entry.error_code in METADATA_REFRESH_CODES:
                    missing = True
                    continue
                raise KafkaError.for_code(entry.error_code, f"metadata for topic {entry.name!r}")
            self._topics[entry.name] = _TopicMeta(
                entry.topic_id,
                {p.partition_index: _PartitionMeta(p.leader_id if p.error_code == 0 else -1, p.leader_epoch)
                 for p in entry.partitions},
            )
        for tp in self._assignment:
            topic = self._topics.get(tp.topic)
            if topic is not None and tp.partition not in topic.partitions and not missing:
                raise KafkaError.for_code(3, f"{tp.topic} has no partition {tp.partition}")
        missing = missing or any(self._leader(tp) is None for tp in self._assignment)
        self._metadata_stale = missing
        return missing

    def _reset_later(self, partitions: Sequence[TopicPartition], timestamp: int) -> None:
        for tp in partitions or list(self._assignment):
            self._require_assigned(tp)
            self._positions[tp] = ("reset", timestamp)  # resolved by the next poll
            self._buffers.clear(tp)

    def _reset_timestamp(self, tp: TopicPartition) -> int:
        pending = self._positions.get(tp)
        if isinstance(pending, tuple):
            return pending[1]
        return self._policy_timestamp(tp)

    def _policy_timestamp(self, tp: TopicPartition) -> int:
        policy = self.config.auto_offset_reset
        if policy == "none":
            raise NoOffsetForPartitionError(
                f"{tp.topic}-{tp.partition} has no position and auto_offset_reset is 'none': seek() first")
        return EARLIEST_TIMESTAMP if policy == "earliest" else LATEST_TIMESTAMP

    def _reset_progress(self, tp: TopicPartition, offset: int) -> None:
        """A reset skips the offsets between the group's S and the new position, as a
        standard consumer does when it commits its position after a reset: they are amended
        as gaps. With nothing committed S counts as 0 (the proxy's starting S too)."""
        if not self._tracking:
            return
        progress = self._progress.get(tp)
        if progress is None:
            progress = self._progress[tp] = PartitionProgress(None)
        if progress.stable is None:
            progress.stable = 0
        if offset > progress.stable:
            progress.mark(progress.stable, offset - 1)

    async def _reset_offsets(self, pending: list[TopicPartition]) -> bool:
        by_leader: dict[int, list[TopicPartition]] = {}
        for tp in pending:
            timestamp = self._reset_timestamp(tp)  # raises first under "none"
            meta = self._leader(tp)
            if meta is None:
                continue
            by_leader.setdefault(meta.leader, []).append((tp, timestamp))
        retry = len(by_leader) == 0
        for node_id, entries in by_leader.items():
            connection = await self._node(node_id)
            version = connection.versions[ApiKey.LIST_OFFSETS]
            cls = messages.body_class(ApiKey.LIST_OFFSETS, "request")
            topics: dict[str, list] = {}
            for tp, timestamp in entries:
                topics.setdefault(tp.topic, []).append(cls.ListOffsetsPartition(
                    partition_index=tp.partition, current_leader_epoch=self._leader(tp).leader_epoch,
                    timestamp=timestamp))
            body = messages.new_body(
                ApiKey.LIST_OFFSETS, version, "request", replica_id=-1,
                isolation_level=self.config.isolation_code, timeout_ms=self.config.request_timeout_ms,
                topics=[cls.ListOffsetsTopic(name=name, partitions=parts) for name, parts in topics.items()])
            response = await self._request(connection, ApiKey.LIST_OFFSETS, version, body,
                                                         timeout=self._timeout())
            for topic in response.topics:
                for part in topic.partitions:
                    tp = TopicPartition(topic.name, part.partition_index)
                    if tp not in self._assignment or isinstance(self._positions.get(tp), int):
                        continue
                    if part.error_code in METADATA_REFRESH_CODES:
                        self._metrics["retriable_errors"] += 1
                        self._metadata_stale = retry = True
                    elif part.error_code:
                        raise KafkaError.for_code(part.error_code, f"ListOffsets {tp.topic}-{tp.partition}")
                    else:
                        self._positions[tp] = part.offset
                        self._metrics["offset_resets"] += 1
                        self._reset_progress(tp, part.offset)
        return retry

    # -- fetch -----------------------------------------------------------------------------
    async def _fetch(self, partitions: list[TopicPartition], wait_ms: int, received: set[TopicPartition]) -> bool:
        by_leader: dict[int, list[TopicPartition]] = {}
        for tp in partitions:
            by_leader.setdefault(self._leader(tp).leader, []).append(tp)
        outcomes: list[bool | BaseException] = []

        async def fetch_from(node_id: int, tps: list[TopicPartition]) -> None:
            try:
                outcomes.append(await self._fetch_from(node_id, tps, wait_ms, received))
            except _NETWORK_ERRORS as exc:
                log.info("consumer: fetch from node %s failed (%r); reconnecting", node_id, exc)
                self._metadata_stale = True
                outcomes.append(True)
            except (ConsumerError, ProtocolError) as exc:
                outcomes.append(exc)

        async with trio.open_nursery() as nursery:
            for node_id, tps in by_leader.items():
                nursery.start_soon(fetch_from, node_id, tps)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return any(outcomes)

    async def _fetch_from(self, node_id: int, tps: list[TopicPartition], wait_ms: int,
                          received: set[TopicPartition]) -> bool:
        connection = await self._node(node_id)
        version = connection.versions[ApiKey.FETCH]
        ranged = [tp for tp in tps if self._assignment[tp]]
        if ranged and not connection.filters_ranges:
            host, port = self._nodes[node_id]
            raise RangeFetchNotSupportedError(
                f"node {node_id} at {host}:{port} does not advertise {RANGE_FETCH_FEATURE} "
                f"(Fetch v{version}); it cannot serve the key ranges of "
                f"{', '.join(f'{tp.topic}-{tp.partition}' for tp in ranged)}")
        # rotate the partition order so that no partition is always last in the response
        shift = next(self._request_order) % len(tps)
        tps = tps[shift:] + tps[:shift]
        cls = messages.body_class(ApiKey.FETCH, "request")
        topics: dict[str, list] = {}
        offsets: dict[TopicPartition, int] = {}
        for tp in tps:
            offsets[tp] = self._positions[tp]
            ranges = self._assignment[tp]
            topics.setdefault(tp.topic, []).append(cls.FetchPartition(
                partition=tp.partition, current_leader_epoch=self._leader(tp).leader_epoch,
                fetch_offset=offsets[tp], partition_max_bytes=self.config.max_partition_fetch_bytes,
                key_ranges=[cls.KeyRange(start=r.start, end=r.end) for r in ranges] if ranges else None))
        body = messages.new_body(
            ApiKey.FETCH, version, "request", replica_id=-1, max_wait_ms=wait_ms, min_bytes=1,
            max_bytes=self.config.fetch_max_bytes, isolation_level=self.config.isolation_code,
            session_id=0, session_epoch=-1, rack_id="",
            topics=[cls.FetchTopic(topic=name, topic_id=self._topics[name].topic_id, partitions=parts)
                    for name, parts in topics.items()])
        self._metrics["fetch_requests"] += 1
        response = await self._request(connection, ApiKey.FETCH, version, body,
                                                     timeout=self._timeout() + wait_ms / 1000)
        received_time = time.time()
        if response.error_code:
            if response.error_code in METADATA_REFRESH_CODES:
                self._metadata_stale = True
                return True
            raise KafkaError.for_code(response.error_code, f"Fetch from node {node_id}")
        names = {meta.topic_id: name for name, meta in self._topics.items()}
        retry = False
        for topic in response.responses:
            name = topic.topic if version < 13 else names.get(topic.topic_id)
            for part in topic.partitions:
                tp = TopicPartition(name, part.partition_index)
                if tp not in offsets or self._positions.get(tp) != offsets[tp] or self._buffers.has_buffered(tp):
                    continue  # reassigned or moved by seek meanwhile: the data is stale
                retry = self._handle_partition(tp, part, offsets[tp], received_time, received) or retry
        return retry

    def _handle_partition(self, tp: TopicPartition, part, fetch_offset: int, received_time: float,
                          received: set[TopicPartition]) -> bool:
        code = part.error_code
        if code in METADATA_REFRESH_CODES:
            self._metrics["retriable_errors"] += 1
            self._metadata_stale = True
            return True
        if code == OffsetOutOfRangeError.code:
            if self.config.auto_offset_reset == "none":
                raise OffsetOutOfRangeError(f"{tp.topic}-{tp.partition} offset {fetch_offset} is out of range "
                                            f"and auto_offset_reset is 'none'")
            log.info("consumer: %s-%s offset %s out of range; resetting to %s", tp.topic, tp.partition,
                     fetch_offset, self.config.auto_offset_reset)
            self._positions[tp] = ("reset", self._policy_timestamp(tp))
            return False
        if code:
            raise KafkaError.for_code(code, f"Fetch {tp.topic}-{tp.partition} at offset {fetch_offset}")
        ranges = self._assignment[tp]
        if ranges:
            applied = part.key_ranges_applied
            if applied is None or normalize(KeyRange(r.start, r.end) for r in applied) != normalize(ranges):
                # not filtered (or filtered differently): the local check below decides
                self._metrics["unfiltered_range_responses"] += 1
        parsed = parse_partition(
            tp, part.records, fetch_offset,
            aborted_transactions=[(a.producer_id, a.first_offset) for a in part.aborted_transactions or ()],
            read_committed=self._read_committed, ranges=ranges or None, amend_gaps=tp in self._progress)
        self._metrics["records_outside_ranges"] += parsed.outside_ranges
        self._metrics["aborted_records_dropped"] += parsed.aborted
        progress = self._progress.get(tp)
        if progress is not None:
            for start, end in parsed.gaps:
                progress.mark(start, end)
            if progress.covers_from(fetch_offset):  # else no record can be committed already
                fresh = [r for r in parsed.records if not progress.already_committed(r.offset)]
                self._metrics["records_already_committed"] += len(parsed.records) - len(fresh)
                parsed.records = fresh
        self._ends[tp] = _EndOffsets(received_time, part.high_watermark, part.last_stable_offset,
                                     part.log_start_offset)
        received.add(tp)
        if parsed.records:
            self._buffers.add(tp, parsed.records, parsed.next_offset)
        else:
            self._positions[tp] = parsed.next_offset
        return False

    # -- connections -----------------------------------------------------------------------
    def _timeout(self) -> float:
        return self.config.request_timeout_ms / 1000

    async def _node(self, node_id: int) -> _Connection:
        connection = self._connections.get(node_id)
        if connection is not None and not connection.conn.closed:
            return connection
        host, port = self._nodes[node_id]
        connection = await self._open(host, port)
        if node_id in self._nodes_opened:
            self._metrics["reconnects"] += 1
        self._nodes_opened.add(node_id)
        self._connections[node_id] = connection
        return connection

    async def _drop(self, connection: _Connection) -> None:
        with trio.CancelScope(shield=True):
            await connection.conn.aclose()

    async def _request(self, connection: _Connection, api_key: int, version: int, body: Any, *,
                       timeout: float) -> Any:
        """One request; a connection that failed or was cancelled mid-request is closed, so a
        late response can never be read as the answer to the next request."""
        try:
            return await connection.conn.request(api_key, version, body, timeout=timeout)
        except BaseException:
            await self._drop(connection)
            raise

    async def _open(self, host: str, port: int) -> _Connection:
        conn = await BrokerConnection.open(host, port, client_id=self.config.client_id, timeout=self._timeout())
        try:
            body = messages.new_body(ApiKey.API_VERSIONS, 3, "request", client_software_name="keyrange-consumer",
                                     client_software_version="1")
            response = await conn.request(ApiKey.API_VERSIONS, 3, body, timeout=self._timeout())
            if response.error_code:
                raise KafkaError.for_code(response.error_code, f"ApiVersions from {host}:{port}")
            theirs = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
            versions = {}
            for api_key, floor in _VERSION_FLOOR.items():
                ours = messages.supported_versions(api_key)
                low, high = theirs.get(api_key, (0, -1))
                version = min(_VERSION_CEILING[api_key], ours[1], high)
                if version < max(floor, low, ours[0]):
                    raise UnsupportedVersionError(
                        f"{host}:{port} serves {ApiKey(api_key).name} v{low}-{high}; this consumer needs "
                        f"v{max(floor, ours[0])}-{min(_VERSION_CEILING[api_key], ours[1])}")
                versions[api_key] = version
            for api_key, (floor, ceiling) in _GROUP_VERSIONS.items():
                low, high = theirs.get(api_key, (0, -1))
                version = min(ceiling, messages.supported_versions(api_key)[1], high)
                if version >= max(floor, low):
                    versions[api_key] = version
            features = frozenset(f.name for f in response.supported_features or ())
        except BaseException:
            with trio.CancelScope(shield=True):
                await conn.aclose()
            raise
        return _Connection(conn, versions, features)

    def _require_started(self) -> None:
        if self._closed:
            raise IllegalStateError("the consumer is closed")
        if not self._started:
            raise IllegalStateError("the consumer is not started: use `async with Consumer(...)` or await start()")

    def _require_assigned(self, tp: TopicPartition) -> None:
        if tp not in self._assignment:
            raise IllegalStateError(f"{tp[0]}-{tp[1]} is not assigned to this consumer")


def _first_error(response, group: str) -> KafkaError | None:
    """The first partition error of an OffsetCommit response, as a typed error."""
    for topic in response.topics:
        for part in topic.partitions:
            if part.error_code:
                return KafkaError.for_code(part.error_code,
                                           f"OffsetCommit {topic.name}-{part.partition_index} for group {group!r}")
    return None
