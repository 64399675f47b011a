"""Fetching: one sessionless Fetch per leader, concurrently, and at most one fetch in the
background while the application works.

Requests are built and answers taken in by ``fetch_protocol`` (sans I/O); this module
only groups partitions by leader, sends, and runs the background fetch in the nursery
the consumer's ``async with`` owns. A background fetch covers only partitions with nothing
buffered, so memory stays one fetch deep; its error is raised by the next ``poll``.

Cooperative partitions (docs/wire-contract.md#37-cooperative-fetch) are fetched with the
member identity ``member()`` gives at the time (none: they wait, as a group member that is
between generations does); key ranges and cooperative partitions of one leader go in two
requests, the second without waiting at the broker (the first already did).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter
from collections.abc import Callable

import trio

from proxy.client.assignment import AssignmentState, narrows
from proxy.client.connection import (
    COOPERATIVE_FETCH_FEATURE,
    NETWORK_ERRORS,
    RANGE_FETCH_FEATURE,
    RETRIABLE_FAILURES,
    Connections,
    NodeConnection,
)
from proxy.client.errors import ConsumerError, CooperativeFetchNotSupportedError, RangeFetchNotSupportedError
from proxy.client.fetch_protocol import (
    CooperativeMember,
    FetchLimits,
    FetchPosition,
    apply_fetch_response,
    fetch_request,
    rotated,
)
from proxy.client.metadata import ClusterMetadata
from proxy.client.records import TopicPartition
from proxy.protocol.errors import ProtocolError
from proxy.protocol.messages import ApiKey

log = logging.getLogger(__name__)


class Fetcher:
    def __init__(self, state: AssignmentState, metadata: ClusterMetadata, connections: Connections, *,
                 max_wait_ms: int, max_bytes: int, partition_max_bytes: int, isolation_level: int,
                 auto_offset_reset: str, metrics: Counter[str],
                 member: Callable[[], CooperativeMember | None] = lambda: None,
                 on_fenced: Callable[[int], None] = lambda generation: None) -> None:
        self._state = state
        self._member = member  # who fetches cooperative partitions now (None: nobody, wait)
        self._on_fenced = on_fenced  # a cooperative fetch of this generation got ILLEGAL_GENERATION
        self._metadata = metadata
        self._connections = connections
        self._max_wait_ms = max_wait_ms
        self._max_bytes = max_bytes
        self._partition_max_bytes = partition_max_bytes
        self._isolation_level = isolation_level
        self._auto_offset_reset = auto_offset_reset
        self._metrics = metrics
        self._request_order = itertools.count()
        self._nursery: trio.Nursery | None = None
        self._background: trio.Event | None = None
        self._background_received: set[TopicPartition] = set()
        self._background_error: BaseException | None = None

    def fetchable(self) -> list[TopicPartition]:
        """Partitions to fetch now; cooperative ones only while there is a member to fetch
        them as (else the poll loop would spin on partitions it cannot fetch)."""
        state = self._state
        tps = state.fetchable(lambda tp: self._metadata.leader(tp) is not None)
        if state.cooperative and any(tp in state.cooperative for tp in tps) and self._member() is None:
            tps = [tp for tp in tps if tp not in state.cooperative]
        return tps

    # -- foreground -------------------------------------------------------------------
    async def fetch(self, partitions: list[TopicPartition], wait_ms: int, received: set[TopicPartition]) -> bool:
        """Fetch ``partitions`` from their leaders concurrently. True when something must be
        retried (metadata is stale); a leader that cannot be reached marks it stale."""
        by_leader: dict[int, list[TopicPartition]] = {}
        for tp in partitions:
            leader = self._metadata.leader(tp)
            if leader is not None:
                by_leader.setdefault(leader.leader, []).append(tp)
        outcomes: list[bool | BaseException] = []

        async def fetch_from(node_id: int, tps: list[TopicPartition]) -> None:
            try:
                outcomes.append(await self._fetch_from(node_id, tps, wait_ms, received))
            except NETWORK_ERRORS as exc:
                log.info("consumer: fetch from node %s failed (%r); reconnecting", node_id, exc)
                self._metadata.stale = True
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
        state, metadata = self._state, self._metadata
        address = metadata.nodes[node_id]
        connection = await self._connections.node(node_id, address)
        version = connection.versions[ApiKey.FETCH]
        positions = []
        member = self._member() if any(tp in state.cooperative for tp in tps) else None
        for tp in rotated(tps, next(self._request_order)):
            # the application may have reassigned or reset a partition while this task
            # waited for its connection (a background fetch): fetch only what still fits
            leader = metadata.leader(tp)
            offset = state.positions.get(tp)
            if leader is None or not isinstance(offset, int) or tp not in state:
                continue
            if tp in state.cooperative:
                if member is not None:  # else no identity to fetch with now (between generations)
                    positions.append(FetchPosition(tp, leader.leader_epoch, offset, [], member))
            else:
                positions.append(FetchPosition(tp, leader.leader_epoch, offset, state.ranges[tp]))
        if not positions:
            return False
        where = f"node {node_id} at {address[0]}:{address[1]}"
        ranged = [p.tp for p in positions if p.ranges]
        if ranged and not connection.filters_ranges:
            raise RangeFetchNotSupportedError(
                f"{where} does not advertise {RANGE_FETCH_FEATURE} (Fetch v{version}); it cannot serve the key "
                f"ranges of {', '.join(f'{tp.topic}-{tp.partition}' for tp in ranged)}")
        shared = [p for p in positions if p.cooperative is not None]
        if shared and not connection.fetches_cooperatively:
            raise CooperativeFetchNotSupportedError(
                f"{where} does not advertise {COOPERATIVE_FETCH_FEATURE} (Fetch v{version}); it cannot hand out "
                f"chunks of {', '.join(f'{p.tp.topic}-{p.tp.partition}' for p in shared)}")
        if ranged and shared:
            # the proxy serves ranged and cooperative fetches with different features: two
            # requests on the one connection, the chunks first (they are leased from the moment
            # they are handed out); the second waits at the broker no longer, as the first did
            refresh = await self._request(node_id, connection, version, shared, wait_ms, received)
            rest = [p for p in positions if p.cooperative is None]
            return await self._request(node_id, connection, version, rest, 0, received) or refresh
        return await self._request(node_id, connection, version, positions, wait_ms, received)

    async def _request(self, node_id: int, connection: NodeConnection, version: int, positions: list[FetchPosition],
                       wait_ms: int, received: set[TopicPartition]) -> bool:
        """One Fetch of ``positions`` taken in. True when something must be retried: metadata
        is stale, or a cooperative fetch was fenced (the group rejoins meanwhile)."""
        state, metadata = self._state, self._metadata
        body = fetch_request(version, positions, {p.tp.topic: metadata.topic_id(p.tp.topic) for p in positions},
                             FetchLimits(wait_ms, self._max_bytes, self._partition_max_bytes, self._isolation_level))
        self._metrics["fetch_requests"] += 1
        response = await self._connections.request(connection, ApiKey.FETCH, version, body,
                                                   timeout=self._connections.timeout + wait_ms / 1000)
        # an answer fetched for fewer key ranges than the partition has now lacks records:
        # it is stale like one for a moved position
        offsets = {p.tp: p.offset for p in positions
                   if p.ranges == state.ranges.get(p.tp) or narrows(p.ranges, state.ranges.get(p.tp, []))}
        shared = {p.tp: p.cooperative for p in positions if p.cooperative is not None}
        fenced: list[TopicPartition] = []
        refresh = apply_fetch_response(
            state, response, version=version, node_id=node_id, offsets=offsets,
            topic_names=metadata.topic_names(), received_time=time.time(), received=received,
            auto_offset_reset=self._auto_offset_reset, metrics=self._metrics, cooperative=shared, fenced=fenced)
        if refresh:
            metadata.stale = True
        if fenced:
            self._on_fenced(shared[fenced[0]].generation_id)
        return refresh or bool(fenced)

    # -- background -------------------------------------------------------------------
    def attach(self, nursery: trio.Nursery | None) -> None:
        """The nursery background fetches run in (None: fetch only inside ``poll``)."""
        self._nursery = nursery

    @property
    def background_running(self) -> bool:
        """Whether a background fetch was started and not yet taken in by a poll."""
        return self._background is not None

    def start_background(self) -> None:
        """Fetch the partitions ``poll`` just emptied while the application processes what
        it returned, so the next poll finds records waiting."""
        if self._nursery is None or self._background is not None or self._metadata.stale:
            return
        if not self.fetchable():
            return
        done = trio.Event()
        self._background = done
        self._nursery.start_soon(self._run_background, done)

    async def _run_background(self, done: trio.Event) -> None:
        received: set[TopicPartition] = set()
        try:
            fetchable = self.fetchable()  # again: assign or seek may have run since
            if fetchable:
                await self.fetch(fetchable, self._max_wait_ms, received)
        except RETRIABLE_FAILURES as exc:
            log.info("consumer: background fetch failed (%r); retrying", exc)
            self._metadata.stale = True
        except (ConsumerError, ProtocolError) as exc:
            self._background_error = exc  # raised by the next poll
        finally:
            self._background_received |= received
            done.set()

    async def wait_background(self, deadline: float) -> None:
        """Wait until the background fetch is done, or ``deadline`` (trio time)."""
        if self._background is not None:
            with trio.move_on_at(deadline):
                await self._background.wait()

    def take_background(self, received: set[TopicPartition]) -> None:
        """Take a finished background fetch in: its partitions join ``received``, and its
        error, if any, is raised here."""
        if self._background is None or not self._background.is_set():
            return
        self._background = None
        received |= self._background_received
        self._background_received = set()
        error, self._background_error = self._background_error, None
        if error is not None:
            raise error
