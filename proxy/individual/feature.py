"""The I/O edge of individual commit: OffsetCommit, OffsetFetch, TxnOffsetCommit,
DeleteGroups and OffsetDelete request stages, and their metrics
(docs/wire-contract.md#33-offsetcommit to #4-individual-commit-log).

Write order of a range commit (docs/individual-commit.md explains why):

1. In the request hook, under a per-(group, topic, partition) lock: compute S' from the
   state this instance holds and forward a standard OffsetCommit carrying S' for those
   partitions; the group's log partition is read to its end alongside (first use: before).
   R' and the log values are computed while the broker works.
2. The broker checks generation and membership and stores S'. A partition it rejects
   changes nothing: no log write, no memory change.
3. In the response transform, for partitions the broker accepted: once the log's end is
   read, a key another instance wrote meanwhile is merged again from that record (and the
   coordinator given the corrected S if it differs); then the states are written to the
   log with acks=all. If that write did not land right where the read ended, another
   instance wrote in between: a key it wrote there is merged again and written again.
   Only then does the response (with StableOffset) leave. If the end cannot be read or a
   write fails, the partition is answered COORDINATOR_NOT_AVAILABLE (retriable), so no
   commit is acknowledged that is not in the log's newest record of its key.

What to do at each step, and what each answer means, is ``RangeCommit``
(``proxy.commits.range_commit``, no I/O); the commit layer (``proxy.commits``: its reads,
writes and transactions, shared with virtual range topics) performs its actions, holds the
log and the key locks.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import trio

from proxy.commits.cluster import CommitLogError
from proxy.commits.range_commit import RangeCommit
from proxy.commits.service import CommitService
from proxy.commits.shadows import CARRIER_MARKER, range_shadow
from proxy.commits.state import CommitState, apply_ranges, check, check_packed
from proxy.commits.wire import CommitRequest, forward_frame, parse_request, parse_response, rewrite_response
from proxy.commits.writes import Planned
from proxy.individual import txn
from proxy.individual.answers import FetchedTopic, add_refused, merge_fetched
from proxy.individual.metrics import IndividualCommitMetrics
from proxy.individual.settings import IndividualCommitSettings
from proxy.pipeline import ClusterView, ConnectionContext, Feature, Request, RequestStage, Route
from proxy.pipeline.background import Background
from proxy.pipeline.route import DecodedResponse, OwnRequest, own_correlation_id
from proxy.protocol import messages
from proxy.protocol.constants import EXTENSION_TAG_BYTES, INDIVIDUAL_COMMIT_FEATURE, ErrorCode
from proxy.protocol.message_types import (
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)
from proxy.protocol.message_versions import (
    OFFSET_COMMIT_FIRST_FLEXIBLE,
    OFFSET_FETCH_FIRST_FLEXIBLE,
    OFFSET_FETCH_FIRST_GROUPS,
    TXN_OFFSET_COMMIT_FIRST_FLEXIBLE,
)
from proxy.protocol.messages import ApiKey

log = logging.getLogger("proxy.commits")

FEATURE = INDIVIDUAL_COMMIT_FEATURE
# tag 10000 fields ride from the first flexible version on
_FIRST_RANGE_COMMIT = OFFSET_COMMIT_FIRST_FLEXIBLE
_FIRST_TXN_RANGE_COMMIT = TXN_OFFSET_COMMIT_FIRST_FLEXIBLE
_FIRST_RANGE_FETCH = OFFSET_FETCH_FIRST_FLEXIBLE
# Refusals for max.individual.commit.ranges.held come once per commit while a share lags
# (a client narrows its commit, and retries with each commit): one log line at once, then
# at most one per this many seconds, saying how many went unlogged (the metric counts all).
_HELD_LOG_INTERVAL = 10.0

TopicPartitionKey = tuple[str, int]


@dataclass
class _Commit:
    """One OffsetCommit between its request and its response."""

    version: int
    request: CommitRequest
    commit: RangeCommit
    planned: Planned
    refused: dict[TopicPartitionKey, int]
    prepared: trio.Event | None


async def _prepare(commit: RangeCommit, ready: trio.Event) -> None:
    """R' and the log values of the commit, computed while the broker handles it."""
    try:
        # Let the connection's reader send the request to the broker first (not needed
        # for correctness: the transform waits for ``ready`` whatever the order).
        await trio.lowlevel.checkpoint()
        await trio.lowlevel.checkpoint()
        commit.prepare()
    finally:
        ready.set()


