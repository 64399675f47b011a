"""What one chaos cell's history says, as plain counts: a pure function, no I/O.

Input: every acknowledged record with the time its acknowledgement arrived, every record
handed out (H) and finished (F) by every member with times on the system's one monotonic
clock, the members killed and the members that found themselves lost, and the heal time
of each fault. Output, per cell:

- lost: acknowledged and never handed out (the goal is 0 in every cell);
- re-delivered, by cause: the record's earlier holder was killed (``member_killed``), or
  lost its partitions to a session timeout or a fencing (``member_lost``), or neither
  (``other``: a commit the fault swallowed, a rebalance racing a commit);
- order violations: a record of a key handed out before an earlier record of the key
  finished its first processing (a member handed both in one batch keeps their order by
  finishing the earlier first). Those where either record was re-delivered, or was held
  by a member later killed or lost, are re-delivery's doing and counted apart
  (``order_after_redelivery``); the rest (``order_violations``) break the promise;
- strays: handed out, never acknowledged (corruption, or another run's records);
- committed behind: partitions whose committed offset is not at the log end at the end;
- recovery: for each fault, seconds from its heal until every record acknowledged before
  the heal had been handed out (how long consumers lagged behind the fault's end).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

Record = tuple[int, int]  # (partition, offset) of one topic


@dataclass(frozen=True, slots=True)
class Acked:
    partition: int
    offset: int
    key: bytes | None
    time: float


@dataclass(frozen=True, slots=True)
class Handed:
    """One hand-out of a record to ``member`` (``finished``: when its processing ended;
    a consumer that does not report it gives the hand-out time)."""

    member: str
    partition: int
    offset: int
    key: bytes | None
    time: float
    finished: float | None = None


@dataclass
class CellVerdict:
    acknowledged: int = 0
    delivered: int = 0
    lost: list[Record] = field(default_factory=list)
    redelivered: Counter[str] = field(default_factory=Counter)  # cause -> extra hand-outs
    order_violations: list[str] = field(default_factory=list)
    order_after_redelivery: int = 0
    strays: list[Record] = field(default_factory=list)
    committed_behind: dict[int, tuple[int, int]] = field(default_factory=dict)
    recovery: list[float] = field(default_factory=list)  # seconds, one per healed fault

    @property
    def ok(self) -> bool:
        return not (self.lost or self.order_violations or self.strays or self.committed_behind)

    def as_dict(self) -> dict:
        return {
            "acknowledged": self.acknowledged, "delivered": self.delivered, "lost": len(self.lost),
            "lost_examples": [list(r) for r in self.lost[:10]],
            "redelivered": dict(self.redelivered), "redelivered_total": sum(self.redelivered.values()),
            "order_violations": len(self.order_violations), "order_examples": self.order_violations[:5],
            "order_after_redelivery": self.order_after_redelivery, "strays": len(self.strays),
            "committed_behind": {str(p): list(v) for p, v in self.committed_behind.items()},
            "recovery_s": [round(r, 2) for r in self.recovery],
            "recovery_max_s": round(max(self.recovery), 2) if self.recovery else None,
            "ok": self.ok,
        }


def pair_events(kinds: Iterable[tuple[str, str, int, int, bytes | None, float]]) -> list[Handed]:
    """H and F events (kind, member, partition, offset, key, time), in any order, as
    hand-outs: each F closes the earliest open H of the same member and record."""
    handed: list[Handed] = []
    finishes: dict[tuple[str, int, int], list[float]] = defaultdict(list)
    for kind, member, partition, offset, key, time in kinds:
        if kind == "H":
            handed.append(Handed(member, partition, offset, key, time))
        elif kind == "F":
            finishes[member, partition, offset].append(time)
    out: list[Handed] = []
    for h in sorted(handed, key=lambda h: h.time):
        times = finishes.get((h.member, h.partition, h.offset))
        done = None
        if times:
            times.sort()
            later = [t for t in times if t >= h.time]
            if later:
                done = later[0]
                times.remove(done)
        out.append(Handed(h.member, h.partition, h.offset, h.key, h.time, done))
    return out


def judge(acked: Sequence[Acked], handed: Sequence[Handed], *, killed: Mapping[str, float] | None = None,
          lost_members: Mapping[str, float] | None = None, keyed_order: bool = True,
          committed: Mapping[int, int] | None = None, log_end: Mapping[int, int] | None = None,
          heals: Sequence[float] = ()) -> CellVerdict:
    """The verdict of one cell; ``killed`` and ``lost_members``: member -> when."""
    killed = killed or {}
    lost_members = lost_members or {}
    tainted = set(killed) | set(lost_members)
    by_record: dict[Record, list[Handed]] = defaultdict(list)
    for h in sorted(handed, key=lambda h: h.time):
        by_record[h.partition, h.offset].append(h)
    acks = {(a.partition, a.offset): a for a in acked}
    verdict = CellVerdict(acknowledged=len(acks), delivered=len(by_record))
    verdict.lost = sorted(r for r in acks if r not in by_record)
    verdict.strays = sorted(r for r in by_record if r not in acks)
    redelivered: set[Record] = set()
    for record, outs in by_record.items():
        for earlier, _later in itertools.pairwise(outs):
            redelivered.add(record)
            if earlier.member in killed:
                cause = "member_killed"
            elif earlier.member in lost_members:
                cause = "member_lost"
            else:
                cause = "other"
            verdict.redelivered[cause] += 1
    if keyed_order:
        firsts = [outs[0] for outs in by_record.values()]
        done = {record: min((h.finished for h in outs if h.finished is not None), default=math.inf)
                for record, outs in by_record.items()}
        for key, earlier, later in _order_pairs(firsts, done):
            if ({(earlier.partition, earlier.offset), (later.partition, later.offset)} & redelivered
                    or {earlier.member, later.member} & tainted):
                verdict.order_after_redelivery += 1
            else:
                verdict.order_violations.append(
                    f"p{later.partition} key {key!r}: offset {later.offset} handed to {later.member} at "
                    f"{later.time:.3f} before offset {earlier.offset} at {earlier.member} finished "
                    f"({earlier.finished})")
    if log_end is not None:
        given = committed or {}
        for partition, end in log_end.items():
            at = given.get(partition, -1)
            if at < end:
                verdict.committed_behind[partition] = (at, end)
    verdict.recovery = recovery_times(acked, by_record, heals)
    return verdict


def _order_pairs(firsts: Iterable[Handed], done: Mapping[Record, float]) -> Iterable[tuple[bytes, Handed, Handed]]:
    """Consecutive records of a key where the later was first handed out before the earlier
    was first finished by anyone (``done``; never finished: infinity)."""
    by_key: dict[tuple[int, bytes], list[Handed]] = defaultdict(list)
    for h in firsts:
        if h.key is not None:
            by_key[h.partition, h.key].append(h)
    for (_, key), outs in by_key.items():
        outs.sort(key=lambda h: h.offset)
        for earlier, later in itertools.pairwise(outs):
            if later.time >= done[earlier.partition, earlier.offset] or _in_order_by_one_member(earlier, later):
                continue
            yield key, earlier, later


def _in_order_by_one_member(earlier: Handed, later: Handed) -> bool:
    """A member handed a batch processes it in order: two records of a key in one hand-out
    (or the later one in a later hand-out to the same member) are in order if the member
    finished the earlier first."""
    return (earlier.member == later.member and earlier.time <= later.time and earlier.finished is not None
            and (later.finished is None or earlier.finished <= later.finished))


def recovery_times(acked: Sequence[Acked], by_record: Mapping[Record, list[Handed]],
                   heals: Sequence[float]) -> list[float]:
    """Per heal time h: seconds from h until every record acknowledged by h had been handed
    out (0 when all were out by h; records never handed out are the verdict's ``lost``)."""
    out = []
    for heal in heals:
        latest = heal
        for a in acked:
            if a.time <= heal:
                outs = by_record.get((a.partition, a.offset))
                if outs:
                    latest = max(latest, outs[0].time)
        out.append(latest - heal)
    return out


def merge_windows(windows: Iterable[tuple[float, float]], join: float = 1.0) -> list[tuple[float, float]]:
    """Fault windows (began, healed), those less than ``join`` seconds apart made one (the
    proxies of a rolling restart, restarted one after another, are one window)."""
    out: list[tuple[float, float]] = []
    for began, healed in sorted(windows):
        if out and began - out[-1][1] < join:
            out[-1] = (out[-1][0], max(out[-1][1], healed))
        else:
            out.append((began, healed))
    return out


def longest_gap(times: Iterable[float], windows: Sequence[tuple[float, float]]) -> float:
    """The longest stretch inside any window with none of ``times`` in it (the window's
    edges count as its ends: a gap is clipped to the window)."""
    ordered = sorted(times)
    longest = 0.0
    for began, healed in windows:
        points = [began, *(t for t in ordered if began < t < healed), healed]
        longest = max(longest, max(b - a for a, b in itertools.pairwise(points)))
    return longest


def pauses(handed: Sequence[Handed], acked: Sequence[Acked], windows: Sequence[tuple[float, float]], *,
           exclude: Iterable[str] = ()) -> dict | None:
    """What each consumer saw of the faults: per member, the longest gap between two of its
    hand-outs inside a fault window (``merge_windows``), for the members that had handed
    out a record before the first window began and are not in ``exclude`` (killed, or that
    lost their partitions); and the producer's longest gap between two acknowledgements in
    the same windows, the least a member would see with no fault at all. None without a
    window or such a member."""
    windows = merge_windows(windows)
    if not windows:
        return None
    excluded = set(exclude)
    by_member: dict[str, list[float]] = defaultdict(list)
    for h in handed:
        by_member[h.member].append(h.time)
    gaps = {member: round(longest_gap(times, windows), 2) for member, times in sorted(by_member.items())
            if member not in excluded and min(times) < windows[0][0]}
    if not gaps:
        return None
    return {"members": gaps, "max_s": max(gaps.values()), "median_s": round(statistics.median(gaps.values()), 2),
            "producer_gap_s": round(longest_gap((a.time for a in acked), windows), 2),
            "window_s": round(sum(b - a for a, b in windows), 2)}
