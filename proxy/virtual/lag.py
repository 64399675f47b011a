"""Lag that tells the truth on virtual partitions, without I/O (docs/virtual-topics.md#lag).

Most applications commit the offset after the last record they processed. On a virtual
partition the share's last record is usually before the log end, the rest being other
shares' records, so such a commit leaves lag that never goes away: lag-based autoscalers
and alerts read a caught-up group as behind, and the real partition's committed offset
(the lowest of its shares') stays behind its log end.

The proxy knows better: when its control batch moved a share's consumer past the end of
a read (``proxy.virtual.fetch.compose``), every offset it passed held no record of the
share. ``ShareGaps`` keeps those stretches per share (``proxy.commits.gaps``), and a
share's committed offset is lifted over them (``proxy.commits.state.lift_marks``):

- when a member commits (its commit carries the gaps of every share of the partition),
- when OffsetFetch answers (so ``kafka-consumer-groups --describe`` shows lag 0 at once),
- and by the proxy itself once the partition's commits have gone quiet (``LiftWatch``):
  a caught-up member commits nothing more, yet the stretches after its last record are
  often read only after that commit.

The proxy's own lift is an OffsetCommit as a member of the group (the identity of the
group's latest heartbeat or commit through this instance), so the broker checks its
generation as for any member's commit, and then the log's record, as a member's virtual
commit goes.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from proxy.commits.gaps import Gaps, add_gap, lift
from proxy.commits.state import Marks, lift_marks

RealKey = tuple[str, int]  # (real topic, partition)

GAPS_PER_SHARE = 4  # the highest stretches of a share kept: committed offsets wait near the log end
MAX_GAPS = 100_000  # stretches kept in all (about 120 bytes each), the least recently learnt partitions dropped
MAX_GROUPS = 10_000  # groups an instance lifts by itself, least recently committed dropped
IDLE_S = 300.0  # a partition neither committed nor learnt about this long, nothing pending: no longer watched
QUIET_S = 1.0  # a partition's commits quiet this long: the proxy lifts it itself
RETRY_S = 5.0  # a lift the coordinator refused is tried again after this long (with a fresh identity)
SCAN_INTERVAL_S = 5.0  # a partition's tail is read for a group at most this often
SCAN_BYTES = 256 << 10  # one read of a partition's tail
SCAN_READS = 3  # reads of one partition in one lift (from the lowest committed offsets up)


@dataclass(slots=True)
class _PartitionGaps:
    topic_id: uuid.UUID
    shares: dict[tuple[int, int], Gaps] = field(default_factory=dict)  # (K, share) -> its stretches
    end: int = 0  # the highest offset any stretch reaches
    version: int = 0  # ShareGaps' count when something was last learnt of it


class ShareGaps:
    """The stretches of each real partition known to hold no record of a share, per K
    (as ``VirtualTopic.mark_k`` counts it: key shares and stripes apart) and share.

    What was known stops counting when the partition's offsets may have been written
    again: under another topic id (the topic deleted and created again under its name;
    an unknown id, None, is neither learnt nor answered), or below a stretch's end (a
    high watermark seen below it: an unclean leader election truncated the log, and the
    offsets past the new end will hold other records).

    ``version(topic, partition)`` counts what was learnt of a partition, so a watcher can
    tell whether anything is new since it last looked. Bounded: ``per_share`` stretches
    per share, ``max_gaps`` in all (the least recently learnt partitions dropped)."""

    def __init__(self, per_share: int = GAPS_PER_SHARE, max_gaps: int = MAX_GAPS) -> None:
        self.per_share = per_share
        self.max_gaps = max_gaps
        self.held = 0  # stretches kept
        self._known: OrderedDict[RealKey, _PartitionGaps] = OrderedDict()
        self._learnt = 0  # counts everything learnt: a partition's version is its last count, never repeated

    def learn(self, topic: str, topic_id: uuid.UUID | None, partition: int, mark_k: int, share: int,
              start: int, end: int) -> bool:
        """[start, end) of ``topic``/``partition`` holds no record of ``share`` of
        ``mark_k``. Whether that is news."""
        if topic_id is None or start >= end or start < 0:
            return False
        key = (topic, partition)
        entry = self._known.get(key)
        if entry is None or entry.topic_id != topic_id:
            if entry is not None:
                self._drop(key)
            entry = self._known[key] = _PartitionGaps(topic_id)
        else:
            self._known.move_to_end(key)
        before = entry.shares.get((mark_k, share), ())
        after = add_gap(before, start, end, self.per_share)
        if after == before:
            return False
        entry.shares[(mark_k, share)] = after
        self.held += len(after) - len(before)
        while self.held > self.max_gaps and len(self._known) > 1:
            self._drop(next(iter(self._known)))
        entry.end = max(entry.end, end)
        self._learnt += 1
        entry.version = self._learnt
        return True

    def high_watermark(self, topic: str, partition: int, high_watermark: int) -> None:
        """A read of ``topic``/``partition`` answered ``high_watermark``: what was known
        above it is forgotten (the log was truncated below it; its offsets will be written
        again)."""
        entry = self._known.get((topic, partition))
        if entry is None or high_watermark < 0 or high_watermark >= entry.end:
            return
        for slot, gaps in list(entry.shares.items()):
            kept = tuple((start, min(end, high_watermark)) for start, end in gaps if start < high_watermark)
            self.held += len(kept) - len(gaps)
            if kept:
                entry.shares[slot] = kept
            else:
                del entry.shares[slot]
        entry.end = high_watermark

    def _drop(self, key: RealKey) -> None:
        entry = self._known.pop(key)
        self.held -= sum(len(gaps) for gaps in entry.shares.values())

    def of(self, topic: str, topic_id: uuid.UUID | None, partition: int, mark_k: int) -> dict[int, Gaps]:
        """Share -> its stretches, of ``topic``/``partition`` under ``mark_k`` (empty when
        nothing is known, or the topic's id is not the one they were learnt under)."""
        entry = self._known.get((topic, partition))
        if entry is None or topic_id is None or entry.topic_id != topic_id:
            return {}
        return {share: gaps for (k, share), gaps in entry.shares.items() if k == mark_k}

    def version(self, topic: str, partition: int) -> int:
        entry = self._known.get((topic, partition))
        return entry.version if entry is not None else 0


@dataclass(frozen=True, slots=True)
class Identity:
    """A group member as an OffsetCommit names it (the broker checks it)."""

    generation: int
    member: str
    instance: str | None = None


@dataclass(slots=True)
class _Watched:
    marks: set[int]  # the K its virtual commits named
    committed_at: float  # a member's last commit of it through this instance
    seen: int  # ShareGaps.version when its watermarks were last lifted (or committed)
    retry_at: float = 0.0  # a refused lift waits until then
    pending: bool = True  # committed since its last lift: due once quiet, whatever was learnt
    scanned: object = None  # the committed state its tail was last read for
    scanned_at: float = float("-inf")


@dataclass(slots=True)
class _Group:
    identity: Identity
    partitions: dict[RealKey, _Watched] = field(default_factory=dict)
    lifting: bool = False


VersionOf = Callable[[RealKey], int]


class LiftWatch:
    """Which (group, real partition) the proxy lifts by itself, and when.

    A partition is watched once a member commits a virtual partition of it through this
    instance. It is due for a lift when its commits have been quiet for ``quiet`` seconds
    (an active member's next commit carries the lift anyway) and it was committed, or the
    proxy learnt something of it, since its last lift; one lift of a group at a time.
    Lifts go as the member whose heartbeat or commit came last (``identity``). A lift may
    read the partition's tail (what this instance's Fetches did not show it): once per
    committed state, at most every ``scan_interval`` seconds (``scan_wait``).
    Pure: the caller passes the clock and what was learnt (``ShareGaps.version``).
    Bounded: ``max_groups`` groups, the least recently committed dropped."""

    def __init__(self, quiet: float = QUIET_S, retry: float = RETRY_S, max_groups: int = MAX_GROUPS,
                 scan_interval: float = SCAN_INTERVAL_S) -> None:
        self.quiet = quiet
        self.retry = retry
        self.scan_interval = scan_interval
        self.max_groups = max_groups
        self._groups: OrderedDict[str, _Group] = OrderedDict()

    def __bool__(self) -> bool:
        return bool(self._groups)

    def watches(self, group: str) -> bool:
        return group in self._groups

    def committed(self, group: str, marks: dict[RealKey, set[int]], identity: Identity, now: float,
                  version_of: VersionOf) -> None:
        """A member committed these partitions' virtual partitions (``marks``: real
        partition -> the K named), lifted with what was known then (``version_of``)."""
        entry = self._groups.pop(group, None)
        if entry is None:
            entry = _Group(identity)
        entry.identity = identity
        self._groups[group] = entry  # the most recently committed last
        for key, ks in marks.items():
            watched = entry.partitions.get(key)
            if watched is None:
                watched = entry.partitions[key] = _Watched(set(), now, 0)
            watched.marks |= ks
            watched.committed_at = now
            watched.seen = version_of(key)
            watched.pending = True
        while len(self._groups) > self.max_groups:
            self._groups.popitem(last=False)

    def groups(self) -> list[str]:
        return list(self._groups)

    def forget_idle(self, now: float, version_of: VersionOf, idle: float = IDLE_S) -> int:
        """Stop watching partitions with nothing pending whose last commit through this
        instance is ``idle`` seconds old and of which nothing was learnt since their last
        lift (a group gone quiet for good, or whose commits now reach another instance),
        and groups left with none, so that what the proxy looks at stays what is alive.
        How many partitions were dropped."""
        dropped = 0
        for group, entry in list(self._groups.items()):
            if entry.lifting:
                continue
            for key, watched in list(entry.partitions.items()):
                if (not watched.pending and now - watched.committed_at >= idle
                        and version_of(key) == watched.seen):
                    del entry.partitions[key]
                    dropped += 1
            if not entry.partitions:
                del self._groups[group]
        return dropped

    def heard(self, group: str, identity: Identity) -> None:
        """A member of ``group`` heartbeat: lifts go as it (it is in the current generation)."""
        entry = self._groups.get(group)
        if entry is not None:
            entry.identity = identity

    def due(self, group: str, now: float, version_of: VersionOf) -> tuple[Identity, dict[RealKey, set[int]]] | None:
        """The partitions of ``group`` to lift now (real partition -> its K) and as whom,
        marked as being lifted: ``done`` must follow. None while a lift of the group
        runs, or when nothing is due."""
        entry = self._groups.get(group)
        if entry is None or entry.lifting:
            return None
        out = {}
        for key, watched in entry.partitions.items():
            if now - watched.committed_at < self.quiet or now < watched.retry_at:
                continue
            version = version_of(key)
            if version != watched.seen or watched.pending:
                watched.seen = version
                watched.pending = False
                out[key] = set(watched.marks)
        if not out:
            return None
        entry.lifting = True
        return entry.identity, out

    def done(self, group: str, refused: Iterable[RealKey], now: float) -> None:
        """The lift of ``group`` ended; ``refused`` partitions (the coordinator's error, or
        none answered) are tried again after ``retry`` seconds, if still quiet."""
        entry = self._groups.get(group)
        if entry is None:
            return
        entry.lifting = False
        for key in refused:
            watched = entry.partitions.get(key)
            if watched is not None:
                watched.pending = True
                watched.retry_at = now + self.retry

    def scan_wait(self, group: str, key: RealKey, state: object, now: float) -> float | None:
        """Whether the tail of ``key`` is to be read for ``group``, whose committed state
        is ``state``: None when it was read for that state already, else how long to
        wait first (0: now; at most one read per ``scan_interval``)."""
        entry = self._groups.get(group)
        watched = entry.partitions.get(key) if entry is not None else None
        if watched is None or watched.scanned == state:
            return None
        return max(0.0, watched.scanned_at + self.scan_interval - now)

    def scanned(self, group: str, key: RealKey, state: object, now: float) -> None:
        entry = self._groups.get(group)
        watched = entry.partitions.get(key) if entry is not None else None
        if watched is not None:
            watched.scanned, watched.scanned_at = state, now

    def later(self, group: str, key: RealKey, at: float) -> None:
        """``key`` of ``group`` is due again at ``at`` (a read of its tail waits until then)."""
        entry = self._groups.get(group)
        watched = entry.partitions.get(key) if entry is not None else None
        if watched is not None:
            watched.pending = True
            watched.retry_at = max(watched.retry_at, at)


def txn_watch_marks(committed: dict[RealKey, dict[int, dict[int, int]]]) -> dict[RealKey, set[int]]:
    """The partitions (real partition -> its K) a transactional commit's accepted edits
    (real partition -> K -> share -> W) have the proxy watch: every K named, whether or not
    a share of it moved."""
    return {key: set(by_k) for key, by_k in committed.items()}


# -- the lifts a commit or an answer makes -------------------------------------------------------

GapsOf = Callable[[RealKey, int], "dict[int, Gaps]"]  # (real partition, K) -> share -> its stretches


def commit_gaps(keys: Iterable[tuple[RealKey, int]], gaps_of: GapsOf) -> dict[RealKey, dict[int, dict[int, Gaps]]]:
    """What a commit of these (real partition, K) lifts over: every share's stretches,
    not only the committed share's (the others' watermarks move in the same record)."""
    out: dict[RealKey, dict[int, dict[int, Gaps]]] = {}
    for key, mark_k in keys:
        found = gaps_of(key, mark_k)
        if found:
            out.setdefault(key, {})[mark_k] = found
    return out


def lift_edits(edits: dict[RealKey, dict[int, dict[int, int]]], gaps_of: GapsOf) -> dict[RealKey, dict[int, dict[int, int]]]:
    """Committed offsets (real partition -> K -> share -> W) each lifted over its share's
    stretches: a transactional commit's, whose watermark goes into a shadow group as it
    stands (``proxy.virtual.txn``) rather than through ``lift_marks``."""
    out: dict[RealKey, dict[int, dict[int, int]]] = {}
    for key, by_k in edits.items():
        for mark_k, marks in by_k.items():
            found = gaps_of(key, mark_k)
            out.setdefault(key, {})[mark_k] = {share: lift(offset, found.get(share, ())) for share, offset in marks.items()}
    return out


def lift_answer(stable: int, per_k: dict[int, list[int]], gaps_of: Callable[[int], dict[int, Gaps]]
                ) -> tuple[int, dict[int, list[int]]]:
    """An OffsetFetch answer's S and watermarks per K (-1: none, the share reads S) with
    each share lifted as a commit would lift it (``lift_marks``); S as it is (the
    coordinator's, until the proxy's own lift moves it)."""
    out: dict[int, list[int]] = {}
    for mark_k, offsets in per_k.items():
        found = gaps_of(mark_k)
        if not found:
            out[mark_k] = offsets
            continue
        marks = tuple((mark_k, share, offset, 0) for share, offset in enumerate(offsets) if offset >= 0)
        lifted = list(offsets)
        for _k, share, offset, _sequence in lift_marks(marks, stable, mark_k, found):
            if 0 <= share < len(lifted):
                lifted[share] = offset
        out[mark_k] = lifted
    return stable, out


def lifts_anything(marks: Marks, stable: int, gaps: dict[int, dict[int, Gaps]]) -> bool:
    """Whether ``gaps`` (K -> share -> stretches) would move a watermark of ``marks`` (or
    S of a share without one): the proxy lifts by itself only then."""
    return any(lift_marks(marks, stable, mark_k, found) != marks for mark_k, found in gaps.items())
