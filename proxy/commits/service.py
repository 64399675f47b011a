"""The individual-commit log as a service shared by the features that keep state in it:
individual commit (offset ranges) and virtual range topics (share watermarks).

One instance per proxy, built by the server beside the broker pool and handed to both
features, so that both write ``__individual_commit_offsets`` with one protocol, one memory
of what was read and one set of per-key locks (a virtual commit and a range commit of one
partition serialise like two range commits). The protocol of one commit is ``RangeCommit``
(``proxy.commits.range_commit``, no I/O); this module performs its actions: the log-end
read alongside the broker's commit, the coordinator's correction, the writes and the
windows after them (docs/individual-commit.md, "Write order").

For virtual topics (docs/wire-contract.md#9-virtual-range-topics) it plans a commit of share
watermarks (``begin_shares``: S' and the metadata to send the coordinator in the client's
own OffsetCommit), completes it once the coordinator answered (``finish_shares``: the log
record, written only for partitions the coordinator accepted), and reads watermarks back
(``read`` then ``watermarks``: the log's record and the coordinator's copy combined).
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import trio
from prometheus_client import Counter, Histogram

from proxy.commits import txn_stages, watermarks
from proxy.commits.cluster import Cluster, CommitLogError
from proxy.commits.log import CommitLog
from proxy.commits.packed import pack
from proxy.commits.range_commit import Answer, Correct, FetchCommitted, RangeCommit, ReadLogEnd, Write
from proxy.commits.state import CommitState, MarkEdit, Range, apply_ranges, check_held, normalise
from proxy.net.pool import BrokerPool
from proxy.pipeline import ClusterView, ConnectionContext
from proxy.pipeline.background import Background
from proxy.protocol.constants import ErrorCode
from proxy.protocol.groups import parse_salted, stage_prefix

log = logging.getLogger("proxy.commits")

_DELETION_DRAIN_S = 30.0  # longest a deletion waits for the group's commits under way
_TXN_SEQUENCES = 100_000  # shares whose transactional sequences an instance remembers
_DELETIONS_REMEMBERED = 10_000  # groups whose last deletion time an instance remembers

Key = tuple[str, int]


class KeyLocks:
    """Serialises commits to one (group, topic, partition) across connections. A holder
    releases when its response transform has run, or when its connection ends.

    A held key maps to the queue of its waiters (empty when none); ownership passes to the
    first waiter on release. Taking a free key costs a dict insertion, no scheduling."""

    def __init__(self) -> None:
        self._held: dict[tuple, deque[trio.Event]] = {}

    async def acquire(self, keys: list[tuple]) -> None:
        taken = []
        try:
            for key in sorted(keys):
                waiters = self._held.get(key)
                if waiters is None:
                    self._held[key] = deque()
                else:
                    handed = trio.Event()
                    waiters.append(handed)
                    try:
                        await handed.wait()
                    except BaseException:
                        if handed.is_set():
                            taken.append(key)  # handed over as we were cancelled: ours to release
                        else:
                            waiters.remove(handed)
                        raise
                taken.append(key)
        except BaseException:
            self.release(taken)
            raise

    def release(self, keys) -> None:
        for key in keys:
            waiters = self._held[key]
            if waiters:
                waiters.popleft().set()
            else:
                del self._held[key]

    async def drain(self, group: str, keys: set[Key] | None = None) -> None:
        """Return once the holders of ``group``'s keys at the call (``keys``: only those
        (topic, partition)) have released them; holders that come later are not waited for."""
        busy = [key for key in self._held if key[0] == group and (keys is None or key[1:] in keys)]
        for key in busy:  # one at a time: waiting for one key holds no other
            await self.acquire([key])
            self.release([key])


class EndCheck:
    """The log-end read that runs concurrently with the broker's OffsetCommit."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.error: CommitLogError | None = None
        self.position = -1  # where the read ended: every record below it was in memory


@dataclass
class Planned:
    """A commit planned in a request hook: what the coordinator gets (``stable``: S' per
    range-committed key), the keys refused (the state could not be read, or the commit
    would pass ``max.individual.commit.ranges.held``), the concurrent end read, and ``done``, to set once the response is out (releases the
    key locks)."""

    commit: RangeCommit
    done: trio.Event
    check: EndCheck | None = None
    stable: dict[Key, int] = field(default_factory=dict)
    refused: dict[Key, int] = field(default_factory=dict)


