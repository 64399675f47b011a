"""A Kafka consumer on trio that speaks the proxy's extensions (key-range fetch, individual
commit, cooperative fetch). It is either a member of its group (``subscribe``: the group
shares the topics' partitions among its members, by key range once members outnumber
partitions; docs/consumer.md, "Groups") or on its own (``assign``: the application names
the partitions and their key ranges):

    async with Consumer("127.0.0.1:9092", auto_offset_reset="earliest") as consumer:
        consumer.assign({TopicPartition("orders", 0): [equal_shares(4)[i]]})
        # or, with a group_id: consumer.subscribe(["orders"])
        while True:
            for record in await consumer.poll(1.0):
                ...

Each assigned partition may carry key ranges (docs/wire-contract.md#2-key-hash-and-ranges); an empty list means
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
whole-partition assignments: with ``assign`` as a simple group (generation -1), after
``subscribe`` as the group's member (its generation and member id).

With ``allow_individual_commit`` the application marks records processed in any order
(``mark_processed``) and ``commit`` sends exactly those offsets as OffsetRanges (docs/wire-contract.md
section 3), together with the offsets nobody will process (control batches, aborted
transactions, and for a whole partition the offsets compaction removed: gap amending). On
start the consumer reads the group's stable offset S and ranges R and never hands out a
record they already cover. Where the proxy does not advertise ``individual.commit`` it
falls back to plain commits of the contiguous processed prefix.

``assign(partitions, cooperative=True)`` (or ``partition_sharing="cooperative"`` in a group)
shares whole partitions with the group's other members by chunks of offsets the proxy hands
out (docs/wire-contract.md#37-cooperative-fetch): no per-key order, individual commit of
each chunk's offsets, and where the proxy does not advertise ``cooperative.fetch`` a
``CooperativeFetchNotSupportedError``.

This class is the facade; each job is a module of its own (docs/consumer.md, "How the
consumer is built"): ``connection`` (ApiVersions, features, a connection per node),
``metadata`` (leaders), ``offsets`` (where partitions start), ``assignment`` (per-partition
state), ``fetch_protocol`` and ``fetcher`` (fetching), ``coordinator``,
``commit_protocol`` and ``committer`` (committed offsets).
"""

from __future__ import annotations

import logging
import math
import re
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import trio

from proxy.client.assignment import (
    AssignmentInput,
    AssignmentState,
    check_assignment,
)
from proxy.client.committer import Committer
from proxy.client.config import ConsumerConfig
from proxy.client.connection import (
    COOPERATIVE_FETCH_FEATURE,
    NETWORK_ERRORS,
    RANGE_FETCH_FEATURE,
    RETRIABLE_FAILURES,
    Connections,
    NodeConnection,
)
from proxy.client.consumer_commits import ConsumerCommits
from proxy.client.consumer_positions import ConsumerPositions
from proxy.client.coordinator import Coordinator
from proxy.client.errors import (
    ConfigError,
    CooperativeFetchNotSupportedError,
    IllegalStateError,
    NetworkExceptionError,
    RangeFetchNotSupportedError,
)
from proxy.client.fetch_protocol import CooperativeMember
from proxy.client.fetcher import Fetcher
from proxy.client.group import GroupMember, RebalanceListener
from proxy.client.membership import Phase
from proxy.client.metadata import ClusterMetadata, refresh_metadata
from proxy.client.offsets import OffsetResolver
from proxy.client.records import ConsumerRecords, TopicPartition
from proxy.protocol.constants import ErrorCode
from proxy.protocol.message_types import MetadataRequest, MetadataResponse
from proxy.protocol.messages import ApiKey
from proxy.ranges import KeyRange

log = logging.getLogger(__name__)

METRIC_NAMES = ("records_outside_ranges", "unfiltered_range_responses", "range_responses_discarded",
                "aborted_records_dropped",
                "records_returned", "fetch_requests", "metadata_refreshes", "offset_resets", "reconnects",
                "retriable_errors", "records_already_committed", "records_skipped_by_reset", "range_commits",
                "plain_commits", "range_commits_deferred",
                "partitions_lost", "revocations", "cooperative_chunks", "cooperative_records",
                "cooperative_records_outside_chunk")


@asynccontextmanager
async def background_nursery() -> AsyncIterator[trio.Nursery]:
    """A nursery for background tasks, cancelled when the block ends. The block's own
    exception never enters the nursery: it propagates as raised, not inside an exception
    group, once the background tasks are gone."""
    raised: BaseException | None = None
    async with trio.open_nursery() as nursery:
        try:
            yield nursery
        except BaseException as exc:
            raised = exc
        nursery.cancel_scope.cancel()
    if raised is not None:
        raise raised


