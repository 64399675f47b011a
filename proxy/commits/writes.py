"""Writing commits through the individual-commit log: range commits, commits of share
watermarks, and deletions, as every feature that commits needs them (individual commit,
and virtual range topics).

One ``CommitWrites`` per proxy, over the one ``CommitLog``, so that every commit of a key
goes through one protocol, one memory of what was read and one set of per-key locks (a
virtual commit and a range commit of one partition serialise like two range commits). The
protocol of one commit is ``RangeCommit`` (``proxy.commits.range_commit``, no I/O); this
module performs its actions: the log-end read alongside the broker's commit, the
coordinator's correction, the writes and the windows after them (docs/individual-commit.md,
"Write order").

For virtual topics (docs/wire-contract.md#9-virtual-range-topics) it plans a commit of share
watermarks (``begin_shares``: S' and the metadata to send the coordinator in the client's
own OffsetCommit) and completes it once the coordinator answered (``finish_shares``: the
log record, written only for partitions the coordinator accepted).
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from proxy.commits import watermarks
from proxy.commits.cluster import CommitLogError
from proxy.commits.gaps import Gaps
from proxy.commits.log import CommitLog
from proxy.commits.metrics import CommitLogMetrics
from proxy.commits.range_commit import Answer, Correct, FetchCommitted, RangeCommit, ReadLogEnd, Write, lift_commit
from proxy.commits.state import CommitState, MarkEdit
from proxy.pipeline import ConnectionContext
from proxy.pipeline.background import Background

log = logging.getLogger("proxy.commits")

_DELETION_DRAIN_S = 30.0  # longest a deletion waits for the group's commits under way
_DELETIONS_REMEMBERED = 10_000  # groups whose last deletion time an instance remembers
_SHARED_S = 10.0  # after a commit met another instance's write, how long the group's commits read the log first
_SHARED_REMEMBERED = 10_000  # groups whose last meeting with another instance's write is remembered

TopicPartitionKey = tuple[str, int]
# real partition -> K -> share -> a watermark (or what goes with it, as the caller says)
ShareEdits = dict[TopicPartitionKey, dict[int, dict[int, int]]]
# real partition -> K -> share -> the stretches known to hold none of the share's records
ShareGaps = dict[TopicPartitionKey, dict[int, dict[int, Gaps]]]
# Where a commit's lock holder runs: the client's connection, or the proxy's background
# (a follow-up of a transaction, which outlives the connection).
Starter = ConnectionContext | Background


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

    async def drain(self, group: str, keys: set[TopicPartitionKey] | None = None) -> None:
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
    would pass ``max.individual.commit.ranges.held``), the concurrent end read, and
    ``done``, to set once the response is out (releases the key locks)."""

    commit: RangeCommit
    done: trio.Event
    check: EndCheck | None = None
    stable: dict[TopicPartitionKey, int] = field(default_factory=dict)
    refused: dict[TopicPartitionKey, int] = field(default_factory=dict)


@dataclass
class SharePlan:
    """A commit of share watermarks planned by ``begin_shares``: ``offsets`` key ->
    (committed offset, metadata) for the coordinator; ``refused`` key -> error for keys
    whose state could not be read (the client's commit must not carry them)."""

    group: str
    planned: Planned
    offsets: dict[TopicPartitionKey, tuple[int, str]] = field(default_factory=dict)
    refused: dict[TopicPartitionKey, int] = field(default_factory=dict)
    # key -> (reset epoch, (K, share) -> sequence) of its watermarks with the edits applied
    sequences: dict[TopicPartitionKey, tuple[int, dict[tuple[int, int], int]]] = field(default_factory=dict)


