"""The I/O edge of key-range fetch: a Fetch hook on the router, and its metrics."""

from __future__ import annotations

import logging

import trio
from prometheus_client import Counter, Gauge

from proxy.keyrange.engine import ConnectionRanges, KeyRangeEngine
from proxy.protocol import messages
from proxy.protocol.framing import RequestHeaderPeek
from proxy.protocol.messages import ApiKey
from proxy.server.exchange import LocalAnswer
from proxy.server.rewrite import rewrite_node_endpoints
from proxy.server.routing import Route

log = logging.getLogger("proxy.keyrange")

# Tag 10000 as an unsigned varint: a frame without these two bytes carries no extension.
_TAG_10000 = bytes([0x90, 0x4E])
_FIRST_FLEXIBLE_FETCH = 12
FEATURE = "keyrange.fetch"
_COALESCE_GRACE = 1.0  # seconds beyond the request's max_wait_ms to wait for a shared read
_MAX_INFLIGHT_READS = 10_000
_LOOKUP_INTERVAL = 5.0  # seconds between lookups of unknown topic ids
_LOOKUP_TIMEOUT = 5.0
_STALE_READ_SECONDS = 60.0


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


class KeyRangeFetchFeature:
    def __init__(self, config, router, metrics, lookup_topic_names=None) -> None:
        self.router = router
        # async () -> {topic id: name}; asked when a Fetch names a topic id the proxy has
        # not seen in any Metadata response yet (e.g. a client reconnecting after a restart)
        self._lookup_topic_names = lookup_topic_names
        self._last_lookup = -float("inf")
        self.engine = KeyRangeEngine(
            cache_bytes=config.get("max.bytes.key.range.results"),
            topic_setting=config.topic_setting,
            topic_name=router.topic_names.get,
            recompress=config.get("key.range.fetch.compression") == "source",
            interest_seconds=config.get("key.range.interest.ms") / 1000,
        )
        registry = metrics.registry
        self._hits = Counter("kafka_proxy_keyrange_cache_hits", "Shares served from the cache.", registry=registry)
        self._misses = Counter("kafka_proxy_keyrange_cache_misses", "Cache lookups that found nothing.",
                               registry=registry)
        self._evictions = Counter("kafka_proxy_keyrange_cache_evictions",
                                  "Shares evicted by max.bytes.key.range.results.", registry=registry)
        self._held = Gauge("kafka_proxy_keyrange_cache_bytes", "Bytes held by the key-range cache.",
                           registry=registry)
        self._kept = Counter("kafka_proxy_keyrange_records_kept", "Records that passed the key filter.",
                             registry=registry)
        self._dropped = Counter("kafka_proxy_keyrange_records_dropped", "Records removed by the key filter.",
                                registry=registry)
        self._broker_bytes = Counter("kafka_proxy_keyrange_broker_bytes",
                                     "Record bytes read from brokers for range-filtered partitions.",
                                     ["topic", "partition"], registry=registry)
        self._inflight: dict[tuple[str, int, int], _Read] = {}
        self._last = (0, 0, 0, 0, 0)
        self._last_bytes: dict = {}
        router.register(ApiKey.FETCH, self.on_fetch)
        router.advertise(FEATURE)

    def _state(self, conn) -> ConnectionRanges:
        state = conn.state.get("keyrange")
        if state is None:
            state = conn.state["keyrange"] = ConnectionRanges()
        return state

    async def on_fetch(self, conn, peek: RequestHeaderPeek, frame: bytes) -> Route | None:
        version = peek.api_version
        if version < _FIRST_FLEXIBLE_FETCH:
            return None
        state = self._state(conn)
        if _TAG_10000 not in frame and not state.sessions.sessions:
            return None  # no extension anywhere: the default route, no decoding
        header, body = messages.decode_request(frame)
        await self._learn_topic_names(body)
        engine, book = self.engine, self.router.book
        plan = engine.plan(state, version, body, trio.current_time())
        if plan is None:
            return None
        waiting = [self._inflight[key] for key in engine.cacheable_misses(state, plan) if key in self._inflight]
        if waiting:
            # Another consumer's read of the same position is on its way: its split fills
            # our share. Waiting is no worse than the broker holding the fetch (max_wait_ms),
            # and responses on this connection are ordered anyway.
            with trio.move_on_after(max(body.max_wait_ms, 0) / 1000 + _COALESCE_GRACE):
                for event in waiting:
                    await event.wait()
            engine.take_hits(state, plan)
        reads = engine.upstream_reads(plan)
        engine.finish(plan)
        if plan.upstream_body is None:
            response = engine.complete(state, plan, None, trio.current_time())
            answer = LocalAnswer()
            answer.set(messages.encode_response(ApiKey.FETCH, version, messages.new_response_header(peek.correlation_id),
                                                response))
            self._export()
            return Route(None, local=answer)

        events = self._announce(reads)

        async def transform(raw: bytes) -> bytes:
            try:
                response_header, response = messages.decode_response(ApiKey.FETCH, version, raw)
                rewrite_node_endpoints(response, book)
                response = engine.complete(state, plan, response, trio.current_time())
                self._export()
                return messages.encode_response(ApiKey.FETCH, version, response_header, response)
            finally:
                self._settle(events)

        return Route(messages.encode_request(header, plan.upstream_body), transform=transform)

    async def _learn_topic_names(self, body) -> None:
        names = self.router.topic_names
        unknown = [t.topic_id for t in body.topics if t.topic_id is not None and int(t.topic_id) != 0
                   and t.topic_id not in names]
        now = trio.current_time()
        if not unknown or self._lookup_topic_names is None or now - self._last_lookup < _LOOKUP_INTERVAL:
            return
        self._last_lookup = now
        with trio.move_on_after(_LOOKUP_TIMEOUT):
            try:
                names.update(await self._lookup_topic_names())
            except Exception as exc:  # noqa: BLE001 - per-topic settings fall back to defaults
                log.warning("topic name lookup failed reason=%r", str(exc))

    def _announce(self, reads) -> list:
        """Register this request's broker reads so consumers at the same position wait
        for them instead of reading the broker again."""
        events = []
        now = trio.current_time()
        if len(self._inflight) > _MAX_INFLIGHT_READS:
            stale = [key for key, event in self._inflight.items() if now - event.started > _STALE_READ_SECONDS]
            for key in stale:
                self._inflight.pop(key).set()
        for key in reads:
            if key not in self._inflight:
                event = _Read(now)
                self._inflight[key] = event
                events.append((key, event))
        return events

    def _settle(self, events) -> None:
        for key, event in events:
            if self._inflight.get(key) is event:
                del self._inflight[key]
            event.set()

    def _export(self) -> None:
        cache = self.engine.cache
        stats = self.engine.stats
        now = (cache.stats.hits, cache.stats.misses, cache.stats.evictions, stats.records_kept, stats.records_dropped)
        for counter, new, old in zip((self._hits, self._misses, self._evictions, self._kept, self._dropped),
                                     now, self._last):
            if new > old:
                counter.inc(new - old)
        self._last = now
        self._held.set(cache.bytes_held)
        for partition in stats.touched:  # not every partition ever read: this runs per fetch
            total = stats.broker_bytes[partition]
            previous = self._last_bytes.get(partition, 0)
            if total > previous:
                self._broker_bytes.labels(partition[0], str(partition[1])).inc(total - previous)
                self._last_bytes[partition] = total
        stats.touched.clear()
