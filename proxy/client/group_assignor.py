"""The group leader's assignors, pure functions over plain values (docs/wire-contract.md section 8).

``keyrange``: per topic, lay the P partitions end to end, each one unit of hash space
(2^63 values) wide, and cut the line into M equal pieces for the topic's M members.

* M <= P: whole partitions only; counts differ by at most one.
* M > P: every member gets P/M units (loads within ``SLIVER`` hash values of each other:
  a piece of a partition thinner than that, which rounding can leave a member beside its
  real stretch, goes to the neighbour it touches instead, since a partition held for a
  millionth of its keys costs the member a fetch and a commit like any other). A fresh
  cut gives each member one stretch of the line, so at most two pieces (it crosses at most
  one partition boundary).
* A member that does not allow individual commit only ever gets whole partitions: with
  M > P each such member takes one whole partition (keeping at least one partition for the
  members that share by range), and the rest of the line is cut among the others.
* Sticky: every member first keeps what it owns, up to its quota, and only the shortfall
  moves. The members that own the most get the quotas one hash value larger, so the moved
  hash space is the least any balanced cut needs. Neighbours that both give hash space up
  trim towards each other, so what they free is one stretch: a member joining four that
  split a partition gets two pieces and the four only shrink. When keeping would leave some member in
  more than two pieces of a topic, the line is cut afresh instead, in the order in which the
  members already sit on it (new members slotted where they disturb least), so pieces
  never pile up over generations.

* Cooperative sharing (``cooperative_topics``): when every subscriber of a topic shares
  partitions cooperatively (``partition_sharing="cooperative"``, which needs individual
  commit) and they outnumber its partitions, each member gets one whole partition, each
  partition floor(M/P) or ceil(M/P) members, fetched by offset chunks the proxy hands out
  (docs/wire-contract.md#37-cooperative-fetch). Members keep the partition they hold where it
  has room; with nothing held, member i (by id) gets partition i mod P. With M <= P, or a
  single member sharing by key range, the topic is assigned as above.

``cooperative-sticky``: whole partitions only, with the same stickiness: what a group
with standard Java or librdkafka members can agree on.

``withhold_moving`` is the first of the two rebalances of a cooperative hand-off (as in
KIP-429): hash space some other member still owns is left out of a member's assignment, so
the owner revokes it first and the follow-up rebalance hands it over. A partition shared
cooperatively is never withheld: its members keep no per-key order, so one more member
on it (or one that moves to it) needs nobody to revoke anything first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from proxy.client.records import TopicPartition
from proxy.ranges import HASH_SPACE, KeyRange, normalize

UNIT = HASH_SPACE  # hash values per partition
MAX_PIECES = 2
SLIVER = UNIT >> 20  # a piece thinner than this (a millionth of a partition) is not kept apart

Interval = tuple[int, int]  # [start, end) on a topic's line, or within one partition's [0, UNIT)
Assignment = dict[TopicPartition, list[KeyRange]]  # [] = the whole partition


@dataclass(frozen=True)
class MemberInfo:
    """What the leader knows of one member from its subscription."""

    member_id: str
    topics: frozenset[str]
    owned: Mapping[TopicPartition, Sequence[KeyRange]] = field(default_factory=dict)
    allows_ranges: bool = True  # allow.individual.commit: may share a partition by range
    generation: int = -1  # the generation its owned ranges are from; newer claims win
    cooperative: bool = False  # partition_sharing="cooperative": shares by offset chunks, no key order


# -- interval arithmetic -----------------------------------------------------------------
def merge(intervals: Iterable[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for a, b in sorted(i for i in intervals if i[0] < i[1]):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def subtract(intervals: Sequence[Interval], minus: Sequence[Interval]) -> list[Interval]:
    """``intervals`` without ``minus``; both merged (sorted, disjoint)."""
    out: list[Interval] = []
    j = 0
    for a, b in intervals:
        while j < len(minus) and minus[j][1] <= a:
            j += 1
        k = j
        start = a
        while k < len(minus) and minus[k][0] < b:
            if minus[k][0] > start:
                out.append((start, minus[k][0]))
            start = max(start, minus[k][1])
            k += 1
        if start < b:
            out.append((start, b))
    return out


def intersect(x: Sequence[Interval], y: Sequence[Interval]) -> list[Interval]:
    out: list[Interval] = []
    i = j = 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def length(intervals: Iterable[Interval]) -> int:
    return sum(b - a for a, b in intervals)


def to_intervals(ranges: Sequence[KeyRange]) -> list[Interval]:
    """A partition's key ranges as half-open intervals of [0, UNIT); [] is the whole."""
    if not ranges:
        return [(0, UNIT)]
    return merge((r.start, r.end + 1) for r in ranges)


