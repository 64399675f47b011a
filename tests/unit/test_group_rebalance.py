"""A group member's assignment changing under it: what it keeps goes on being handed out."""

from __future__ import annotations

from collections import Counter

from proxy.client import TopicPartition, equal_shares
from proxy.client.assignment import AssignmentState, narrows
from proxy.client.config import ConsumerConfig
from proxy.client.connection import Connections
from proxy.client.errors import NotCoordinatorError
from proxy.client.group import GroupMember, RebalanceListener
from proxy.client.membership import Change, difference, union
from proxy.client.progress import PartitionProgress
from proxy.client.records import ConsumerRecord
from proxy.ranges import KeyRange, contains
from proxy.records.keyhash import key_hash

TP = TopicPartition("t", 0)


def _records(start: int, count: int) -> list[ConsumerRecord]:
    return [ConsumerRecord("t", 0, o, 0, b"key-%d" % o, b"") for o in range(start, start + count)]


def test_narrows():
    halves = equal_shares(2)
    assert narrows([], halves[:1]) and narrows(halves, halves[1:]) and narrows(halves, [KeyRange(5, 9)])
    assert not narrows(halves[:1], []) and not narrows(halves[:1], halves[1:])
    assert narrows(halves, [KeyRange(halves[0].end - 5, halves[1].start + 5)]), "adjacent ranges hold as one"
    assert not narrows([KeyRange(0, 10), KeyRange(20, 30)], [KeyRange(5, 25)])


def _buffered(count: int):
    """A state holding ``count`` buffered records of TP from offset 100, its fetch ended
    right after them."""
    state = AssignmentState(read_committed=False, tracking=True)
    state.assign({TP: []})
    state.seek(TP, 100)
    records = _records(100, count)
    state.buffers.add(TP, records, 100 + count)
    return state, records


def test_a_narrowed_range_keeps_its_buffered_records_in_order():
    state, records = _buffered(40)
    quarter = equal_shares(4)[1]
    state.assign({TP: [quarter]})
    kept = [r.offset for r in records if contains([quarter], key_hash(r.key, r.offset))]
    assert kept and len(kept) < 40
    drained = state.drain(1000, ())
    assert [r.offset for r in drained] == kept
    assert state.position(TP) == 140


def test_a_buffer_narrowed_to_nothing_moves_the_position_past_the_fetch():
    state, records = _buffered(3)
    hashes = sorted(key_hash(r.key, r.offset) for r in records)
    state.assign({TP: [KeyRange(hashes[0] + 1, hashes[0] + 1)]})
    assert not state.buffers.has_buffered(TP) and state.position(TP) == 103
    assert state.fetchable(lambda tp: True) == [TP]


def test_grown_ranges_drop_the_buffer():
    state = AssignmentState(read_committed=False, tracking=True)
    halves = equal_shares(2)
    state.assign({TP: halves[:1]})
    state.seek(TP, 100)
    state.buffers.add(TP, _records(100, 3), 103)
    state.assign({TP: []})
    assert not state.buffers.has_buffered(TP) and state.position(TP) == 100


def test_growing_starts_over_at_the_group_state_with_the_members_own_marks_held_as_done():
    state = AssignmentState(read_committed=False, tracking=True)
    quarters = equal_shares(4)
    state.assign({TP: [quarters[1]]})
    state.progress[TP] = PartitionProgress(100)
    state.positions[TP] = 150
    state.progress[TP].mark(100, 120)  # acknowledged below, so only the group has it
    state.progress[TP].acknowledged([(100, 120)], 100)
    state.progress[TP].mark(130, 140)  # marked, no commit has carried it yet
    state.buffers.add(TP, _records(150, 5), 155)
    # the group: S = 90, R = the previous owner's [95, 99] and this member's [100, 120]
    state.grow(TP, quarters[1:3], 90, [(95, 99), (100, 120)])
    assert state.ranges[TP] == quarters[1:3] and not state.buffers.has_buffered(TP)
    progress = state.progress[TP]
    assert state.position(TP) == 100 and progress.stable == 100, "S never moves back"
    assert list(progress.pending) == [(130, 140)], "unacknowledged marks are still committed"
    done = [o for o in range(90, 160) if progress.already_committed(o)]
    assert done == [*range(90, 121), *range(130, 141)]


