"""Fetch of virtual partitions: a Fetch naming a virtual topic is answered by the proxy,
in fetch sessions of its own, from one broker read of each real partition split into its
shares through the key-range engine's result cache (``ResultCache``); another
connection's read of the same position is waited for rather than repeated. The rules are
``proxy.virtual.fetch``'s (no I/O).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

import trio

from proxy.net.native_table import known_blob
from proxy.pipeline import ConnectionContext, DecodedResponse, Feature, Request, RequestStage, Route
from proxy.pipeline.context import StateKey
from proxy.pipeline.feature import NativePass
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import ErrorCode
from proxy.protocol.message_types import FetchRequest, FetchResponse, RequestHeader
from proxy.protocol.message_versions import FETCH_FIRST_TOPIC_ID
from proxy.records.stripes import STRIPED_MARKS, Stripe
from proxy.virtual import fetch
from proxy.virtual.metrics import VirtualTopicsMetrics
from proxy.virtual.names import VirtualTopic
from proxy.virtual.precheck import fetch_topic_ids
from proxy.virtual.resolver import VirtualResolver

_MERGE_GRACE = 1.0  # seconds beyond the request's max_wait_ms to wait for another connection's read
_MAX_INFLIGHT_READS = 10_000


class ResultCache(Protocol):
    """The key-range engine's result cache, as the server hands it over."""

    def split(self, partition_id: tuple[str, int], wanted: list, fetch_offset: int, blob, metadata: dict,
              now: float, *, isolation_level: int) -> tuple[list[bytes], int | None]: ...

    def take(self, partition_id: tuple[str, int], ranges: tuple, position: int, now: float, *,
             isolation_level: int) -> Any: ...

    def interest(self, partition_id: tuple[str, int], ranges: tuple, now: float) -> None: ...

    def split_stripes(self, partition_id: tuple[str, int], counts: list[int], wanted: list, fetch_offset: int,
                      blob, metadata: dict, *, isolation_level: int) -> tuple[list[bytes], int | None]: ...

    def take_stripe(self, partition_id: tuple[str, int], stripe: Stripe, position: int, *,
                    isolation_level: int) -> Any: ...


class _Connection:
    """One client connection's virtual-topic state."""

    def __init__(self) -> None:
        self.sessions = fetch.VirtualSessions()

    def close(self) -> None:
        self.sessions.sessions.clear()


STATE = StateKey("virtual-fetch", _Connection)


def _holds_sessions(ctx: ConnectionContext) -> bool:
    """Whether the connection holds a fetch session of the proxy's: its every Fetch is read."""
    state = ctx.existing(STATE)
    return state is not None and bool(state.sessions.sessions)