class Consumer(ConsumerCommits, ConsumerPositions):
    """See the module documentation. Settings are Kafka's consumer settings in snake case;
    see ``ConsumerConfig`` for the defaults."""

    def __init__(self, bootstrap_servers: str | Sequence[str], **settings: Any) -> None:
        if not isinstance(bootstrap_servers, str) and isinstance(bootstrap_servers, Sequence):
            bootstrap_servers = list(bootstrap_servers)
        self.config = config = ConsumerConfig(bootstrap_servers, **settings)
        self._metrics: Counter[str] = Counter()
        # the member id of cooperative fetches in assign mode (a group member uses the group's)
        self.cooperative_member_id = f"{config.client_id}-{uuid.uuid4()}"
        timeout = config.request_timeout_ms / 1000
        self._state = AssignmentState(read_committed=config.isolation_level == "read_committed",
                                      tracking=config.allow_individual_commit)
        self._metadata = ClusterMetadata()
        self._connections = Connections(config.bootstrap_addresses, client_id=config.client_id, timeout=timeout,
                                        metrics=self._metrics)
        self._coordinator: Coordinator | None = None
        self._committer: Committer | None = None
        if config.group_id is not None:
            self._coordinator = Coordinator(config.group_id, self._connections,
                                            retry_backoff=config.retry_backoff_ms / 1000, metrics=self._metrics)
            self._committer = Committer(self._coordinator, self._state, self._metadata,
                                        max_ranges=config.individual_commit_max_ranges, metrics=self._metrics)
        self._offsets = OffsetResolver(self._state, self._metadata, self._connections, self._committer,
                                       auto_offset_reset=config.auto_offset_reset,
                                       isolation_level=config.isolation_code, timeout_ms=config.request_timeout_ms,
                                       metrics=self._metrics)
        self._fetcher = Fetcher(self._state, self._metadata, self._connections, max_wait_ms=config.fetch_max_wait_ms,
                                max_bytes=config.fetch_max_bytes,
                                partition_max_bytes=config.max_partition_fetch_bytes,
                                isolation_level=config.isolation_code, auto_offset_reset=config.auto_offset_reset,
                                metrics=self._metrics, member=self._cooperative_member, on_fenced=self._fenced)
        self._group: GroupMember | None = None
        if config.group_id is not None and self._committer is not None:
            self._group = GroupMember(config, self._connections, self._state, self._committer, metrics=self._metrics,
                                      set_ranges=self._set_group_ranges, commit_supported=self._commit_supported)
        self._subscribed = False
        self._pattern: re.Pattern[str] | None = None
        self._started = False
        self._closed = False
        self._polling = False
        self._running: AsyncExitStack | None = None  # set under `async with`

    # -- lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> Consumer:
        if self._running is not None:
            raise IllegalStateError("the consumer is already in an `async with` block")
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(self._run())
            self._running = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        running, self._running = self._running, None
        if running is None:
            return None
        return await running.__aexit__(*exc_info)

    @asynccontextmanager
    async def _run(self) -> AsyncIterator[None]:
        """Started, with the background fetch's nursery, for the length of the block; on
        the way out the background fetch is cancelled first, then every connection closed."""
        started = False
        try:
            async with background_nursery() as nursery:
                await self.start()
                started = True
                self._fetcher.attach(nursery)
                if self._group is not None:
                    nursery.start_soon(self._group.run)
                try:
                    yield
                finally:
                    self._fetcher.attach(None)
                    if self._group is not None:
                        await self._group.close()  # LeaveGroup before the connections go
        finally:
            if started:
                await self.close()

    async def start(self) -> None:
        """Connect to a bootstrap server and learn its versions and features."""
        if self._closed:
            raise IllegalStateError("the consumer is closed")
        if self._started:
            return
        await self._connections.connect_bootstrap()
        self._started = True

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._group is not None:
            await self._group.close()
        await self._connections.aclose()
        if self._coordinator is not None:
            await self._coordinator.aclose()

    @property
    def range_fetch_supported(self) -> bool:
        """Whether the bootstrap connection advertises ``keyrange.fetch``."""
        return self._bootstrap().filters_ranges

    @property
    def individual_commit_supported(self) -> bool:
        """Whether the bootstrap connection advertises ``individual.commit``."""
        return self._bootstrap().commits_ranges

    @property
    def cooperative_fetch_supported(self) -> bool:
        """Whether the bootstrap connection advertises ``cooperative.fetch``."""
        return self._bootstrap().fetches_cooperatively

    # -- assignment and positions ---------------------------------------------------------
    def assign(self, assignment: AssignmentInput, *, cooperative: bool = False) -> None:
        """Replace the assignment. A mapping gives each partition its key ranges (an empty
        list: the whole partition); a plain sequence of partitions assigns them whole.
        Ranges must be sorted, disjoint and within [0, 2^63 - 1].

        ``cooperative=True``: every partition listed is whole and shared with the other
        consumers of ``group_id`` that fetch it cooperatively: the proxy hands each fetch
        the next chunk of offsets nobody has had (docs/wire-contract.md#37-cooperative-fetch).
        No per-key order; needs ``allow_individual_commit`` (each member commits its own
        chunks' offsets) and a proxy that advertises ``cooperative.fetch``."""
        bootstrap = self._bootstrap()
        if self._subscribed:
            raise IllegalStateError("the consumer is subscribed: its group assigns its partitions (unsubscribe first)")
        if not isinstance(cooperative, bool):
            raise ValueError(f"cooperative must be a bool, got {type(cooperative).__name__} {cooperative!r}")
        new = check_assignment(assignment)
        if cooperative:
            self._check_cooperative(new, bootstrap)
        for tp, ranges in new.items():
            if ranges and not bootstrap.filters_ranges:
                raise RangeFetchNotSupportedError(
                    f"{tp.topic}-{tp.partition} is assigned key ranges, but the cluster at "
                    f"{self.config.bootstrap_servers} does not advertise {RANGE_FETCH_FEATURE} "
                    f"(connect through a keyrange-proxy)")
        self._state.assign(new, new if cooperative else ())
        if any(not self._metadata.knows(tp.topic) for tp in new):
            self._metadata.stale = True

    def _check_cooperative(self, new: Mapping[TopicPartition, Sequence[KeyRange]], bootstrap: NodeConnection) -> None:
        if self.config.group_id is None:
            raise ConfigError("assign(..., cooperative=True) needs a group_id: the group names the consumers that "
                              "share the partitions, and their commits belong to it")
        if not self.config.allow_individual_commit:
            raise ConfigError("assign(..., cooperative=True) needs allow_individual_commit=True: each consumer "
                              "commits the offsets of the chunks it was handed as ranges (mark_processed, commit)")
        ranged = [f"{tp.topic}-{tp.partition}" for tp, ranges in new.items() if ranges]
        if ranged:
            raise ConfigError(f"assign(..., cooperative=True) shares whole partitions by offset chunks, but "
                              f"{', '.join(ranged)} {'is' if len(ranged) == 1 else 'are'} given key ranges: "
                              f"list the partitions without ranges, or assign ranges without cooperative=True")
        if new and not bootstrap.fetches_cooperatively:
            raise CooperativeFetchNotSupportedError(
                f"{', '.join(f'{tp.topic}-{tp.partition}' for tp in new)} would be fetched cooperatively, but the "
                f"cluster at {self.config.bootstrap_servers} does not advertise {COOPERATIVE_FETCH_FEATURE} "
                f"(connect through a keyrange-proxy with cooperative.fetch.enabled=true)")

    def cooperative_partitions(self) -> set[TopicPartition]:
        """The assigned partitions fetched cooperatively."""
        return set(self._state.cooperative)

    def _cooperative_member(self) -> CooperativeMember | None:
        """Who fetches the cooperative partitions now: a group member with its id and
        generation while it holds one (None between generations: its cooperative
        partitions wait), in assign mode this consumer's own id with generation -1."""
        group_id = self.config.group_id
        if group_id is None:
            return None
        if self._group is not None and self._subscribed:
            m = self._group.membership
            if not m.member_id or m.generation < 0 or m.phase == Phase.UNJOINED:
                return None
            return CooperativeMember(group_id, m.member_id, m.generation)
        return CooperativeMember(group_id, self.cooperative_member_id, -1)

    def _fenced(self, generation: int) -> None:
        """A cooperative fetch with ``generation`` was refused as a zombie's: rejoin."""
        if self._group is not None and self._subscribed:
            self._group.fetch_fenced(generation)

    # -- group membership -----------------------------------------------------------------
    def subscribe(self, topics: Sequence[str] | str | re.Pattern[str],
                  listener: RebalanceListener | None = None) -> None:
        """Join ``group_id`` and let it share ``topics`` (names, or a regex pattern matched
        against the cluster's topics at every join) among its members: whole partitions
        while members <= partitions, key ranges beyond (docs/consumer.md, "Groups").
        ``listener`` gets ``on_assigned``, ``on_revoked`` and ``on_lost`` inside ``poll``.
        With ``partition_sharing="cooperative"`` members beyond the partition count share
        whole partitions by offset chunks instead (docs/consumer.md, "Sharing a partition
        without key order"), which needs a proxy that advertises ``cooperative.fetch``."""
        self._require_started()
        if self._group is None:
            raise IllegalStateError("subscribe needs a group_id")
        if self.config.partition_sharing == "cooperative" and not self._bootstrap().fetches_cooperatively:
            raise CooperativeFetchNotSupportedError(
                f"partition_sharing='cooperative', but the cluster at {self.config.bootstrap_servers} does not "
                f"advertise {COOPERATIVE_FETCH_FEATURE} (connect through a keyrange-proxy with "
                f"cooperative.fetch.enabled=true, or share by key range)")
        if self._state.partitions() and not self._subscribed:
            raise IllegalStateError("the consumer has partitions assigned by assign(): assign({}) first")
        if isinstance(topics, (str, re.Pattern)):
            self._pattern = re.compile(topics) if isinstance(topics, str) else topics
            names: list[str] = []
        else:
            names = [t for t in topics]
            if not names or not all(isinstance(t, str) and t for t in names):
                raise ValueError(f"topics must be a non-empty list of topic names or a pattern, got {topics!r}")
            self._pattern = None
        self._subscribed = True
        self._group.subscribe(names, listener)
        if self._pattern is not None:
            self._group.pattern = self._pattern

    async def unsubscribe(self) -> None:
        """Leave the group (LeaveGroup) and drop every partition; nothing is revoked
        cooperatively, so commit first."""
        if self._group is not None and self._subscribed:
            await self._group.unsubscribe()
        self._subscribed = False

    def subscription(self) -> list[str]:
        return list(self._group.membership.topics) if self._group is not None and self._subscribed else []

    def to_be_revoked(self) -> set[TopicPartition]:
        """KIP-983: partitions with ranges being revoked: none of their records is handed
        out any more, and the revocation completes at the start of a later poll, once the
        records of them already handed out are marked processed (and committed)."""
        return self._group.to_be_revoked() if self._group is not None else set()

    def to_be_revoked_ranges(self) -> dict[TopicPartition, list[KeyRange]]:
        return self._group.to_be_revoked_ranges() if self._group is not None else {}

    def lost(self) -> set[TopicPartition]:
        """KIP-983: partitions lost during the last poll (fenced, or the poll interval
        expired): commit nothing of them."""
        return self._group.lost() if self._group is not None else set()

    def delay_revoke(self, partitions: Sequence[TopicPartition]) -> bool:
        """KIP-983: keep ``partitions`` one more poll before their revocation completes.
        False (and nothing delayed) when some of them are not being revoked (lost)."""
        return self._group.delay_revoke(partitions) if self._group is not None else False

    def group_metadata(self) -> dict[str, object]:
        """The member's generation, id, protocol and whether it leads (for tests and tools)."""
        if self._group is None:
            return {}
        m = self._group.membership
        return {"generation": m.generation, "member_id": m.member_id, "protocol": m.protocol,
                "leader": m.is_leader, "phase": m.phase.value, "rebalances": self._group.rebalances}

    def _set_group_ranges(self, ranges: Mapping[TopicPartition, Sequence[KeyRange]],
                          paused: Iterable[TopicPartition], cooperative: Iterable[TopicPartition] = ()) -> None:
        """The group changed what this member fetches (``cooperative``: those of its
        partitions it fetches cooperatively)."""
        new = {TopicPartition(*tp): list(r) for tp, r in ranges.items()}
        self._state.assign(new, cooperative)
        self._state.pause(paused)
        if any(not self._metadata.knows(tp.topic) for tp in new):
            self._metadata.stale = True

    async def _commit_supported(self) -> bool:
        return (await self._any_connection()).commits_ranges

    async def _any_connection(self) -> NodeConnection:
        """A connection for a call outside the poll loop's retries: a failure to open one
        is the retriable ``NetworkExceptionError``, not the transport's own exception."""
        try:
            return await self._connections.any()
        except NETWORK_ERRORS as exc:
            raise NetworkExceptionError(f"no connection to the cluster: {exc}") from exc

    def assignment(self) -> dict[TopicPartition, list[KeyRange]]:
        return {tp: list(ranges) for tp, ranges in self._state.ranges.items()}

    def metrics(self) -> dict[str, int]:
        """Counters: ``cooperative_chunks`` (chunks received), ``cooperative_records``
        (their records handed to poll), ``cooperative_records_outside_chunk`` (dropped:
        sent outside the chunk, or without one), ``records_outside_ranges`` (dropped: key hash outside the assignment),
        ``unfiltered_range_responses`` (a ranged partition answered without
        KeyRangesApplied), ``range_responses_discarded`` (answers filtered for ranges not
        covering the assignment, refused whole), ``aborted_records_dropped``, ``records_returned``,
        ``fetch_requests``, ``metadata_refreshes``, ``offset_resets``, ``reconnects``,
        ``retriable_errors``, ``records_already_committed`` (skipped: the group's S or R
        covers them), ``records_skipped_by_reset`` (a key-range member's own records below
        its reset point, committed as skipped), ``range_commits`` and ``plain_commits``
        (acknowledged partitions), ``range_commits_deferred`` (partitions whose ranges a
        commit left pending because the group's state of the partition is at the proxy's
        ``max.individual.commit.ranges.held``: docs/consumer.md)."""
        return {key: self._metrics[key] for key in METRIC_NAMES} | dict(self._metrics)

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
            if self._group is not None and self._subscribed:
                await self._group.before_poll(self._pattern_topics)
            records = await self._poll(trio.current_time() + timeout)
            if self._group is not None and self._subscribed and self._state.tracking and records:
                self._group.handed.handed(records)  # for revocations: assign mode has none
            return records
        finally:
            self._polling = False

    async def _pattern_topics(self) -> list[str] | None:
        """With a pattern subscription, the cluster's topics that match it now."""
        if self._pattern is None:
            return None
        connection = await self._connections.any()
        version = connection.versions[ApiKey.METADATA]
        body = MetadataRequest(topics=None, allow_auto_topic_creation=False)
        response: MetadataResponse = await self._connections.request(connection, ApiKey.METADATA, version, body)
        pattern = self._pattern
        return sorted(t.name for t in response.topics if t.error_code == ErrorCode.NONE and t.name is not None
                      and pattern.fullmatch(t.name) and not t.is_internal)

    async def _poll(self, deadline: float) -> ConsumerRecords:
        fetcher, state = self._fetcher, self._state
        received: set[TopicPartition] = set()
        while True:
            retry = False
            fetchable: list[TopicPartition] = []
            if fetcher.background_running:
                # A fetch runs in the background: serve what is buffered, or wait for it.
                # Nothing else touches the connections meanwhile.
                if not state.any_buffered():
                    await fetcher.wait_background(deadline)
                fetcher.take_background(received)
            if not fetcher.background_running:
                try:
                    retry = await self._prepare()
                    fetchable = fetcher.fetchable()
                    if fetchable:
                        remaining_ms = max(0, int((deadline - trio.current_time()) * 1000))
                        wait_ms = 0 if state.any_buffered() else min(self.config.fetch_max_wait_ms, remaining_ms)
                        retry = await fetcher.fetch(fetchable, wait_ms, received) or retry
                except RETRIABLE_FAILURES as exc:
                    log.info("consumer: metadata or offsets request failed (%r); retrying", exc)
                    self._metadata.stale = True
                    retry = True
            result = state.drain(self.config.max_poll_records, received)
            self._metrics["records_returned"] += len(result)
            now = trio.current_time()
            if result or now >= deadline:
                if not self._closed:
                    fetcher.start_background()
                return result
            if not fetcher.background_running and (retry or not fetchable):
                await trio.sleep(min(self.config.retry_backoff_ms / 1000, deadline - now))

    async def _prepare(self) -> bool:
        """Refresh metadata when stale and give every partition a position. True when
        something is still missing (the caller backs off)."""
        retry = False
        partitions = self._state.partitions()
        if self._metadata.stale or any(self._metadata.leader(tp) is None for tp in partitions):
            retry = await refresh_metadata(self._metadata, self._connections, partitions, self._metrics)
        return await self._offsets.resolve() or retry

    # -- checks ----------------------------------------------------------------------------
    def _bootstrap(self) -> NodeConnection:
        self._require_started()
        bootstrap = self._connections.bootstrap
        if bootstrap is None:
            raise IllegalStateError("the consumer has no bootstrap connection")
        return bootstrap

    def _require_started(self) -> None:
        if self._closed:
            raise IllegalStateError("the consumer is closed")
        if not self._started:
            raise IllegalStateError("the consumer is not started: use `async with Consumer(...)` or await start()")

    def _require_assigned(self, tp: TopicPartition) -> None:
        if tp not in self._state:
            raise IllegalStateError(f"{tp[0]}-{tp[1]} is not assigned to this consumer")

    def _require_group(self) -> Committer:
        if self._committer is None:
            raise IllegalStateError("committed offsets belong to a group: set group_id")
        return self._committer