def to_ranges(intervals: Sequence[Interval]) -> list[KeyRange]:
    """Intervals within one partition as key ranges; the whole partition as []."""
    merged = merge(intervals)
    if merged == [(0, UNIT)]:
        return []
    return [KeyRange(a, b - 1) for a, b in merged]


def pieces(assignment: Mapping[TopicPartition, Sequence[KeyRange]], topic: str | None = None) -> int:
    """How many separate stretches an assignment holds (a whole partition is one)."""
    return sum(max(1, len(normalize(r))) for tp, r in assignment.items() if topic is None or tp.topic == topic)


def hash_space(assignment: Mapping[TopicPartition, Sequence[KeyRange]]) -> int:
    return sum(length(to_intervals(r)) for r in assignment.values())


def moved(before: Mapping[TopicPartition, Sequence[KeyRange]], after: Mapping[TopicPartition, Sequence[KeyRange]]
          ) -> int:
    """Hash space ``after`` holds that ``before`` did not."""
    total = 0
    for tp, ranges in after.items():
        new = to_intervals(ranges)
        old = to_intervals(before[tp]) if tp in before else []
        total += length(subtract(new, old))
    return total


# -- the line of one topic ---------------------------------------------------------------
class _Line:
    """One topic's partitions laid end to end, ``UNIT`` each."""

    def __init__(self, topic: str, partitions: Sequence[int]) -> None:
        self.topic = topic
        self.partitions = list(partitions)
        self.index = {p: k for k, p in enumerate(self.partitions)}

    @property
    def total(self) -> int:
        return len(self.partitions) * UNIT

    def unit(self, partition: int) -> Interval:
        k = self.index[partition]
        return (k * UNIT, (k + 1) * UNIT)

    def from_owned(self, owned: Mapping[TopicPartition, Sequence[KeyRange]]) -> list[Interval]:
        out: list[Interval] = []
        for tp, ranges in owned.items():
            if tp.topic == self.topic and tp.partition in self.index:
                base = self.index[tp.partition] * UNIT
                out.extend((base + a, base + b) for a, b in to_intervals(ranges))
        return merge(out)

    def to_assignment(self, intervals: Sequence[Interval]) -> Assignment:
        out: Assignment = {}
        for a, b in merge(intervals):
            k = a // UNIT
            while a < b:
                end = min(b, (k + 1) * UNIT)
                tp = TopicPartition(self.topic, self.partitions[k])
                out.setdefault(tp, []).append(KeyRange(a - k * UNIT, end - k * UNIT - 1))
                a, k = end, k + 1
        return {tp: [] if to_intervals(r) == [(0, UNIT)] else normalize(r) for tp, r in sorted(out.items())}


def _claims(members: Sequence[MemberInfo], line: _Line) -> dict[str, list[Interval]]:
    """Each member's owned stretch of the line; where two claim the same hash space the
    newer generation (then the smaller member id) keeps it."""
    taken: list[Interval] = []
    out: dict[str, list[Interval]] = {}
    for member in sorted(members, key=lambda m: (-m.generation, m.member_id)):
        mine = subtract(line.from_owned(member.owned), taken)
        out[member.member_id] = mine
        taken = merge([*taken, *mine])
    return out


def _quotas(ids: Sequence[str], total: int, owned: Mapping[str, int]) -> dict[str, int]:
    """Equal shares of ``total``; the remainder's extra unit goes to the biggest owners."""
    base, extra = divmod(total, len(ids))
    ranked = sorted(ids, key=lambda m: (-owned.get(m, 0), m))
    return {m: base + (1 if i < extra else 0) for i, m in enumerate(ranked)}


# -- whole partitions --------------------------------------------------------------------
def _assign_whole(ids: Sequence[str], line: _Line, partitions: Sequence[int],
                  claims: Mapping[str, list[Interval]]) -> dict[str, list[int]]:
    """``partitions`` as whole partitions to ``ids``, counts within one, sticky."""
    out: dict[str, list[int]] = {m: [] for m in ids}
    if not ids:
        return out
    share = {(m, p): length(intersect(claims.get(m, []), [line.unit(p)])) for m in ids for p in partitions}
    owned_count = {m: sum(share[m, p] for p in partitions) for m in ids}
    quota = _quotas(ids, len(partitions), owned_count)
    left = []
    # a partition goes to whoever owns most of it, while that member has room
    for p in sorted(partitions, key=lambda p: (-max(share[m, p] for m in ids), p)):
        owners = sorted((m for m in ids if share[m, p] > 0 and len(out[m]) < quota[m]),
                        key=lambda m: (-share[m, p], m))
        if owners:
            out[owners[0]].append(p)
        else:
            left.append(p)
    for p in sorted(left):
        m = min((m for m in ids if len(out[m]) < quota[m]), key=lambda m: (len(out[m]), m))
        out[m].append(p)
    return out