class VirtualFetchFeature(Feature):
    name = "virtual-fetch"

    def __init__(self, resolver: VirtualResolver, metrics: VirtualTopicsMetrics | None, shared: ResultCache) -> None:
        self.resolver = resolver
        self.cluster = resolver.cluster
        self.shared = shared
        self.gaps = resolver.gaps
        # Broker reads of virtual partitions on their way, by (topic, partition, offset,
        # isolation level): a connection at the same position and level waits for the read
        # and takes its share from the cache instead of reading the broker again (the cache
        # serves a share only at the level of its read).
        self._inflight: dict[tuple[str, int, int, int], trio.Event] = {}
        self._recent = fetch.RecentReads()
        metrics = metrics or VirtualTopicsMetrics()
        self._records, self._reads, self._bytes = metrics.records, metrics.broker_reads, metrics.broker_bytes
        self._hits, self._skips = metrics.cache_hits, metrics.control_batches
        self._known: tuple[int, bytes] | None = None  # _known_ids': (the cluster's ids generation, blob)

    def request_stages(self) -> Mapping[int, RequestStage]:
        return {ApiKey.FETCH: self.on_fetch}

    def native_passes(self) -> Mapping[int, NativePass]:
        # What on_fetch passes on untouched: a Fetch naming no virtual topic, by name or by
        # an id the proxy knows (an id it does not know may be a virtual topic's another
        # instance handed out), on a connection holding none of the proxy's fetch sessions.
        return {ApiKey.FETCH: NativePass(guard=self.resolver.precheck.native_guard, known=self._known_ids,
                                         held=_holds_sessions)}

    def _known_ids(self) -> bytes:
        """The ids of the topics the proxy knows (``native_table.known_blob``), made again
        only when they change."""
        generation = self.cluster.ids_generation
        if self._known is None or self._known[0] != generation:
            self._known = (generation, known_blob(topic_id.bytes for topic_id in self.cluster.known_ids()))
        return self._known[1]

    # -- Fetch -----------------------------------------------------------------------------------
    def _names_unknown_id(self, request: Request) -> bool:
        """Whether a Fetch the pre-check let pass names a topic id this proxy cannot name:
        maybe a virtual topic's, handed out by another proxy instance (a sidecar of another
        broker, or this one before a restart). It is decoded then, which looks the id up
        (every topic's metadata, at most once per lookup interval) and remembers it for
        the pre-check once it is a virtual topic's. An id that cannot be read or is a real
        topic's costs only the walk over the request."""
        ids = fetch_topic_ids(request.frame, request.version)
        if ids is None:
            return request.version >= FETCH_FIRST_TOPIC_ID
        return any(self.cluster.name_of(uuid.UUID(bytes=topic_id)) is None for topic_id in ids)

    def _describe(self, key: fetch.TopicKey) -> tuple[VirtualTopic | None, str, uuid.UUID | None] | None:
        if isinstance(key, uuid.UUID):
            vt = self.resolver.by_id(key)
            if vt is not None:
                self.resolver.precheck.remember(key)  # handed out by another instance, maybe: known from now on
                return vt, vt.real, self.cluster.id_of(vt.real)
            name = self.cluster.name_of(key)
            return (None, name, key) if name else None
        vt = self.resolver.virtual(key)
        if vt is not None:
            return vt, vt.real, self.cluster.id_of(vt.real)
        return None, key, self.cluster.id_of(key)

    async def on_fetch(self, ctx: ConnectionContext, request: Request[FetchRequest]) -> Route | None:
        state = ctx.existing(STATE)
        if ((state is None or not state.sessions.sessions) and not self.resolver.precheck.may_name_virtual(request.frame)
                and not self._names_unknown_id(request)):
            return None
        header, body = request.decoded()
        state = ctx.state(STATE)
        version = request.version
        if not state.sessions.owns(body.session_id):
            ids = [t.topic_id for t in body.topics if version >= FETCH_FIRST_TOPIC_ID]
            if ids:
                await self.cluster.look_up_ids(ids)
            described = [self._describe(fetch.topic_key(t)) for t in body.topics]
            if not any(d is not None and d[0] is not None for d in described):
                return self._unsessioned(request, header, body, described)
            if body.session_id != fetch.NO_SESSION:
                # A session the broker holds cannot take a virtual partition: the client
                # opens a new one, which is the proxy's.
                return self._answer_fetch(request, fetch.Resolved([], None, False,
                                                                  int(ErrorCode.FETCH_SESSION_ID_NOT_FOUND)), {})
        resolved = state.sessions.resolve(body, self._describe)
        answers: dict = {}
        if resolved.error != ErrorCode.NONE:
            return self._answer_fetch(request, resolved, answers)
        for part in resolved.parts:
            if not part.real:
                answers[part.key] = fetch.PartAnswer(error_code=int(
                    ErrorCode.UNKNOWN_TOPIC_ID if version >= FETCH_FIRST_TOPIC_ID else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
        isolation = body.isolation_level
        self._take_cached(state, resolved.parts, answers, isolation)
        waiting = [event for part in resolved.parts if part.key not in answers and part.share is not None
                   and (event := self._inflight.get((part.real, part.real_partition, part.fetch_offset,
                                                     isolation))) is not None
                   and not self._recent.at_log_end((part.real, part.real_partition), part.fetch_offset)]
        if waiting:
            # Another connection's read of the same position is on its way: its split fills
            # our shares. Waiting is no worse than the broker holding the fetch (max_wait_ms).
            # Not at the log end: that read is a long poll, and merging two of them only
            # queues one behind the other.
            with trio.move_on_after(max(body.max_wait_ms, 0) / 1000 + _MERGE_GRACE):
                for event in waiting:
                    await event.wait()
            self._take_cached(state, resolved.parts, answers, isolation)
        served = state.sessions.served
        reads = fetch.plan_reads(resolved.parts, set(answers), lambda part: None if (
            part.real, part.real_partition) in served else self._recent.probe_offset(
            (part.real, part.real_partition), part.fetch_offset, isolation), state.sessions.out_of_range.floor)
        if not reads:
            return self._answer_fetch(request, resolved, answers)
        upstream = fetch.upstream_request(body, version, reads, max_wait_ms=0 if answers or any(
            read.probe for read in reads) else None)
        for read in reads:
            self._reads.labels(read.real).inc()
        announced = self._announce(reads, isolation)

        async def on_response(response: DecodedResponse[FetchResponse]) -> None:
            self._complete(state, response.body, reads, answers, version, isolation)
            response.body = fetch.client_response(version, resolved, answers, response.body.throttle_time_ms)
            response.changed = True

        return Route(messages.encode_request(header, upstream), on_response=on_response,
                     settle=lambda: self._settle(announced))

    @staticmethod
    def _unsessioned(request: Request, header: RequestHeader, body: FetchRequest, described: list) -> Route | None:
        """A Fetch that would open a broker session naming a topic id this proxy cannot
        name goes sessionless. The id may be a virtual topic's whose real topic this proxy
        has not learnt yet (just restarted, or a sidecar of another broker): in a broker
        session it would stay, answered UNKNOWN_TOPIC_ID forever, since the client's
        incremental fetches no longer name it. Sessionless, each fetch names it again and
        is looked at again, until the lookup knows it. A real unknown id (a deleted topic)
        only costs its client full fetches.

        Opening a session is any full fetch (epoch 0), also one naming the session it had:
        a Java consumer whose connection closed (its proxy restarting) sends its session id
        with epoch 0, to close that session and open a new one. Its epoch becomes -1: the
        broker closes the session named, if it holds it, and opens none."""
        if None not in described or body.session_epoch != fetch.INITIAL_EPOCH:
            return None
        body.session_epoch = fetch.FINAL_EPOCH
        return Route(messages.encode_request(header, body))

    def _take_cached(self, state: _Connection, parts: list[fetch.FetchPart], answers: dict, isolation: int) -> None:
        """Answer from the result cache the shares it holds for reads at the request's
        isolation level, of partitions the broker has served this connection (the cache
        never answers a connection the broker would refuse)."""
        now, now_ms = trio.current_time(), int(time.time() * 1000)
        for part in parts:
            if part.key in answers or part.share is None:
                continue
            if (part.real, part.real_partition) not in state.sessions.served:
                continue
            share = self._take_share(part, now, isolation)
            if share is None:
                continue
            answers[part.key] = self._cached_answer(part, share, now_ms)

    def _take_share(self, part: fetch.FetchPart, now: float, isolation: int) -> Any:
        """The result cache's share of ``part`` at its position, if it holds one."""
        if part.share is None:
            return None
        if isinstance(part.share, Stripe):
            return self.shared.take_stripe((part.real, part.real_partition), part.share, part.fetch_offset,
                                           isolation_level=isolation)
        return self.shared.take((part.real, part.real_partition), part.share, part.fetch_offset, now,
                                isolation_level=isolation)

    def _cached_answer(self, part: fetch.FetchPart, share: Any, now_ms: int) -> fetch.PartAnswer:
        composed = fetch.compose(share.records, part.fetch_offset, share.next_offset, now_ms)
        self._count(part, composed, hit=True)
        self._learn(part, composed)
        return fetch.PartAnswer(
            high_watermark=share.high_watermark, last_stable_offset=share.last_stable_offset,
            log_start_offset=share.log_start_offset, aborted_transactions=list(share.aborted_transactions),
            records=composed.records)

    def _announce(self, reads: list[fetch.Read], isolation: int) -> list:
        """Register this request's broker reads so that other connections at the same
        position and isolation level wait for them (a probe reads nothing for anyone else)."""
        if len(self._inflight) > _MAX_INFLIGHT_READS:
            for event in self._inflight.values():
                event.set()
            self._inflight.clear()
        announced = []
        for read in reads:
            key = (read.real, read.partition, read.fetch_offset, isolation)
            if not read.probe and key not in self._inflight:
                event = self._inflight[key] = trio.Event()
                announced.append((key, event))
        return announced

    def _settle(self, announced: list) -> None:
        for key, event in announced:
            if self._inflight.get(key) is event:
                del self._inflight[key]
            event.set()

    def _answer_fetch(self, request: Request, resolved: fetch.Resolved, answers: dict) -> Route:
        response = fetch.client_response(request.version, resolved, answers)
        return Route.answer(messages.encode_response(ApiKey.FETCH, request.version,
                                                     messages.new_response_header(request.correlation_id), response))

    def _complete(self, state: _Connection, body: FetchResponse, reads: list[fetch.Read], answers: dict, version: int,
                  isolation: int) -> None:
        now, now_ms = trio.current_time(), int(time.time() * 1000)
        data: dict[tuple[str | None, int], FetchResponse.PartitionData] = {}
        for topic in body.responses:
            name = topic.topic if version < FETCH_FIRST_TOPIC_ID else self.cluster.name_of(topic.topic_id)
            for entry in topic.partitions:
                data[(name, entry.partition_index)] = entry
        out_of_range = state.sessions.out_of_range
        for read in reads:
            partition = data.get((read.real, read.partition))
            if read.probe and partition is not None and partition.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
                # The high watermark went back: no leave to use the cache, and no error for a
                # position the probe did not ask about. The client asks again and reads.
                self._recent.forget((read.real, read.partition))
                for part in read.parts + read.below_floor:
                    answers[part.key] = fetch.PartAnswer()
                continue
            if partition is not None and partition.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
                # Only the parts whose own position is out of range get the error; the others
                # ask again, and their read starts above the refused position.
                refused = {part.key for part in out_of_range.refused(read, partition.log_start_offset)}
                for part in read.parts + read.below_floor:
                    answers[part.key] = fetch.PartAnswer(error_code=int(ErrorCode.OFFSET_OUT_OF_RANGE)) \
                        if part.key in refused else fetch.PartAnswer()
                continue
            if partition is None or partition.error_code != ErrorCode.NONE:
                error = partition.error_code if partition is not None else int(ErrorCode.UNKNOWN_SERVER_ERROR)
                for part in read.parts + read.below_floor:
                    answers[part.key] = fetch.PartAnswer(error_code=error)
                continue
            state.sessions.served.add((read.real, read.partition))
            self.gaps.high_watermark(read.real, read.partition, partition.high_watermark)
            if partition.records:
                self._bytes.labels(read.real).inc(len(partition.records))
            refused = {part.key for part in out_of_range.served(read, partition.log_start_offset)}
            for part in read.below_floor:
                answers[part.key] = fetch.PartAnswer(error_code=int(ErrorCode.OFFSET_OUT_OF_RANGE)) \
                    if part.key in refused else fetch.PartAnswer(
                        high_watermark=partition.high_watermark, last_stable_offset=partition.last_stable_offset,
                        log_start_offset=partition.log_start_offset)
            if read.probe:
                self._recent.add((read.real, read.partition), read.fetch_offset, None, partition.high_watermark,
                                 isolation)
                for part in read.parts:
                    share = None if part.share is None else self._take_share(part, now, isolation)
                    answers[part.key] = self._cached_answer(part, share, now_ms) if share is not None else \
                        fetch.PartAnswer(high_watermark=partition.high_watermark,
                                         last_stable_offset=partition.last_stable_offset,
                                         log_start_offset=partition.log_start_offset)
                continue
            self._split_read(read, partition, answers, isolation, now, now_ms)

    def _split_read(self, read: fetch.Read, partition: FetchResponse.PartitionData, answers: dict, isolation: int, now: float,
                    now_ms: int) -> None:
        """Answer the parts of a broker read that served records: each share's records split
        out of it (the other active shares' cached for the connections that come next)."""
        aborted = list(partition.aborted_transactions or ())
        metadata = {"high_watermark": partition.high_watermark,
                    "last_stable_offset": partition.last_stable_offset,
                    "log_start_offset": partition.log_start_offset, "aborted_transactions": aborted}
        wanted: list = []
        stripes: list = []
        for part in read.parts:
            into = stripes if isinstance(part.share, Stripe) else wanted
            if part.share is not None and part.share not in into:
                into.append(part.share)
        outputs: list[bytes] = []
        read_end = None
        if wanted and partition.records:
            for ranges in fetch.every_share(read.parts):
                self.shared.interest((read.real, read.partition), ranges, now)
            outputs, read_end = self.shared.split((read.real, read.partition), wanted, read.fetch_offset,
                                                  partition.records, metadata, now, isolation_level=isolation)
        if stripes and partition.records:
            striped, read_end = self.shared.split_stripes(
                (read.real, read.partition), fetch.every_stripe_count(read.parts), stripes, read.fetch_offset,
                partition.records, metadata, isolation_level=isolation)
            outputs = [*outputs, *striped]
            wanted = [*wanted, *stripes]
        self._recent.add((read.real, read.partition), read.fetch_offset, read_end, partition.high_watermark,
                         isolation)
        for part in read.parts:
            answer = fetch.PartAnswer(high_watermark=partition.high_watermark,
                                      last_stable_offset=partition.last_stable_offset,
                                      log_start_offset=partition.log_start_offset, aborted_transactions=aborted)
            if part.share is None:
                answer.records = bytes(partition.records or b"")
            elif outputs:
                composed = fetch.compose(outputs[wanted.index(part.share)], part.fetch_offset, read_end, now_ms)
                answer.records = composed.records
                self._count(part, composed, hit=False)
                self._learn(part, composed)
            answers[part.key] = answer

    def _learn(self, part: fetch.FetchPart, composed: fetch.Composed) -> None:
        """What the answer's control batch passed holds no record of the share: its
        committed offsets are lifted over that (``proxy.virtual.lag``)."""
        if composed.skipped is None or part.share is None or not part.shares:
            return
        mark_k = part.shares + STRIPED_MARKS if isinstance(part.share, Stripe) else part.shares
        self.gaps.learn(part.real, part.real_id, part.real_partition, mark_k, part.index % part.shares,
                        *composed.skipped)

    def _count(self, part: fetch.FetchPart, composed: fetch.Composed, *, hit: bool) -> None:
        name = part.real
        if composed.records_kept:
            self._records.labels(name).inc(composed.records_kept)
        if composed.control_added:
            self._skips.labels(name).inc()
        if hit:
            self._hits.labels(name).inc()