def test_growing_without_individual_commit_restarts_at_the_group_offset():
    state = AssignmentState(read_committed=False, tracking=False)
    state.assign({TP: equal_shares(2)[:1]})
    state.positions[TP] = 50
    state.grow(TP, [], 40, [])
    assert state.ranges[TP] == [] and state.position(TP) == 40 and TP not in state.progress


# -- the member's poll-side step, with the network replaced ----------------------------------
class _Committer:
    def __init__(self, state: AssignmentState) -> None:
        self.state = state
        self.group_state: dict[TopicPartition, tuple[int | None, list[tuple[int, int]]]] = {}
        self.reads = 0
        self.failing_reads = 0  # this many reads fail first (a coordinator moving, say)
        self.commits = 0
        self.member = None

    async def committed_ranges(self, partitions):
        self.reads += 1
        if self.failing_reads:
            self.failing_reads -= 1
            raise NotCoordinatorError("moving")
        return {tp: self.group_state.get(tp, (None, [])) for tp in partitions}

    async def commit_processed(self, ranges_supported: bool) -> None:
        """Every mark acknowledged, S where it was."""
        self.commits += 1
        for progress in self.state.progress.values():
            progress.acknowledged(list(progress.pending), -1)


class _Listener(RebalanceListener):
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    async def on_assigned(self, assignment):
        self.calls.append(("assigned", assignment))

    async def on_revoked(self, assignment):
        self.calls.append(("revoked", assignment))


def _member(state: AssignmentState) -> tuple[GroupMember, _Committer]:
    config = ConsumerConfig("127.0.0.1:1", group_id="g", allow_individual_commit=True)
    committer = _Committer(state)

    def set_ranges(ranges, paused, cooperative=()):
        state.assign({tp: list(r) for tp, r in ranges.items()}, cooperative)
        state.pause(paused)

    async def supported() -> bool:
        return True

    member = GroupMember(config, Connections([("127.0.0.1", 1)], client_id="t", timeout=1.0, metrics=Counter()),
                         state, committer, metrics=Counter(), set_ranges=set_ranges,  # type: ignore[arg-type]
                         commit_supported=supported)
    member.listener = _Listener()
    return member, committer


def _records_in(ranges, start: int, count: int) -> list[ConsumerRecord]:
    return [r for r in _records(start, count) if contains(ranges, key_hash(r.key, r.offset))]


async def _sync(member: GroupMember, owned: dict, new: dict) -> None:
    """The member's SyncGroup answer assigns ``new``; the next poll applies it."""
    m = member.membership
    m.owned = {tp: list(r) for tp, r in owned.items()}
    m.revoking = {}
    revoked, added = difference(m.owned, new), difference(new, m.owned)
    m.revoking = revoked
    m.owned = union(new, revoked)
    member._changes.append(Change(new, added, revoked))
    await member.before_poll(_no_pattern)


async def _no_pattern():
    return None


