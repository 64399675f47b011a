"""The I/O edge of individual commit: OffsetCommit, OffsetFetch, DeleteGroups and
OffsetDelete request stages, and their metrics (docs/wire-contract.md#33-offsetcommit to #4-individual-commit-log).

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
(``proxy.commits.range_commit``, no I/O); ``CommitService`` (``proxy.commits.service``,
shared with virtual range topics) performs its actions, holds the log and the key locks.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import trio
from prometheus_client import Counter, Gauge

from proxy.commits.cluster import CommitLogError
from proxy.commits.range_commit import RangeCommit
from proxy.commits.service import CommitService
from proxy.commits.state import CommitState, apply_ranges, check, check_packed, rebase
from proxy.commits.wire import forward_frame, parse_request, parse_response, rewrite_response
from proxy.pipeline import ClusterView, ConnectionContext, Feature, LocalAnswer, Request, RequestStage, Route
from proxy.pipeline.route import DecodedResponse, OwnRequest, own_correlation_id
from proxy.protocol import messages
from proxy.protocol.constants import EXTENSION_TAG_BYTES, ErrorCode
from proxy.protocol.groups import salted_group, stage_prefix
from proxy.protocol.messages import ApiKey

log = logging.getLogger("proxy.commits")

FEATURE = "individual.commit"
_FIRST_RANGE_COMMIT = 8
_FIRST_TXN_RANGE_COMMIT = 3  # the first flexible TxnOffsetCommit, where tag 10000 can ride
# The carrier of a transactional range commit marks the real partition's committed offset:
# a stage may hold ranges the log does not have yet.
STAGE_MARKER = "keyrange.txnstage/1"
_SETTLE_FIRST_DELAY = 0.02
_SETTLE_MAX_DELAY = 1.0
_SETTLE_DEADLINE = 900.0  # transaction.max.timeout.ms, Kafka's default
_FIRST_RANGE_FETCH = 6
_LOG_LOOKUP_INTERVAL = 5.0  # seconds between looks for a log topic not seen yet (plain commits)
# Refusals for max.individual.commit.ranges.held come once per commit while a share lags
# (a client narrows its commit, and retries with each commit): one log line at once, then
# at most one per this many seconds, saying how many went unlogged (the metric counts all).
_HELD_LOG_INTERVAL = 10.0

Key = tuple[str, int]


class IndividualCommitFeature(Feature):
    name = "individual-commit"

    def __init__(self, config, cluster: ClusterView, metrics, *, service: CommitService) -> None:
        self.cluster = cluster
        self.enabled = config.get("accept.individual.commit")
        # Plain commits reset the state of a partition (its ranges, and the share
        # watermarks virtual topics keep there) whenever either feature may have written it.
        self.resets = self.enabled or bool(config.get("virtual.topics.enabled"))
        self.max_ranges = config.get("max.individual.commit.ranges")
        self.max_held = config.get("max.individual.commit.ranges.held")
        self._held_log_at = -_HELD_LOG_INTERVAL
        self._held_unlogged = 0
        registry = metrics.registry
        self._commits = Counter("kafka_proxy_individual_commit_range_commits",
                                "Partitions committed with offset ranges and acknowledged.", registry=registry)
        self._refused = Counter("kafka_proxy_individual_commit_refused",
                                "Partitions of range commits refused, by reason.", ["reason"], registry=registry)
        self._held = Gauge("kafka_proxy_individual_commit_ranges_held",
                           "Ranges above the stable offset held in the state this instance has read.",
                           registry=registry)
        self.service = service
        self.log = service.log
        self._log_looked_up_at = -_LOG_LOOKUP_INTERVAL

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

    def _topic_name(self, topic) -> str:
        name = getattr(topic, "name", "") or ""
        if not name:
            topic_id = getattr(topic, "topic_id", None)
            if topic_id is not None:
                name = self.cluster.name_of(topic_id) or ""
        return name

    def _export(self) -> None:
        self._held.set(self.log.ranges_held())

    # -- OffsetCommit ---------------------------------------------------------------------------
    async def on_offset_commit(self, ctx: ConnectionContext, incoming: Request) -> Route | None:
        peek, frame = incoming.peek, incoming.frame
        version = peek.api_version
        if version < _FIRST_RANGE_COMMIT:
            return None
        has_ranges = EXTENSION_TAG_BYTES in frame
        if not has_ranges and not self.resets:
            return None
        request = parse_request(frame)
        group = request.group
        names = [self._topic_name(topic) for topic in request.topics]
        refused: dict[Key, int] = {}
        range_commits: dict[Key, list] = {}
        plain: dict[Key, int] = {}
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
                    log.info("refusing range commit group=%s topic=%s partition=%s reason=%r", group, name,
                             part.index, reason)
                    refused[key] = ErrorCode.INVALID_REQUEST
                    self._refused.labels("invalid").inc()
                    continue
                range_commits.setdefault(key, []).append(ordered)
        if not range_commits and not refused:
            if not self.resets or not await self._has_state(group, plain):
                return None

        # Plain commits of partitions that hold state reset it (S = O, R and watermarks cleared).
        known = self.log.records(group) if self.resets else {}
        locked = list({*range_commits, *(key for key in plain if key in known)})
        commit = RangeCommit(range_commits, plain, max_held=self.max_held)
        planned = await self.service.plan(ctx, group, commit, locked)
        refused.update(planned.refused)
        for (name, partition), reason in commit.over_bound.items():
            self._refuse_held("range commit", group, name, partition, reason)
        stable = planned.stable  # S' of each range commit, what the broker gets
        done = planned.done

        offsets = {}
        for number, (name, topic) in enumerate(zip(names, request.topics)):
            for part in topic.partitions:
                key = (name, part.index)
                if key in stable:
                    offsets[(number, part.index)] = stable[key]
        upstream = forward_frame(request, lambda number, part: (names[number], part.index) not in refused, offsets)
        if not any((names[number], part.index) not in refused
                   for number, topic in enumerate(request.topics) for part in topic.partitions):
            done.set()
            answer = LocalAnswer()
            response = messages.new_body(ApiKey.OFFSET_COMMIT, version, "response")
            self._add_refused(response, refused)
            answer.set(messages.encode_response(ApiKey.OFFSET_COMMIT, version,
                                                messages.new_response_header(peek.correlation_id), response))
            return Route(None, local=answer)
        prepared = None
        if commit.needs_prepare:
            prepared = trio.Event()
            ctx.start_soon(self._prepare, commit, prepared)

        async def transform(raw: bytes) -> bytes:
            try:
                if prepared is not None:
                    await prepared.wait()
                # The broker's answer as brokers send it is rewritten from slices; anything
                # else (and a response that must list refused partitions) through the codec.
                parsed = parse_response(raw, version) if not refused else None
                if parsed is not None:
                    response_names = [self._topic_name(topic) for topic in parsed.topics]
                    results = [((name, part.index), part.error_code)
                               for name, topic in zip(response_names, parsed.topics) for part in topic.partitions]
                else:
                    response_header, response = messages.decode_response(ApiKey.OFFSET_COMMIT, version, raw)
                    results = [((self._topic_name(topic), part.partition_index), part.error_code)
                               for topic in response.topics for part in topic.partitions]
                outcome = await self.service.perform(group, request.generation, request.member,
                                                     request.instance_id, planned, commit.on_response(results))
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
                self._add_refused(response, refused)
                return messages.encode_response(ApiKey.OFFSET_COMMIT, version, response_header, response)
            finally:
                done.set()

        return Route(upstream, transform=transform)

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

    async def _prepare(self, commit: RangeCommit, ready: trio.Event) -> None:
        """R' and the log values of the commit, computed while the broker handles it."""
        try:
            # Let the connection's reader send the request to the broker first (not needed
            # for correctness: the transform waits for ``ready`` whatever the order).
            await trio.lowlevel.checkpoint()
            await trio.lowlevel.checkpoint()
            commit.prepare()
        finally:
            ready.set()

    async def _has_state(self, group: str, plain: dict[Key, int]) -> bool:
        """Whether a plain commit may touch state. Reads the group's log partition when
        this instance has never read it; afterwards what it read is trusted for plain
        commits (range commits and fetches always read to the log's end)."""
        if self.log.current(group):
            return self.log.table.holds_any(group, plain)
        if self.log.partitions is None:
            # No log seen yet: look again at most every few seconds, so standard commits
            # do not each pay a Metadata request while nobody uses individual commit.
            now = trio.current_time()
            if now - self._log_looked_up_at < _LOG_LOOKUP_INTERVAL:
                return False
            self._log_looked_up_at = now
        try:
            # The log exists but this instance has not read the group's log partition yet
            # (another instance wrote it): read it once, so the plain commit resets any
            # state there. Later plain commits of groups on that partition trust memory.
            await self.log.catch_up(group)
        except CommitLogError:
            return False
        return self.log.table.holds_any(group, plain)

    def _add_refused(self, response, refused: dict[Key, int]) -> None:
        if not refused:
            return
        cls = messages.body_class(ApiKey.OFFSET_COMMIT, "response")
        by_topic: dict[str, list] = {}
        for (name, partition), error in refused.items():
            by_topic.setdefault(name, []).append(cls.OffsetCommitResponsePartition(partition_index=partition,
                                                                                   error_code=error))
        existing = {topic.name: topic for topic in response.topics}
        for name, parts in by_topic.items():
            if name in existing:
                existing[name].partitions.extend(parts)
            else:
                response.topics.append(cls.OffsetCommitResponseTopic(name=name, partitions=parts))

    # -- TxnOffsetCommit with offset ranges --------------------------------------------------------
    async def _offsets_partitions(self) -> int:
        count = await self.cluster.offsets_partitions()
        if count is None:
            raise CommitLogError("the partition count of __consumer_offsets is unknown")
        return count

    async def on_txn_offset_commit(self, ctx: ConnectionContext, incoming: Request) -> Route | None:
        """A TxnOffsetCommit naming offset ranges (individual.commit version 2): the member's
        stage, in a shadow group of its own, and the client's request as the carrier (S_c,
        the member's generation), both in the client's transaction; once it is committed
        the stage is folded into the log (docs/individual-commit.md, "Offset ranges of
        extension clients")."""
        if incoming.version < _FIRST_TXN_RANGE_COMMIT or EXTENSION_TAG_BYTES not in incoming.frame:
            return None
        header, body = incoming.decoded()
        ranged = [(topic.name, part) for topic in body.topics for part in topic.partitions if part.offset_ranges]
        if not ranged:
            return None
        group = body.group_id
        refused: dict[Key, int] = {}
        commits: dict[Key, list] = {}
        for name, part in ranged:
            key = (name, part.partition_index)
            reason, ordered = check(part.committed_offset, [(r.start, r.end) for r in part.offset_ranges],
                                    self.max_ranges)
            if reason is not None:
                log.info("refusing transactional range commit group=%s topic=%s partition=%s reason=%r", group,
                         name, part.partition_index, reason)
                refused[key] = int(ErrorCode.INVALID_REQUEST)
                self._refused.labels("invalid").inc()
                continue
            commits[key] = ordered
        plan = None
        slot = None
        if commits:
            try:
                slot = salted_group(stage_prefix(group, body.transactional_id), group, await self._offsets_partitions())
            except (CommitLogError, ValueError) as exc:
                log.warning("transactional range commit refused group=%s reason=%r", group, str(exc))
                refused.update({key: int(ErrorCode.INVALID_REQUEST) for key in commits})
                commits = {}
        if commits and slot is not None:
            plan = await self.service.begin_stage(ctx, group, slot, commits, max_held=self.max_held)
            refused.update(plan.refused)
            for (name, partition), reason in plan.over_bound.items():
                self._refuse_held("transactional range commit", group, name, partition, reason)
        offsets = plan.offsets if plan is not None else {}
        request_class = messages.body_class(ApiKey.TXN_OFFSET_COMMIT, "request")
        shadow = copy.copy(body)
        shadow.group_id, shadow.generation_id, shadow.member_id, shadow.group_instance_id = slot, -1, "", None
        by_topic: dict[str, list] = {}
        for (name, partition), (stable, text) in offsets.items():
            by_topic.setdefault(name, []).append(request_class.TxnOffsetCommitRequestPartition(
                partition_index=partition, committed_offset=stable, committed_leader_epoch=-1,
                committed_metadata=text))
        shadow.topics = [request_class.TxnOffsetCommitRequestTopic(name=n, partitions=p) for n, p in by_topic.items()]
        kept = []
        for topic in body.topics:
            parts = []
            for part in topic.partitions:
                key = (topic.name, part.partition_index)
                if key in refused:
                    continue
                if key in offsets:
                    part.committed_offset, part.committed_metadata = offsets[key][0], STAGE_MARKER
                    part.offset_ranges = None
                parts.append(part)
            if parts:
                topic.partitions = parts
                kept.append(topic)
        asked = [(topic.name, [p.partition_index for p in topic.partitions]) for topic in body.topics]
        body.topics = kept
        if not kept:
            if plan is not None:
                plan.done.set()
            return Route.answer(messages.encode_response(ApiKey.TXN_OFFSET_COMMIT, incoming.version,
                                                         messages.new_response_header(incoming.correlation_id),
                                                         _txn_answer(asked, {}, {}, refused, incoming.version)))
        answers: dict[str, Any] = {}
        own: tuple[OwnRequest, ...] = ()
        if shadow.topics:
            correlation_id = own_correlation_id()

            async def keep(raw: bytes) -> None:
                _, answers["stage"] = messages.decode_response(ApiKey.TXN_OFFSET_COMMIT, incoming.version, raw)

            own = (OwnRequest(messages.encode_request(dataclasses.replace(header, correlation_id=correlation_id),
                                                      shadow), ApiKey.TXN_OFFSET_COMMIT, incoming.version,
                              correlation_id, keep),)
        generation, member, instance = body.generation_id, body.member_id, body.group_instance_id
        self._commits.inc(len(offsets))

        async def on_response(response: DecodedResponse) -> None:
            if plan is not None:
                plan.done.set()
            carrier = {(t.name, p.partition_index): p.error_code for t in response.body.topics for p in t.partitions}
            staged = {(t.name, p.partition_index): p.error_code for t in answers["stage"].topics
                      for p in t.partitions} if "stage" in answers else {}
            response.body = _txn_answer(asked, carrier, {key: staged.get(key, int(ErrorCode.UNKNOWN_SERVER_ERROR))
                                                         for key in offsets}, refused, incoming.version)
            response.changed = True
            accepted = [key for key in offsets if carrier.get(key) == ErrorCode.NONE and staged.get(key) == ErrorCode.NONE]
            if accepted and slot is not None:
                background = self.service.background
                background.start(self._settle_stage, background, group, slot, accepted, generation, member, instance)

        return Route(messages.encode_request(header, body), before=own, on_response=on_response,
                     settle=(lambda: plan.done.set()) if plan is not None else None)

    async def _settle_stage(self, ctx: Any, group: str, slot: str, keys: list[Key], generation: int,
                            member: str, instance: str | None) -> None:
        """Once the transaction ended, fold what the committed stage holds beyond the log;
        an aborted stage never shows, and nothing is written."""
        try:
            began = trio.current_time()
            delay, deadline = _SETTLE_FIRST_DELAY, began + _SETTLE_DEADLINE
            while True:
                await trio.sleep(delay)
                await self.log.catch_up(group)
                extra, pending = await self.service.stages(group, [slot], keys, require_stable=True)
                if not pending:
                    break
                if trio.current_time() > deadline:
                    return
                delay = min(delay * 2, _SETTLE_MAX_DELAY)
            if extra:
                await self.service.fold_stages(ctx, group, extra, generation=generation, member=member,
                                               instance_id=instance, since=began)
                self._export()
        except Exception as exc:  # noqa: BLE001 - the next commit or OffsetFetch folds it
            log.warning("transactional range commit not folded group=%s reason=%r", group, str(exc))

    async def _stage_slots(self, group: str) -> list[str]:
        """The stage shadow groups of ``group``'s members (ListGroups at its coordinator)."""
        return await self.service.stage_slots(group)

    # -- OffsetFetch ----------------------------------------------------------------------------
    async def on_offset_fetch(self, ctx: ConnectionContext, incoming: Request) -> Route | None:
        peek, frame = incoming.peek, incoming.frame
        version = peek.api_version
        if version < _FIRST_RANGE_FETCH:
            return None
        single_group = None
        if version < 8:
            _, request = messages.decode_request(frame)
            single_group = request.group_id

        async def transform(raw: bytes) -> bytes:
            response_header, response = messages.decode_response(ApiKey.OFFSET_FETCH, version, raw)
            if version >= 8:
                groups = [(entry.group_id, entry.topics, entry) for entry in response.groups]
            else:
                groups = [(single_group, response.topics, response)]
            changed = False
            for group, topics, holder in groups:
                if holder.error_code != ErrorCode.NONE:
                    continue
                try:
                    states = await self.log.states(group)
                except CommitLogError as exc:
                    if self.log.partitions is None:
                        # This instance has never seen the log (and cannot reach it, e.g.
                        # the brokers require authentication the proxy does not have): it
                        # holds no state to add; the standard answer stands.
                        log.debug("individual-commit log unavailable group=%s reason=%r", group, str(exc))
                        continue
                    # Never serve state older than the log: a retriable error instead.
                    log.warning("individual-commit log unreadable group=%s reason=%r", group, str(exc))
                    holder.error_code = ErrorCode.COORDINATOR_NOT_AVAILABLE
                    changed = True
                    continue
                if await self._with_stages(ctx, group, topics, states, frame):
                    changed = True
                if states and self._merge_fetched(topics, states, version):
                    changed = True
            if not changed:
                return raw
            self._export()
            return messages.encode_response(ApiKey.OFFSET_FETCH, version, response_header, response)

        return Route(frame, transform=transform)

    async def _with_stages(self, ctx: ConnectionContext, group: str, topics, states: dict[Key, CommitState],
                           frame) -> bool:
        """Add to ``states`` what committed transactional stages hold beyond the log, and
        answer UNSTABLE_OFFSET_COMMIT (with RequireStable) where one is pending. Asked only
        where stages may be: the group holds state in the log, or a carrier's marker shows.
        Returns whether a partition's error was set."""
        asked = {(self._topic_name(t), p.partition_index): p for t in topics for p in t.partitions
                 if p.error_code == ErrorCode.NONE}
        if not asked or not (states or any((p.metadata or "").startswith(STAGE_MARKER) for p in asked.values())):
            return False
        try:
            slots = await self._stage_slots(group)
            if not slots:
                return False
            _, request = messages.decode_request(frame)
            extra, pending = await self.service.stages(group, slots, sorted(asked),
                                                       require_stable=bool(getattr(request, "require_stable", False)))
        except (CommitLogError, ValueError) as exc:
            log.warning("transactional range stages unreadable group=%s reason=%r", group, str(exc))
            return False
        for key, ranges in extra.items():
            states[key] = apply_ranges(states.get(key, CommitState(-1)), ranges)
        if extra:
            background = self.service.background
            background.start(self.service.fold_stages, background, group, extra)
        for key in pending:
            asked[key].error_code = int(ErrorCode.UNSTABLE_OFFSET_COMMIT)
            asked[key].committed_offset = -1
            states.pop(key, None)
        return bool(pending)

    def _merge_fetched(self, topics, states: dict[Key, CommitState], version: int) -> bool:
        cls = messages.body_class(ApiKey.OFFSET_FETCH, "response")
        changed = False
        for topic in topics:
            name = self._topic_name(topic)
            for part in topic.partitions:
                state = states.get((name, part.partition_index))
                if state is None or part.error_code != ErrorCode.NONE:
                    continue
                merged = rebase(state, part.committed_offset) if part.committed_offset >= 0 else state
                part.committed_offset = merged.stable
                part.committed_range_offsets = [cls.OffsetRange(start=start, end=end) for start, end in merged.ranges]
                changed = True
        return changed

    # -- deletion ---------------------------------------------------------------------------------
    async def on_delete_groups(self, ctx: ConnectionContext, incoming: Request) -> Route | None:
        peek, frame = incoming.peek, incoming.frame
        version = peek.api_version

        async def transform(raw: bytes) -> bytes:
            _, response = messages.decode_response(ApiKey.DELETE_GROUPS, version, raw)
            for result in response.results:
                if result.error_code == ErrorCode.NONE:
                    await self.service.deleting(result.group_id)
                    await self._tombstone(result.group_id, None)
                    await self.service.deleted(result.group_id, None)
            return raw

        return Route(frame, transform=transform)

    async def on_offset_delete(self, ctx: ConnectionContext, incoming: Request) -> Route | None:
        peek, frame = incoming.peek, incoming.frame
        version = peek.api_version
        _, request = messages.decode_request(frame)
        group = request.group_id

        async def transform(raw: bytes) -> bytes:
            _, response = messages.decode_response(ApiKey.OFFSET_DELETE, version, raw)
            if response.error_code == ErrorCode.NONE:
                deleted = {(topic.name, part.partition_index) for topic in response.topics
                           for part in topic.partitions if part.error_code == ErrorCode.NONE}
                await self.service.deleting(group, deleted)
                await self._tombstone(group, deleted)
                if deleted:
                    await self.service.deleted(group, deleted)
            return raw

        return Route(frame, transform=transform)

    async def _tombstone(self, group: str, keys: set[Key] | None) -> None:
        try:
            states = await self.log.states(group)
            doomed = [key for key in states if keys is None or key in keys]
            if not doomed:
                return
            locks = [(group, *key) for key in doomed]
            await self.service.locks.acquire(locks)
            try:
                await self.log.write(group, {key: None for key in doomed})
            finally:
                self.service.locks.release(locks)
            self._export()
        except CommitLogError as exc:
            log.error("cannot delete individual-commit state group=%s reason=%r", group, str(exc))


def _txn_answer(asked: list[tuple[str, list[int]]], carrier: dict[Key, int], staged: dict[Key, int],
                refused: dict[Key, int], version: int) -> Any:
    """The client's TxnOffsetCommit answer: per partition asked, ``refused`` first, then the
    carrier's error, then (range partitions) the stage's."""
    cls = messages.body_class(ApiKey.TXN_OFFSET_COMMIT, "response")
    body = messages.new_body(ApiKey.TXN_OFFSET_COMMIT, version, "response")

    def error_of(key: Key) -> int:
        if key in refused:
            return refused[key]
        code = carrier.get(key, int(ErrorCode.UNKNOWN_SERVER_ERROR))
        if code == ErrorCode.NONE and key in staged:
            return staged[key]
        return code

    body.topics = [cls.TxnOffsetCommitResponseTopic(name=name, partitions=[
        cls.TxnOffsetCommitResponsePartition(partition_index=index, error_code=error_of((name, index)))
        for index in parts]) for name, parts in asked]
    return body
