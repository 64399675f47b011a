"""The I/O edge of key-range fetch: a Fetch request stage, its broker reads shared between
consumers, and its metrics. The filtering and the cache are ``engine``'s (sans-IO)."""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable, Iterable, Mapping

import trio

from proxy.keyrange.engine import ConnectionRanges, FetchPlan, KeyRangeEngine, Prefetch
from proxy.keyrange.metrics import KeyRangeMetrics
from proxy.keyrange.native import NativeShares
from proxy.keyrange.settings import KeyRangeSettings
from proxy.keyrange.workers import SplitWorkers
from proxy.net import native_relay
from proxy.net.native_relay import NativeAnswers
from proxy.pipeline import (
    ClusterView,
    ConnectionContext,
    DecodedResponse,
    Feature,
    OwnRequest,
    Request,
    RequestStage,
    Route,
)
from proxy.pipeline.context import StateKey
from proxy.pipeline.feature import NativePass
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import EXTENSION_TAG_BYTES, KEY_RANGE_FETCH_FEATURE
from proxy.protocol.message_types import FetchRequest, FetchResponse, RequestHeader
from proxy.protocol.message_versions import FETCH_FIRST_FLEXIBLE

log = logging.getLogger("proxy.keyrange")

FEATURE = KEY_RANGE_FETCH_FEATURE
_COALESCE_GRACE = 1.0  # seconds beyond the request's max_wait_ms to wait for a shared read
_MAX_INFLIGHT_READS = 10_000
_STALE_READ_SECONDS = 60.0

RANGES = StateKey("keyrange", ConnectionRanges)  # a connection's ranges and fetch sessions


def _holds_sessions(ctx: ConnectionContext) -> bool:
    """Whether the connection holds a key-range fetch session: its every Fetch is read."""
    state = ctx.existing(RANGES)
    return state is not None and bool(state.sessions.sessions)
ReadKey = tuple[str, int, int, int]  # topic, partition, fetch offset, isolation level


class _Read:
    """A broker read in flight: ``done`` is set once its response has been split."""

    __slots__ = ("done", "started")

    def __init__(self, started: float) -> None:
        self.done = trio.Event()
        self.started = started

    def set(self) -> None:
        self.done.set()

    async def wait(self) -> None:
        await self.done.wait()


