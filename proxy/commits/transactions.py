"""Commits made inside Kafka transactions: written to shadow groups in the client's own
transaction (``proxy.commits.shadows``), and folded into the individual-commit log once the
transaction has ended (docs/individual-commit.md, "Transactional commits (exactly-once on
shared partitions)" and "Offset ranges of extension clients").

Two kinds of shadows, one mechanism:

- *ranges* (individual commit, TxnOffsetCommit with offset ranges): ``begin_ranges`` plans
  what the member's range shadow holds next and S_c for the carrier; ``settle_ranges``
  folds the committed shadow once its transaction has ended;
- *share watermarks* (virtual range topics): ``begin_marks`` plans the watermarks, their
  sequences and S_c; ``settle_marks`` folds the committed share shadows.

Both settles wait for the transaction's end the same way (``until_ended``: the shadows
asked with RequireStable, with backoff, until none is pending), then fold what the
committed shadows hold beyond the log, as commits that are already committed, and move S
at the coordinator (``commit_settled``). An aborted transaction leaves nothing newer, and
nothing is written. Settles run in ``background``: they outlive the client's connection.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from proxy.commits import shadows, watermarks
from proxy.commits.cluster import CommitLogError
from proxy.commits.packed import pack
from proxy.commits.range_commit import RangeCommit
from proxy.commits.reads import CommittedReads, ShadowAnswers, pending
from proxy.commits.state import CommitState, OffsetRange, apply_ranges, check_held, normalise
from proxy.commits.writes import CommitWrites, ShareEdits, SharePlan, Starter
from proxy.pipeline import ConnectionContext
from proxy.pipeline.background import Background
from proxy.protocol.constants import ErrorCode

log = logging.getLogger("proxy.commits")

TopicPartitionKey = tuple[str, int]
_TXN_SEQUENCES = 100_000  # shares whose transactional sequences an instance remembers


@dataclass(frozen=True, slots=True)
class Patience:
    """How long, and how often, a shadow is asked until its transaction has ended."""

    first_delay: float  # before the second question (and before the first, with sleep_first)
    max_delay: float  # the delay doubles up to this
    wait: float  # then the answers stand as they are
    sleep_first: bool = False


# After a transactional commit's answer: the transaction ends after the client's EndTxn,
# and no transaction stays open longer than transaction.max.timeout.ms (Kafka's default).
AFTER_COMMIT = Patience(first_delay=0.02, max_delay=1.0, wait=900.0, sleep_first=True)
# Before a range shadow is written again: only the same member's previous transaction,
# whose markers are being written, can hold it; longer, the client retries.
BEFORE_WRITE = Patience(first_delay=0.02, max_delay=0.5, wait=5.0)


async def until_ended(ask: Callable[[], Awaitable[ShadowAnswers]], patience: Patience) -> tuple[ShadowAnswers, bool]:
    """Ask (with RequireStable) until no key is pending in an open transaction: the last
    answers, and whether they are settled (False: ``patience.wait`` ran out first)."""
    delay = patience.first_delay
    deadline = trio.current_time() + patience.wait
    if patience.sleep_first:
        await trio.sleep(delay)
        delay = min(delay * 2, patience.max_delay)
    while True:
        found = await ask()
        if not pending(found):
            return found, True
        if trio.current_time() + delay > deadline:
            return found, False
        await trio.sleep(delay)
        delay = min(delay * 2, patience.max_delay)


@dataclass
class RangesPlan:
    """A transactional range commit planned by ``begin_ranges``: ``offsets`` key -> (S_c,
    the shadow's metadata); ``refused`` key -> error; ``over_bound`` key -> why it was
    refused for ``max.individual.commit.ranges.held``; ``done`` releases the key locks."""

    done: trio.Event
    offsets: dict[TopicPartitionKey, tuple[int, str]] = field(default_factory=dict)
    refused: dict[TopicPartitionKey, int] = field(default_factory=dict)
    over_bound: dict[TopicPartitionKey, str] = field(default_factory=dict)


class TransactionalCommits:
    def __init__(self, reads: CommittedReads, writes: CommitWrites, background: Background) -> None:
        self.reads = reads
        self.writes = writes
        self.log = reads.log
        # where settles run (they outlive the client's connection)
        self.background = background
        # (group, key, K, share) -> the highest sequence this instance gave a transaction's
        # watermark of that share (``begin_marks``), least recently used dropped
        self._sequences: OrderedDict[tuple, int] = OrderedDict()

    # -- offset ranges ----------------------------------------------------------------------------
    async def begin_ranges(self, ctx: ConnectionContext, group: str, shadow: str, commits: dict[TopicPartitionKey, list[OffsetRange]], *,
                           metadata_limit: int = shadows.DEFAULT_METADATA_MAX, max_held: int | None = None
                           ) -> RangesPlan:
        """Plan a transactional range commit of ``commits`` by the member whose range
        shadow is ``shadow``: per key, what the shadow holds next (its committed ranges
        joined with the new ones, less what the log covers) and S_c for the carrier. Holds
        the keys' locks until ``done`` is set (or the connection ends): commits of one key
        through this instance serialise, as range commits do.

        ``max_held``: a key whose log state, with the shadow folded in, would hold more
        ranges above S than that and than it holds now is refused
        (INVALID_COMMIT_OFFSET_SIZE) before anything enters the transaction. Shadows of
        other members not folded yet are not counted; a committed shadow is always folded."""
        plan = RangesPlan(trio.Event())
        keys = sorted(commits)
        locked = [(group, *key) for key in keys]
        await self.writes.locks.acquire(locked)
        ctx.start_soon(self.writes.hold, locked, plan.done)
        try:
            await self.log.catch_up(group)
            states = await self.reads.states(group, keys)
            found, _ = await until_ended(lambda: self.reads.shadow_offsets(group, {shadow: keys}, require_stable=True),
                                         BEFORE_WRITE)
        except CommitLogError as exc:
            log.warning("transactional range commit unavailable group=%s reason=%r", group, str(exc))
            plan.refused = {key: int(ErrorCode.COORDINATOR_NOT_AVAILABLE) for key in keys}
            return plan
        except BaseException:
            plan.done.set()
            raise
        for key in keys:
            offset, metadata, error = found.get(shadow, {}).get(key, (-1, None, int(ErrorCode.NONE)))
            if error == ErrorCode.UNSTABLE_OFFSET_COMMIT:
                # the member's previous transaction is still being completed: the client retries
                plan.refused[key] = int(ErrorCode.CONCURRENT_TRANSACTIONS)
                continue
            self._plan_ranges(plan, group, key, states[key], shadows.next_ranges(
                states[key], shadows.decode_ranges(metadata), commits[key]), metadata_limit, max_held)
        return plan

    @staticmethod
    def _plan_ranges(plan: RangesPlan, group: str, key: TopicPartitionKey, state: CommitState, ranges: list[OffsetRange],
                     metadata_limit: int, max_held: int | None) -> None:
        # The log's state once the shadow is folded; its S is the carrier's (``carrier_offset``).
        after = apply_ranges(state, ranges) if ranges else state
        reason = check_held(state, after, max_held) if max_held is not None else None
        if reason is not None:
            plan.over_bound[key] = reason
            plan.refused[key] = int(ErrorCode.INVALID_COMMIT_OFFSET_SIZE)
            return
        try:
            text = shadows.encode_ranges(state.epoch, ranges, metadata_limit)
        except shadows.RangesTooLarge as exc:
            log.info("transactional range commit refused group=%s key=%s reason=%r", group, key, str(exc))
            plan.refused[key] = int(ErrorCode.INVALID_REQUEST)
            return
        plan.offsets[key] = (after.stable, text)

    async def settle_ranges(self, ctx: Starter, group: str, shadow: str, keys: list[TopicPartitionKey],
                            generation: int, member: str, instance_id: str | None) -> bool:
        """Once the transaction of a range commit has ended, fold what the committed range
        shadow holds beyond the log; an aborted shadow never shows, and nothing is written.
        Whether something was folded."""
        try:
            return await self._settle_ranges(ctx, group, shadow, keys, generation, member, instance_id)
        except Exception as exc:  # noqa: BLE001 - the next commit or OffsetFetch folds it
            log.warning("transactional range commit not folded group=%s reason=%r", group, str(exc))
            return False

    async def _settle_ranges(self, ctx: Starter, group: str, shadow: str, keys: list[TopicPartitionKey],
                             generation: int, member: str, instance_id: str | None) -> bool:
        began = trio.current_time()
        found, ended = await until_ended(
            lambda: self.reads.shadow_offsets(group, {shadow: keys}, require_stable=True), AFTER_COMMIT)
        if not ended:
            return False
        await self.log.catch_up(group)
        extra, _ = self.reads.beyond_log(group, found)
        if not extra:
            return False
        await self.fold_ranges(ctx, group, extra, generation=generation, member=member, instance_id=instance_id,
                               since=began)
        return True

    async def fold_ranges(self, ctx: Starter, group: str, ranges: dict[TopicPartitionKey, list[OffsetRange]], *,
                          generation: int = -1, member: str = "", instance_id: str | None = None,
                          since: float | None = None) -> dict[TopicPartitionKey, int]:
        """Write committed range shadows' ranges into the log, as range commits that are
        already committed (their transaction is); with a member's ``generation``, S' also
        reaches the coordinator in an OffsetCommit of the proxy's own. Returns the error per
        key."""
        edits = {key: [pack(normalise(found))] for key, found in ranges.items() if found}
        if not edits:
            return {}
        commit = RangeCommit(edits, {})  # type: ignore[arg-type]  # packed ranges are Edits
        planned = await self.writes.plan(ctx, group, commit, sorted(edits))
        if since is not None and self.writes.deleted_since(group, since):
            planned.done.set()  # deleted meanwhile (its locks are held now): nothing to fold
            return {}
        try:
            results = [(key, int(ErrorCode.NONE)) for key in planned.stable]
            answer = await self.writes.perform(group, generation, member, instance_id, planned,
                                               commit.on_response(results))
            if generation >= 0:  # the log first: once S shows at the coordinator, the fold is durable
                await self.commit_settled(group, generation, member, instance_id, planned.stable)
            return {**planned.refused, **dict(answer.errors)}
        finally:
            planned.done.set()

    # -- share watermarks -------------------------------------------------------------------------
    async def begin_marks(self, ctx: ConnectionContext, group: str, edits: ShareEdits) -> SharePlan:
        """Plan the watermarks a transactional commit of virtual partitions writes to its
        share shadows: S_c and the watermarks, computed under the keys' locks as a plain
        virtual commit plans them; nothing is written to the log (the transaction may still
        abort). Each watermark's sequence is above every one this instance gave its share
        in a transaction before, so a later transaction's shadow is always the newer."""
        floor = self._sequences
        at_least = {key: {shares: {share: floor.get((group, key, shares, share), 0) + 1 for share in marks}
                          for shares, marks in by_k.items()} for key, by_k in edits.items()}
        plan = await self.writes.begin_shares(ctx, group, edits, {}, at_least=at_least)
        for key, (_epoch, sequences) in plan.sequences.items():
            for (shares, share), sequence in sequences.items():
                if share in edits.get(key, {}).get(shares, {}):
                    self._remember_sequence((group, key, shares, share), sequence)
        return plan

    def _remember_sequence(self, slot: tuple, sequence: int) -> None:
        floor = self._sequences
        floor[slot] = max(sequence, floor.get(slot, 0))
        floor.move_to_end(slot)
        while len(floor) > _TXN_SEQUENCES:
            floor.popitem(last=False)

    async def settle_marks(self, ctx: Starter, group: str, keys: dict[TopicPartitionKey, dict],
                           generation: int, member: str, instance_id: str | None) -> bool:
        """Once the transaction has ended, fold the committed share shadows of ``keys`` (real
        -> K -> shares) into the log and move S at the coordinator; an aborted transaction
        left nothing newer, and nothing is written. Whether something was folded."""
        try:
            return await self._settle_marks(ctx, group, keys, generation, member, instance_id)
        except Exception as exc:  # noqa: BLE001 - the next commit or OffsetFetch folds them
            log.warning("transactional watermarks not settled group=%s reason=%r", group, str(exc))
            return False

    async def _settle_marks(self, ctx: Starter, group: str, keys: dict[TopicPartitionKey, dict],
                            generation: int, member: str, instance_id: str | None) -> bool:
        partitions = await self.reads.offsets_partitions()
        asked: dict[str, list[TopicPartitionKey]] = {}
        slots: dict[str, tuple[int, int]] = {}
        for key, by_k in keys.items():
            for shares in by_k:
                for share in range(shadows.shares_of(shares)):  # every share of K: a settle catches up the others' too
                    name = shadows.share_shadow(group, shares, share, partitions)
                    asked.setdefault(name, []).append(key)
                    slots[name] = (shares, share)
        began = trio.current_time()
        found, ended = await until_ended(lambda: self.reads.shadow_offsets(group, asked, require_stable=True),
                                         AFTER_COMMIT)
        if not ended:
            return False
        marks: dict[TopicPartitionKey, list[shadows.ShadowMark]] = {}
        for name, answers in found.items():
            shares, share = slots[name]
            for key, (offset, metadata, error) in answers.items():
                mark = shadows.shadow_mark(shares, share, offset, metadata) if error == ErrorCode.NONE else None
                if mark is not None:
                    marks.setdefault(key, []).append(mark)
        await self.reads.read(group)
        folds = self.fold_edits(group, marks)
        if not folds:
            return False
        errors = await self.fold_marks(ctx, group, folds, generation, member, instance_id, since=began)
        failed = {key: code for key, code in errors.items() if code != ErrorCode.NONE}
        if failed:
            log.info("transactional watermarks folded later group=%s refused=%s", group,
                     {f"{t}-{p}": ErrorCode.name_of(c) for (t, p), c in failed.items()})
        return True

    def fold_edits(self, group: str, marks: dict[TopicPartitionKey, list[shadows.ShadowMark]]
                   ) -> dict[TopicPartitionKey, dict[int, dict[int, tuple[int, int]]]]:
        """The watermark edits that bring each key's log record (``read`` first) up to its
        committed share shadow watermarks; keys with nothing newer are left out."""
        records = self.log.records(group)
        edits = {}
        for key, found in marks.items():
            record = records.get(key)
            by_k = watermarks.fold(record[1] if record is not None else CommitState(-1), found)
            if by_k:
                edits[key] = by_k
        return edits

    async def fold_marks(self, ctx: Starter, group: str,
                         folds: dict[TopicPartitionKey, dict[int, dict[int, tuple[int, int]]]],
                         generation: int, member: str, instance_id: str | None, *,
                         since: float | None = None) -> dict[TopicPartitionKey, int]:
        """A commit of share watermarks that are already committed (``folds``: key -> K ->
        share -> (W, the shadow's sequence), as ``fold_edits`` gives them), made by the
        proxy itself: the log (the transaction committed them: no coordinator check is
        needed), then S' with the watermarks at the coordinator (``commit_settled``).
        Nothing is written when the group was deleted through this instance after
        ``since``. Returns the coordinator's error per key."""
        edits = {key: {k: {share: w for share, (w, _) in marks.items()} for k, marks in by_k.items()}
                 for key, by_k in folds.items()}
        exact = {key: {k: {share: seq for share, (_, seq) in marks.items()} for k, marks in by_k.items()}
                 for key, by_k in folds.items()}
        plan = await self.writes.begin_shares(ctx, group, edits, {}, exact=exact)
        if since is not None and self.writes.deleted_since(group, since):
            self.writes.abandon(plan)  # deleted meanwhile (its locks are held now): nothing to fold
            return {}
        try:
            # the log first: once S shows at the coordinator, the fold is durable
            errors = await self.writes.finish_shares(plan, generation, member, instance_id,
                                                     [(key, int(ErrorCode.NONE)) for key in plan.offsets])
            answered = await self.commit_settled(group, generation, member, instance_id, plan.offsets)
            return {**plan.refused, **answered, **errors}
        finally:
            self.writes.abandon(plan)

    # -- S at the coordinator -----------------------------------------------------------------------
    async def commit_settled(self, group: str, generation: int, member: str, instance_id: str | None,
                             offsets: dict[TopicPartitionKey, int] | dict[TopicPartitionKey, tuple[int, str]]) -> dict[TopicPartitionKey, int]:
        """S of keys whose processed offsets a committed transaction holds, to the
        coordinator: as the member that committed them, or, when the member has left or the
        generation moved on, as nobody (accepted while the group is empty, as an admin tool's
        commit is); otherwise left to the next commit of the key. The error per key."""
        if not offsets:
            return {}
        stale = (ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID)
        cluster = self.log.cluster
        try:
            answered = await cluster.commit_offsets(group, generation, member, instance_id, offsets)
            if answered and generation >= 0 and all(code in stale for code in answered.values()):
                answered = await cluster.commit_offsets(group, -1, "", None, offsets)
        except CommitLogError as exc:
            log.info("stable offset not moved after a transaction group=%s reason=%r", group, str(exc))
            return {key: int(ErrorCode.COORDINATOR_NOT_AVAILABLE) for key in offsets}
        refused = {key: code for key, code in answered.items() if code != ErrorCode.NONE}
        if refused:
            log.info("stable offset not moved after a transaction group=%s refused=%s", group,
                     {f"{t}-{p}": ErrorCode.name_of(c) for (t, p), c in refused.items()})
        return answered

    # -- deletion -----------------------------------------------------------------------------------
    async def delete_share_shadows(self, group: str, keys: set[TopicPartitionKey] | None) -> None:
        """G deleted (``keys`` None) deletes G's share shadows; offsets of G deleted delete
        them in G's share shadows too. Otherwise a group created again under the name would
        read its predecessor's transactional watermarks."""
        partitions = await self.reads.offsets_partitions()
        cluster = self.log.cluster
        names = [name for name in await cluster.groups_beside(group)
                 if (shadow := shadows.parse_share_shadow(name, partitions)) is not None and shadow.group == group]
        if not names:
            return
        if keys is None:
            errors = await cluster.delete_groups(group, names)
            left = {name: ErrorCode.name_of(code) for name, code in errors.items() if code != ErrorCode.NONE}
            if left:
                log.warning("shadow groups not deleted group=%s errors=%s", group, left)
            return
        for name in names:
            code = await cluster.delete_offsets(name, sorted(keys))
            if code not in (ErrorCode.NONE, ErrorCode.GROUP_ID_NOT_FOUND):
                log.warning("shadow offsets not deleted group=%s shadow=%s error=%s", group, name,
                            ErrorCode.name_of(code))