async def test_a_member_that_gives_up_a_slice_keeps_handing_out_the_rest():
    state = AssignmentState(read_committed=False, tracking=True)
    member, committer = _member(state)
    quarters = equal_shares(4)
    state.assign({TP: [quarters[1]]})
    state.progress[TP] = PartitionProgress(0)
    state.positions[TP] = 0
    buffered = _records_in([quarters[1]], 0, 400)
    state.buffers.add(TP, buffered, 400)
    kept = KeyRange(quarters[1].start, quarters[1].start + quarters[1].size * 4 // 5)
    out = state.drain(30, ())  # out with the application when the revocation arrives
    assert any(not contains([kept], key_hash(r.key, r.offset)) for r in out)
    member.handed.handed(out)
    await _sync(member, {TP: [quarters[1]]}, {TP: [kept]})
    assert member.to_be_revoked() == {TP}, "a record of the slice is still out"
    assert state.ranges[TP] == [kept] and TP not in state.paused
    handed = state.drain(1000, ())
    assert [r.offset for r in handed] == [r.offset for r in buffered[30:] if contains([kept], key_hash(r.key, r.offset))]
    member.handed.handed(handed)
    for r in [*out, *handed]:
        state.progress[TP].mark(r.offset)
        member.marked(TP, r.offset)
    await member.before_poll(_no_pattern)  # nothing of the slice is out, but its marks wait for a commit
    assert member.to_be_revoked() == {TP} and committer.commits == 0, "the poll does not wait for a commit"
    await member._step()  # the background task commits
    assert committer.commits == 1
    await member.before_poll(_no_pattern)
    assert member.to_be_revoked() == set() and committer.commits == 1
    assert [c for c, _ in member.listener.calls] == ["revoked"]


async def test_a_revocation_whose_marks_the_application_committed_completes_at_once():
    state = AssignmentState(read_committed=False, tracking=True)
    member, committer = _member(state)
    halves = equal_shares(2)
    state.assign({TP: halves})
    state.progress[TP] = PartitionProgress(0)
    state.positions[TP] = 0
    state.buffers.add(TP, _records(0, 50), 50)
    out = state.drain(20, ())
    member.handed.handed(out)
    await _sync(member, {TP: halves}, {TP: halves[:1]})
    for r in out:
        state.progress[TP].mark(r.offset)
        member.marked(TP, r.offset)
    await committer.commit_processed(True)  # the application's own commit
    more = state.drain(100, ())  # the kept half goes on; its marks above the bound do not hold it up
    member.handed.handed(more)
    for r in more:
        state.progress[TP].mark(r.offset)
        member.marked(TP, r.offset)
    await member.before_poll(_no_pattern)
    assert member.to_be_revoked() == set() and committer.commits == 1 and not member._commit_wanted


def _growing_member():
    """A member reading a quarter of TP from offset 0, and that quarter grown by a fifth
    of its width downwards (what a neighbour that leaves gives up)."""
    state = AssignmentState(read_committed=False, tracking=True)
    member, committer = _member(state)
    quarter = equal_shares(4)[1]
    old, new = [quarter], [KeyRange(quarter.start - quarter.size // 5, quarter.end)]
    state.assign({TP: old})
    state.progress[TP] = PartitionProgress(0)
    state.positions[TP] = 0
    return state, member, committer, old, new


async def test_a_member_that_grows_goes_on_with_what_it_keeps_and_takes_the_rest_from_the_group_state():
    state, member, committer, old, new = _growing_member()
    first = _records_in(old, 0, 100)
    state.buffers.add(TP, first, 100)
    handed = state.drain(10, ())  # out with the application when the growth arrives
    member.handed.handed(handed)
    committer.group_state[TP] = (5, [(7, 9)])
    await _sync(member, {TP: old}, {TP: new})
    # records are out unmarked: the partition waits, paused, and the group is not read yet
    assert committer.reads == 0 and TP in state.paused and state.ranges[TP] == old
    for r in handed:
        state.progress[TP].mark(r.offset)
        member.marked(TP, r.offset)
    await member.before_poll(_no_pattern)
    assert committer.reads == 1 and committer.commits == 0, "no commit waits before the growth"
    assert state.ranges[TP] == new and TP not in state.paused and state.position(TP) == 5
    progress = state.progress[TP]
    assert all(progress.already_committed(r.offset) for r in handed)
    assert progress.already_committed(4) and progress.already_committed(8)
    unhanded = [o for o in range(5, 100) if o not in {r.offset for r in handed} and o not in (7, 8, 9)]
    assert not any(progress.already_committed(o) for o in unhanded)


async def test_a_growth_that_arrives_between_polls_of_a_sequential_application_never_pauses():
    state, member, committer, old, new = _growing_member()
    committer.group_state[TP] = (0, [])
    await _sync(member, {TP: old}, {TP: new})
    assert committer.reads == 1 and state.ranges[TP] == new and not state.paused
    assert [c for c, _ in member.listener.calls] == ["assigned"]


def _moving_member():
    """A member reading the second quarter of TP from offset 0, 200 offsets of it buffered,
    about to be moved to the third quarter (nothing of the second kept)."""
    state = AssignmentState(read_committed=False, tracking=True)
    member, committer = _member(state)
    quarters = equal_shares(4)
    old, new = [quarters[1]], [quarters[2]]
    state.assign({TP: old})
    state.progress[TP] = PartitionProgress(0)
    state.positions[TP] = 0
    state.buffers.add(TP, _records_in(old, 0, 200), 200)
    return state, member, committer, old, new


def _handed_in(ranges, records) -> list[int]:
    return [r.offset for r in records if contains(ranges, key_hash(r.key, r.offset))]


async def test_a_range_moved_to_a_disjoint_one_stops_being_handed_out_at_once():
    state, member, committer, old, new = _moving_member()
    out = state.drain(10, ())
    member.handed.handed(out)
    for r in out:  # processed, not committed yet: the revocation waits for a commit
        state.progress[TP].mark(r.offset)
        member.marked(TP, r.offset)
    committer.failing_reads = 1
    committer.group_state[TP] = (0, [])
    await _sync(member, {TP: old}, {TP: new})
    assert member.to_be_revoked() == {TP} and committer.reads == 1 and committer.commits == 0
    assert TP in state.paused and not state.drain(1000, ()), "nothing more of the revoked quarter"
    assert state.fetchable(lambda tp: True) == []
    await member._step()  # the background task commits
    await member.before_poll(_no_pattern)
    assert member.to_be_revoked() == set() and committer.reads == 2
    assert state.ranges[TP] == new and TP not in state.paused and state.position(TP) == 0


async def test_a_failed_look_up_of_the_new_range_never_revives_the_revoked_one():
    state, member, committer, old, new = _moving_member()
    committer.failing_reads = 2
    committer.group_state[TP] = (40, [])
    await _sync(member, {TP: old}, {TP: new})
    assert [c for c, _ in member.listener.calls] == ["assigned", "revoked"], "the revocation completed"
    assert member.membership.rejoin_needed, "the follow-up rebalance hands the old quarter on"
    assert _handed_in(old, state.drain(1000, ())) == [] and state.fetchable(lambda tp: True) == []
    await member.before_poll(_no_pattern)  # the look-up fails again
    assert committer.reads == 2 and TP in state.paused and state.ranges[TP] == old
    assert not state.drain(1000, ())
    await member.before_poll(_no_pattern)  # and is retried until it answers
    assert committer.reads == 3 and state.ranges[TP] == new and TP not in state.paused
    assert state.position(TP) == 40


async def test_a_parked_partition_given_its_old_range_back_starts_from_the_group_state():
    state, member, committer, old, new = _moving_member()
    state.drain(50, ())  # handed out and processed: the position is 50
    committer.failing_reads = 2
    await _sync(member, {TP: old}, {TP: new})
    committer.group_state[TP] = (120, [])  # the next owner of the old quarter went on to 120
    await _sync(member, {TP: new}, {TP: old})
    assert TP in state.paused and state.ranges[TP] == old, "not resumed from its own position 50"
    await member.before_poll(_no_pattern)
    assert state.ranges[TP] == old and TP not in state.paused and state.position(TP) == 120


async def test_a_parked_partition_whose_growth_is_called_off_goes_with_its_revocation():
    state, member, committer, old, new = _moving_member()
    committer.failing_reads = 1
    await _sync(member, {TP: old}, {TP: new})
    assert TP in state.paused
    await _sync(member, {TP: new}, {})  # the next rebalance gives the partition to others
    assert TP not in state.ranges and not member.to_be_revoked()
    assert [c for c, _ in member.listener.calls] == ["assigned", "revoked", "revoked"]


async def test_a_consumer_outside_the_group_sleeps_past_the_poll_deadline(autojump_clock):
    """Found by the soak benchmark (benchmarks/bench_soak.py): an assign-mode consumer with a
    group_id (individual commit) runs the group's background task but never reports its
    polls to it; once max_poll_interval_ms had passed, every step slept for 0 s, a busy loop
    that took a core per consumer. Outside the group it now sleeps until woken."""
    import trio

    state = AssignmentState(read_committed=False, tracking=True)
    member, _ = _member(state)  # never subscribed: assign mode
    deadline = member.config.max_poll_interval_ms / 1000
    steps = 0
    step = member._step

    async def counted() -> None:
        nonlocal steps
        steps += 1
        if steps > 1000:
            raise AssertionError(f"busy loop: {steps} steps by {trio.current_time():.0f} s")
        await step()

    member._step = counted
    async with trio.open_nursery() as nursery:
        nursery.start_soon(member.run)
        await trio.sleep(3 * deadline)  # virtual time: the clock jumps whenever every task waits
        nursery.cancel_scope.cancel()
    assert steps <= 2
