"""What the consumer holds per assigned partition, sans I/O: its key ranges, its position,
its buffered records, the end offsets of the latest fetch response, and (with individual
commit) its processed offsets.

A partition fetched cooperatively (docs/wire-contract.md#37-cooperative-fetch) is held whole
and its "position" is the member's *token*: ``ChunkEnd + 1`` of the last chunk the proxy
handed it (at first the partition's starting position). The proxy decides which offsets the
member gets and reads the token only to recognise a retried fetch, so it may go down (a
re-delivered chunk below earlier ones) and handing out records never moves it; see
``fetch_protocol.apply_cooperative``.

Fetching, committing and offset resets all read and write this one state; a future group
membership changes the assignment through ``assign`` like the application does. Nothing
here touches the network, so every rule (a reset drops the buffer, a new range starts
over, lag comes from the cache) is testable with plain values.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from proxy.client.errors import NoOffsetForPartitionError
from proxy.client.progress import PartitionProgress
from proxy.client.records import ConsumerRecords, FairBuffers, FetchMetadata, TopicPartition, lag
from proxy.ranges import KeyRange, contains, normalize, validate_ranges
from proxy.records.keyhash import key_hash

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1


@dataclass(frozen=True)
class PendingReset:
    """A position to be looked up with ListOffsets at ``timestamp`` (``EARLIEST_TIMESTAMP``,
    ``LATEST_TIMESTAMP``) by the next poll."""

    timestamp: int


# A partition's position: the next offset to fetch, a reset to resolve, or None while the
# group's committed offset (then ``auto_offset_reset``) has not been asked yet.
Position = int | PendingReset | None

AssignmentInput = Mapping[TopicPartition, Sequence[KeyRange]] | Sequence[TopicPartition]


@dataclass(frozen=True)
class EndOffsets:
    """A partition's end offsets as the latest fetch response gave them (KIP-695)."""

    received_time: float  # time.time() when the response arrived
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int

    def end(self, read_committed: bool) -> int:
        """The end a consumer can reach: the last stable offset under read_committed."""
        if read_committed and self.last_stable_offset >= 0:
            return self.last_stable_offset
        return self.high_watermark


def check_assignment(assignment: AssignmentInput) -> dict[TopicPartition, list[KeyRange]]:
    """A mapping of partitions to key ranges (a plain sequence: whole partitions), checked:
    ``ValueError`` names the first bad partition or range."""
    if not isinstance(assignment, Mapping):
        assignment = {tp: [] for tp in assignment}
    out: dict[TopicPartition, list[KeyRange]] = {}
    for tp, ranges in assignment.items():
        if not (isinstance(tp, tuple) and len(tp) == 2 and isinstance(tp[0], str) and isinstance(tp[1], int)
                and tp[0] and tp[1] >= 0):
            raise ValueError(f"not a TopicPartition(topic, partition): {tp!r}")
        tp = TopicPartition(*tp)
        checked = list(ranges or [])
        for r in checked:
            if not isinstance(r, KeyRange):
                raise ValueError(f"{tp.topic}-{tp.partition}: ranges must be KeyRange values, got {r!r}")
        reason = validate_ranges(checked)
        if reason:
            raise ValueError(f"{tp.topic}-{tp.partition}: {reason}")
        out[tp] = checked
    return out


def narrows(old: Sequence[KeyRange], new: Sequence[KeyRange]) -> bool:
    """Whether ``new`` holds no key hash ``old`` does not (both non-empty or [] = whole): the
    records fetched for ``old`` hold every record of ``new`` over the same offsets."""
    if not old:
        return True
    if not new:
        return False
    held = normalize(old)
    return all(any(h.start <= r.start and r.end <= h.end for h in held) for r in new)


def reset_timestamp(policy: str, tp: TopicPartition) -> int:
    """The ListOffsets timestamp ``auto_offset_reset`` asks for; raises under "none"."""
    if policy == "none":
        raise NoOffsetForPartitionError(
            f"{tp.topic}-{tp.partition} has no position and auto_offset_reset is 'none': seek() first")
    return EARLIEST_TIMESTAMP if policy == "earliest" else LATEST_TIMESTAMP


