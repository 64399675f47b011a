"""The I/O edge of cooperative fetch (docs/wire-contract.md#37-cooperative-fetch): Fetch
partitions tagged ``Cooperative`` get the next chunk of offsets nobody has had, read on
the client's own broker connection. The decisions are ``grants``' and ``chunks``' (sans-IO).

Who holds which chunk is the log's (``proxy.coop.grant_log``): the fetch asks the log for
the member's next chunk (an ask names no offsets of its own: every instance computes the
same chunk as it applies the ask), and the chunk is handed out only once this instance has
applied its own record. So chunks never overlap, whichever instances the members reach.

While this instance knows of offsets past where the chunk would start (its latest read
of the partition ended beyond it), it asks before it reads: the ask names how many
offsets the chunk may span (the member's byte limit at the bytes per offset seen), and the
read then starts at the chunk the log placed, so that asks of several instances made at
once get consecutive chunks and each reads only what it hands out: the chunk and the
batches it begins and ends in (``_Partition.chunk_read_bytes``), so that one read holds it
whole. At the log end, and for offsets handed out again, resets and claims, it reads first
and asks within what it read; an ask whose whole range other instances' chunks took gets
no chunk. So that asks of several instances made from the same state each find a chunk
there, such a fetch reads ahead: one more time the member's byte limit than the most
chunks that took offsets of the read of one of this instance's latest asks before it was
applied (``KeyGrants.ahead``; at most ``_READ_AHEAD`` times, 8 MiB); the chunk itself
stays within the limit. Alone, an instance reads what the member asked for.

Fetches of one (group, topic, partition) through this instance take turns: a turn lasts
from the decision until its ask is on its way to the log, when the next fetch decides
around the chunk it expects (``KeyGrants.hold``) without waiting for it, so that chunks of
one partition follow each other at the pace of the broker's reads, not of the log's round
trips. Offsets handed out again, a reset or a claim below the read keep the turn until their
chunk is known. A fetch that cannot have its turn within its ``MaxWaitMs`` is answered with
no chunk, as the broker answers a fetch with nothing new.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import trio
from prometheus_client import Gauge

from proxy.commits.cluster import CommitLogError
from proxy.commits.reads import CommittedReads
from proxy.coop.chunks import Chunk, batch_bounds, cut_chunk, first_batch_bytes
from proxy.coop.grant_log import GrantLog, Proposal
from proxy.coop.grants import STALE, TAKEN, Committed, Decision, Grant, KeyGrants, Span
from proxy.coop.metrics import CooperativeFetchMetrics
from proxy.coop.settings import CooperativeFetchSettings
from proxy.pipeline import ClusterView, ConnectionContext, DecodedResponse, Feature, Request, RequestStage, Route
from proxy.pipeline.feature import NativePass
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import COOPERATIVE_FETCH_FEATURE, ErrorCode
from proxy.protocol.message_types import FetchRequest, FetchResponse
from proxy.protocol.message_versions import FETCH_FIRST_FLEXIBLE, FETCH_FIRST_TOPIC_ID

log = logging.getLogger("proxy.coop")

FEATURE = COOPERATIVE_FETCH_FEATURE
COOPERATIVE_TAG_BYTES = b"\x91\x4e"  # tag 10001 as an unsigned varint
_MAX_STATES = 10_000  # (group, topic, partition) states kept; the least recently used go first
_MAX_GROUPS = 10_000  # groups whose newest generation is remembered
_EMPTY = b""
_PROPOSALS = 3  # asks for one read before it is answered with no chunk
_READ_AHEAD = 16  # the most times the member's byte limit a fetch reads (``KeyGrants.ahead``)
_READ_AHEAD_BYTES = 8 << 20  # and the most bytes it reads ahead (never less than the member's limit)
_CHUNK_FILL = 0.9  # an ask before its read spans this share of the member's limit at the bytes per offset seen

GroupPartitionKey = tuple[str, str, int]  # (group, topic, partition)


def generation_error(newest: int, generation: int) -> int:
    """0, or ILLEGAL_GENERATION for a member of a generation older than ``newest`` (the
    newest seen in the group's cooperative fetches); -1 (assign mode) is never refused."""
    if generation < 0 or generation >= newest:
        return 0
    return int(ErrorCode.ILLEGAL_GENERATION)


class _Partition:
    """One partition's grants (as this instance applied the log) and its turn here."""

    __slots__ = ("grants", "turn", "lag", "expired", "ends", "offset_bytes", "batch_bytes")

    def __init__(self, grants: KeyGrants) -> None:
        self.grants = grants
        self.turn = trio.Semaphore(1)
        self.lag: Gauge | None = None  # the partition's child of kafka_proxy_coop_marker_lag
        self.expired = grants.counts.expired
        self.ends = (-1, -1)  # the high watermark and last stable offset of this instance's latest read
        self.offset_bytes = 0.0  # bytes per offset of the chunks this instance handed out lately
        self.batch_bytes = 0  # the size of the batches its reads began in, lately (the largest, fading)

    def known_end(self, read_committed: bool) -> int:
        """The last offset this instance knows the partition holds for such a member (-1: none)."""
        return (self.ends[1] if read_committed else self.ends[0]) - 1

    def read_began_in(self, size: int) -> None:
        """Learn the size of the batch a read began in (the largest lately: a chunk's read
        must hold the batches its first and last offsets lie in besides the chunk itself)."""
        if size:
            self.batch_bytes = max(size, self.batch_bytes * 3 // 4)

    def chunk_read_bytes(self, first: int, last: int, limit: int) -> int:
        """The byte limit of the read of chunk [first, last], granted before the read: the
        chunk at the bytes per offset seen, and the batches it begins and ends in (a chunk
        begins and ends inside batches, and the broker cuts a read at its limit, inside the
        last batch if need be: read with the member's limit alone, it would come back
        holding the first batch only, and the member's next fetch would read the rest);
        the member's limit at least, three times it at most."""
        wanted = int((last - first + 1) * self.offset_bytes) + 2 * self.batch_bytes
        return max(limit, min(wanted, 3 * limit))

    def saw(self, chunk: Chunk) -> None:
        """Learn the bytes per offset from a chunk handed out (half the weight to the newest)."""
        if chunk.records and chunk.end >= chunk.start:
            sample = len(chunk.records) / (chunk.end - chunk.start + 1)
            self.offset_bytes = sample if not self.offset_bytes else (self.offset_bytes + sample) / 2


@dataclass
class _Pending:
    """One cooperative partition of a request, between its decision and its answer."""

    key: GroupPartitionKey
    topic: str | uuid.UUID  # how the request names the topic: its name (before v13) or its id
    part: FetchRequest.FetchPartition  # the request's, rewritten
    state: _Partition | None = None
    span: Span | None = None
    member: str = ""
    token: int = -1
    committed: Committed = Committed()
    error: int = 0  # answered by the proxy with this code (no broker read)
    held: bool = False  # holds the partition's turn
    done: bool = False
    deadline: float = 0.0  # the fetch's MaxWaitMs from its arrival (trio time): how long it waits for a turn
    max_bytes: int = 0  # the member's PartitionMaxBytes: what a chunk holds at most (at least one batch)
    read_committed: bool = False
    ask: Grant | None = None  # an ask made before the read, on its way through the log
    proposal: Proposal | None = None  # that ask, queued for the log
    chunk: tuple[int, int] | None = None  # the chunk the log granted that ask: what the read is cut to
    redelivered: bool = False  # that chunk holds offsets handed out before


class CooperativeFetchFeature(Feature):
    name = "cooperative"

    def __init__(self, settings: CooperativeFetchSettings, cluster: ClusterView, commits: CommittedReads,
                 metrics: CooperativeFetchMetrics | None = None, *, grants: GrantLog) -> None:
        self.cluster = cluster
        self.commits = commits
        self.grants = grants
        self.lease_ms = settings.lease_ms
        self.max_leases = settings.max_leases_per_member
        self._states: OrderedDict[GroupPartitionKey, _Partition] = OrderedDict()
        self._generations: OrderedDict[str, int] = OrderedDict()
        self.metrics = metrics = metrics or CooperativeFetchMetrics()
        self._refused = metrics.refused
        self._marker_lag = metrics.marker_lag
        self._asks_before, self._asks_after = metrics.asks.labels("before"), metrics.asks.labels("after")
        metrics.partitions.set_function(lambda: len(self._states))
        metrics.leases.set_function(lambda: sum(p.grants.uncommitted() for p in self._states.values()))

    def request_stages(self) -> Mapping[int, RequestStage]:
        return {ApiKey.FETCH: self.on_fetch}

    def native_passes(self) -> Mapping[int, NativePass]:
        # Cooperative is a tagged field of a partition: a Fetch with key ranges alone passes too
        return {ApiKey.FETCH: NativePass(untagged=True, key_ranges=True)}

    def advertised(self) -> Mapping[str, tuple[int, int]]:
        return {FEATURE: (1, 1)}

    # -- the request ----------------------------------------------------------------------------
    async def on_fetch(self, ctx: ConnectionContext, request: Request[FetchRequest]) -> Route | None:
        version = request.version
        if version < FETCH_FIRST_FLEXIBLE or COOPERATIVE_TAG_BYTES not in request.frame:
            return None
        header, body = request.decoded()
        if not any(p.cooperative is not None for t in body.topics for p in t.partitions):
            return None
        await self.cluster.look_up_ids(t.topic_id for t in body.topics)
        pending = self._pending(version, body)
        invalid = self._invalid_request(body)
        deadline = trio.current_time() + max(body.max_wait_ms, 0) / 1000
        try:
            for item in sorted(pending, key=lambda p: p.key):
                if invalid:
                    item.error = ErrorCode.INVALID_REQUEST
                    continue
                await self._decide(item, deadline)
            asking = [item for item in pending if item.ask is not None]
            if asking:  # the chunks asked for before the read: every partition's ask at once
                async with trio.open_nursery() as nursery:
                    for item in asking:
                        nursery.start_soon(self._ask_before_read, item)
        except BaseException:
            for item in pending:
                if item.proposal is not None and item.ask is not None and item.state is not None:
                    self.grants.withdraw(item.proposal)
                    item.state.grants.settle(item.ask.proposal)
            self._release(pending)
            raise
        local = [item for item in pending if item.span is None]
        self._release(local)  # no read: their turns are over
        if invalid:
            return Route.answer(messages.encode_response(
                ApiKey.FETCH, version, messages.new_response_header(request.correlation_id),
                self._refuse_all(version, body)))
        reading = {id(item.part) for item in pending if item.span is not None}
        for topic in body.topics:
            topic.partitions = [p for p in topic.partitions if p.cooperative is None or id(p) in reading]
            for part in topic.partitions:
                part.cooperative = None
        body.topics = [t for t in body.topics if t.partitions]
        if not body.topics:
            response = FetchResponse(session_id=0)
            self._answer_locally(version, response, local)
            self._release(pending)
            return Route.answer(messages.encode_response(
                ApiKey.FETCH, version, messages.new_response_header(request.correlation_id), response))
        remaining = max(0.0, deadline - trio.current_time())
        body.max_wait_ms = min(body.max_wait_ms, int(remaining * 1000))

        async def on_response(response: DecodedResponse[FetchResponse]) -> None:
            await self._on_response(version, response.body, pending)
            self._answer_locally(version, response.body, local)
            response.changed = True

        return Route(messages.encode_request(header, body), on_response=on_response,
                     settle=lambda: self._release(pending))

    def _pending(self, version: int, body: FetchRequest) -> list[_Pending]:
        pending = []
        for topic in body.topics:
            name = topic.topic if version < FETCH_FIRST_TOPIC_ID else self.cluster.name_of(topic.topic_id)
            for part in topic.partitions:
                coop = part.cooperative
                if coop is None:
                    continue
                item = _Pending((coop.group_id, name or "", part.partition),
                                topic.topic if version < FETCH_FIRST_TOPIC_ID else topic.topic_id, part,
                                member=coop.member_id, token=part.fetch_offset,
                                read_committed=body.isolation_level == 1)
                if name is None:
                    item.error = ErrorCode.UNKNOWN_TOPIC_ID
                elif not coop.group_id:
                    item.error = ErrorCode.INVALID_GROUP_ID
                elif not coop.member_id:
                    item.error = ErrorCode.UNKNOWN_MEMBER_ID
                else:
                    item.error = self._generation_error(coop.group_id, coop.generation_id)
                pending.append(item)
        return pending

    @staticmethod
    def _invalid_request(body: FetchRequest) -> bool:
        """Cooperative partitions need a sessionless Fetch without key ranges anywhere."""
        if body.session_id != 0 or body.session_epoch != -1:
            return True
        if body.key_ranges is not None:
            return True
        return any(p.key_ranges is not None for t in body.topics for p in t.partitions)

    def _generation_error(self, group: str, generation: int) -> int:
        newest = self._generations.get(group, -1)
        if generation > newest:
            self._generations[group] = generation
            self._generations.move_to_end(group)
            while len(self._generations) > _MAX_GROUPS:
                self._generations.popitem(last=False)
        code = generation_error(newest, generation)
        if code:
            self._refused.labels("generation").inc()
        return code

    async def _decide(self, item: _Pending, deadline: float) -> None:
        """Take the partition's turn and decide the span the fetch reads (or nothing)."""
        if item.error:
            return
        try:
            state = await self._state(item.key)
        except Exception as exc:  # the grants log, the commit log or coordinator could not be read
            log.warning("cooperative fetch: grants or committed offsets unavailable group=%s topic=%s partition=%s "
                        "reason=%r", *item.key, str(exc))
            self._refused.labels("grants_unavailable").inc()
            item.error = ErrorCode.COORDINATOR_NOT_AVAILABLE
            return
        if not await self._take_turn(state, deadline):
            self._refused.labels("turn").inc()
            return
        item.state, item.held, item.deadline = state, True, deadline
        grants = state.grants
        group, topic, partition = item.key
        committed = self._known(item.key)
        grants.release(committed)
        span = grants.next_span(item.member, item.token, committed, _now_ms(), self.max_leases)
        if span is not None and span.lease is None and grants.redelivery(span):
            try:  # offsets handed out before: what the group committed decides what goes out again;
                # read it whole, transactions committed and not yet folded into the log included
                committed = self._committed(await self.commits.committed_state(group, (topic, partition),
                                                                               with_shadows=True))
            except Exception as exc:
                log.warning("cooperative fetch: cannot read what was committed group=%s topic=%s partition=%s "
                            "reason=%r", group, topic, partition, str(exc))
                self._refused.labels("commits_unavailable").inc()
                return
            grants.release(committed)
            span = grants.next_span(item.member, item.token, committed, _now_ms(), self.max_leases)
        if span is None:
            self._refused.labels("lease_limit").inc()
            return
        item.span, item.committed = span, committed
        item.max_bytes = item.part.partition_max_bytes
        item.part.fetch_offset = span.start
        item.part.last_fetched_epoch = -1
        if span.lease is None and not span.reset and span.claim_from is None and not grants.redelivery(span):
            ask = self._ask_for(item, state, span)
            if ask is not None:  # offsets known to exist: the log places the chunk, then it is read
                item.ask = ask
                expected = grants.expect(ask, _now_ms())
                if expected is not None:
                    grants.hold(ask.proposal, expected)  # the next fetch decides around it: the turn passes on
                item.proposal = self.grants.submit(item.key, ask)  # queued in the order of the decisions
                self._release([item])
                return
        if span.lease is None:  # read beyond the chunks the asks of other instances may take first
            ahead = min(grants.ahead(self.grants.instance), _READ_AHEAD)
            if ahead > 1:  # and half a limit more: a batch may be a little larger than the limit
                wanted = item.max_bytes * ahead + item.max_bytes // 2
                item.part.partition_max_bytes = max(item.max_bytes, min(wanted, _READ_AHEAD_BYTES))

    def _ask_for(self, item: _Pending, state: _Partition, span: Span) -> Grant | None:
        """The ask for ``item``'s next chunk before its read, when this instance knows of
        offsets from ``span`` on (its latest read of the partition ended past it) and has
        seen how many bytes an offset takes; None: read first, then ask (at the log end)."""
        end = state.known_end(item.read_committed)
        if span.end is not None:
            end = min(end, span.end)
        if end < span.start or state.offset_bytes <= 0:
            return None
        offsets = max(1, int(item.max_bytes * _CHUNK_FILL / state.offset_bytes))
        return state.grants.ask(span, item.member, item.token, (), end, item.max_bytes, item.committed,
                                lease_ms=self.lease_ms, instance=self.grants.instance,
                                proposal=self.grants.next_proposal(), now_ms=_now_ms(),
                                view=self.grants.view(item.key), offsets=offsets)

    async def _ask_before_read(self, item: _Pending) -> None:
        """Propose ``item``'s ask; with a chunk, the read starts at its first offset, else
        the partition is answered with no chunk. An ask refused as stale is made again from
        the view its own record gave (a few times in all)."""
        state, span, ask, proposal = item.state, item.span, item.ask, item.proposal
        assert state is not None and span is not None and ask is not None and proposal is not None
        grants = state.grants
        for _attempt in range(_PROPOSALS):
            self._asks_before.inc()
            try:
                decision = await self._outcome(proposal)
            except CommitLogError as exc:
                log.warning("cooperative fetch: ask not written or not read back group=%s topic=%s partition=%s "
                            "reason=%r", *item.key, str(exc))
                self._refused.labels("grants_unavailable").inc()
                item.span = None
                return
            finally:
                grants.settle(ask.proposal)
            if decision.chunk is not None:
                item.chunk, item.redelivered = decision.chunk, decision.redelivered
                item.part.fetch_offset = decision.chunk[0]
                item.part.partition_max_bytes = state.chunk_read_bytes(*decision.chunk, item.max_bytes)
                return
            if decision.reason != STALE:
                break
            renewed = self._ask_for(item, state, span)
            if renewed is None:
                break
            ask, proposal = renewed, self.grants.submit(item.key, renewed)
        self._refused.labels("taken" if decision.reason == TAKEN else "conflict").inc()
        item.span = None

    async def _outcome(self, proposal: Proposal) -> Decision:
        """``proposal``'s chunk from the grants log, its time there counted
        (``kafka_proxy_coop_ask_seconds``). Raises ``CommitLogError`` as ``outcome`` does."""
        decision = await self.grants.outcome(proposal)
        self.metrics.ask_seconds.observe(trio.current_time() - proposal.submitted)
        return decision

    def _known(self, key: GroupPartitionKey) -> Committed:
        group, topic, partition = key
        return self._committed(self.commits.known_state(group, (topic, partition)))

    @staticmethod
    def _committed(state: tuple[int, tuple] | None) -> Committed:
        return Committed() if state is None else Committed(state[0], tuple(state[1]))

    async def _state(self, key: GroupPartitionKey) -> _Partition:
        group, topic, partition = key
        grants = await self.grants.state(key)  # the log read to its end, and followed
        state = self._states.get(key)
        if state is None or state.grants is not grants:
            await self.commits.committed_state(group, (topic, partition))  # the commit log read to its end
            state = self._states.get(key)  # another fetch may have made it meanwhile
            if state is None or state.grants is not grants:
                state = _Partition(grants)
                state.lag = self._marker_lag.labels(group, topic, str(partition))
                self._states[key] = state
                self._evict()
        self._states.move_to_end(key)
        return state

    def _forget(self, key: GroupPartitionKey) -> None:
        if self._states.pop(key, None) is not None:
            try:
                self._marker_lag.remove(key[0], key[1], str(key[2]))
            except KeyError:
                pass

    def _evict(self) -> None:
        """Beyond ``_MAX_STATES``, forget the turns of the least recently fetched partitions
        nobody is fetching now (their grants are the log's)."""
        while len(self._states) > _MAX_STATES:
            for key, state in self._states.items():
                if state.turn.value == 1:
                    self._forget(key)
                    break
            else:
                return

    # -- the response ---------------------------------------------------------------------------
    async def _on_response(self, version: int, response: FetchResponse, pending: list[_Pending]) -> None:
        parts: dict[tuple[str | None, int], FetchResponse.PartitionData] = {}
        for topic in response.responses:
            name = topic.topic if version < FETCH_FIRST_TOPIC_ID else self.cluster.name_of(topic.topic_id)
            for entry in topic.partitions:
                parts[(name, entry.partition_index)] = entry
        for item in pending:
            if item.span is None or item.done:
                continue
            item.done = True
            state, span = item.state, item.span
            assert state is not None
            grants = state.grants
            part = parts.get(item.key[1:])
            if part is None:
                continue
            if part.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
                grants.reset_pending = True  # passed on: the member resets, its next FetchOffset is where to go
                continue
            if part.error_code != ErrorCode.NONE:
                continue
            state.ends = (part.high_watermark, part.last_stable_offset)
            state.read_began_in(first_batch_bytes(part.records))
            self.metrics.read_bytes.inc(len(part.records or _EMPTY))
            if span.lease is not None:  # a retry, or the rest of a chunk: the member's own again, no new grant
                chunk = cut_chunk(part.records, span.start, span.end)
                if chunk is None:
                    self._empty(part)
                else:
                    self.metrics.retried.inc()
                    self._hand_out(state, part, span.start, chunk)
            elif item.chunk is not None:
                self._hand_out_granted(item, state, part)
            else:
                await self._grant(item, state, part)
            if part.high_watermark >= 0 and state.lag is not None and grants.frontier is not None:
                state.lag.set(max(0, part.high_watermark - grants.frontier))
            if grants.counts.expired > state.expired:
                self.metrics.expired.inc(grants.counts.expired - state.expired)
                state.expired = grants.counts.expired

    async def _grant(self, item: _Pending, state: _Partition, part: FetchResponse.PartitionData) -> None:
        """Ask the log for the member's next chunk within the read; hand out the chunk it
        assigns once this instance has applied the ask. An ask refused as stale is made
        again as it was, an ask that lost its offsets to others from the offsets left (a few
        times in all); one whose range is all taken, or refused again, gets no chunk."""
        grants, span = state.grants, item.span
        assert span is not None
        blob = part.records
        for _attempt in range(_PROPOSALS):
            bounds = batch_bounds(blob, span.start, span.end)
            if bounds is None:
                if not _attempt:  # the read holds nothing complete (the log end): nothing to ask for
                    self._empty(part)
                    return
                break
            batches, end = bounds
            ask = grants.ask(span, item.member, item.token, batches, end, item.max_bytes, item.committed,
                             lease_ms=self.lease_ms, instance=self.grants.instance,
                             proposal=self.grants.next_proposal(), now_ms=_now_ms(),
                             view=self.grants.view(item.key))
            if item.held and not grants.redelivery(span) and not span.reset and span.claim_from is None:
                expected = grants.expect(ask, _now_ms())
                if expected is not None:
                    grants.hold(ask.proposal, expected)  # the next fetch decides around it: the turn passes on
                self._release([item])
            self._asks_after.inc()
            try:
                decision = await self._outcome(self.grants.submit(item.key, ask))
            except CommitLogError as exc:
                log.warning("cooperative fetch: ask not written or not read back group=%s topic=%s partition=%s "
                            "reason=%r", *item.key, str(exc))
                self._refused.labels("grants_unavailable").inc()
                self._empty(part)
                return
            finally:
                grants.settle(ask.proposal)
            if decision.chunk is not None:
                first, last = decision.chunk
                chunk = cut_chunk(blob, max(first, span.start), last)
                if chunk is None or chunk.end != last:  # cannot be: the ask named only what the read holds
                    log.error("cooperative fetch: chunk [%d, %d] not in the read group=%s topic=%s partition=%s",
                              first, last, *item.key)
                    self._refused.labels("conflict").inc()
                    self._empty(part)
                    return
                if span.reset:
                    grants.reset_pending = False
                self._count_grant(first, last, span, decision.redelivered)
                self._hand_out(state, part, first, chunk)
                return
            if decision.reason == TAKEN:
                self._refused.labels("taken").inc()
                self._empty(part)
                return  # every offset the read holds is someone's
            if not item.held:  # the turn again, for a grant that lost
                item.held = await self._take_turn(state, item.deadline)
                if not item.held:
                    break
            if decision.reason == STALE:  # asked from a view older than the lease (a quiet log
                continue  # partition): the same again, from the view its own record gave
            following = grants.next_span(item.member, item.token, item.committed, _now_ms(), self.max_leases)
            if following is None or following.lease is not None or following.reset or \
                    following.claim_from is not None or following.start < span.start:
                break
            span = following
        self._refused.labels("conflict").inc()
        self._empty(part)

    @staticmethod
    async def _take_turn(state: _Partition, deadline: float) -> bool:
        """The partition's turn: at once when it is free, however late (reading the state may
        have taken longer than the fetch's MaxWaitMs), else if it frees up by ``deadline``."""
        try:
            state.turn.acquire_nowait()
            return True
        except trio.WouldBlock:
            with trio.move_on_at(deadline):
                await state.turn.acquire()
                return True
            return False

    def _hand_out_granted(self, item: _Pending, state: _Partition, part: FetchResponse.PartitionData) -> None:
        """Cut the read to the chunk granted before it. A read that came back short (more
        bytes per offset than seen before) hands out what it holds: the member's next fetch
        reads the rest of its chunk (``KeyGrants.retry_of``); one that holds nothing of it is
        answered with no records, and the member's next fetch reads it again."""
        assert item.chunk is not None and item.span is not None
        first, last = item.chunk
        self._count_grant(first, last, item.span, item.redelivered)
        chunk = cut_chunk(part.records, first, last)
        if chunk is None:
            self._empty(part)
            return
        self._hand_out(state, part, first, chunk)

    def _count_grant(self, first: int, last: int, span: Span, redelivered: bool) -> None:
        if redelivered:
            self.metrics.redelivered.inc()
        if first > span.start:
            self.metrics.moved.inc()
        self.metrics.leased.inc()
        self.metrics.leased_offsets.inc(last - first + 1)

    def _hand_out(self, state: _Partition, part: FetchResponse.PartitionData, start: int, chunk: Chunk) -> None:
        state.saw(chunk)
        self.metrics.chunk_bytes.inc(len(chunk.records))
        part.records = chunk.records
        part.cooperative_chunk = FetchResponse.CooperativeChunk(chunk_start=start, chunk_end=chunk.end)

    @staticmethod
    def _empty(part: FetchResponse.PartitionData) -> None:
        part.records = _EMPTY
        part.aborted_transactions = []

    def _answer_locally(self, version: int, response: FetchResponse, local: list[_Pending]) -> None:
        """The cooperative partitions that got no broker read: no chunk, or their error."""
        if not local:
            return
        response_class = FetchResponse
        topics: dict[str | uuid.UUID, FetchResponse.FetchableTopicResponse] = {}
        for answered in response.responses:
            topics[answered.topic if version < FETCH_FIRST_TOPIC_ID else answered.topic_id] = answered
        for item in local:
            key = item.topic
            topic = topics.get(key)
            if topic is None:
                topic = (response_class.FetchableTopicResponse(topic=key, partitions=[])
                         if isinstance(key, str) else  # a name before v13, an id from v13 on
                         response_class.FetchableTopicResponse(topic_id=key, partitions=[]))
                response.responses.append(topic)
                topics[key] = topic
            topic.partitions.append(response_class.PartitionData(
                partition_index=item.key[2], error_code=item.error, high_watermark=-1, last_stable_offset=-1,
                log_start_offset=-1, records=_EMPTY))

    def _refuse_all(self, version: int, body: FetchRequest) -> FetchResponse:
        response_class = FetchResponse
        response = response_class(session_id=0)
        for topic in body.topics:
            entry = (response_class.FetchableTopicResponse(topic=topic.topic, partitions=[])
                     if version < FETCH_FIRST_TOPIC_ID else
                     response_class.FetchableTopicResponse(topic_id=topic.topic_id, partitions=[]))
            entry.partitions = [response_class.PartitionData(
                partition_index=p.partition, error_code=ErrorCode.INVALID_REQUEST, high_watermark=-1,
                last_stable_offset=-1, log_start_offset=-1, records=_EMPTY) for p in topic.partitions]
            response.responses.append(entry)
        self._refused.labels("invalid").inc()
        return response

    def _release(self, pending: list[_Pending]) -> None:
        for item in pending:
            if item.held and item.state is not None:
                item.held = False
                item.state.turn.release()


def _now_ms() -> int:
    """This instance's idea of the log-append time (its wall clock): what it proposes from;
    the log's own times decide."""
    return int(time.time() * 1000)