# -- key ranges --------------------------------------------------------------------------
def _sticky_cut(ids: Sequence[str], space: Sequence[Interval], claims: Mapping[str, list[Interval]]
                ) -> dict[str, list[Interval]]:
    """Each member keeps its claim up to its quota (trimming from the end, or from the start
    where that joins what it frees to its neighbour's, see ``_trim_sides``); the shortfall
    is filled from what nobody keeps, nearest to what the member keeps first."""
    own = {m: intersect(claims.get(m, []), space) for m in ids}
    quota = _quotas(ids, length(space), {m: length(own[m]) for m in ids})
    keep_end = _trim_sides(ids, own, quota)
    # A member over its quota by no more than a sliver keeps it all (it took a sliver its
    # neighbour could not, see _without_slivers): the next rebalance moves nothing.
    kept = {m: _keep(own[m], quota[m] + (SLIVER if length(own[m]) - quota[m] <= SLIVER else 0),
                     from_end=m in keep_end) for m in ids}
    # free stretches never cross a partition boundary: a piece is within one partition
    free = [piece for a, b in subtract(list(space), merge(i for m in ids for i in kept[m]))
            for piece in _split_at_units(a, b)]
    out = {m: list(kept[m]) for m in ids}
    # members with a shortfall, in the order they sit on the line (new members last)
    order = sorted(ids, key=lambda m: (kept[m][0][0] if kept[m] else 1 << 80, m))
    for m in order:
        need = quota[m] - length(kept[m])
        while need > 0 and free:
            # prefer free space touching the member's own, then a stretch that covers the
            # whole shortfall in one piece, then the first free stretch
            ends = {b for _, b in out[m]} | {a for a, _ in out[m]}
            pick = next((i for i, (a, b) in enumerate(free) if a in ends or b in ends),
                        next((i for i, (a, b) in enumerate(free) if b - a >= need), 0))
            a, b = free[pick]
            take = min(need, b - a)
            if b in ends and a not in ends:  # grow the member's stretch downwards
                got, rest = (b - take, b), (a, b - take)
            else:
                got, rest = (a, a + take), (a + take, b)
            out[m].append(got)
            free[pick:pick + 1] = [rest] if rest[0] < rest[1] else []
            need -= take
        out[m] = merge(out[m])
    return out


def _trim_sides(ids: Sequence[str], own: Mapping[str, list[Interval]], quota: Mapping[str, int]) -> set[str]:
    """The members that give up the start of what they own rather than its end.

    Two members giving up hash space that sit next to each other on the line (within one
    partition) trim towards each other, so what they free is one stretch instead of two:
    when a member joins four that split a partition, the four free two stretches (m0's end
    with m1's start, m2's end with m3's start), which the newcomer takes as its two pieces,
    and nobody's kept part moves."""
    donors = sorted((m for m in ids if own[m] and length(own[m]) > quota[m]), key=lambda m: own[m][0][0])
    keep_end: set[str] = set()
    i = 0
    while i + 1 < len(donors):
        left, right = own[donors[i]], own[donors[i + 1]]
        boundary = left[-1][1]
        if boundary == right[0][0] and boundary % UNIT:
            keep_end.add(donors[i + 1])
            i += 2
        else:
            i += 1
    return keep_end


def _keep(own: Sequence[Interval], quota: int, *, from_end: bool) -> list[Interval]:
    """Up to ``quota`` of ``own``: its first stretches, or with ``from_end`` its last."""
    keep, room = [], quota
    for a, b in (reversed(own) if from_end else own):
        if room <= 0:
            break
        take = min(room, b - a)
        keep.append((b - take, b) if from_end else (a, a + take))
        room -= take
    return sorted(keep)