class AssignmentState:
    """Per assigned partition: ranges, position, buffer, end offsets, progress."""

    def __init__(self, *, read_committed: bool, tracking: bool) -> None:
        self.read_committed = read_committed
        self.tracking = tracking  # individual commit: keep each partition's progress
        self.ranges: dict[TopicPartition, list[KeyRange]] = {}
        self.positions: dict[TopicPartition, Position] = {}
        self.ends: dict[TopicPartition, EndOffsets] = {}
        self.buffers = FairBuffers()
        self.progress: dict[TopicPartition, PartitionProgress] = {}
        # A key-range member's reset point per partition, where it read from the group's S
        # first (see ``reset_to``): its own records below it are marked, not handed out.
        self.reset_points: dict[TopicPartition, int] = {}
        # assigned but neither fetched nor handed out: a group member's partition whose
        # revocation (or growth) waits for the application's records in flight
        self.paused: set[TopicPartition] = set()
        # fetched cooperatively (whole, by chunks the proxy hands out); their positions are tokens
        self.cooperative: set[TopicPartition] = set()
        # per cooperative partition: the highest ChunkEnd + 1 received (for current_lag)
        self.chunks_reached: dict[TopicPartition, int] = {}

    # -- the assignment ----------------------------------------------------------------
    def assign(self, new: Mapping[TopicPartition, list[KeyRange]], cooperative: Iterable[TopicPartition] = ()
               ) -> None:
        """Replace the assignment; the partitions of ``cooperative`` (assigned whole) are
        fetched cooperatively. A partition whose ranges narrow keeps its buffered records
        of the ranges it keeps (a group member giving up part of its range goes on handing
        out the rest without a refetch); one whose ranges grow or move starts over from a
        fresh buffer; a partition removed gives up its position, end offsets and the marks
        not committed yet. A partition that turns cooperative or stops being so starts
        again from the group's committed offset (a token is no position, nor a position a
        token), with a fresh buffer: its buffered records were fetched for the other mode,
        and the proxy hands them to others. Its marks stay (they are this member's)."""
        shared = {tp for tp in cooperative if tp in new}
        ranged = sorted(f"{tp.topic}-{tp.partition}" for tp in shared if new[tp])
        if ranged:
            raise ValueError(f"{', '.join(ranged)}: a partition fetched cooperatively is shared whole "
                             f"(by offset chunks), so it cannot carry key ranges")
        for tp in list(self.positions):
            if tp in new and (tp in shared) != (tp in self.cooperative):
                self.buffers.clear(tp)
                self.positions[tp] = None
                self.reset_points.pop(tp, None)
                self.chunks_reached.pop(tp, None)
            elif tp in new and new[tp] != self.ranges.get(tp) and narrows(self.ranges.get(tp, []), new[tp]):
                self._keep_buffered(tp, new[tp])
            elif tp not in new or new[tp] != self.ranges.get(tp):
                self.buffers.clear(tp)
            if tp not in new:
                del self.positions[tp]
                self.ends.pop(tp, None)
                self.progress.pop(tp, None)
                self.reset_points.pop(tp, None)
                self.chunks_reached.pop(tp, None)
        for tp in new:
            self.positions.setdefault(tp, None)
        self.ranges = {tp: list(ranges) for tp, ranges in new.items()}
        self.cooperative = shared
        self.paused &= set(new)
        self.buffers.set_partitions([tp for tp in new if tp not in self.paused])

    def _keep_buffered(self, tp: TopicPartition, ranges: Sequence[KeyRange]) -> None:
        """Drop the buffered records of ``tp`` whose key hash falls outside ``ranges``; an
        emptied buffer moves the position to where its fetch ended."""
        buffer = self.buffers.buffers.get(tp)
        if buffer is None:
            return
        buffer.records = deque(r for r in buffer.records if contains(ranges, key_hash(r.key, r.offset)))
        if not buffer.records:
            self.buffers.clear(tp)
            self.positions[tp] = buffer.next_fetch_offset

    def grow(self, tp: TopicPartition, ranges: Sequence[KeyRange], stable: int | None,
             committed: Iterable[tuple[int, int]]) -> None:
        """A group member's partition takes on more key ranges, whose records start at the
        group's (``stable``, ``committed``), read after their previous owner committed them:
        the partition starts over at ``stable`` (None: the next poll asks the group again,
        then ``auto_offset_reset``). Every offset this member processed (its marks, committed
        or not) is held as done too, so none of its own records is handed out twice; the
        marks not acknowledged yet stay pending for the next commit. The caller makes sure
        no record of ``tp`` is out with the application unmarked."""
        self.ranges[tp] = list(ranges)
        self.buffers.clear(tp)
        self.positions[tp] = stable
        self.reset_points.pop(tp, None)
        if not self.tracking:
            return
        old = self.progress.get(tp)
        progress = PartitionProgress(stable, committed)
        if old is not None:
            if old.stable is not None and (progress.stable is None or old.stable > progress.stable):
                progress.stable = old.stable
            for start, end in (*old.committed, *old.pending):
                progress.committed.add(start, end)
            progress.pending = old.pending
            if progress.stable is not None:
                progress.committed.discard_below(progress.stable)
                progress.pending.discard_below(progress.stable)
        self.progress[tp] = progress
        self.positions[tp] = progress.stable

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        """Stop fetching and handing out ``partitions`` (and only them); buffers go."""
        self.paused = set(partitions) & set(self.ranges)
        for tp in self.paused:
            self.buffers.clear(tp)
        self.buffers.set_partitions([tp for tp in self.ranges if tp not in self.paused])

    def __contains__(self, tp: object) -> bool:
        return tp in self.ranges

    def partitions(self) -> list[TopicPartition]:
        return list(self.ranges)

    # -- positions ---------------------------------------------------------------------
    def position(self, tp: TopicPartition) -> int | None:
        """The next offset that can be handed out: past a reset point still being read up to
        (``reset_to``), that point. For a cooperative partition, the token."""
        position = self.positions.get(tp)
        if not isinstance(position, int):
            return None
        return max(position, self.reset_points.get(tp, position))

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.positions[tp] = offset
        self.reset_points.pop(tp, None)
        self.buffers.clear(tp)

    def reset_later(self, tp: TopicPartition, timestamp: int) -> None:
        """Resolve the position with ListOffsets on the next poll; buffered records go."""
        self.positions[tp] = PendingReset(timestamp)
        self.reset_points.pop(tp, None)
        self.buffers.clear(tp)

    def needs_log_start(self, tp: TopicPartition) -> bool:
        """Whether resolving a reset of ``tp`` needs the log start offset too (``reset_to``)."""
        return self.tracking and bool(self.ranges.get(tp))

    def reset_to(self, tp: TopicPartition, offset: int, log_start: int | None = None) -> None:
        """A reset resolved to ``offset``. With individual commit the offsets between the
        group's S and the new position must be committed as skipped, as a standard consumer
        does when it commits its position after a reset, or S could never pass them. With
        nothing committed S counts as 0 (the proxy's starting S too).

        A member holding the whole partition amends [S, offset) as a gap. A member holding
        key ranges must not: the gap would claim the other members' records in it, and two
        members resetting to the log end a moment apart (A at 100, B at 110) would have B
        commit A's records 100-109 that nobody processed. Such a member amends only what
        lies below the log start (deleted: nobody can process it), reads from S on, and
        marks its own records below ``offset`` processed without handing them out (the
        reset point in ``reset_points``), so each member commits exactly its own skipped
        records and S passes the span once every member has. ``log_start``: the
        partition's log start offset (None: unknown, nothing is amended).

        A cooperative partition amends nothing: the proxy hands each offset to one member,
        and the chunk that starts its marker at a reset claims the skipped offsets
        (docs/wire-contract.md#37-cooperative-fetch); a member's own gap would claim what
        the proxy handed to others."""
        self.reset_points.pop(tp, None)
        self.positions[tp] = offset
        if not self.tracking or tp in self.cooperative:
            return
        progress = self.progress.get(tp)
        if progress is None:
            progress = self.progress[tp] = PartitionProgress(None)
        if progress.stable is None:
            progress.stable = 0
        stable = progress.stable
        gap_end = offset if not self.ranges.get(tp) else min(offset, stable if log_start is None else log_start)
        if gap_end > stable:
            progress.mark(stable, gap_end - 1)
        begin = max(stable, gap_end)
        if offset > begin:
            self.positions[tp] = begin
            self.reset_points[tp] = offset

    def take_reset_skips(self, tp: TopicPartition, records: list, next_offset: int) -> list:
        """Of a fetch's ``records`` of ``tp`` (already in this member's ranges), those to
        hand out: the ones below the partition's reset point are marked processed instead.
        The reset point goes once the fetch reaches it."""
        point = self.reset_points.get(tp)
        if point is None:
            return records
        progress = self.progress.get(tp)
        kept = []
        for record in records:
            if record.offset < point:
                if progress is not None:
                    progress.mark(record.offset)
            else:
                kept.append(record)
        if next_offset >= point:
            del self.reset_points[tp]
        return kept

    def last_handed(self, tp: TopicPartition) -> int:
        """The highest offset of ``tp`` that may have been handed out so far (-1: none): below
        the position, or for a cooperative partition within the highest chunk received
        (its token may lie below records handed out earlier)."""
        if tp in self.cooperative:
            return self.chunks_reached.get(tp, 0) - 1
        position = self.position(tp)
        return position - 1 if position is not None else -1

    def pending_resets(self) -> list[TopicPartition]:
        """Partitions without a position to fetch from."""
        return [tp for tp in self.ranges if not isinstance(self.positions.get(tp), int)]

    def wants_group_offsets(self) -> list[TopicPartition]:
        """Partitions whose start needs the group's committed state: no position yet, or
        (with individual commit) no progress yet."""
        return [tp for tp in self.ranges
                if self.positions.get(tp) is None or (self.tracking and tp not in self.progress)]

    # -- fetching and draining ---------------------------------------------------------
    def fetchable(self, has_leader: Callable[[TopicPartition], bool]) -> list[TopicPartition]:
        """Partitions to fetch now: with a position, nothing buffered, and a leader."""
        return [tp for tp in self.ranges
                if isinstance(self.positions.get(tp), int) and not self.buffers.has_buffered(tp) and has_leader(tp)
                and tp not in self.paused]

    def any_buffered(self) -> bool:
        return any(self.buffers.has_buffered(tp) for tp in self.ranges)

    def lag(self, tp: TopicPartition) -> int | None:
        """From the cached end offsets, never the network (KIP-695). For a cooperative
        partition the token says nothing of the group's progress (it is only where this
        member's last chunk ended, and may go down): the lag is the end minus the highest
        ChunkEnd + 1 received, None before the first chunk. That is how far the partition
        is ahead of what was handed out to this member, an upper bound of how far the proxy's
        marker is behind the end (other members' chunks may have moved it further)."""
        ends = self.ends.get(tp)
        end = ends.end(self.read_committed) if ends else None
        if tp in self.cooperative:
            return lag(end, self.chunks_reached.get(tp))
        return lag(end, self.position(tp))

    def drain(self, max_records: int, received: Iterable[TopicPartition]) -> ConsumerRecords:
        """Up to ``max_records`` buffered records in fair rotation, positions moved past
        them, with fetch metadata for each partition that returned records or got a fetch
        response (``received``)."""
        records, positions = self.buffers.drain(max_records)
        # a cooperative partition's token was set when its chunk came: handing out moves it not
        self.positions.update((tp, p) for tp, p in positions.items() if tp not in self.cooperative)
        metadata: dict[TopicPartition, FetchMetadata] = {}
        for tp in itertools.chain(records, received):
            ends = self.ends.get(tp)
            position = self.position(tp)
            if ends is None or position is None or tp in metadata:
                continue
            end = ends.end(self.read_committed)
            metadata[tp] = FetchMetadata(ends.received_time, position, self.lag(tp) or 0, ends.log_start_offset, end)
        return ConsumerRecords(records, metadata)
