"""The I/O edge of virtual range topics: one feature that rewrites every request naming a
virtual topic before any other feature or the broker sees it, and the responses back;
answers Fetch of virtual partitions through the key-range engine's shared reads; keeps
share watermarks; refuses writes. The rules are the sans-IO modules' (see the package).

It runs right after the cluster feed, so the shared cluster view learns only real topics.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import trio
from prometheus_client import Counter

from proxy.commits import shadows
from proxy.commits.service import CommitService
from proxy.pipeline import ClusterView, ConnectionContext, DecodedResponse, Feature, Request, RequestStage, Route
from proxy.pipeline.background import Background
from proxy.pipeline.context import StateKey
from proxy.pipeline.route import OwnRequest, own_correlation_id
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import ErrorCode
from proxy.records.stripes import Stripe
from proxy.virtual import commits, fetch, refusals, rewrite, txn
from proxy.virtual.names import VirtualNames, VirtualTopic
from proxy.virtual.precheck import Precheck, fetch_topic_ids

log = logging.getLogger("proxy.virtual")

_REGEX_VERDICTS = 256  # heartbeat regular expressions whose verdict is remembered
_REFRESH_INTERVAL = 5.0  # seconds between full metadata reads to tell real names from virtual ones
_OFFSET_FETCH_VERSION = 8
_FIND_COORDINATOR_VERSION = 4
_LOAD_TIMEOUT = 10.0
_MERGE_GRACE = 1.0  # seconds beyond the request's max_wait_ms to wait for another connection's read
_MAX_INFLIGHT_READS = 10_000
NEWEST_COMMIT_BY_NAME = 9  # OffsetCommit / OffsetFetch v10 name topics by id only


class SharedReads(Protocol):
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
        self.pending: dict[int, tuple[str, Any]] = {}  # correlation id -> (what, plan) for the response

    def close(self) -> None:
        self.pending.clear()
        self.sessions.sessions.clear()


STATE = StateKey("virtual", _Connection)


class _Resolver:
    def __init__(self, names: VirtualNames, cluster: ClusterView, config) -> None:
        self.names = names
        self.cluster = cluster
        self.config = config
        self._ids: dict[uuid.UUID, VirtualTopic] = {}
        self._ids_for: set[uuid.UUID] = set()

    def virtual(self, name: str) -> VirtualTopic | None:
        if not name or name in self.cluster.topics:
            return None  # a real topic of that name always wins
        vt = self.names.parse(name)
        if vt is None or not self.config.topic_setting(vt.real, "accept.range.fetch"):
            return None
        return vt

    def refusal(self, name: str) -> str | None:
        if not name or name in self.cluster.topics or self.names.split(name) is None:
            return None
        reason = self.names.out_of_bounds(name)
        if reason is not None:
            return reason
        vt = self.names.parse(name)
        if vt is not None and not self.config.topic_setting(vt.real, "accept.range.fetch"):
            return f"virtual topic {name}: topic {vt.real} does not accept range fetches (accept.range.fetch=false)"
        return None

    def by_id(self, topic_id: uuid.UUID) -> VirtualTopic | None:
        vt = self._ids.get(topic_id)
        if vt is None:
            self._index()
            vt = self._ids.get(topic_id)
        if vt is not None and self.virtual(vt.name) is None:
            return None
        return vt

    def _index(self) -> None:
        for view in list(self.cluster.topics.values()):
            if view.topic_id is None or view.topic_id in self._ids_for:
                continue
            self._ids_for.add(view.topic_id)
            for shares in range(2, self.names.max_shares + 1):
                for striped in (False, True):
                    vt = VirtualTopic(self.names.name(view.name, shares, striped), view.name, shares, striped)
                    self._ids[vt.topic_id(view.topic_id)] = vt

    def real_id(self, real: str) -> uuid.UUID | None:
        return self.cluster.id_of(real)


class VirtualTopicsFeature(Feature):
    name = "virtual-topics"

    def __init__(self, config, cluster: ClusterView, metrics, shared: SharedReads,
                 commits: CommitService | None) -> None:
        self.cluster = cluster
        self.names = VirtualNames(config.get("virtual.topic.suffix"), config.get("virtual.topic.max.shares"),
                                  config.get("virtual.coop.suffix"))
        self.resolver = _Resolver(self.names, cluster, config)
        self.precheck = Precheck(self.names.suffixes)  # which requests are decoded at all
        self.shared = shared
        if commits is not None:
            self.reads, self.writes, self.transactions = commits.reads, commits.writes, commits.transactions
            self.writes.on_deleted(self.transactions.delete_share_shadows)
        self._last_refresh = -float("inf")
        self._regex_verdicts: dict[tuple[str, tuple[str, ...], int], str | None] = {}
        # Broker reads of virtual partitions on their way, by (topic, partition, offset,
        # isolation level): a connection at the same position and level waits for the read
        # and takes its share from the cache instead of reading the broker again (the cache
        # serves a share only at the level of its read).
        self._inflight: dict[tuple[str, int, int, int], trio.Event] = {}
        self._recent = fetch.RecentReads()
        registry = metrics.registry
        self._records = Counter("kafka_proxy_virtual_records", "Records served to virtual partitions.",
                                ["topic"], registry=registry)
        self._reads = Counter("kafka_proxy_virtual_broker_reads", "Real partitions read from brokers for virtual "
                              "partitions.", ["topic"], registry=registry)
        self._bytes = Counter("kafka_proxy_virtual_broker_bytes", "Record bytes read from brokers for virtual "
                              "partitions.", ["topic"], registry=registry)
        self._hits = Counter("kafka_proxy_virtual_cache_hits", "Virtual partitions answered from the result cache.",
                             ["topic"], registry=registry)
        self._skips = Counter("kafka_proxy_virtual_control_batches", "Control batches that moved a virtual "
                              "partition's position past records of other shares.", ["topic"], registry=registry)
        self._refused = Counter("kafka_proxy_virtual_refused", "Requests refused for naming a virtual topic.",
                                ["api"], registry=registry)
        self._commits = Counter("kafka_proxy_virtual_commits", "Virtual partitions committed.", ["topic"],
                                registry=registry)
        self._txn_commits = Counter("kafka_proxy_virtual_txn_commits", "Virtual partitions committed inside "
                                    "transactions.", ["topic"], registry=registry)
        self._settles = Counter("kafka_proxy_virtual_txn_settles", "Committed transactions whose share watermarks "
                                "were folded into the log and S moved.", registry=registry)

    def request_stages(self) -> Mapping[int, RequestStage]:
        stages: dict[int, RequestStage] = {
            ApiKey.METADATA: self.on_metadata,
            ApiKey.LIST_OFFSETS: self.on_list_offsets,
            ApiKey.OFFSET_FOR_LEADER_EPOCH: self.on_leader_epoch,
            ApiKey.DESCRIBE_CONFIGS: self.on_describe_configs,
            ApiKey.DESCRIBE_TOPIC_PARTITIONS: self.on_describe_topic_partitions,
            ApiKey.FETCH: self.on_fetch,
            ApiKey.OFFSET_COMMIT: self.on_offset_commit,
            ApiKey.OFFSET_FETCH: self.on_offset_fetch,
            ApiKey.TXN_OFFSET_COMMIT: self.on_txn_offset_commit,
            ApiKey.CONSUMER_GROUP_HEARTBEAT: self.on_group_heartbeat,
        }
        for api_key in refusals.REFUSED_APIS:
            stages[api_key] = self.on_refused
        # A request whose bytes cannot name a virtual topic goes on undecoded. Not Fetch (a
        # connection's own sessions decide, see on_fetch) nor OffsetFetch (asked for every
        # topic, it lists the virtual partitions too, and its bytes name none).
        # A heartbeat's regular expression may hold the suffix with no digit after it.
        return {api_key: stage if api_key in (ApiKey.FETCH, ApiKey.OFFSET_FETCH)
                else self._guard(stage, self.precheck.may_match_virtual if api_key == ApiKey.CONSUMER_GROUP_HEARTBEAT
                                 else self.precheck.may_name_virtual)
                for api_key, stage in stages.items()}

    def version_limits(self) -> Mapping[int, int]:
        # OffsetCommit and OffsetFetch v10 name topics by id only; the watermark commits
        # and their answers work by name, so clients are offered v9, which every client
        # that speaks v10 also speaks.
        return {ApiKey.OFFSET_COMMIT: NEWEST_COMMIT_BY_NAME, ApiKey.OFFSET_FETCH: NEWEST_COMMIT_BY_NAME}

    @staticmethod
    def _guard(stage: RequestStage, may_name: Callable[[bytes | bytearray], bool]) -> RequestStage:
        async def guarded(ctx: ConnectionContext, request: Request) -> Route | None:
            if not may_name(request.frame):
                return None
            return await stage(ctx, request)
        return guarded

    def response_stages(self) -> Mapping[int, tuple[int, Any]]:
        # Not OffsetCommit: a virtual commit has its own route's on_response, and a stage
        # here would have every commit response decoded (a range commit's too) for nothing.
        keys = (ApiKey.METADATA, ApiKey.LIST_OFFSETS, ApiKey.OFFSET_FOR_LEADER_EPOCH, ApiKey.DESCRIBE_CONFIGS,
                ApiKey.DESCRIBE_TOPIC_PARTITIONS, ApiKey.OFFSET_FETCH)
        stages: dict[int, tuple[int, Any]] = {api_key: (0, self._on_response) for api_key in keys}
        stages[ApiKey.LIST_GROUPS] = (0, self._hide_shadows)
        return stages

    def _hide_shadows(self, ctx: ConnectionContext, response: DecodedResponse) -> None:
        """Shadow groups of transactional commits are the proxy's bookkeeping: ListGroups
        through the proxy does not show them (DescribeGroups and OffsetFetch by name do)."""
        partitions = self.cluster.consumer_offsets_partitions
        listed = response.body.groups or []
        kept = [group for group in listed if shadows.parse_share_shadow(group.group_id, partitions) is None]
        if len(kept) != len(listed):
            response.body.groups = kept
            response.changed = True

    # -- the cluster view ---------------------------------------------------------------------
    async def _know(self, names) -> None:
        """Make sure the view has seen every real topic a name could be, so a real topic
        named like a virtual one is never taken for one (read at most every few seconds)."""
        unknown = [name for name in names if name and name not in self.cluster.topics and self.names.split(name)]
        if unknown:
            await self._refresh_all()

    async def _refresh_all(self) -> None:
        """Read every topic's metadata into the view, at most every few seconds."""
        now = trio.current_time()
        if now - self._last_refresh < _REFRESH_INTERVAL:
            return
        self._last_refresh = now
        with trio.move_on_after(_LOAD_TIMEOUT):
            try:
                await self.cluster.refresh(None)
            except Exception as exc:  # noqa: BLE001 - the view stays as it is
                log.warning("metadata refresh failed reason=%r", str(exc))

    def _remember(self, ctx: ConnectionContext, request: Request, what: str, plan: Any, body: Any) -> None:
        header, _ = request.decoded()
        request.replace(messages.encode_request(header, body), (header, body))
        ctx.state(STATE).pending[request.correlation_id] = (what, plan)

    def _on_response(self, ctx: ConnectionContext, response: DecodedResponse) -> None:
        state = ctx.existing(STATE)
        if state is None or not state.pending:
            return
        entry = state.pending.pop(response.header.correlation_id, None)
        if entry is None:
            return
        what, plan = entry
        body, version = response.body, response.version
        self._rewrite_response(what, plan, body, version)
        response.changed = True

    def _rewrite_response(self, what: str, plan: Any, body: Any, version: int) -> None:
        if what == "metadata":
            rewrite.metadata_response(body, version, plan, self.resolver)
            self._handed_out(body.topics)
        elif what == "list_offsets":
            rewrite.list_offsets_response(body, plan)
        elif what == "leader_epoch":
            rewrite.offsets_for_leader_epoch_response(body, plan)
        elif what == "partitions":
            rewrite.describe_topic_partitions_response(body, plan, self.resolver)
            self._handed_out(body.topics)
        elif what == "configs":
            rewrite.describe_configs_response(body, plan)
        elif what == "offset_fetch":
            shadow_marks = plan.shadow_marks

            def marks_of(group: str, real: str, partition: int, committed: int,
                         metadata: str | None) -> tuple[int, dict[int, list[int]]]:
                return self.reads.watermarks(group, (real, partition), committed, metadata,
                                             shadow_marks.get((group, (real, partition)), ()))

            commits.offset_fetch_response(body, version, plan, marks_of, self.names.name_of_marks)

    def _handed_out(self, topics: Any) -> None:
        """Clients may now name these virtual topics by id: the pre-check looks for them."""
        for topic in topics or ():
            if topic.name and self.names.split(topic.name):
                self.precheck.remember(getattr(topic, "topic_id", None))

    # -- Metadata and friends -------------------------------------------------------------------
    async def on_metadata(self, ctx: ConnectionContext, request: Request) -> Route | None:
        _, body = request.decoded()
        if not body.topics:
            return None
        await self._know(t.name for t in body.topics)
        plan = rewrite.metadata_request(body, request.version, self.resolver)
        if plan is not None:
            self._remember(ctx, request, "metadata", plan, body)
        return None

    async def on_list_offsets(self, ctx: ConnectionContext, request: Request) -> Route | None:
        header, body = request.decoded()
        await self._know(t.name for t in body.topics)
        plan = rewrite.list_offsets_request(body, self.resolver)
        if plan is None:
            return None
        self._remember(ctx, request, "list_offsets", plan, body)
        return self._asked_apart(request, header, plan)

    async def on_leader_epoch(self, ctx: ConnectionContext, request: Request) -> Route | None:
        header, body = request.decoded()
        await self._know(t.topic for t in body.topics)
        plan = rewrite.offsets_for_leader_epoch_request(body, self.resolver)
        if plan is None:
            return None
        self._remember(ctx, request, "leader_epoch", plan, body)
        return self._asked_apart(request, header, plan)

    @staticmethod
    def _asked_apart(request: Request, header: Any, plan: rewrite.PartitionPlan) -> Route | None:
        """Shares of one real partition that asked different questions: the further ones go
        upstream, on the client's connection, just before its request, and its response is
        rewritten with every answer. None (the request goes on) when one request asks all."""
        if not plan.extra:
            return None
        return Route(request.frame, before=rewrite.extra_requests(header, request.api_key, plan))

    async def on_describe_configs(self, ctx: ConnectionContext, request: Request) -> Route | None:
        _, body = request.decoded()
        plan = rewrite.describe_configs_request(body, self.resolver)
        if plan is not None:
            self._remember(ctx, request, "configs", plan, body)
        return None

    async def on_describe_topic_partitions(self, ctx: ConnectionContext, request: Request) -> Route | None:
        _, body = request.decoded()
        await self._know(t.name for t in body.topics or ())
        plan = rewrite.describe_topic_partitions_request(body, self.resolver)
        if plan is not None:
            self._remember(ctx, request, "partitions", plan, body)
        return None

    async def on_refused(self, ctx: ConnectionContext, request: Request) -> Route | None:
        _, body = request.decoded()
        response = refusals.refuse(request.api_key, request.version, body, self.resolver.virtual, self.resolver.by_id)
        if response is None:
            return None
        self._refused.labels(messages.api_name(request.api_key)).inc()
        if request.api_key == ApiKey.PRODUCE and body.acks == 0:
            return Route(None, expect_response=False)
        return Route.answer(messages.encode_response(request.api_key, request.version,
                                                     messages.new_response_header(request.correlation_id), response))

    async def on_group_heartbeat(self, ctx: ConnectionContext, request: Request) -> Route | None:
        _, body = request.decoded()
        await self._know(body.subscribed_topic_names or ())
        if refusals.regex_mentions_suffix(body, self.names.suffixes) is None:
            message = refusals.heartbeat_refusal(body, self.resolver.virtual, self.names)
        else:
            await self._refresh_all()  # the expression is tried against every real topic
            message = self._regex_verdict(body)
        if message is None:
            return None
        self._refused.labels(messages.api_name(request.api_key)).inc()
        log.warning("refused a consumer-protocol group group=%s reason=%s", body.group_id, message)
        return Route.answer(messages.encode_response(request.api_key, request.version,
                                                     messages.new_response_header(request.correlation_id),
                                                     refusals.refuse_heartbeat(request.version, message)))

    def _regex_verdict(self, body: Any) -> str | None:
        """``heartbeat_refusal`` of a heartbeat carrying a regular expression, remembered until
        the topics the proxy knows change: a member may repeat its expression in every heartbeat."""
        key = (body.subscribed_topic_regex, tuple(body.subscribed_topic_names or ()), len(self.cluster.topics))
        if key not in self._regex_verdicts:
            if len(self._regex_verdicts) >= _REGEX_VERDICTS:
                self._regex_verdicts.clear()
            self._regex_verdicts[key] = refusals.heartbeat_refusal(body, self.resolver.virtual, self.names,
                                                                   self.cluster.topics)
        return self._regex_verdicts[key]

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
            return request.version >= 13
        return any(self.cluster.name_of(uuid.UUID(bytes=topic_id)) is None for topic_id in ids)

    def _describe(self, key) -> tuple[VirtualTopic | None, str, uuid.UUID | None] | None:
        if isinstance(key, uuid.UUID):
            vt = self.resolver.by_id(key)
            if vt is not None:
                self.precheck.remember(key)  # handed out by another instance, maybe: known from now on
                return vt, vt.real, self.cluster.id_of(vt.real)
            name = self.cluster.name_of(key)
            return (None, name, key) if name else None
        vt = self.resolver.virtual(key)
        if vt is not None:
            return vt, vt.real, self.cluster.id_of(vt.real)
        return None, key, self.cluster.id_of(key)

    async def on_fetch(self, ctx: ConnectionContext, request: Request) -> Route | None:
        state = ctx.existing(STATE)
        if ((state is None or not state.sessions.sessions) and not self.precheck.may_name_virtual(request.frame)
                and not self._names_unknown_id(request)):
            return None
        header, body = request.decoded()
        state = ctx.state(STATE)
        version = request.version
        if not state.sessions.owns(body.session_id):
            ids = [t.topic_id for t in body.topics if version >= 13]
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
                    ErrorCode.UNKNOWN_TOPIC_ID if version >= 13 else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
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

        async def on_response(response: DecodedResponse) -> None:
            self._complete(state, response.body, reads, answers, version, isolation)
            response.body = fetch.client_response(version, resolved, answers, response.body.throttle_time_ms)
            response.changed = True

        return Route(messages.encode_request(header, upstream), on_response=on_response,
                     settle=lambda: self._settle(announced))

    @staticmethod
    def _unsessioned(request: Request, header: Any, body: Any, described: list) -> Route | None:
        """A Fetch that would open a broker session naming a topic id this proxy cannot
        name goes sessionless. The id may be a virtual topic's whose real topic this proxy
        has not learnt yet (just restarted, or a sidecar of another broker): in a broker
        session it would stay, answered UNKNOWN_TOPIC_ID forever, since the client's
        incremental fetches no longer name it. Sessionless, each fetch names it again and
        is looked at again, until the lookup knows it. A real unknown id (a deleted topic)
        only costs its client full fetches."""
        if None not in described or body.session_id != fetch.NO_SESSION or body.session_epoch != fetch.INITIAL_EPOCH:
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

    def _complete(self, state: _Connection, body: Any, reads: list[fetch.Read], answers: dict, version: int,
                  isolation: int) -> None:
        now, now_ms = trio.current_time(), int(time.time() * 1000)
        data = {}
        for topic in body.responses:
            name = topic.topic if version < 13 else self.cluster.name_of(topic.topic_id)
            for partition in topic.partitions:
                data[(name, partition.partition_index)] = partition
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
                answers[part.key] = answer

    def _count(self, part: fetch.FetchPart, composed: fetch.Composed, *, hit: bool) -> None:
        name = part.real
        if composed.records_kept:
            self._records.labels(name).inc(composed.records_kept)
        if composed.control_added:
            self._skips.labels(name).inc()
        if hit:
            self._hits.labels(name).inc()

    # -- commits -----------------------------------------------------------------------------------
    async def on_offset_commit(self, ctx: ConnectionContext, request: Request) -> Route | None:
        header, body = request.decoded()
        plan = commits.commit_plan(body, self.resolver)
        if plan is None:
            return None
        # The commit log service plans S and the watermarks under its per-partition locks
        # (held until the log is written) and writes the log once the coordinator accepted.
        shares = await self.writes.begin_shares(ctx, plan.group, plan.edits, plan.plain)
        refused = {**plan.refused, **shares.refused}
        for _name, vt, parts in plan.topics:
            if vt is not None:
                self._commits.labels(vt.real).inc(len(parts))
        if not commits.commit_request(body, plan, shares.offsets, refused):
            self.writes.abandon(shares)
            response = messages.new_body(ApiKey.OFFSET_COMMIT, request.version, "response")
            commits.commit_response(response, plan, {}, refused)
            return Route.answer(messages.encode_response(ApiKey.OFFSET_COMMIT, request.version,
                                                         messages.new_response_header(request.correlation_id),
                                                         response))

        async def on_response(response: DecodedResponse) -> None:
            results = [((t.name, p.partition_index), p.error_code) for t in response.body.topics
                       for p in t.partitions]
            errors = await self.writes.finish_shares(shares, body.generation_id_or_member_epoch, body.member_id,
                                                    body.group_instance_id, results)
            commits.commit_response(response.body, plan, errors, refused)
            response.changed = True

        return Route(messages.encode_request(header, body), on_response=on_response)

    def _marks_of(self, group: str, real: str, partition: int, committed: int,
                  metadata: str | None) -> tuple[int, dict[int, list[int]]]:
        return self.reads.watermarks(group, (real, partition), committed, metadata)

    async def on_offset_fetch(self, ctx: ConnectionContext, request: Request) -> Route | None:
        _, body = request.decoded()
        version = request.version
        groups = body.groups if version >= 8 else [body]
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
        await self._read_shadows(plan, bool(getattr(body, "require_stable", False)))
        self._remember(ctx, request, "offset_fetch", plan, body)
        return None

    # -- transactional commits ---------------------------------------------------------------
    async def _read_shadows(self, plan: commits.FetchPlan, require_stable: bool) -> None:
        """The committed watermark of each shadow group of the virtual partitions asked (one
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

    async def on_txn_offset_commit(self, ctx: ConnectionContext, request: Request) -> Route | None:
        header, body = request.decoded()
        await self._know(t.name for t in body.topics)
        plan = txn.commit_plan(body, self.resolver)
        if plan is None:
            return None
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
            response = messages.new_body(ApiKey.TXN_OFFSET_COMMIT, request.version, "response")
            txn.commit_response(response, plan, refused)
            return Route.answer(messages.encode_response(ApiKey.TXN_OFFSET_COMMIT, request.version,
                                                         messages.new_response_header(request.correlation_id),
                                                         response))
        generation, member, instance = body.generation_id, body.member_id, body.group_instance_id

        async def on_response(response: DecodedResponse) -> None:
            self.writes.abandon(planned)
            outcome = txn.commit_response(response.body, plan, refused)
            response.changed = True
            committed = {key: plan.edits[key] for key, code in outcome.items() if code == ErrorCode.NONE}
            if committed:
                background = self.transactions.background
                background.start(self._settle_txn, background, plan.group, committed, generation, member, instance)

        return Route(messages.encode_request(header, body), before=tuple(own), on_response=on_response,
                     settle=lambda: self.writes.abandon(planned))

    @staticmethod
    def _keep_shadow(plan: txn.TxnPlan, slot: tuple[int, int], version: int):
        async def keep(raw: bytes) -> None:
            _, plan.answers[slot] = messages.decode_response(ApiKey.TXN_OFFSET_COMMIT, version, raw)
        return keep

    async def _settle_txn(self, ctx: Background, group: str, keys: dict, generation: int, member: str,
                          instance: str | None) -> None:
        """Once the transaction has ended, fold its committed share shadows into the log."""
        if await self.transactions.settle_marks(ctx, group, keys, generation, member, instance):
            self._settles.inc()