def _split_at_units(a: int, b: int) -> list[Interval]:
    out = []
    while a < b:
        end = min(b, (a // UNIT + 1) * UNIT)
        out.append((a, end))
        a = end
    return out


def _ordered_cut(ids: Sequence[str], space: Sequence[Interval], claims: Mapping[str, list[Interval]]
                 ) -> dict[str, list[Interval]]:
    """A fresh cut of ``space`` into len(ids) consecutive stretches, the members in the
    order they already sit on it; members owning nothing are slotted in one at a time where
    the most owned hash space stays put."""
    own = {m: intersect(claims.get(m, []), space) for m in ids}
    # where a member sits: the start of its largest stretch
    placed = sorted((m for m in ids if own[m]), key=lambda m: (max(own[m], key=lambda i: (i[1] - i[0], -i[0]))[0], m))
    for newcomer in sorted(m for m in ids if not own[m]):
        best = max(range(len(placed) + 1),
                   key=lambda i: (_kept(placed[:i] + [newcomer] + placed[i:], space, own), -i))
        placed.insert(best, newcomer)
    return _cut(placed, space)


def _cut(order: Sequence[str], space: Sequence[Interval]) -> dict[str, list[Interval]]:
    """Cut points at floor(k * total / M), so with M a multiple of P each member gets
    exactly an equal share of section 2 of one partition."""
    total, count = length(space), len(order)
    return {m: _slice(space, i * total // count, (i + 1) * total // count) for i, m in enumerate(order)}


def _slice(space: Sequence[Interval], start: int, end: int) -> list[Interval]:
    out, offset = [], 0
    for a, b in space:
        lo, hi = max(a, a + start - offset), min(b, a + end - offset)
        if lo < hi:
            out.append((lo, hi))
        offset += b - a
    return out


def _kept(order: Sequence[str], space: Sequence[Interval], own: Mapping[str, list[Interval]]) -> int:
    cut = _cut(order, space)
    return sum(length(intersect(cut[m], own[m])) for m in order)


def _line_pieces(line: _Line, intervals: Sequence[Interval]) -> int:
    return pieces(line.to_assignment(intervals))


def _assign_topic(line: _Line, members: Sequence[MemberInfo], ranges: bool) -> dict[str, list[Interval]]:
    claims = _claims(members, line)
    ids = sorted(m.member_id for m in members)
    rangers = [m.member_id for m in sorted(members, key=lambda m: m.member_id) if m.allows_ranges and ranges]
    whole_only = [m for m in ids if m not in rangers]
    partitions = line.partitions
    out: dict[str, list[Interval]] = {m: [] for m in ids}
    if len(ids) <= len(partitions) or not rangers:
        for m, parts in _assign_whole(ids, line, partitions, claims).items():
            out[m] = [line.unit(p) for p in parts]
        return out
    # M > P with members that may share: the whole-only members take one partition each
    # (leaving at least one), the others cut the rest of the line
    takers = len(partitions) - 1 if len(whole_only) >= len(partitions) else len(whole_only)
    if takers:
        owners = sorted(whole_only, key=lambda m: (-max((length(intersect(claims[m], [line.unit(p)]))
                                                         for p in partitions), default=0), m))[:takers]
        given = _assign_whole(owners, line, partitions, claims)
        # _assign_whole spreads every partition; keep each taker's best one only
        chosen: set[int] = set()
        for m in owners:
            best = max(given[m], key=lambda p: (length(intersect(claims[m], [line.unit(p)])), -p))
            chosen.add(best)
            out[m] = [line.unit(best)]
    else:
        chosen = set()
    rest = [p for p in partitions if p not in chosen]
    space = merge(line.unit(p) for p in rest)
    if len(rangers) <= len(rest):
        for m, parts in _assign_whole(rangers, line, rest, claims).items():
            out[m] = [line.unit(p) for p in parts]
        return out
    if not any(intersect(claims[m], space) for m in rangers):
        cut = _cut(rangers, space)  # nothing to keep: a plain cut in member order
    else:
        cut = _sticky_cut(rangers, space, claims)
    if any(_line_pieces(line, cut[m]) > MAX_PIECES for m in rangers):
        cut = _ordered_cut(rangers, space, claims)
    out.update(_without_slivers(cut))
    return out


def _without_slivers(cut: Mapping[str, list[Interval]]) -> dict[str, list[Interval]]:
    """``cut`` with every piece thinner than ``SLIVER`` (within one partition) that is not
    its member's only piece given to the member whose stretch it touches in the same
    partition: that member's piece grows and keeps its count, the other loses one."""
    out = {m: [p for a, b in intervals for p in _split_at_units(a, b)] for m, intervals in cut.items()}
    for m in sorted(out):
        for piece in [p for p in out[m] if p[1] - p[0] < SLIVER]:
            if len(out[m]) < 2:
                break
            a, b = piece
            neighbour = next((n for n in sorted(out) if n != m and any(
                (y == a and a % UNIT) or (x == b and b % UNIT) for x, y in out[n])), None)
            if neighbour is None:
                continue
            out[m].remove(piece)
            out[neighbour].append(piece)
    return {m: merge(intervals) for m, intervals in out.items()}


def cooperative_topics(members: Sequence[MemberInfo], partitions: Mapping[str, Sequence[int]], *,
                       ranges: bool = True) -> set[str]:
    """The topics ``keyrange`` shares cooperatively: every subscriber shares cooperatively
    (and allows individual commit, which cooperative sharing commits with), and they
    outnumber the topic's partitions. Never under ``cooperative-sticky`` (not ``ranges``)."""
    out: set[str] = set()
    if not ranges:
        return out
    for topic, parts in partitions.items():
        subscribed = [m for m in members if topic in m.topics]
        if parts and len(subscribed) > len(parts) and all(m.cooperative and m.allows_ranges for m in subscribed):
            out.add(topic)
    return out


def _assign_shared(topic: str, partitions: Sequence[int], members: Sequence[MemberInfo]) -> dict[str, Assignment]:
    """M > P members sharing a topic cooperatively: one whole partition each, every
    partition floor(M/P) or ceil(M/P) members. Sticky: a member keeps a partition it holds
    (whole or in part) while that partition has room (first up to floor(M/P), then the
    ceil(M/P) slots, newer generations first); the rest, by member id, fill the partitions
    with the fewest members, lowest id first, so with nothing held member i gets i mod P."""
    parts = sorted(partitions)
    base, extra = divmod(len(members), len(parts))
    count = {p: 0 for p in parts}
    placed: dict[str, int] = {}
    held = {m.member_id: sorted({tp.partition for tp in m.owned if tp.topic == topic and tp.partition in count})
            for m in members}
    by_claim = sorted(members, key=lambda m: (-m.generation, m.member_id))
    for slots in ("base", "extra"):
        for member in by_claim:
            if member.member_id in placed:
                continue
            mine = [p for p in held[member.member_id]
                    if count[p] < base or (slots == "extra" and extra and count[p] == base)]
            if mine:
                p = min(mine, key=lambda p: (count[p], p))
                extra -= count[p] == base
                count[p] += 1
                placed[member.member_id] = p
    for member_id in sorted(m.member_id for m in members if m.member_id not in placed):
        room = [p for p in parts if count[p] < base] or [p for p in parts if extra and count[p] == base]
        p = min(room, key=lambda p: (count[p], p))
        extra -= count[p] == base
        count[p] += 1
        placed[member_id] = p
    return {member_id: {TopicPartition(topic, p): []} for member_id, p in placed.items()}


def assign(members: Sequence[MemberInfo], partitions: Mapping[str, Sequence[int]], *, ranges: bool = True
           ) -> dict[str, Assignment]:
    """The target assignment of every member: ``keyrange`` when ``ranges``, else
    ``cooperative-sticky`` (whole partitions). ``partitions`` maps each topic to its
    partition ids; topics nobody subscribes to and unknown topics are left out. The
    partitions of ``cooperative_topics`` are fetched cooperatively by their members (the
    assignment names them whole, like any whole partition)."""
    out: dict[str, Assignment] = {m.member_id: {} for m in members}
    shared = cooperative_topics(members, partitions, ranges=ranges)
    for topic in sorted(partitions):
        subscribed = [m for m in members if topic in m.topics]
        if not subscribed or not partitions[topic]:
            continue
        if topic in shared:
            for member_id, assignment in _assign_shared(topic, partitions[topic], subscribed).items():
                out[member_id].update(assignment)
            continue
        line = _Line(topic, sorted(partitions[topic]))
        for member_id, intervals in _assign_topic(line, subscribed, ranges).items():
            out[member_id].update(line.to_assignment(intervals))
    return out


def withhold_moving(target: Mapping[str, Assignment], members: Sequence[MemberInfo],
                    shared_topics: Iterable[str] = ()) -> dict[str, Assignment]:
    """The first rebalance of a cooperative hand-off: each member's target without the hash
    space another member still owns (that member revokes it, then rejoins). Partitions of
    ``shared_topics`` (shared cooperatively) are never withheld."""
    shared = set(shared_topics)
    owned_by: dict[TopicPartition, list[tuple[str, list[Interval]]]] = {}
    for member in members:
        for tp, ranges in member.owned.items():
            owned_by.setdefault(tp, []).append((member.member_id, to_intervals(ranges)))
    out: dict[str, Assignment] = {}
    for member_id, assignment in target.items():
        mine: Assignment = {}
        for tp, ranges in assignment.items():
            if tp.topic in shared:
                mine[tp] = list(ranges)
                continue
            others = merge(i for who, owned in owned_by.get(tp, []) if who != member_id for i in owned)
            free = subtract(to_intervals(ranges), others)
            if free:
                mine[tp] = to_ranges(free)
        out[member_id] = mine
    return out