@dataclass
class StagePlan:
    """A transactional range commit planned by ``begin_stage``: ``offsets`` key -> (S_c,
    the stage's metadata); ``refused`` key -> error; ``over_bound`` key -> why it was
    refused for ``max.individual.commit.ranges.held``; ``done`` releases the key locks."""

    done: trio.Event
    offsets: dict[Key, tuple[int, str]] = field(default_factory=dict)
    refused: dict[Key, int] = field(default_factory=dict)
    over_bound: dict[Key, str] = field(default_factory=dict)


@dataclass
class SharePlan:
    """A commit of share watermarks planned by ``begin_shares``: ``offsets`` key ->
    (committed offset, metadata) for the coordinator; ``refused`` key -> error for keys
    whose state could not be read (the client's commit must not carry them)."""

    group: str
    planned: Planned
    offsets: dict[Key, tuple[int, str]] = field(default_factory=dict)
    refused: dict[Key, int] = field(default_factory=dict)
    # key -> (reset epoch, (K, share) -> sequence) of its watermarks with the edits applied
    sequences: dict[Key, tuple[int, dict[tuple[int, int], int]]] = field(default_factory=dict)


class CommitService:
    def __init__(self, config, cluster: ClusterView, metrics, *, pool: BrokerPool,
                 background: Background | None = None) -> None:
        # where follow-ups of transactional commits run (they outlive the client's connection)
        self.background = background if background is not None else Background()
        self.cluster = cluster
        registry = metrics.registry
        self._write_latency = Histogram("kafka_proxy_individual_commit_log_write_seconds",
                                        "Time to write states to __individual_commit_offsets (acks=all).",
                                        buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10),
                                        registry=registry)
        self._foreign = Counter("kafka_proxy_individual_commit_foreign_writes",
                                "Committed partitions whose state another instance wrote since this one read it.",
                                registry=registry)
        self._rebuilds = Counter("kafka_proxy_individual_commit_state_rebuilds",
                                 "Log partitions read from the start to rebuild state.", registry=registry)
        self.log = CommitLog(
            Cluster(pool, cluster),
            segment_bytes=config.get("individual.commit.log.segment.bytes"),
            on_rebuild=self._rebuilds.inc,
            on_write=self._write_latency.observe,
        )
        self.locks = KeyLocks()
        # (group, key, K, share) -> the highest sequence this instance gave a transaction's
        # watermark of that share (``begin_shares``), least recently used dropped
        self._txn_sequences: OrderedDict[tuple, int] = OrderedDict()
        # group -> when a deletion of it (or of offsets of it) through this instance began:
        # a follow-up that started before must not write its state back afterwards
        self._deleted_at: OrderedDict[str, float] = OrderedDict()
        # told of every group (keys None) or committed offsets deleted through this proxy
        self._deletion_hooks: list[Callable[[str, set[Key] | None], Awaitable[None]]] = []

    # -- one commit's protocol --------------------------------------------------------------------
    async def plan(self, ctx: ConnectionContext, group: str, commit: RangeCommit, locked: list[Key], *,
                   with_marks: bool = False) -> Planned:
        """Take the key locks of ``locked`` (held until ``done`` is set or the connection
        ends), then ``commit.begin``: from what this instance holds, with the log's end
        read alongside (or first, the first time the group's log partition is met).
        ``with_marks``: a key without state starts from the coordinator's committed offset
        and the watermarks in its metadata."""
        planned = Planned(commit, trio.Event())
        keys = [(group, *key) for key in locked]
        if keys:
            await self.locks.acquire(keys)
            ctx.start_soon(self._hold, keys, planned.done)
        try:
            if keys:
                if self.log.current(group):
                    # Optimistic: compute from what this instance has read, and read the
                    # log's end concurrently with the broker's commit (merged before any
                    # log write; see docs/individual-commit.md).
                    planned.check = EndCheck()
                    ctx.start_soon(self._check_end, group, planned.check)
                else:
                    await self.log.catch_up(group)  # first use: read to the log's end first
                step = commit.begin(self.log.position(group), self.log.records(group),
                                    end_read=planned.check is not None)
                if isinstance(step, FetchCommitted):
                    if with_marks:
                        found = await self.log.cluster.committed(group, list(step.keys))
                        known: dict[Key, int | CommitState] = {
                            key: watermarks.combine(None, offset, metadata) for key, (offset, metadata) in found.items()}
                    else:
                        known = dict(await self.log.cluster.committed_offsets(group, list(step.keys)))
                    step = commit.on_committed(known, self.log.records(group))
                planned.stable = step.offsets
                planned.refused = dict(step.refused)  # over max.individual.commit.ranges.held
        except CommitLogError as exc:
            log.warning("individual-commit state unavailable group=%s reason=%r", group, str(exc))
            planned.refused = commit.unavailable()
        except BaseException:
            planned.done.set()
            raise
        return planned

    async def _hold(self, keys, done: trio.Event) -> None:
        try:
            await done.wait()
        finally:
            self.locks.release(keys)

    async def _check_end(self, group: str, check: EndCheck) -> None:
        try:
            await self.log.catch_up(group)
            check.position = self.log.position(group)
        except CommitLogError as exc:
            check.error = exc
        finally:
            check.done.set()

    async def perform(self, group: str, generation: int, member: str, instance_id: str | None, planned: Planned,
                      step) -> Answer:
        """Perform the commit's actions (``proxy.commits.range_commit``) from ``step`` (what
        ``on_response`` returned) until it answers."""
        commit, check = planned.commit, planned.check
        try:
            while not isinstance(step, Answer):
                if isinstance(step, ReadLogEnd):
                    assert check is not None  # a commit reads the log end only when a check runs
                    await check.done.wait()
                    if check.error is not None:
                        log.warning("individual-commit log end unknown group=%s reason=%r", group, str(check.error))
                        step = commit.on_log_end_failed()
                    else:
                        step = commit.on_log_end(check.position, self.log.records(group))
                elif isinstance(step, Correct):
                    try:
                        errors = await self.log.cluster.commit_offsets(group, generation, member, instance_id,
                                                                       step.offsets)
                    except CommitLogError as exc:
                        log.warning("individual-commit correction failed group=%s reason=%r", group, str(exc))
                        step = commit.on_correction_failed()
                    else:
                        step = commit.on_corrected(errors)
                else:
                    try:
                        if isinstance(step, Write):
                            at = await self.log.write(group, step.states, step.encoded)
                        else:
                            window, read_to = await self.log.window(group, step.start, step.stop, step.keys)
                    except CommitLogError as exc:
                        log.error("individual-commit log write failed group=%s reason=%r", group, str(exc))
                        step = commit.on_write_failed()
                    else:
                        step = commit.on_written(at) if isinstance(step, Write) else commit.on_window(window, read_to)
            return step
        finally:
            if commit.foreign_writes:
                self._foreign.inc(commit.foreign_writes)

    # -- share watermarks (virtual range topics) --------------------------------------------------
    async def begin_shares(self, ctx: ConnectionContext, group: str, edits: dict[Key, dict[int, dict[int, int]]],
                           plain: dict[Key, int], *, transactional: bool = False,
                           exact: dict[Key, dict[int, dict[int, int]]] | None = None) -> SharePlan:
        """Plan a commit of share watermarks: ``edits`` real partition -> K -> share -> W;
        ``plain``: real partitions the same request commits plainly (a key with state is
        reset, as individual commit resets it). Holds the keys' locks until
        ``finish_shares`` or ``abandon`` (or the connection's end)."""
        txn_floor = self._txn_sequences
        commits = {key: [MarkEdit(shares, marks,
                                  exact=(exact or {}).get(key, {}).get(shares),
                                  at_least={share: txn_floor.get((group, key, shares, share), 0) + 1 for share in marks}
                                  if transactional else None)
                         for shares, marks in sorted(by_k.items())]
                   for key, by_k in edits.items()}
        resets = {key: offset for key, offset in plain.items()
                  if key not in commits and self.log.table.holds_any(group, [key])}
        commit = RangeCommit(commits, resets)  # type: ignore[arg-type]  # MarkEdit lists are Edit lists
        planned = await self.plan(ctx, group, commit, sorted({*commits, *resets}), with_marks=True)
        plan = SharePlan(group, planned, refused=dict(planned.refused))
        for key, stable in planned.stable.items():
            state = commit.planned(key)
            assert state is not None  # a watermark edit's state is computed when planned
            plan.offsets[key] = (stable, watermarks.encode_metadata(state))
            plan.sequences[key] = (state.epoch, watermarks.sequences(state))
            if transactional:
                for (shares, share), sequence in plan.sequences[key][1].items():
                    if share in edits.get(key, {}).get(shares, {}):
                        self._remember_txn_sequence((group, key, shares, share), sequence)
        return plan

    def _remember_txn_sequence(self, slot: tuple, sequence: int) -> None:
        floor = self._txn_sequences
        floor[slot] = max(sequence, floor.get(slot, 0))
        floor.move_to_end(slot)
        while len(floor) > _TXN_SEQUENCES:
            floor.popitem(last=False)

    async def finish_shares(self, plan: SharePlan, generation: int, member: str, instance_id: str | None,
                            results: list[tuple[Key, int]]) -> dict[Key, int]:
        """The coordinator's answer (error per real partition): the log is written for the
        partitions it accepted; returns the error each partition is to be answered with
        (a partition not in it keeps the coordinator's)."""
        planned = plan.planned
        try:
            step = planned.commit.on_response(results)
            answer = await self.perform(plan.group, generation, member, instance_id, planned, step)
            return dict(answer.errors)
        finally:
            planned.done.set()

    async def settle_shares(self, ctx: ConnectionContext, group: str,
                            folds: dict[Key, dict[int, dict[int, tuple[int, int]]]],
                            generation: int, member: str, instance_id: str | None, *,
                            since: float | None = None) -> dict[Key, int]:
        """A commit of share watermarks that are already committed elsewhere (a transaction's
        shadow groups; ``folds``: key -> K -> share -> (W, the shadow's sequence), as
        ``fold_edits`` gives them), made by the proxy itself: the log (the transaction
        committed them: no coordinator check is needed), then S' with the watermarks at the
        coordinator in an OffsetCommit of the proxy's own (``commit_settled``). Nothing is
        written when the group was deleted through this instance after ``since``. Returns
        the coordinator's error per key."""
        edits = {key: {k: {share: w for share, (w, _) in marks.items()} for k, marks in by_k.items()}
                 for key, by_k in folds.items()}
        exact = {key: {k: {share: seq for share, (_, seq) in marks.items()} for k, marks in by_k.items()}
                 for key, by_k in folds.items()}
        plan = await self.begin_shares(ctx, group, edits, {}, exact=exact)
        if since is not None and self.deleted_since(group, since):
            self.abandon(plan)  # deleted meanwhile (its locks are held now): nothing to fold
            return {}
        try:
            # the log first: once S shows at the coordinator, the fold is durable
            errors = await self.finish_shares(plan, generation, member, instance_id,
                                              [(key, int(ErrorCode.NONE)) for key in plan.offsets])
            answered = await self.commit_settled(group, generation, member, instance_id, plan.offsets)
            return {**plan.refused, **answered, **errors}
        finally:
            self.abandon(plan)

    async def commit_settled(self, group: str, generation: int, member: str, instance_id: str | None,
                             offsets: dict[Key, int] | dict[Key, tuple[int, str]]) -> dict[Key, int]:
        """S of keys whose processed offsets a committed transaction holds, to the
        coordinator: as the member that committed them, or, when the member has left or the
        generation moved on, as nobody (accepted while the group is empty, as an admin tool's
        commit is); otherwise left to the next commit of the key. The error per key."""
        if not offsets:
            return {}
        stale = (ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID)
        try:
            answered = await self.log.cluster.commit_offsets(group, generation, member, instance_id, offsets)
            if answered and generation >= 0 and all(code in stale for code in answered.values()):
                answered = await self.log.cluster.commit_offsets(group, -1, "", None, offsets)
        except CommitLogError as exc:
            log.info("stable offset not moved after a transaction group=%s reason=%r", group, str(exc))
            return {key: int(ErrorCode.COORDINATOR_NOT_AVAILABLE) for key in offsets}
        refused = {key: code for key, code in answered.items() if code != ErrorCode.NONE}
        if refused:
            log.info("stable offset not moved after a transaction group=%s refused=%s", group,
                     {f"{t}-{p}": ErrorCode.name_of(c) for (t, p), c in refused.items()})
        return answered

    async def shadow_offsets(self, group: str, shadows: dict[str, list[Key]], *,
                             require_stable: bool) -> dict[str, dict[Key, tuple[int, str | None, int]]]:
        """Committed offset, metadata and error of ``shadows`` (groups on ``group``'s
        coordinator), in one request (raises ``CommitLogError``)."""
        return await self.log.cluster.committed_groups(group, shadows, require_stable=require_stable)

    def fold_edits(self, group: str, shadows: dict[Key, list[watermarks.ShadowMark]]
                   ) -> dict[Key, dict[int, dict[int, tuple[int, int]]]]:
        """The watermark edits that bring each key's log record (``read`` first) up to its
        committed shadow watermarks; keys with nothing newer are left out."""
        records = self.log.records(group)
        edits = {}
        for key, marks in shadows.items():
            record = records.get(key)
            by_k = watermarks.fold(record[1] if record is not None else CommitState(-1), marks)
            if by_k:
                edits[key] = by_k
        return edits

    # -- offset ranges committed in transactions (stages) -----------------------------------------
    async def begin_stage(self, ctx: ConnectionContext, group: str, slot: str, commits: dict[Key, list[Range]], *,
                          metadata_limit: int = 4096, max_held: int | None = None) -> StagePlan:
        """Plan a transactional range commit of ``commits`` by the member whose stage is
        ``slot`` (a shadow group on ``group``'s coordinator): per key, the stage to write
        (its committed stage joined with the new ranges, less what the log covers) and S_c
        for the carrier. Holds the keys' locks until ``done`` is set (or the connection
        ends): commits of one key through this instance serialise, as range commits do.

        ``max_held``: a key whose log state, with the stage folded in, would hold more
        ranges above S than that and than it holds now is refused
        (INVALID_COMMIT_OFFSET_SIZE) before anything enters the transaction. Stages of
        other members not folded yet are not counted; a committed stage is always folded."""
        plan = StagePlan(trio.Event())
        keys = sorted(commits)
        locked = [(group, *key) for key in keys]
        await self.locks.acquire(locked)
        ctx.start_soon(self._hold, locked, plan.done)
        try:
            await self.log.catch_up(group)
            states = await self._states_for(group, keys)
            found = await self._stable_stages(group, {slot: keys})
        except CommitLogError as exc:
            log.warning("transactional range commit unavailable group=%s reason=%r", group, str(exc))
            plan.refused = {key: int(ErrorCode.COORDINATOR_NOT_AVAILABLE) for key in keys}
            return plan
        except BaseException:
            plan.done.set()
            raise
        for key in keys:
            offset, metadata, error = found.get(slot, {}).get(key, (-1, None, int(ErrorCode.NONE)))
            if error == ErrorCode.UNSTABLE_OFFSET_COMMIT:
                # the member's previous transaction is still being completed: the client retries
                plan.refused[key] = int(ErrorCode.CONCURRENT_TRANSACTIONS)
                continue
            state = states[key]
            stage = txn_stages.next_stage(state, txn_stages.decode_stage(metadata), commits[key])
            # The log's state once the stage is folded; its S is the carrier's
            # (``txn_stages.carrier_offset``).
            after = apply_ranges(state, stage) if stage else state
            reason = check_held(state, after, max_held) if max_held is not None else None
            if reason is not None:
                plan.over_bound[key] = reason
                plan.refused[key] = int(ErrorCode.INVALID_COMMIT_OFFSET_SIZE)
                continue
            try:
                text = txn_stages.encode_stage(state.epoch, stage, metadata_limit)
            except txn_stages.StageTooLarge as exc:
                log.info("transactional range commit refused group=%s key=%s reason=%r", group, key, str(exc))
                plan.refused[key] = int(ErrorCode.INVALID_REQUEST)
                continue
            plan.offsets[key] = (after.stable, text)
        return plan

    async def _states_for(self, group: str, keys: list[Key]) -> dict[Key, CommitState]:
        """Each key's state from the log (read first), or from the coordinator's committed
        offset where the log holds none."""
        records = self.log.records(group)
        states = {key: records[key][1] for key in keys if key in records}
        missing = [key for key in keys if key not in states]
        if missing:
            for key, offset in (await self.log.cluster.committed_offsets(group, missing)).items():
                states[key] = CommitState(max(offset, -1))
            for key in missing:
                states.setdefault(key, CommitState(-1))
        return states

    async def _stable_stages(self, group: str, slots: dict[str, list[Key]], *, wait: float = 5.0
                             ) -> dict[str, dict[Key, tuple[int, str | None, int]]]:
        """The stages of ``slots`` with RequireStable, asked again while a transaction of
        theirs is being completed, up to ``wait`` seconds."""
        delay, deadline = 0.02, trio.current_time() + wait
        while True:
            found = await self.log.cluster.committed_groups(group, slots, require_stable=True)
            pending = any(error == ErrorCode.UNSTABLE_OFFSET_COMMIT for keys in found.values()
                          for _o, _m, error in keys.values())
            if not pending or trio.current_time() + delay > deadline:
                return found
            await trio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def stages(self, group: str, slots: list[str], keys: list[Key], *, require_stable: bool
                     ) -> tuple[dict[Key, list[Range]], set[Key]]:
        """What the committed stages of ``slots`` hold for ``keys`` beyond the log (``read``
        first; a stage of another reset epoch counts for nothing), and the keys a stage of
        which is pending in an open transaction (asked with ``require_stable``)."""
        if not slots or not keys:
            return {}, set()
        found = await self.log.cluster.committed_groups(group, {slot: keys for slot in slots},
                                                        require_stable=require_stable)
        records = self.log.records(group)
        extra: dict[Key, list[Range]] = {}
        pending: set[Key] = set()
        for answers in found.values():
            for key, (_offset, metadata, error) in answers.items():
                if error == ErrorCode.UNSTABLE_OFFSET_COMMIT:
                    pending.add(key)
                    continue
                stage = txn_stages.decode_stage(metadata)
                if stage is None:
                    continue
                record = records.get(key)
                state = record[1] if record is not None else CommitState(-1)
                if stage[0] != state.epoch:
                    continue
                ranges = txn_stages.uncovered(state, stage[1])
                if ranges:
                    extra.setdefault(key, []).extend(ranges)
        return extra, pending

    async def fold_stages(self, ctx: ConnectionContext, group: str, ranges: dict[Key, list[Range]], *,
                          generation: int = -1, member: str = "", instance_id: str | None = None,
                          since: float | None = None) -> dict[Key, int]:
        """Write committed stages' ranges into the log, as range commits that are already
        committed (their transaction is); with a member's ``generation``, S' also reaches
        the coordinator in an OffsetCommit of the proxy's own. Returns the error per key."""
        edits = {key: [pack(normalise(found))] for key, found in ranges.items() if found}
        if not edits:
            return {}
        commit = RangeCommit(edits, {})  # type: ignore[arg-type]  # packed ranges are Edits
        planned = await self.plan(ctx, group, commit, sorted(edits))
        if since is not None and self.deleted_since(group, since):
            planned.done.set()  # deleted meanwhile (its locks are held now): nothing to fold
            return {}
        try:
            results = [(key, int(ErrorCode.NONE)) for key in planned.stable]
            answer = await self.perform(group, generation, member, instance_id, planned, commit.on_response(results))
            if generation >= 0:  # the log first: once S shows at the coordinator, the fold is durable
                await self.commit_settled(group, generation, member, instance_id, planned.stable)
            return {**planned.refused, **dict(answer.errors)}
        finally:
            planned.done.set()

    # -- deletion -------------------------------------------------------------------------------
    async def deleting(self, group: str, keys: set[Key] | None = None) -> None:
        """A deletion of ``group`` (``keys`` None) or of those offsets of it is about to be
        written: a follow-up that begins from now on writes nothing (``deleted_since``).
        Returns once the commits of those keys under way have ended: one that checked
        before this deletion began holds its keys' locks until its log write is done, and
        that write (a key's first record, say) may land after the deletion read the log
        for what to tombstone."""
        self._deleted_at[group] = trio.current_time()
        self._deleted_at.move_to_end(group)
        while len(self._deleted_at) > _DELETIONS_REMEMBERED:
            self._deleted_at.popitem(last=False)
        # Bounded: a commit pipelined behind the deletion on the client's own connection
        # holds its locks until its answer, which waits for this one's.
        with trio.move_on_after(_DELETION_DRAIN_S) as waited:
            await self.locks.drain(group, keys)
        if waited.cancelled_caught:
            log.warning("deleting with commits of the group still under way group=%s waited_s=%g", group,
                        _DELETION_DRAIN_S)

    def deleted_since(self, group: str, since: float) -> bool:
        return self._deleted_at.get(group, -float("inf")) >= since

    def on_deleted(self, hook: Callable[[str, set[Key] | None], Awaitable[None]]) -> None:
        """Call ``hook(group, keys)`` once a deletion the broker accepted is in the log:
        the group (``keys`` None) or those committed offsets of it."""
        self._deletion_hooks.append(hook)

    async def deleted(self, group: str, keys: set[Key] | None) -> None:
        for hook in self._deletion_hooks:
            try:
                await hook(group, keys)
            except Exception as exc:  # noqa: BLE001 - one hook's failure must not stop the others
                log.error("deletion follow-up failed group=%s reason=%r", group, str(exc))

    async def groups_beside(self, group: str) -> list[str]:
        return await self.log.cluster.groups_beside(group)

    async def delete_groups(self, coordinator_of: str, groups: list[str]) -> dict[str, int]:
        return await self.log.cluster.delete_groups(coordinator_of, groups)

    async def delete_offsets(self, group: str, keys: list[Key]) -> int:
        return await self.log.cluster.delete_offsets(group, keys)

    def abandon(self, plan: SharePlan) -> None:
        """The commit will not be completed (nothing was sent): release its locks."""
        plan.planned.done.set()

    async def read(self, group: str) -> None:
        """Read the group's log partition to its end (raises ``CommitLogError``)."""
        await self.log.catch_up(group)

    def known_state(self, group: str, key: Key) -> tuple[int, tuple[Range, ...]] | None:
        """(S, R) of ``key`` as this instance last read or wrote it; None when it holds no
        record of it (then the coordinator's committed offset is S: ``committed_state``)."""
        record = self.log.records(group).get(key)
        return None if record is None else (record[1].stable, record[1].ranges)

    async def committed_state(self, group: str, key: Key, *, with_stages: bool = False
                              ) -> tuple[int, tuple[Range, ...]]:
        """(S, R) of ``key``, the log read to its end first; S from the coordinator where
        the log holds nothing (-1: nothing committed). ``with_stages``: plus what committed
        transactions hold that is not folded into the log yet. Raises ``CommitLogError``."""
        await self.log.catch_up(group)
        state = (await self._states_for(group, [key]))[key]
        if with_stages:
            slots = await self.stage_slots(group)
            if slots:
                extra, _pending = await self.stages(group, slots, [key], require_stable=False)
                if extra.get(key):
                    state = apply_ranges(state, extra[key])
        return state.stable, state.ranges

    async def stage_slots(self, group: str) -> list[str]:
        """The stage shadow groups of ``group``'s transactional producers (ListGroups at
        its coordinator)."""
        partitions = await self.cluster.offsets_partitions()
        if partitions is None:
            raise CommitLogError("the partition count of __consumer_offsets is unknown")
        prefix = stage_prefix(group, "")
        return [name for name in await self.groups_beside(group)
                if name.startswith(prefix) and parse_salted(name, group, partitions) is not None]

    def watermarks(self, group: str, key: Key, committed: int, metadata: str | None,
                   shadows: Sequence[watermarks.ShadowMark] = ()) -> tuple[int, dict[int, list[int]]]:
        """S and W per share per K (-1: none) of ``key``, from what this instance read of
        the log (``read`` first), the coordinator's committed offset and metadata, and the
        committed shadow watermarks of transactions (the newer of each share's)."""
        record = self.log.records(group).get(key)
        state = watermarks.combine(record[1] if record is not None else None, committed, metadata)
        if shadows:
            state = watermarks.overlay(state, list(shadows))
        return state.stable, watermarks.per_share(state.marks)