class CommitWrites:
    def __init__(self, log: CommitLog, metrics: CommitLogMetrics | None = None) -> None:
        self.log = log
        self.locks = KeyLocks()
        metrics = metrics or CommitLogMetrics()
        self._foreign, self._corrections = metrics.foreign_writes, metrics.corrections
        # group -> when a deletion of it (or of offsets of it) through this instance began:
        # a follow-up that started before must not write its state back afterwards
        self._deleted_at: OrderedDict[str, float] = OrderedDict()
        # group -> until when its range commits read the log's end before planning: another
        # instance's write met a commit of it lately (its members commit through several)
        self._shared_until: OrderedDict[str, float] = OrderedDict()
        # told of every group (keys None) or committed offsets deleted through this proxy
        self._deletion_hooks: list[Callable[[str, set[TopicPartitionKey] | None], Awaitable[None]]] = []

    # -- one commit's protocol --------------------------------------------------------------------
    async def plan(self, ctx: Starter, group: str, commit: RangeCommit, locked: list[TopicPartitionKey], *,
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
            ctx.start_soon(self.hold, keys, planned.done)
        try:
            if keys:
                if self.log.current(group) and not self._shared(group):
                    # Optimistic: compute from what this instance has read, and read the
                    # log's end concurrently with the broker's commit (merged before any
                    # log write; see docs/individual-commit.md).
                    planned.check = EndCheck()
                    ctx.start_soon(self._check_end, group, planned.check)
                else:
                    # First use, or a group other instances write too: read to the log's end
                    # first, so that S' is computed from their commits as well (else nearly
                    # every commit would need a second OffsetCommit to correct it).
                    await self.log.catch_up(group)
                step = commit.begin(self.log.position(group), self.log.records(group),
                                    end_read=planned.check is not None)
                if isinstance(step, FetchCommitted):
                    if with_marks:
                        found = await self.log.cluster.committed(group, list(step.keys))
                        known: dict[TopicPartitionKey, int | CommitState] = {
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

    async def hold(self, keys: list[tuple], done: trio.Event) -> None:
        """Release ``keys`` (taken) once ``done`` is set, or when the caller's nursery ends."""
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
                    step = await self._correct(group, generation, member, instance_id, commit, step)
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
                self._shared_until[group] = trio.current_time() + _SHARED_S
                self._shared_until.move_to_end(group)
                while len(self._shared_until) > _SHARED_REMEMBERED:
                    self._shared_until.popitem(last=False)

    def _shared(self, group: str) -> bool:
        """Whether a commit of ``group`` met another instance's write within ``_SHARED_S``."""
        until = self._shared_until.get(group)
        return until is not None and trio.current_time() < until

    async def lift(self, group: str, floors: dict[TopicPartitionKey, int]) -> dict[TopicPartitionKey, int]:
        """Make the log hold every offset below the coordinator's committed offset
        (``floors``, key -> the offset an OffsetFetch got from it) where that is above the
        log's S (``read`` first). Returns the keys it could not write (retriable error).

        The coordinator is ahead of the log after an instance died between the broker's
        acceptance of a range commit and its log write. An OffsetFetch serves the larger
        of the two, and its member resumes there, never to commit the offsets below again;
        range commits plan S' from the log, so without the lift the next one would move
        the coordinator back below them, and S would stay there for good.

        Written as a range commit without the coordinator (``Floor`` edits), and without
        the key locks: a commit under way through this instance meets it as it would
        another instance's write (merged, the coordinator corrected), and an OffsetFetch
        waiting for a lock could wait for a commit pipelined behind it on the client's
        own connection, whose answer waits for the fetch's."""
        records = self.log.records(group)
        lift = lift_commit(records, floors, self.log.position(group))
        if lift is None:
            return {}
        commit, write = lift
        log.info("individual-commit state behind the coordinator, lifted group=%s keys=%s", group,
                 {f"{topic}-{partition}": (records[(topic, partition)][1].stable, floors[(topic, partition)])
                  for topic, partition in commit.commits})
        answer = await self.perform(group, -1, "", None, Planned(commit, trio.Event()), write)
        return dict(answer.errors)

    async def _correct(self, group: str, generation: int, member: str, instance_id: str | None,
                       commit: RangeCommit, step: Correct):
        self._corrections.inc(len(step.offsets))
        try:
            errors = await self.log.cluster.commit_offsets(group, generation, member, instance_id, step.offsets)
        except CommitLogError as exc:
            log.warning("individual-commit correction failed group=%s reason=%r", group, str(exc))
            return commit.on_correction_failed()
        return commit.on_corrected(errors)

    # -- share watermarks (virtual range topics) --------------------------------------------------
    async def begin_shares(self, ctx: Starter, group: str, edits: ShareEdits, plain: dict[TopicPartitionKey, int], *,
                           exact: ShareEdits | None = None, at_least: ShareEdits | None = None,
                           gaps: ShareGaps | None = None) -> SharePlan:
        """Plan a commit of share watermarks: ``edits`` real partition -> K -> share -> W
        (a K with no share: only its lifts); ``plain``: real partitions the same request
        commits plainly (a key with state is reset, as individual commit resets it);
        ``exact`` / ``at_least``: the sequence each watermark takes, or its lowest
        (``MarkEdit``); ``gaps``: per K and share, the stretches known to hold none of the
        share's records, which the shares' watermarks are lifted over (``MarkEdit``).
        Holds the keys' locks until ``finish_shares`` or ``abandon`` (or the connection's end)."""
        commits = {key: [MarkEdit(shares, marks, exact=(exact or {}).get(key, {}).get(shares),
                                  at_least=(at_least or {}).get(key, {}).get(shares),
                                  gaps=(gaps or {}).get(key, {}).get(shares))
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
        return plan

    async def finish_shares(self, plan: SharePlan, generation: int, member: str, instance_id: str | None,
                            results: list[tuple[TopicPartitionKey, int]]) -> dict[TopicPartitionKey, int]:
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

    def abandon(self, plan: SharePlan) -> None:
        """The commit will not be completed (nothing was sent): release its locks."""
        plan.planned.done.set()

    # -- deletion -------------------------------------------------------------------------------
    async def delete(self, group: str, keys: set[TopicPartitionKey] | None) -> None:
        """The broker deleted ``group`` (``keys`` None) or those committed offsets of it:
        wait for the commits of those keys under way (``deleting``), tombstone their state
        in the log, then tell the deletion hooks (``on_deleted``)."""
        await self.deleting(group, keys)
        await self._tombstone(group, keys)
        if keys is None or keys:
            await self.deleted(group, keys)

    async def deleting(self, group: str, keys: set[TopicPartitionKey] | None = None) -> None:
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

    def on_deleted(self, hook: Callable[[str, set[TopicPartitionKey] | None], Awaitable[None]]) -> None:
        """Call ``hook(group, keys)`` once a deletion the broker accepted is in the log:
        the group (``keys`` None) or those committed offsets of it."""
        self._deletion_hooks.append(hook)

    async def deleted(self, group: str, keys: set[TopicPartitionKey] | None) -> None:
        for hook in self._deletion_hooks:
            try:
                await hook(group, keys)
            except Exception as exc:  # noqa: BLE001 - one hook's failure must not stop the others
                log.error("deletion follow-up failed group=%s reason=%r", group, str(exc))

    async def _tombstone(self, group: str, keys: set[TopicPartitionKey] | None) -> None:
        try:
            states = await self.log.states(group)
            doomed = [key for key in states if keys is None or key in keys]
            if not doomed:
                return
            locks = [(group, *key) for key in doomed]
            await self.locks.acquire(locks)
            try:
                await self.log.write(group, {key: None for key in doomed})
            finally:
                self.locks.release(locks)
        except CommitLogError as exc:
            log.error("cannot delete individual-commit state group=%s reason=%r", group, str(exc))
