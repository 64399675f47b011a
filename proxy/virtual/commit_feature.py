"""Commits of virtual partitions: OffsetCommit and TxnOffsetCommit naming a virtual topic
become commits of share watermarks on the real partition, kept by the commit layer
(``proxy.commits``: the log, and shadow groups inside transactions); OffsetFetch answers
each share's watermark. The rules are ``proxy.virtual.commits``' and ``proxy.virtual.txn``'s
(no I/O); docs/wire-contract.md#9-virtual-range-topics.

Committed offsets are lifted over the offsets Fetch proved hold no record of their share
(``proxy.virtual.lag``): in each commit, in each OffsetFetch answer, and by the proxy
itself once a partition's commits have gone quiet (an OffsetCommit as a member of the
group, sent when one of its members' heartbeats passes).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import trio

from proxy.commits import shadows
from proxy.commits.gaps import Gaps, lift
from proxy.commits.service import CommitService
from proxy.commits.state import share_count
from proxy.commits.writes import ShareEdits
from proxy.pipeline import ConnectionContext, DecodedResponse, Feature, Request, RequestStage, ResponseStage, Route
from proxy.pipeline.background import Background
from proxy.pipeline.route import OwnRequest, own_correlation_id
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import ErrorCode
from proxy.protocol.message_types import (
    HeartbeatRequest,
    ListGroupsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)
from proxy.protocol.message_versions import OFFSET_FETCH_FIRST_GROUPS
from proxy.virtual import commits, lag, scan, txn
from proxy.virtual.metrics import VirtualTopicsMetrics
from proxy.virtual.resolver import VirtualResolver

log = logging.getLogger("proxy.virtual")

NEWEST_COMMIT_BY_NAME = 9  # OffsetCommit / OffsetFetch v10 name topics by id only
_STALE = (ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID)


class VirtualCommitFeature(Feature):
    name = "virtual-commits"

    def __init__(self, resolver: VirtualResolver, metrics: VirtualTopicsMetrics | None, commits: CommitService) -> None:
        self.resolver = resolver
        self.reads, self.writes, self.transactions = commits.reads, commits.writes, commits.transactions
        # G deleted through the proxy deletes its share shadows (and offsets of G, theirs):
        # a group created again under the name must not read its predecessor's watermarks.
        self.writes.on_deleted(self.transactions.delete_share_shadows)
        metrics = metrics or VirtualTopicsMetrics()
        self._commits, self._txn_commits, self._settles = metrics.commits, metrics.txn_commits, metrics.txn_settles
        self._lifts = metrics.lifts
        self.gaps = resolver.gaps  # what Fetch learnt: the stretches holding no record of a share
        self.watch = lag.LiftWatch()  # the partitions the proxy lifts by itself
        self._ticking = False

    def request_stages(self) -> Mapping[int, RequestStage]:
        guarded = self.resolver.guarded
        # Not OffsetFetch: asked for every topic, it lists the virtual partitions too, and
        # its bytes name none.
        # Nor Heartbeat: it names no topic; it only tells which member lifts go as.
        return {ApiKey.OFFSET_COMMIT: guarded(self.on_offset_commit), ApiKey.OFFSET_FETCH: self.on_offset_fetch,
                ApiKey.TXN_OFFSET_COMMIT: guarded(self.on_txn_offset_commit), ApiKey.HEARTBEAT: self.on_heartbeat}

    def response_stages(self) -> Mapping[int, tuple[int, ResponseStage]]:
        return {ApiKey.LIST_GROUPS: (0, self._hide_shadows)}

    def version_limits(self) -> Mapping[int, int]:
        # OffsetCommit and OffsetFetch v10 name topics by id only; the watermark commits
        # and their answers work by name, so clients are offered v9, which every client
        # that speaks v10 also speaks.
        return {ApiKey.OFFSET_COMMIT: NEWEST_COMMIT_BY_NAME, ApiKey.OFFSET_FETCH: NEWEST_COMMIT_BY_NAME}

    def _hide_shadows(self, ctx: ConnectionContext, response: DecodedResponse[ListGroupsResponse]) -> None:
        """Share shadows of transactional commits are the proxy's bookkeeping: ListGroups
        through the proxy does not show them (DescribeGroups and OffsetFetch by name do)."""
        partitions = self.resolver.cluster.consumer_offsets_partitions
        listed = response.body.groups or []
        kept = [group for group in listed if shadows.parse_share_shadow(group.group_id, partitions) is None]
        if len(kept) != len(listed):
            response.body.groups = kept
            response.changed = True

    # -- OffsetCommit ------------------------------------------------------------------------------
    async def on_offset_commit(self, ctx: ConnectionContext, request: Request[OffsetCommitRequest]) -> Route | None:
        header, body = request.decoded()
        plan = commits.commit_plan(body, self.resolver)
        if plan is None:
            return None
        # The commit layer plans S and the watermarks under its per-partition locks (held
        # until the log is written) and writes the log once the coordinator accepted. The
        # watermarks of every share of the partitions are lifted over what Fetch learnt.
        named = {key: set(by_k) for key, by_k in plan.edits.items()}
        gaps = lag.commit_gaps([(key, mark_k) for key, ks in named.items() for mark_k in ks], self._gaps_of)
        self._watch(plan.group, named, lag.Identity(body.generation_id_or_member_epoch, body.member_id,
                                                    body.group_instance_id))
        shares = await self.writes.begin_shares(ctx, plan.group, plan.edits, plan.plain, gaps=gaps)
        refused = {**plan.refused, **shares.refused}
        for _name, vt, parts in plan.topics:
            if vt is not None:
                self._commits.labels(vt.real).inc(len(parts))
        if not commits.commit_request(body, plan, shares.offsets, refused):
            self.writes.abandon(shares)
            response = OffsetCommitResponse()
            commits.commit_response(response, plan, {}, refused)
            return Route.answer(messages.encode_response(ApiKey.OFFSET_COMMIT, request.version,
                                                         messages.new_response_header(request.correlation_id),
                                                         response))

        async def on_response(response: DecodedResponse[OffsetCommitResponse]) -> None:
            results = [((t.name, p.partition_index), p.error_code) for t in response.body.topics
                       for p in t.partitions]
            errors = await self.writes.finish_shares(shares, body.generation_id_or_member_epoch, body.member_id,
                                                     body.group_instance_id, results)
            commits.commit_response(response.body, plan, errors, refused)
            response.changed = True

        return Route(messages.encode_request(header, body), on_response=on_response)

    # -- OffsetFetch -------------------------------------------------------------------------------
    async def on_offset_fetch(self, ctx: ConnectionContext, request: Request[OffsetFetchRequest]) -> Route | None:
        header, body = request.decoded()
        version = request.version
        groups: Sequence[OffsetFetchRequest.OffsetFetchRequestGroup | OffsetFetchRequest] = (
            body.groups if version >= OFFSET_FETCH_FIRST_GROUPS else [body])
        names = [t.name for group in groups for t in group.topics or ()]
        every = any(group.topics is None for group in groups)
        if not every and not any(self.resolver.virtual(name) for name in names):
            return None
        plan = commits.offset_fetch_request(body, version, self.resolver)
        for group_id in plan.group_ids():
            try:
                await self.reads.read(group_id)  # the log's watermarks, up to its end
            except Exception as exc:  # noqa: BLE001 - CommitLogError: answered retriable, never stale
                log.warning("share watermarks unreadable group=%s reason=%r", group_id, str(exc))
                plan.unavailable.add(group_id)
        await self._read_shadows(plan, bool(body.require_stable))
        reads, name_of_marks, gaps_of = self.reads, self.resolver.names.name_of_marks, self._gaps_of

        def marks_of(group: str, real: str, partition: int, committed: int,
                     metadata: str | None) -> tuple[int, dict[int, list[int]]]:
            stable, per_k = reads.watermarks(group, (real, partition), committed, metadata,
                                             plan.shadow_marks.get((group, (real, partition)), ()))
            # each share's committed offset lifted as its next commit would lift it
            return lag.lift_answer(stable, per_k, lambda mark_k: gaps_of((real, partition), mark_k))

        def answer(response: DecodedResponse[OffsetFetchResponse]) -> None:
            commits.offset_fetch_response(response.body, response.version, plan, marks_of, name_of_marks)
            response.changed = True

        request.replace(messages.encode_request(header, body), (header, body), on_response=answer)
        return None

    async def _read_shadows(self, plan: commits.OffsetFetchPlan, require_stable: bool) -> None:
        """The committed watermark of each share shadow of the virtual partitions asked (one
        request per group: the shadows share its coordinator), for the answer."""
        wanted: dict[str, dict[str, set[tuple[str, int]]]] = {}  # group -> shadow -> real keys
        slots: dict[tuple[str, str], tuple[int, int]] = {}  # (group, shadow) -> (K, share)
        partitions = None
        for group, vt, index in plan.virtual_partitions():
            if group in plan.unavailable:
                continue
            try:
                partitions = partitions or await self.reads.offsets_partitions()
                shadow = shadows.share_shadow(group, vt.mark_k, vt.share(index), partitions)
            except shadows.ShadowNameError:
                continue  # such a group cannot have committed transactionally
            wanted.setdefault(group, {}).setdefault(shadow, set()).add((vt.real, vt.real_partition(index)))
            slots[(group, shadow)] = (vt.mark_k, vt.share(index))
        for group, by_shadow in wanted.items():
            try:
                found = await self.reads.shadow_offsets(group, {name: sorted(keys) for name, keys in by_shadow.items()},
                                                        require_stable=require_stable)
            except Exception as exc:  # noqa: BLE001 - CommitLogError: answered retriable, never stale
                log.warning("shadow watermarks unreadable group=%s reason=%r", group, str(exc))
                plan.unavailable.add(group)
                continue
            for shadow, keys in found.items():
                shares, share = slots[(group, shadow)]
                for key, (offset, metadata, error) in keys.items():
                    if error != ErrorCode.NONE:
                        plan.shadows[(group, *key, shares, share)] = (error, "")
                        continue
                    mark = shadows.shadow_mark(shares, share, offset, metadata)
                    decoded = shadows.decode_share_metadata(metadata)
                    if mark is None or decoded is None:
                        continue
                    plan.shadows[(group, *key, shares, share)] = (int(ErrorCode.NONE), decoded.client)
                    plan.shadow_marks.setdefault((group, key), []).append(mark)

    # -- TxnOffsetCommit ---------------------------------------------------------------------------
    async def on_txn_offset_commit(self, ctx: ConnectionContext,
                                   request: Request[TxnOffsetCommitRequest]) -> Route | None:
        header, body = request.decoded()
        await self.resolver.know(t.name for t in body.topics)
        plan = txn.commit_plan(body, self.resolver)
        if plan is None:
            return None
        plan.edits = lag.lift_edits(plan.edits, self._gaps_of)  # the shadows hold them lifted
        refused = dict(plan.refused)
        try:
            partitions = await self.reads.offsets_partitions()
            for shares, share in plan.slots():
                plan.shadows[(shares, share)] = shadows.share_shadow(plan.group, shares, share, partitions)
        except shadows.ShadowNameError as exc:
            log.warning("transactional commit refused group=%s reason=%r", plan.group, str(exc))
            for key in plan.edits:
                refused.setdefault(key, int(ErrorCode.INVALID_REQUEST))
        edits = {key: by_k for key, by_k in plan.edits.items() if key not in refused}
        # S_c and the watermarks, computed under the keys' locks as a plain virtual commit
        # plans them; nothing is written to the log: the transaction may still abort.
        planned = await self.transactions.begin_marks(ctx, plan.group, edits)
        refused.update(planned.refused)
        own = []
        for slot, shadow_body in txn.shadow_requests(body, plan, planned.sequences, refused):
            correlation_id = own_correlation_id()
            own.append(OwnRequest(
                messages.encode_request(dataclasses.replace(header, correlation_id=correlation_id), shadow_body),
                ApiKey.TXN_OFFSET_COMMIT, request.version, correlation_id, self._keep_shadow(plan, slot, request.version)))
        for _name, vt, parts in plan.topics:
            if vt is not None:
                self._txn_commits.labels(vt.real).inc(len(parts))
        if not txn.carrier_request(body, plan, planned.offsets, refused):
            # every partition refused: nothing goes to the broker
            self.writes.abandon(planned)
            response = TxnOffsetCommitResponse()
            txn.commit_response(response, plan, refused)
            return Route.answer(messages.encode_response(ApiKey.TXN_OFFSET_COMMIT, request.version,
                                                         messages.new_response_header(request.correlation_id),
                                                         response))
        generation, member, instance = body.generation_id, body.member_id, body.group_instance_id

        async def on_response(response: DecodedResponse[TxnOffsetCommitResponse]) -> None:
            self.writes.abandon(planned)
            outcome = txn.commit_response(response.body, plan, refused)
            response.changed = True
            committed = {key: plan.edits[key] for key, code in outcome.items() if code == ErrorCode.NONE}
            if committed:
                # Watched as a plain commit's partitions are (the proxy's own lift once quiet),
                # but due at the first quiet heartbeat whatever was learnt: a transactional
                # commit lifts only the shares it names, so another share's watermark may
                # wait in a stretch Fetch proved before this commit (lag.txn_watch_marks).
                self._watch(plan.group, lag.txn_watch_marks(committed), lag.Identity(generation, member, instance))
                background = self.transactions.background
                background.start(self._settle, background, plan.group, committed, generation, member, instance)

        return Route(messages.encode_request(header, body), before=tuple(own), on_response=on_response,
                     settle=lambda: self.writes.abandon(planned))

    @staticmethod
    def _keep_shadow(plan: txn.TxnPlan, slot: tuple[int, int], version: int):
        async def keep(raw: bytes | bytearray) -> None:
            _, plan.answers[slot] = messages.decode_response_as(TxnOffsetCommitResponse, version, raw)
        return keep

    async def _settle(self, ctx: Background, group: str, keys: dict[Any, Any], generation: int, member: str,
                      instance: str | None) -> None:
        """Once the transaction has ended, fold its committed share shadows into the log;
        the partitions are then watched again, so that a lift over what Fetch learnt before
        the fold (it had nothing to lift yet) follows once quiet."""
        if await self.transactions.settle_marks(ctx, group, keys, generation, member, instance):
            self._settles.inc()
        self._watch(group, lag.txn_watch_marks(keys), lag.Identity(generation, member, instance))

    # -- lifts the proxy makes by itself ---------------------------------------------------------------
    def _gaps_of(self, key: tuple[str, int], mark_k: int) -> dict[int, Gaps]:
        real, partition = key
        return self.gaps.of(real, self.resolver.cluster.id_of(real), partition, mark_k)

    def _version_of(self, key: tuple[str, int]) -> int:
        return self.gaps.version(*key)

    def _watch(self, group: str, marks: dict[tuple[str, int], set[int]], identity: lag.Identity) -> None:
        """A member committed ``marks`` (real partition -> K) of ``group`` through this
        instance: lifted by the proxy itself once quiet (``_tick`` looks every half quiet
        period, a heartbeat at once)."""
        self.watch.committed(group, marks, identity, trio.current_time(), self._version_of)
        if not self._ticking:
            self._ticking = self.transactions.background.start(self._tick)

    async def _tick(self) -> None:
        """Lifts due without a heartbeat through this instance: members whose coordinator
        connection reaches another instance, or that left once caught up (their last
        commit often comes just before they close)."""
        try:
            while self.watch:
                await trio.sleep(self.watch.quiet / 2)
                for group in self.watch.groups():
                    self._lift_due(group)
                self.watch.forget_idle(trio.current_time(), self._version_of)
        finally:
            self._ticking = False

    def _lift_due(self, group: str) -> None:
        due = self.watch.due(group, trio.current_time(), self._version_of)
        if due is not None:
            identity, keys = due
            if not self.transactions.background.start(self._lift, group, identity, keys):
                self.watch.done(group, keys, trio.current_time())

    async def on_heartbeat(self, ctx: ConnectionContext, request: Request[HeartbeatRequest]) -> Route | None:
        """A member of a group whose partitions this instance lifts is alive in the current
        generation: lifts go as it, and the partitions due now are lifted (``LiftWatch``)."""
        if not self.watch:
            return None
        _, body = request.decoded()
        group = body.group_id
        if not self.watch.watches(group):
            return None
        self.watch.heard(group, lag.Identity(body.generation_id, body.member_id, body.group_instance_id))
        self._lift_due(group)
        return None

    async def _lift(self, group: str, identity: lag.Identity, keys: dict[tuple[str, int], set[int]]) -> None:
        """Lift the watermarks of ``keys`` (real partition -> K) of ``group`` over what
        this instance knows holds no record of their shares, as a virtual commit goes:
        planned under the keys' locks (the lift applies to the state it meets there), the
        coordinator's OffsetCommit as ``identity`` (as nobody once the group is empty),
        then the log for what it accepted. What it knows: what its Fetches learnt, and,
        once per committed state, a read of the partition's tail (``_scan``), which is all
        it knows of shares whose fetches reach another instance. A key whose S at the
        coordinator is behind the log's (a commit of S refused after the log took the
        watermarks, e.g. the members had left) has S committed again."""
        refused: set[tuple[str, int]] = set()  # tried again later
        began = trio.current_time()
        try:
            await self.reads.read(group)  # the log up to its end: other instances write it too
            records = self.writes.log.records(group)
            read: list[tuple[str, int]] = []
            for key, ks in keys.items():
                record = records.get(key)
                if record is None:
                    continue
                state = (record[1].marks, record[1].stable)
                wait = self.watch.scan_wait(group, key, state, trio.current_time())
                if wait is None:
                    continue
                if wait > 0:
                    self.watch.later(group, key, trio.current_time() + wait)
                    continue
                self.watch.scanned(group, key, state, trio.current_time())
                await self._scan(key, ks, record[1])
                read.append(key)
            gaps = lag.commit_gaps([(key, mark_k) for key, ks in keys.items() for mark_k in ks], self._gaps_of)
            for key in list(gaps):
                record = records.get(key)
                if record is not None and not lag.lifts_anything(record[1].marks, record[1].stable, gaps[key]):
                    del gaps[key]  # nothing would move: no commit
            behind = await self._behind(group, [key for key in read if key not in gaps], records)
            if not gaps and not behind:
                return
            refused = set(gaps) | set(behind)
            edits: ShareEdits = {key: {mark_k: {} for mark_k in by_k} for key, by_k in gaps.items()}
            edits.update({key: {mark_k: {} for mark_k in keys[key]} for key in behind})
            plan = await self.writes.begin_shares(self.transactions.background, group, edits, {}, gaps=gaps)
            try:
                if self.writes.deleted_since(group, began):
                    return  # deleted meanwhile (its locks are held now): nothing to lift
                offsets = {key: value for key, value in plan.offsets.items() if key not in plan.refused}
                if not offsets:
                    return
                identity, answered = await self._commit_as_member(group, identity, offsets)
                errors = await self.writes.finish_shares(plan, identity.generation, identity.member,
                                                         identity.instance, list(answered.items()))
                lifted = {key for key in offsets if answered.get(key) == ErrorCode.NONE
                          and errors.get(key, ErrorCode.NONE) == ErrorCode.NONE}
                refused -= lifted
                for real, _partition in lifted:
                    self._lifts.labels(real).inc()
                if len(lifted) < len(offsets):
                    log.info("share watermarks not lifted group=%s refused=%s", group,
                             {f"{t}-{p}": ErrorCode.name_of(errors.get((t, p), answered.get((t, p),
                                                                       ErrorCode.UNKNOWN_SERVER_ERROR)))
                              for t, p in offsets if (t, p) not in lifted})
            finally:
                self.writes.abandon(plan)
        except Exception as exc:  # noqa: BLE001 - CommitLogError: tried again once quiet
            log.info("share watermarks not lifted group=%s reason=%r", group, str(exc))
            refused = set(keys)
        finally:
            self.watch.done(group, refused, trio.current_time())

    async def _scan(self, key: tuple[str, int], ks: set[int], state: Any) -> None:
        """Read the tail of ``key`` from its shares' lowest committed offsets up (a few
        bounded reads) and learn the stretches holding none of their records, as a Fetch
        through this instance would have (``proxy.virtual.scan``)."""
        real, partition = key
        topic_id = self.resolver.cluster.id_of(real)
        if topic_id is None:
            return
        cluster = self.writes.log.cluster
        for mark_k in ks:
            width = share_count(mark_k)
            marks = {mark[1]: mark[2] for mark in state.marks if mark[0] == mark_k}
            found = self.gaps.of(real, topic_id, partition, mark_k)
            waiting = sorted({lift(marks.get(share, state.stable), found.get(share, ())) for share in range(width)}
                             - {-1})
            for _ in range(lag.SCAN_READS):
                if not waiting:
                    break
                start = waiting[0]
                blob, high_watermark = await cluster.read_partition(real, partition, start, lag.SCAN_BYTES,
                                                                    timeout=self.writes.log.topic.timeout)
                self.gaps.high_watermark(real, partition, high_watermark)
                if start >= high_watermark:
                    break
                by_share, end = scan.read_gaps(blob, start, mark_k, self.gaps.per_share)
                if end is None:
                    break
                for share, stretches in by_share.items():
                    for low, high in stretches:
                        self.gaps.learn(real, topic_id, partition, mark_k, share, low, high)
                waiting = [offset for offset in waiting if offset >= end]

    async def _behind(self, group: str, keys: list[tuple[str, int]], records: Mapping[Any, Any]) -> set[tuple[str, int]]:
        """Of ``keys``, those whose committed offset at the coordinator is below the log's S."""
        wanted = [key for key in keys if key in records and records[key][1].stable >= 0]
        if not wanted:
            return set()
        committed = await self.writes.log.cluster.committed_offsets(group, wanted)
        return {key for key in wanted if committed.get(key, -1) < records[key][1].stable}

    async def _commit_as_member(self, group: str, identity: lag.Identity, offsets: dict[Any, Any]
                                ) -> tuple[lag.Identity, dict[tuple[str, int], int]]:
        """The proxy's own OffsetCommit as ``identity``; when the coordinator no longer knows
        it (the member left, or the generation moved on), as nobody, which it accepts while
        the group is empty (as an admin tool's commit). The identity that answered, and the
        error per key."""
        cluster = self.writes.log.cluster
        answered = await cluster.commit_offsets(group, identity.generation, identity.member, identity.instance,
                                                offsets)
        if answered and identity.generation >= 0 and all(code in _STALE for code in answered.values()):
            nobody = lag.Identity(-1, "")
            return nobody, await cluster.commit_offsets(group, -1, "", None, offsets)
        return identity, answered
