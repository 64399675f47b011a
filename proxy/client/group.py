"""Group membership at the edge: the background task that joins, syncs and heartbeats, and
the poll-side step that applies what it learned (docs/wire-contract.md section 8).

The background task (``GroupMember.run``, in the consumer's nursery) sends what the sans-IO
``Membership`` builds over a coordinator connection of its own, so a JoinGroup the
coordinator holds for the whole rebalance never delays the application's commits. It
heartbeats every ``heartbeat_interval_ms`` whatever the application does (KIP-62), and when
the application has not polled for ``max_poll_interval_ms`` it leaves the group: fetching
stops, and the next poll reports the partitions lost and joins again.

Everything the application sees happens inside ``poll`` (``before_poll``), in its own
task, as Java does: new ranges start fetching and ``on_assigned`` runs; ranges to be
revoked stop being handed out at once, and their revocation completes at the start of a
later poll (KIP-983) once every record of them that poll handed out is marked processed
and committed (individual commit), then ``on_revoked`` runs and the member rejoins so the
follow-up rebalance hands them on. ``delay_revoke`` holds a revocation one more poll.

Partitions the group shares cooperatively (``partition_sharing="cooperative"``,
docs/wire-contract.md#37-cooperative-fetch) are fetched with the member's id and generation;
one added to this member is fetched at once (its other members keep theirs: no per-key
order to keep), and a cooperative fetch refused as a zombie's (ILLEGAL_GENERATION) makes
the member rejoin.
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import trio

from proxy.client.assignment import AssignmentState
from proxy.client.commit_protocol import SIMPLE_GROUP, MemberIdentity
from proxy.client.committer import Committer
from proxy.client.config import ConsumerConfig
from proxy.client.connection import RETRIABLE_FAILURES, Connections
from proxy.client.coordinator import Coordinator
from proxy.client.errors import ConsumerError, KafkaError
from proxy.client.group_assignor import Assignment, intersect, subtract, to_intervals, to_ranges
from proxy.client.group_protocol import leave_error
from proxy.client.handoff import HandedOut, HandOff, RebalanceListener
from proxy.client.membership import Answer, Change, Membership, Phase, difference, union
from proxy.client.metadata import metadata_request
from proxy.client.records import TopicPartition
from proxy.protocol.constants import ErrorCode
from proxy.protocol.message_types import MetadataResponse
from proxy.protocol.messages import ApiKey
from proxy.ranges import KeyRange

log = logging.getLogger(__name__)


Listener = RebalanceListener
# the new assignment of the state, the partitions of it paused, those fetched cooperatively
RangesChanged = Callable[[Mapping[TopicPartition, Sequence[KeyRange]], Iterable[TopicPartition],
                          Iterable[TopicPartition]], None]


class GroupMember(HandOff):
    """A consumer's membership in its group: the background task and the poll-side step."""

    def __init__(self, config: ConsumerConfig, connections: Connections, state: AssignmentState,
                 committer: Committer, *, metrics: Counter[str],
                 set_ranges: RangesChanged, commit_supported: Callable[[], Awaitable[bool]]) -> None:
        assert config.group_id is not None
        self.config = config
        self.membership = Membership(
            config.group_id, config.group_instance_id, config.session_timeout_ms, config.max_poll_interval_ms,
            allows_ranges=config.allow_individual_commit, partition_sharing=config.partition_sharing)
        # a connection of its own: the coordinator holds a JoinGroup for the whole rebalance
        self._coordinator = Coordinator(config.group_id, connections, retry_backoff=config.retry_backoff_ms / 1000,
                                        metrics=metrics)
        self._connections = connections
        self._state = state
        self._committer = committer
        self._metrics = metrics
        self._set_ranges = set_ranges
        self._commit_supported = commit_supported
        self.handed = HandedOut()
        self.listener: RebalanceListener = RebalanceListener()
        self._changes: list[Change] = []
        self._to_revoke: Assignment = {}
        # per partition being revoked: the highest offset handed out before the revocation
        # arrived (no record of revoked ranges is handed out after it); the revocation
        # completes once no mark at or below it waits for a commit
        self._revoke_bounds: dict[TopicPartition, int] = {}
        self._commit_wanted = False
        self._delayed: set[TopicPartition] = set()
        self._growing: Assignment = {}  # partitions waiting to take on more ranges
        # growing partitions that keep none of the ranges they held (their new ranges are
        # disjoint from the old): the state's ranges for them are only a placeholder that
        # keeps their position and marks until _grow gives them the new ranges; nothing of
        # them is fetched or handed out meanwhile
        self._parked: set[TopicPartition] = set()
        self._lost_last: set[TopicPartition] = set()
        # the partitions fetched cooperatively: the latest assignment's, and those of the
        # previous ones still held while their revocation completes
        self._shared: set[TopicPartition] = set()
        self._wake = trio.Event()
        self._last_poll = -math.inf  # set when the background starts (consumers may be built outside trio)
        self._expired = False
        self._error: BaseException | None = None
        self._next_heartbeat = 0.0
        self.rebalances = 0
        self.assigned_event = trio.Event()
        self.pattern: re.Pattern[str] | None = None  # a pattern subscription: the topics are listed at each join

    # -- the background task -------------------------------------------------------------
    async def run(self) -> None:
        backoff = self.config.retry_backoff_ms / 1000
        self._last_poll = max(self._last_poll, trio.current_time())
        while True:
            try:
                await self._step()
            except RETRIABLE_FAILURES as exc:
                log.info("group %s: %r; retrying", self.membership.group, exc)
                self._metrics["retriable_errors"] += 1
                if self.membership.phase in (Phase.JOINING, Phase.SYNCING):
                    self.membership.phase = Phase.UNJOINED
                await trio.sleep(backoff)
            except KafkaError as exc:
                log.warning("group %s: %r", self.membership.group, exc)
                self._error = exc  # the next poll raises it
                self._wake_poll()
                return

    async def _step(self) -> None:
        m, config = self.membership, self.config
        now = trio.current_time()
        poll_deadline = self._last_poll + config.max_poll_interval_ms / 1000
        if not self._expired and m.phase != Phase.UNJOINED and now >= poll_deadline:
            log.warning("group %s: no poll within max_poll_interval_ms=%d; leaving the group",
                        m.group, config.max_poll_interval_ms)
            self._expired = True
            await self._leave("the consumer poll timeout has expired")
            return
        if self._expired:
            await self._sleep(math.inf)  # until the next poll
            return
        if self._commit_wanted:
            self._commit_wanted = False
            try:
                await self._commit()  # for a revocation; a failure is asked again by the next poll
            except ConsumerError as exc:  # not retriable (the cluster lost individual commit, say)
                self._error = exc
            return
        if m.needs_join:
            await self._join()
            return
        if m.phase == Phase.STABLE and now >= self._next_heartbeat:
            await self._heartbeat()
            return
        if m.phase == Phase.UNJOINED:
            # Not in the group and nothing to join (an assign-mode consumer, or a revocation
            # the next poll completes): no poll deadline to watch, sleep until woken. With
            # the deadline, once max_poll_interval_ms had passed without a poll (assign mode
            # never reports its polls here) every step slept for 0 s: a busy loop.
            wake_at = math.inf
        else:
            wake_at = min(poll_deadline, self._next_heartbeat if m.phase == Phase.STABLE else math.inf)
        await self._sleep(wake_at - now)

    async def _sleep(self, seconds: float) -> None:
        with trio.move_on_after(max(0.0, seconds)):
            await self._wake.wait()
        if self._wake.is_set():
            self._wake = trio.Event()

    def wake(self) -> None:
        self._wake.set()

    def _wake_poll(self) -> None:
        self.assigned_event.set()

    async def _request(self, api_key: int, build: Callable[[int], object], timeout: float | None = None) -> Any:
        return await self._coordinator.request(api_key, build, timeout=timeout)

    async def _join(self) -> None:
        m, config = self.membership, self.config
        answer = Answer.JOIN
        # the coordinator holds a JoinGroup until every member rejoined, for up to the
        # rebalance timeout
        join_timeout = (config.max_poll_interval_ms + config.request_timeout_ms) / 1000
        while answer == Answer.JOIN:
            response = await self._request(ApiKey.JOIN_GROUP, lambda v: m.join_request(v), join_timeout)
            answer = m.on_join(response)
        if answer == Answer.LOST:
            self._committer.member = SIMPLE_GROUP
            self._wake_poll()
            return
        assignments: dict[str, bytes] = {}
        if m.is_leader:
            assignments = m.assignments(await self._partitions(m.subscribed_topics()))
        response = await self._request(ApiKey.SYNC_GROUP, lambda v: m.sync_request(v, assignments))
        answer, change = m.on_sync(response)
        if change is not None:
            # commits carry the generation whose assignment this member holds
            self._committer.member = MemberIdentity(m.generation, m.member_id, m.instance_id)
            self.rebalances += 1
            self._changes.append(change)
            self._next_heartbeat = trio.current_time() + config.heartbeat_interval_ms / 1000
            log.info("group %s: generation %d, member %s%s, assigned %s", m.group, m.generation, m.member_id,
                     " (leader)" if m.is_leader else "", describe(change.assignment))
        elif answer == Answer.LOST:
            self._committer.member = SIMPLE_GROUP
        self._wake_poll()

    async def _partitions(self, topics: Sequence[str]) -> dict[str, list[int]]:
        """Partition ids of ``topics`` (the leader's assignment input), from Metadata."""
        if not topics:
            return {}
        connection = await self._connections.any()
        version = connection.versions[ApiKey.METADATA]
        response: MetadataResponse = await self._connections.request(
            connection, ApiKey.METADATA, version, metadata_request(version, topics))
        return {t.name: sorted(p.partition_index for p in t.partitions) for t in response.topics
                if t.error_code == ErrorCode.NONE and t.name is not None}

    async def _heartbeat(self) -> None:
        m = self.membership
        response = await self._request(ApiKey.HEARTBEAT, m.heartbeat_request)
        self._next_heartbeat = trio.current_time() + self.config.heartbeat_interval_ms / 1000
        answer = m.on_heartbeat(response)
        if answer == Answer.LOST:
            self._committer.member = SIMPLE_GROUP
            self._wake_poll()

    async def _leave(self, reason: str) -> None:
        m = self.membership
        try:
            request_built = m.leave_request(5, reason) is not None
            if request_built:
                with trio.move_on_after(self.config.request_timeout_ms / 1000):
                    response = await self._request(ApiKey.LEAVE_GROUP, lambda v: m.leave_request(v, reason))
                    code = leave_error(response)
                    if code:
                        log.info("group %s: LeaveGroup answered error %d", m.group, code)
        except RETRIABLE_FAILURES as exc:
            log.info("group %s: LeaveGroup failed (%r)", m.group, exc)
        finally:
            m.left()
            self._committer.member = SIMPLE_GROUP
            self._wake_poll()

    async def close(self) -> None:
        """Leave cleanly (LeaveGroup; a static member just stops) and drop the connection."""
        with trio.CancelScope(shield=True):
            with trio.move_on_after(self.config.request_timeout_ms / 1000):
                if self.membership.phase != Phase.UNJOINED:
                    await self._leave("the consumer is being closed")
            await self._coordinator.aclose()

    # -- the poll side ---------------------------------------------------------------------
    def subscribe(self, topics: Sequence[str], listener: RebalanceListener | None) -> None:
        self.listener = listener or RebalanceListener()
        self.membership.subscribe(topics)
        self.wake()

    async def unsubscribe(self) -> None:
        await self._leave("the consumer unsubscribed")
        self.membership.topics = []
        self._drop(self._state_assignment())
        self._to_revoke, self._changes, self._growing, self._revoke_bounds = {}, [], {}, {}
        self._parked, self._shared = set(), set()

    def _set_state(self, ranges: Mapping[TopicPartition, Sequence[KeyRange]], paused: Iterable[TopicPartition]
                   ) -> None:
        # a cooperative partition is whole; one left with ranges (a range revocation that
        # completes after the partition turned cooperative) is fetched by range meanwhile
        self._set_ranges(ranges, paused, [tp for tp in ranges if tp in self._shared and not ranges[tp]])

    def fetch_fenced(self, generation: int) -> None:
        """A cooperative fetch with ``generation`` got ILLEGAL_GENERATION: the proxy has
        seen a newer generation of the group, so a rebalance went on without this member
        hearing of it; join again (a later answer about an older generation is ignored)."""
        m = self.membership
        if m.phase == Phase.STABLE and m.generation == generation:
            log.info("group %s: a cooperative fetch of generation %d was fenced; rejoining", m.group, generation)
            m.rejoin_needed = True
            self.wake()

    def _state_assignment(self) -> Assignment:
        return {tp: list(r) for tp, r in self._state.ranges.items()}

    async def before_poll(self, pattern_topics: Callable[[], Awaitable[list[str] | None]]) -> None:
        """Apply what the background learned, complete revocations, note the poll."""
        self._last_poll = trio.current_time()
        if self.pattern is not None and (self.membership.phase == Phase.UNJOINED or self.membership.rejoin_needed
                                         or not self.membership.topics):
            try:
                topics = await pattern_topics()
            except RETRIABLE_FAILURES as exc:
                log.info("group %s: listing topics failed (%r)", self.membership.group, exc)
                topics = None
            if topics is not None:
                self.membership.subscribe(topics)
                self.wake()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self._expired:
            self._expired = False  # the member left; this poll joins again
            self.wake()
        self._lost_last = set()
        lost = self.membership.take_lost()
        if lost:
            await self._lose(lost)
        changes, self._changes = self._changes, []
        for change in changes:
            await self._apply(change)
        await self._complete_revocations()
        self._delayed = set()

    async def _lose(self, lost: Assignment) -> None:
        self._lost_last = set(lost)
        self._drop(union(lost, self._to_revoke))
        self._to_revoke, self._growing, self._revoke_bounds = {}, {}, {}
        self._parked = set()
        self._metrics["partitions_lost"] += len(lost)
        await self.listener.on_lost(lost)

    def _drop(self, gone: Mapping[TopicPartition, Sequence[KeyRange]]) -> None:
        """Stop fetching ``gone`` and forget its records and marks (nothing of it is
        committed any more)."""
        current = self._state_assignment()
        rest = difference(current, gone)
        removed = [tp for tp in current if tp not in rest]
        for tp in removed:
            progress = self._state.progress.get(tp)
            if progress is not None:
                progress.pending = type(progress.pending)()
        self.handed.forget(removed)
        self._set_state(rest, ())

    async def _apply(self, change: Change) -> None:
        self._to_revoke = union(self._to_revoke, change.revoked)
        for tp in change.revoked:
            self._revoke_bounds[tp] = max(self._revoke_bounds.get(tp, -1), self._state.last_handed(tp))
        # a partition assigned takes the assignment's mode; one only being revoked keeps its own
        self._shared = set(change.cooperative) | {tp for tp in self._shared if tp not in change.assignment}
        current = self._state_assignment()
        keep: Assignment = {}
        for tp in list(self._growing):
            if tp not in change.assignment:
                del self._growing[tp]
        for tp, ranges in change.assignment.items():
            if tp in change.cooperative:
                # whole and shared by chunks: no key order to wait for, so it is fetched at
                # once (a partition that changes mode starts from the group's committed
                # offset, AssignmentState.assign)
                self._growing.pop(tp, None)
                self._parked.discard(tp)
                keep[tp] = []
                continue
            # a parked partition holds nothing: whatever it is assigned now is taken on anew
            held = [] if tp in self._parked else to_intervals(current[tp]) if tp in current else None
            if held is not None and subtract(to_intervals(ranges), held):
                # more ranges of a partition already fetched: they start from the group's
                # committed state, below this member's position, so the partition starts
                # over there once no record of it is out unmarked (_complete_revocations);
                # until then the ranges it keeps go on being fetched and handed out
                self._growing[tp] = list(ranges)
                kept = intersect(held, to_intervals(ranges))
                if kept:
                    keep[tp] = to_ranges(kept)
                    self._parked.discard(tp)
                else:
                    # nothing kept: the old ranges stay only as the partition's placeholder
                    # and stop being fetched and handed out now, like every revoked range,
                    # so none of their records follows their revocation to the next owner
                    # (section 8) however long the look-up of the new ranges takes
                    keep[tp] = current[tp]
                    self._parked.add(tp)
            else:
                self._growing.pop(tp, None)
                self._parked.discard(tp)
                keep[tp] = list(ranges)
        # revoked ranges stop being handed out now; a partition revoked whole stays (paused)
        # until its revocation completes, so its marks can still be committed
        for tp in self._to_revoke:
            if tp not in keep and tp in current:
                keep[tp] = current[tp]
        self._set_state(keep, self._paused(keep))
        if change.added:
            await self.listener.on_assigned(change.added)

    def _paused(self, ranges: Mapping[TopicPartition, Sequence[KeyRange]]) -> list[TopicPartition]:
        """Partitions not handed out now: revoked whole (until the revocation completes),
        parked ones (until they grow), and growing ones whose records are still out with the
        application (so that they come back)."""
        assigned = difference(self.membership.owned, self.membership.revoking)
        return [tp for tp in ranges if tp not in assigned or tp in self._parked
                or (tp in self._growing and self.handed.busy(tp, []))]

    @property
    def poll_expired(self) -> bool:
        """Whether the member left for want of a poll and no poll has rejoined yet."""
        return self._expired

    def marked(self, tp: TopicPartition, offset: int) -> None:
        self.handed.done(tp, offset)



def describe(assignment: Mapping[TopicPartition, Sequence[KeyRange]]) -> str:
    """``topic-0[whole] topic-1[0.33]``: each partition and the share of it held."""
    from proxy.client.group_assignor import UNIT, length

    parts = []
    for tp in sorted(assignment):
        share = length(intersect(to_intervals(assignment[tp]), [(0, UNIT)])) / UNIT
        parts.append(f"{tp.topic}-{tp.partition}[{'whole' if not assignment[tp] else f'{share:.2f}'}]")
    return " ".join(parts) or "nothing"
