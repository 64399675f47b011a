"""Reading what a group has committed, as every feature that reads it needs it: a
partition's (S, R) (individual commit, cooperative fetch), its share watermarks (virtual
range topics), and what committed transactions hold that the log does not have yet (the
shadow groups, ``proxy.commits.shadows``).

Nothing is served from state older than the log: a read of a group's state reads its log
partition up to its end first (``read``), and the coordinator's committed offset is S where
the log holds no record of a partition.

What committed transactions hold is read in the other order: the shadows first, then the
log to its end. A range leaves a member's shadow only in the member's next transaction, and
only once the log holds it (the shadow's next content is planned less what the log holds),
so a range committed before the shadows were read is in what was read of them or in the log
read after. Read the other way round, a range folded into the log and dropped from the
shadow between the two reads would be in neither, and an offset committed once would look
uncommitted (and be handed out again).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import trio

from proxy.commits import shadows, watermarks
from proxy.commits.cluster import CommitLogError
from proxy.commits.log import CommitLog
from proxy.commits.state import CommitState, OffsetRange, apply_ranges
from proxy.pipeline import ClusterView
from proxy.protocol.constants import ErrorCode

TopicPartitionKey = tuple[str, int]
_LOG_LOOKUP_INTERVAL = 5.0  # seconds between looks for a log topic not seen yet (plain commits)
# shadow group -> key -> (committed offset, metadata, error), as one OffsetFetch answers
ShadowAnswers = dict[str, dict[TopicPartitionKey, tuple[int, str | None, int]]]


def pending(found: ShadowAnswers) -> bool:
    """Whether a transaction still holds any key of ``found`` pending (asked with
    RequireStable: UNSTABLE_OFFSET_COMMIT)."""
    return any(error == ErrorCode.UNSTABLE_OFFSET_COMMIT for answers in found.values()
               for _offset, _metadata, error in answers.values())


class CommittedReads:
    def __init__(self, log: CommitLog, cluster: ClusterView) -> None:
        self.log = log
        self.cluster = cluster
        self._log_looked_up_at = -_LOG_LOOKUP_INTERVAL

    async def read(self, group: str) -> None:
        """Read the group's log partition to its end (raises ``CommitLogError``)."""
        await self.log.catch_up(group)

    async def offsets_partitions(self) -> int:
        """The partition count of ``__consumer_offsets`` (shadow group names depend on it);
        ``ShadowNameError`` while it is unknown."""
        count = await self.cluster.offsets_partitions()
        if count is None:
            raise shadows.ShadowNameError("the partition count of __consumer_offsets is unknown")
        return count

    # -- a partition's (S, R) -------------------------------------------------------------------
    async def holds_state(self, group: str, keys: Iterable[TopicPartitionKey]) -> bool:
        """Whether a plain commit of ``keys`` may touch state. Reads the group's log
        partition when this instance has never read it; afterwards what it read is trusted
        for plain commits (range commits and fetches always read to the log's end)."""
        if self.log.current(group):
            return self.log.table.holds_any(group, keys)
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
        return self.log.table.holds_any(group, keys)

    def known_state(self, group: str, key: TopicPartitionKey) -> tuple[int, tuple[OffsetRange, ...]] | None:
        """(S, R) of ``key`` as this instance last read or wrote it; None when it holds no
        record of it (then the coordinator's committed offset is S: ``committed_state``)."""
        record = self.log.records(group).get(key)
        return None if record is None else (record[1].stable, record[1].ranges)

    async def committed_state(self, group: str, key: TopicPartitionKey, *, with_shadows: bool = False
                              ) -> tuple[int, tuple[OffsetRange, ...]]:
        """(S, R) of ``key``, the log read to its end; S from the coordinator where the log
        holds nothing (-1: nothing committed). ``with_shadows``: plus what committed
        transactions hold that is not folded into the log yet (read before the log: see the
        module docstring). Raises ``CommitLogError``."""
        extra: dict[TopicPartitionKey, list[OffsetRange]] = {}
        if with_shadows:
            names = await self.range_shadows(group)
            if names:
                extra, _pending = await self.shadowed_ranges(group, names, [key], require_stable=False)
        await self.log.catch_up(group)
        state = (await self.states(group, [key]))[key]
        if extra.get(key):
            state = apply_ranges(state, extra[key])
        return state.stable, state.ranges

    async def states(self, group: str, keys: list[TopicPartitionKey]) -> dict[TopicPartitionKey, CommitState]:
        """Each key's state from the log (``read`` first), or from the coordinator's
        committed offset where the log holds none."""
        records = self.log.records(group)
        states = {key: records[key][1] for key in keys if key in records}
        missing = [key for key in keys if key not in states]
        if missing:
            for key, offset in (await self.log.cluster.committed_offsets(group, missing)).items():
                states[key] = CommitState(max(offset, -1))
            for key in missing:
                states.setdefault(key, CommitState(-1))
        return states

    # -- share watermarks -----------------------------------------------------------------------
    def watermarks(self, group: str, key: TopicPartitionKey, committed: int, metadata: str | None,
                   marks: Sequence[shadows.ShadowMark] = ()) -> tuple[int, dict[int, list[int]]]:
        """S and W per share per K (-1: none) of ``key``, from what this instance read of
        the log (``read`` first), the coordinator's committed offset and metadata, and the
        committed share shadow watermarks of transactions (the newer of each share's)."""
        record = self.log.records(group).get(key)
        state = watermarks.combine(record[1] if record is not None else None, committed, metadata)
        if marks:
            state = watermarks.overlay(state, list(marks))
        return state.stable, watermarks.per_share(state.marks)

    # -- shadow groups --------------------------------------------------------------------------
    async def shadow_offsets(self, group: str, asked: dict[str, list[TopicPartitionKey]], *, require_stable: bool) -> ShadowAnswers:
        """Committed offset, metadata and error of ``asked`` (shadow groups on ``group``'s
        coordinator -> keys), in one request (raises ``CommitLogError``)."""
        return await self.log.cluster.committed_groups(group, asked, require_stable=require_stable)

    async def range_shadows(self, group: str) -> list[str]:
        """The range shadows of ``group``'s transactional producers (ListGroups at its
        coordinator)."""
        partitions = await self.offsets_partitions()
        return [name for name in await self.log.cluster.groups_beside(group)
                if shadows.is_range_shadow(name, group, partitions)]

    async def shadowed_ranges(self, group: str, names: list[str], keys: list[TopicPartitionKey], *, require_stable: bool
                              ) -> tuple[dict[TopicPartitionKey, list[OffsetRange]], set[TopicPartitionKey]]:
        """What the committed range shadows ``names`` hold for ``keys`` beyond the log, and
        the keys one of them holds pending in an open transaction (asked with
        ``require_stable``). The log is read to its end after the shadows (the module
        docstring says why): the caller's states are those of the log as read now."""
        if not names or not keys:
            return {}, set()
        found = await self.shadow_offsets(group, {name: keys for name in names}, require_stable=require_stable)
        await self.log.catch_up(group)
        return self.beyond_log(group, found)

    def beyond_log(self, group: str, found: ShadowAnswers) -> tuple[dict[TopicPartitionKey, list[OffsetRange]], set[TopicPartitionKey]]:
        """The ranges the range shadows' answers ``found`` hold beyond the log (a shadow of
        another reset epoch counts for nothing), and the keys pending in an open transaction."""
        records = self.log.records(group)
        extra: dict[TopicPartitionKey, list[OffsetRange]] = {}
        unstable: set[TopicPartitionKey] = set()
        for answers in found.values():
            for key, (_offset, metadata, error) in answers.items():
                if error == ErrorCode.UNSTABLE_OFFSET_COMMIT:
                    unstable.add(key)
                    continue
                held = shadows.decode_ranges(metadata)
                if held is None:
                    continue
                record = records.get(key)
                state = record[1] if record is not None else CommitState(-1)
                if held[0] != state.epoch:
                    continue
                ranges = shadows.uncovered(state, held[1])
                if ranges:
                    extra.setdefault(key, []).extend(ranges)
        return extra, unstable