class IndividualCommitFeature(Feature):
    name = "individual-commit"

    def __init__(self, settings: IndividualCommitSettings, cluster: ClusterView,
                 metrics: IndividualCommitMetrics | None = None, *, commits: CommitService,
                 virtual_topics: bool = False) -> None:
        self.cluster = cluster
        self.enabled = settings.enabled
        # Plain commits reset the state of a partition (its ranges, and the share
        # watermarks virtual topics keep there) whenever either feature may have written it.
        self.resets = self.enabled or virtual_topics
        self.max_ranges = settings.max_ranges
        self.max_held = settings.max_ranges_held
        self._held_log_at = -_HELD_LOG_INTERVAL
        self._held_unlogged = 0
        metrics = metrics or IndividualCommitMetrics()
        self._commits, self._refused, self._held = metrics.range_commits, metrics.refused, metrics.ranges_held
        self.reads, self.writes, self.transactions = commits.reads, commits.writes, commits.transactions
        self.log = commits.log

    def request_stages(self) -> Mapping[int, RequestStage]:
        stages: dict[int, RequestStage] = {ApiKey.OFFSET_COMMIT: self.on_offset_commit}
        if self.enabled:
            stages[ApiKey.OFFSET_FETCH] = self.on_offset_fetch
            stages[ApiKey.TXN_OFFSET_COMMIT] = self.on_txn_offset_commit
        if self.resets:  # deleted offsets take their ranges and share watermarks with them
            stages.update({ApiKey.DELETE_GROUPS: self.on_delete_groups, ApiKey.OFFSET_DELETE: self.on_offset_delete})
        return stages

    def advertised(self) -> Mapping[str, tuple[int, int]]:
        # version 2: offset ranges inside transactions (TxnOffsetCommit)
        return {FEATURE: (1, 2)} if self.enabled else {}

    def _topic_name(self, topic: object) -> str:
        """The name of a topic entry (wire or decoded, of any version): its name, else the
        name of its id."""
        name = getattr(topic, "name", "") or ""
        if not name:
            topic_id = getattr(topic, "topic_id", None)
            if topic_id is not None:
                name = self.cluster.name_of(topic_id) or ""
        return name

    def _export(self) -> None:
        self._held.set(self.log.ranges_held())

    # -- OffsetCommit ---------------------------------------------------------------------------
    async def on_offset_commit(self, ctx: ConnectionContext, incoming: Request[OffsetCommitRequest]) -> Route | None:
        version = incoming.version
        if version < _FIRST_RANGE_COMMIT:
            return None
        if EXTENSION_TAG_BYTES not in incoming.frame and not self.resets:
            return None
        request = parse_request(incoming.frame)
        group = request.group
        names = [self._topic_name(topic) for topic in request.topics]
        refused, range_commits, plain = self._classify(request, names)
        if not range_commits and not refused:
            if not self.resets or not await self.reads.holds_state(group, plain):
                return None

        # Plain commits of partitions that hold state reset it (S = O, R and watermarks cleared).
        known = self.log.records(group) if self.resets else {}
        locked = list({*range_commits, *(key for key in plain if key in known)})
        commit = RangeCommit(range_commits, plain, max_held=self.max_held)
        planned = await self.writes.plan(ctx, group, commit, locked)
        refused.update(planned.refused)
        for (name, partition), reason in commit.over_bound.items():
            self._refuse_held("range commit", group, name, partition, reason)
        stable = planned.stable  # S' of each range commit, what the broker gets
        offsets = {(number, part.index): stable[(name, part.index)]
                   for number, (name, topic) in enumerate(zip(names, request.topics))
                   for part in topic.partitions if (name, part.index) in stable}
        upstream = forward_frame(request, lambda number, part: (names[number], part.index) not in refused, offsets)
        if not any((names[number], part.index) not in refused
                   for number, topic in enumerate(request.topics) for part in topic.partitions):
            planned.done.set()
            response = OffsetCommitResponse()
            add_refused(response, refused)
            return Route.answer(messages.encode_response(ApiKey.OFFSET_COMMIT, version,
                                                         messages.new_response_header(incoming.correlation_id),
                                                         response))
        prepared = None
        if commit.needs_prepare:
            prepared = trio.Event()
            ctx.start_soon(_prepare, commit, prepared)
        pending = _Commit(version, request, commit, planned, refused, prepared)

        async def transform(raw: bytes) -> bytes:
            return await self._commit_answered(pending, raw)

        return Route(upstream, transform=transform)

    def _classify(self, request: CommitRequest, names: list[str]
                  ) -> tuple[dict[TopicPartitionKey, int], dict[TopicPartitionKey, list], dict[TopicPartitionKey, int]]:
        """The partitions of a commit: refused (ranges while disabled, or ranges that do not
        check), committed with ranges, committed plainly."""
        refused: dict[TopicPartitionKey, int] = {}
        range_commits: dict[TopicPartitionKey, list] = {}
        plain: dict[TopicPartitionKey, int] = {}
        for name, topic in zip(names, request.topics):
            for part in topic.partitions:
                key = (name, part.index)
                ranges = part.packed
                if not ranges:
                    plain[key] = part.committed_offset
                    continue
                if not self.enabled:
                    refused[key] = ErrorCode.INVALID_REQUEST
                    self._refused.labels("disabled").inc()
                    continue
                reason, ordered = check_packed(part.committed_offset, ranges, self.max_ranges)
                if reason is not None:
                    log.info("refusing range commit group=%s topic=%s partition=%s reason=%r", request.group, name,
                             part.index, reason)
                    refused[key] = ErrorCode.INVALID_REQUEST
                    self._refused.labels("invalid").inc()
                    continue
                range_commits.setdefault(key, []).append(ordered)
        return refused, range_commits, plain

    async def _commit_answered(self, pending: _Commit, raw: bytes) -> bytes:
        """The broker answered the commit: perform what the commit's protocol asks (the log
        written for the partitions it accepted), then the client's answer."""
        version, request, refused = pending.version, pending.request, pending.refused
        try:
            if pending.prepared is not None:
                await pending.prepared.wait()
            # The broker's answer as brokers send it is rewritten from slices; anything
            # else (and a response that must list refused partitions) through the codec.
            parsed = parse_response(raw, version) if not refused else None
            if parsed is not None:
                response_names = [self._topic_name(topic) for topic in parsed.topics]
                results = [((name, part.index), part.error_code)
                           for name, topic in zip(response_names, parsed.topics) for part in topic.partitions]
            else:
                response_header, response = messages.decode_response_as(OffsetCommitResponse, version, raw)
                results = [((self._topic_name(topic), part.partition_index), part.error_code)
                           for topic in response.topics for part in topic.partitions]
            outcome = await self.writes.perform(request.group, request.generation, request.member,
                                                request.instance_id, pending.planned,
                                                pending.commit.on_response(results))
            errors, answered = outcome.errors, outcome.stable
            if answered:
                self._commits.inc(len(answered))
            self._export()
            if parsed is not None:
                return rewrite_response(parsed, response_names, errors, answered)
            for topic in response.topics:
                name = self._topic_name(topic)
                for part in topic.partitions:
                    key = (name, part.partition_index)
                    if key in errors:
                        part.error_code = errors[key]
                    if key in answered:
                        part.stable_offset = answered[key]
            add_refused(response, refused)
            return messages.encode_response(ApiKey.OFFSET_COMMIT, version, response_header, response)
        finally:
            pending.planned.done.set()

    def _refuse_held(self, what: str, group: str, topic: str, partition: int, reason: str) -> None:
        """A commit refused for ``max.individual.commit.ranges.held``: counted, and logged
        (throttled: ``_HELD_LOG_INTERVAL``)."""
        self._refused.labels("ranges_held").inc()
        now = trio.current_time()
        if now < self._held_log_at:
            self._held_unlogged += 1
            return
        unlogged, self._held_unlogged, self._held_log_at = self._held_unlogged, 0, now + _HELD_LOG_INTERVAL
        log.warning("refusing %s group=%s topic=%s partition=%s reason=%r (INVALID_COMMIT_OFFSET_SIZE; the "
                    "partition's other shares must close their gaps first)%s", what, group, topic, partition, reason,
                    f"; {unlogged} more such refusals since the last line" if unlogged else "")

    # -- TxnOffsetCommit with offset ranges --------------------------------------------------------
    async def on_txn_offset_commit(self, ctx: ConnectionContext,
                                   incoming: Request[TxnOffsetCommitRequest]) -> Route | None:
        """A TxnOffsetCommit naming offset ranges (individual.commit version 2): the member's
        range shadow and the client's request as the carrier (S_c, the member's
        generation), both in the client's transaction; once it is committed the shadow is
        folded into the log (docs/individual-commit.md, "Offset ranges of extension
        clients")."""
        if incoming.version < _FIRST_TXN_RANGE_COMMIT or EXTENSION_TAG_BYTES not in incoming.frame:
            return None
        header, body = incoming.decoded()
        if not any(part.offset_ranges for topic in body.topics for part in topic.partitions):
            return None
        group, version = body.group_id, incoming.version
        refused, commits = self._txn_range_commits(body)
        plan, shadow = None, None
        if commits:
            try:
                shadow = range_shadow(group, body.transactional_id, await self.reads.offsets_partitions())
            except ValueError as exc:  # ShadowNameError
                log.warning("transactional range commit refused group=%s reason=%r", group, str(exc))
                refused.update({key: int(ErrorCode.INVALID_REQUEST) for key in commits})
        if commits and shadow is not None:
            plan = await self.transactions.begin_ranges(ctx, group, shadow, commits, max_held=self.max_held)
            refused.update(plan.refused)
            for (name, partition), reason in plan.over_bound.items():
                self._refuse_held("transactional range commit", group, name, partition, reason)
        offsets = plan.offsets if plan is not None else {}
        shadow_body = txn.shadow_request(body, shadow or "", offsets)
        asked = txn.carrier_request(body, offsets, refused)
        if not body.topics:
            if plan is not None:
                plan.done.set()
            return Route.answer(messages.encode_response(ApiKey.TXN_OFFSET_COMMIT, version,
                                                         messages.new_response_header(incoming.correlation_id),
                                                         txn.client_answer(asked, {}, {}, refused, version)))
        answers: dict[str, TxnOffsetCommitResponse] = {}
        own: tuple[OwnRequest, ...] = ()
        if shadow_body.topics:
            correlation_id = own_correlation_id()

            async def keep(raw: bytes | bytearray) -> None:
                _, answers["shadow"] = messages.decode_response_as(TxnOffsetCommitResponse, version, raw)

            own = (OwnRequest(messages.encode_request(dataclasses.replace(header, correlation_id=correlation_id),
                                                      shadow_body), ApiKey.TXN_OFFSET_COMMIT, version,
                              correlation_id, keep),)
        generation, member, instance = body.generation_id, body.member_id, body.group_instance_id
        self._commits.inc(len(offsets))

        async def on_response(response: DecodedResponse[TxnOffsetCommitResponse]) -> None:
            if plan is not None:
                plan.done.set()
            carrier = txn.errors_of(response.body)
            shadowed = txn.errors_of(answers["shadow"]) if "shadow" in answers else {}
            response.body = txn.client_answer(asked, carrier, {
                key: shadowed.get(key, int(ErrorCode.UNKNOWN_SERVER_ERROR)) for key in offsets}, refused, version)
            response.changed = True
            accepted = [key for key in offsets if carrier.get(key) == ErrorCode.NONE
                        and shadowed.get(key) == ErrorCode.NONE]
            if accepted and shadow is not None:
                background = self.transactions.background
                background.start(self._settle, background, group, shadow, accepted, generation, member, instance)

        return Route(messages.encode_request(header, body), before=own, on_response=on_response,
                     settle=(lambda: plan.done.set()) if plan is not None else None)

    def _txn_range_commits(self, body: TxnOffsetCommitRequest) -> tuple[dict[TopicPartitionKey, int], dict[TopicPartitionKey, list]]:
        """The range commits of a TxnOffsetCommit, and the partitions refused (ranges that do
        not check)."""
        refused: dict[TopicPartitionKey, int] = {}
        commits: dict[TopicPartitionKey, list] = {}
        for topic in body.topics:
            for part in topic.partitions:
                if not part.offset_ranges:
                    continue
                key = (topic.name, part.partition_index)
                reason, ordered = check(part.committed_offset, [(r.start, r.end) for r in part.offset_ranges],
                                        self.max_ranges)
                if reason is not None:
                    log.info("refusing transactional range commit group=%s topic=%s partition=%s reason=%r",
                             body.group_id, topic.name, part.partition_index, reason)
                    refused[key] = int(ErrorCode.INVALID_REQUEST)
                    self._refused.labels("invalid").inc()
                    continue
                commits[key] = ordered
        return refused, commits

    async def _settle(self, ctx: Background, group: str, shadow: str, keys: list[TopicPartitionKey], generation: int,
                      member: str, instance: str | None) -> None:
        if await self.transactions.settle_ranges(ctx, group, shadow, keys, generation, member, instance):
            self._export()

    # -- OffsetFetch ----------------------------------------------------------------------------
    async def on_offset_fetch(self, ctx: ConnectionContext, incoming: Request[OffsetFetchRequest]) -> Route | None:
        peek, frame = incoming.peek, incoming.frame
        version = peek.api_version
        if version < _FIRST_RANGE_FETCH:
            return None
        single_group = ""  # the group of a request naming one (before v8)
        if version < OFFSET_FETCH_FIRST_GROUPS:
            _, request = messages.decode_request_as(OffsetFetchRequest, frame)
            single_group = request.group_id

        async def transform(raw: bytes) -> bytes:
            response_header, response = messages.decode_response_as(OffsetFetchResponse, version, raw)
            groups: list[tuple[str, Sequence[FetchedTopic], OffsetFetchResponse | OffsetFetchResponse.OffsetFetchResponseGroup]]
            if version >= OFFSET_FETCH_FIRST_GROUPS:
                groups = [(entry.group_id, entry.topics, entry) for entry in response.groups]
            else:
                groups = [(single_group, response.topics, response)]
            changed = False
            for group, topics, holder in groups:
                if holder.error_code == ErrorCode.NONE and await self._fetched(group, topics, holder, frame):
                    changed = True
            if not changed:
                return raw
            self._export()
            return messages.encode_response(ApiKey.OFFSET_FETCH, version, response_header, response)

        return Route(frame, transform=transform)

    async def _fetched(self, group: str, topics: Sequence[FetchedTopic],
                       holder: OffsetFetchResponse | OffsetFetchResponse.OffsetFetchResponseGroup,
                       frame: bytes | bytearray) -> bool:
        """Add the group's (S, R) to its answer; whether anything changed."""
        try:
            states = await self.log.states(group)
        except CommitLogError as exc:
            if self.log.partitions is None:
                # This instance has never seen the log (and cannot reach it, e.g. the
                # brokers require authentication the proxy does not have): it holds no
                # state to add; the standard answer stands.
                log.debug("individual-commit log unavailable group=%s reason=%r", group, str(exc))
                return False
            # Never serve state older than the log: a retriable error instead.
            log.warning("individual-commit log unreadable group=%s reason=%r", group, str(exc))
            holder.error_code = ErrorCode.COORDINATOR_NOT_AVAILABLE
            return True
        changed = await self._with_shadows(group, topics, states, frame)
        if states and not await self._lifted(group, topics):
            holder.error_code = ErrorCode.COORDINATOR_NOT_AVAILABLE
            return True
        return bool(states and merge_fetched(topics, states, self._topic_name)) or changed

    async def _lifted(self, group: str, topics: Sequence[FetchedTopic]) -> bool:
        """Where the coordinator's committed offset is above the log's S, write it into the
        log before it is served (``CommitWrites.lift`` says why); whether that went well."""
        floors = {(self._topic_name(topic), part.partition_index): part.committed_offset
                  for topic in topics for part in topic.partitions if part.error_code == ErrorCode.NONE}
        failed = await self.writes.lift(group, floors)
        if failed:
            log.warning("individual-commit state not lifted to the coordinator's offsets group=%s keys=%s",
                        group, sorted(failed))
        return not failed

    async def _with_shadows(self, group: str, topics: Sequence[FetchedTopic], states: dict[TopicPartitionKey, CommitState],
                            frame: bytes | bytearray) -> bool:
        """Add to ``states`` what committed range shadows hold beyond the log, and answer
        UNSTABLE_OFFSET_COMMIT (with RequireStable) where one is pending. Asked only where
        shadows may be: the group holds state in the log, or a carrier's marker shows.
        Returns whether a partition's error was set."""
        asked = {(self._topic_name(t), p.partition_index): p for t in topics for p in t.partitions
                 if p.error_code == ErrorCode.NONE}
        if not asked or not (states or any((p.metadata or "").startswith(CARRIER_MARKER) for p in asked.values())):
            return False
        try:
            names = await self.reads.range_shadows(group)
            if not names:
                return False
            _, request = messages.decode_request_as(OffsetFetchRequest, frame)
            extra, pending = await self.reads.shadowed_ranges(
                group, names, sorted(asked), require_stable=bool(request.require_stable))
        except (CommitLogError, ValueError) as exc:
            log.warning("transactional range shadows unreadable group=%s reason=%r", group, str(exc))
            return False
        # the log as read after the shadows: what a shadow dropped meanwhile is in it
        states.update(self.log.table.states(group))
        for key, ranges in extra.items():
            states[key] = apply_ranges(states.get(key, CommitState(-1)), ranges)
        if extra:
            background = self.transactions.background
            background.start(self.transactions.fold_ranges, background, group, extra)
        for key in pending:
            asked[key].error_code = int(ErrorCode.UNSTABLE_OFFSET_COMMIT)
            asked[key].committed_offset = -1
            states.pop(key, None)
        return bool(pending)

    # -- deletion ---------------------------------------------------------------------------------
    async def on_delete_groups(self, ctx: ConnectionContext, incoming: Request[DeleteGroupsRequest]) -> Route | None:
        version = incoming.version

        async def transform(raw: bytes) -> bytes:
            _, response = messages.decode_response_as(DeleteGroupsResponse, version, raw)
            for result in response.results:
                if result.error_code == ErrorCode.NONE:
                    await self.writes.delete(result.group_id, None)
                    self._export()
            return raw

        return Route(incoming.frame, transform=transform)

    async def on_offset_delete(self, ctx: ConnectionContext, incoming: Request[OffsetDeleteRequest]) -> Route | None:
        version = incoming.version
        _, request = messages.decode_request_as(OffsetDeleteRequest, incoming.frame)
        group = request.group_id

        async def transform(raw: bytes) -> bytes:
            _, response = messages.decode_response_as(OffsetDeleteResponse, version, raw)
            if response.error_code == ErrorCode.NONE:
                deleted = {(topic.name, part.partition_index) for topic in response.topics
                           for part in topic.partitions if part.error_code == ErrorCode.NONE}
                await self.writes.delete(group, deleted)
                self._export()
            return raw

        return Route(incoming.frame, transform=transform)