class KeyRangeFetchFeature(Feature):
    name = "keyrange"

    def __init__(self, settings: KeyRangeSettings, cluster: ClusterView, metrics: KeyRangeMetrics | None = None
                 ) -> None:
        self.cluster = cluster
        self.engine = KeyRangeEngine(
            cache_bytes=settings.cache_bytes,
            topic_settings=settings.topics.of,
            topic_name=cluster.name_of,
            recompress=settings.compression == "source",
            interest_seconds=settings.interest_ms / 1000,
        )
        self.metrics = metrics = metrics or KeyRangeMetrics()
        self.workers = SplitWorkers(settings.split_threads, settings.split_thread_min_bytes, metrics)
        self.prefetch_enabled = settings.prefetch_enabled
        self.prefetch_max_bytes = settings.prefetch_max_bytes
        self._ahead_bytes = 0  # what the read-aheads on their way may bring into the cache
        self._own_ids = itertools.count(1)
        # (topic, partition, fetch offset, isolation level) of broker reads on their way: a
        # read fills the cache only for consumers at its own isolation level
        self._inflight: dict[tuple[str, int, int, int], _Read] = {}
        self._last = (0, 0, 0, 0, 0, 0, 0)
        self._last_bytes: dict = {}
        # The shares the native relay may hand out itself (``native``): None without the
        # setting, or without a build of the relay that answers.
        self.native: NativeShares | None = None
        if settings.native_answers and native_relay.ANSWERS:
            engine = self.engine
            self.native = NativeShares(native_relay.answers_table(), engine.cache, topic_id=cluster.id_of,
                                       topic_settings=lambda name: engine.topic_settings(name),
                                       reads_ahead=self.prefetch_enabled, in_flight=self._inflight.__contains__)
            engine.cache.listener = self.native

    def reconfigure(self, settings: KeyRangeSettings) -> None:
        """Take reloaded settings: the per-topic ones from the next fetch on, the cache's cap
        at once (a lower one evicts the least recently used shares). The others are read at
        start only."""
        self.engine.topic_settings = settings.topics.of
        if self.native is not None:
            self.native.withdraw()  # published under the old settings (a topic may refuse range fetches now)
        self.engine.cache.resize(settings.cache_bytes)
        self.prefetch_max_bytes = settings.prefetch_max_bytes
        self.metrics.cache_bytes.set(self.engine.cache.bytes_held)

    def request_stages(self) -> Mapping[int, RequestStage]:
        return {ApiKey.FETCH: self.on_fetch}

    def native_passes(self) -> Mapping[int, NativePass]:
        # Its ranges are tagged fields of the request; on a connection holding a key-range
        # fetch session, a plain incremental Fetch keeps the session's ranges.
        return {ApiKey.FETCH: NativePass(untagged=True, held=_holds_sessions, key_ranges=True)}

    def advertised(self) -> Mapping[str, tuple[int, int]]:
        return {FEATURE: (1, 1)}

    # -- answers the native relay sends (proxy.keyrange.native) -----------------------------------
    def native_answers(self) -> NativeAnswers | None:
        return self if self.native is not None else None

    @property
    def table(self) -> object:
        assert self.native is not None
        return self.native.table

    def served(self, ctx: ConnectionContext) -> bytes:
        state = ctx.existing(RANGES)
        return state.served_blob() if state is not None else b""

    def taken(self, handles: list[int]) -> None:
        """The shares the native relay sent (a run's report): served as the event loop
        serves a cached share."""
        native = self.native
        if native is None or not handles:
            return
        self.metrics.native_answers.inc(native.taken(handles, self.engine.active.touch, trio.current_time()))
        self._export()

    async def on_fetch(self, ctx: ConnectionContext, request: Request[FetchRequest]) -> Route | None:
        version = request.version
        if version < FETCH_FIRST_FLEXIBLE:
            return None
        state = ctx.state(RANGES)
        if EXTENSION_TAG_BYTES not in request.frame and not state.sessions.sessions:
            return None  # no extension anywhere: the default route, no decoding
        header, body = request.decoded()
        await self.cluster.look_up_ids(t.topic_id for t in body.topics)
        engine = self.engine
        plan = engine.plan(state, version, body, trio.current_time())
        if plan is None:
            return None
        level = plan.isolation_level
        waiting = [(read, self._inflight[read]) for read in
                   ((*key, level) for key in engine.cacheable_misses(state, plan)) if read in self._inflight]
        if waiting:
            # Another consumer's read of the same position is on its way: its split fills
            # our share. Waiting is no worse than the broker holding the fetch (max_wait_ms),
            # and responses on this connection are ordered anyway.
            with trio.move_on_after(max(body.max_wait_ms, 0) / 1000 + _COALESCE_GRACE):
                for _, event in waiting:
                    await event.wait()
            self._forget_lost(waiting)
            engine.take_hits(state, plan, trio.current_time())
        engine.probe_reads(state, plan, self._inflight.__contains__)
        reads = engine.upstream_reads(plan)
        engine.finish(plan)
        if plan.upstream_body is None:
            response = engine.complete(state, plan, None, trio.current_time())
            self._export()
            route = Route.answer(messages.encode_response_gathered(
                ApiKey.FETCH, version, messages.new_response_header(request.correlation_id), response))
            own = self._prefetch(ctx, header, plan)
            if own is not None:
                route.follow_up = own[0]  # its events are set when its answer is cached
            return route

        events = self._announce([(*key, level) for key in reads])

        async def on_response(response: DecodedResponse[FetchResponse]) -> None:
            splits = engine.split_jobs(plan, response.body, trio.current_time())
            if splits:
                await self.workers.run(splits.values())
            response.body = engine.complete(state, plan, response.body, trio.current_time(), splits)
            response.changed = True
            self._export()
            own = self._prefetch(ctx, header, plan)
            if own is not None:
                request, settle = own
                if not await ctx.send_own(request):  # the connection has other requests on their way
                    settle()

        return Route(messages.encode_request(header, plan.upstream_body), on_response=on_response,
                     settle=lambda: self._settle(events))

    # -- key-range prefetch ----------------------------------------------------------------------
    def _prefetch(self, ctx: ConnectionContext, header: RequestHeader,
                  plan: FetchPlan) -> tuple[OwnRequest, Callable[[], None]] | None:
        """(the request that reads the next positions of this request's shared partitions
        ahead of their consumers, what to call if it is not sent), or None.

        It travels on this client's own upstream connection (the broker answers it in
        order with the client's requests) and its answer is split into every active range
        set and cached. Consumers reaching that position meanwhile wait for it as for any
        read under way; its events are set once it is cached, or at once if it is not sent.
        """
        if not self.prefetch_enabled:
            return None
        engine = self.engine
        now = trio.current_time()
        cache = engine.cache
        room = (cache.max_bytes - cache.bytes_held - self._ahead_bytes) // 2
        ahead = engine.prefetch(plan, lambda key: key in self._inflight, now,
                                max_read_bytes=self.prefetch_max_bytes, room=room)
        if ahead is None:
            return None
        return self._own_read(ctx, header, ahead)

    def _own_read(self, ctx: ConnectionContext, header: RequestHeader,
                  ahead: Prefetch) -> tuple[OwnRequest, Callable[[], None]]:
        """The request of a read ahead, with the events of its positions announced."""
        level = ahead.isolation_level
        events = self._announce([(name, partition, position, level)
                                 for (name, partition), position in ahead.positions.items()])
        settled = False
        self._ahead_bytes += ahead.read_bytes

        def settle() -> None:
            nonlocal settled
            if not settled:
                settled = True
                self._ahead_bytes -= ahead.read_bytes
                self._settle(events)

        async def arrived(raw: bytes | bytearray) -> None:
            try:
                await self._cache_prefetch(ctx, header, ahead, raw)
            finally:
                settle()

        correlation_id = -(next(self._own_ids) % (1 << 31)) - 1  # never one a client uses
        own_header = dataclasses.replace(header, correlation_id=correlation_id)
        self.metrics.prefetch_sent.inc()
        if ahead.wide:
            self.metrics.prefetch_wide.inc(ahead.wide)
        return OwnRequest(messages.encode_request(own_header, ahead.body), ApiKey.FETCH, ahead.version,
                          correlation_id, arrived, settle), settle

    async def _cache_prefetch(self, ctx: ConnectionContext, header: RequestHeader, ahead: Prefetch,
                              raw: bytes | bytearray) -> None:
        decoded: DecodedResponse[FetchResponse]
        _, decoded = ctx.decode_own_response(ApiKey.FETCH, ahead.version, raw)
        engine = self.engine
        cache = engine.cache
        following = engine.chain(ahead, decoded.body, self._inflight.__contains__, trio.current_time(),
                                 room=(cache.max_bytes - cache.bytes_held - self._ahead_bytes) // 2)
        if following is not None:
            request, settle = self._own_read(ctx, header, following)
            self.metrics.prefetch_chained.inc()
            if not await ctx.send_own(request):
                settle()
        jobs = engine.prefetch_jobs(ahead, decoded.body, trio.current_time())
        if jobs:
            await self.workers.run(job for _, job in jobs.values())
        self.metrics.prefetch_shares.inc(engine.cache_prefetch(ahead, jobs))
        self._export()

    def _forget_lost(self, waited: list[tuple[ReadKey, _Read]]) -> None:
        """Reads waited for in vain (their connection ended before the answer, or the broker
        held them past the wait) stop making others wait: the next consumer reads itself."""
        for key, event in waited:
            if not event.done.is_set() and self._inflight.get(key) is event:
                del self._inflight[key]

    def _announce(self, reads: Iterable[ReadKey]) -> list[tuple[ReadKey, _Read]]:
        """Register this request's broker reads so consumers at the same position wait
        for them instead of reading the broker again."""
        events = []
        now = trio.current_time()
        if len(self._inflight) > _MAX_INFLIGHT_READS:
            stale = [key for key, event in self._inflight.items() if now - event.started > _STALE_READ_SECONDS]
            for key in stale:
                self._inflight.pop(key).set()
        native = self.native
        for key in reads:
            if key not in self._inflight:
                event = _Read(now)
                self._inflight[key] = event
                events.append((key, event))
                if native is not None:  # the shares that end where this read begins need no read-ahead now
                    name, partition, position, level = key
                    native.covered((name, partition), level, position)
        return events

    def _settle(self, events: list[tuple[ReadKey, _Read]]) -> None:
        for key, event in events:
            if self._inflight.get(key) is event:
                del self._inflight[key]
            event.set()

    def _export(self) -> None:
        cache = self.engine.cache
        stats = self.engine.stats
        now = (cache.stats.hits, cache.stats.misses, cache.stats.evictions, stats.records_kept, stats.records_dropped,
               stats.shares_cut, stats.wider_splits)
        metrics = self.metrics
        for counter, new, old in zip((metrics.cache_hits, metrics.cache_misses, metrics.cache_evictions,
                                      metrics.records_kept, metrics.records_dropped, metrics.shares_cut,
                                      metrics.wider_splits),
                                     now, self._last):
            if new > old:
                counter.inc(new - old)
        self._last = now
        metrics.cache_bytes.set(cache.bytes_held)
        for partition in stats.touched:  # not every partition ever read: this runs per fetch
            total = stats.broker_bytes[partition]
            previous = self._last_bytes.get(partition, 0)
            if total > previous:
                metrics.broker_bytes.labels(partition[0], str(partition[1])).inc(total - previous)
                self._last_bytes[partition] = total
        stats.touched.clear()
