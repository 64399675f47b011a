"""Individual-commit state: the merge rule of docs/wire-contract.md#33-offsetcommit, validation, and the
seed proposal's worked example (stable offset, ranges, gap amending)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.commits.state import (
    CommitState,
    apply_plain,
    apply_ranges,
    check_held,
    normalise,
    rebase,
    validate,
)
from proxy.protocol.groups import group_partition, java_string_hash


def _expand(state: CommitState, limit: int) -> set[int]:
    return {o for o in range(limit) if state.processed(o)}


def _well_formed(state: CommitState) -> None:
    previous_end = None
    for start, end in state.ranges:
        assert start <= end
        assert start > state.stable, "every range starts above S (one at S is folded in)"
        if previous_end is not None:
            assert start > previous_end + 1, "ranges are disjoint and non-adjacent"
        previous_end = end


_range = st.tuples(st.integers(0, 60), st.integers(0, 8)).map(lambda t: (t[0], t[0] + t[1]))
_commits = st.lists(st.lists(_range, min_size=1, max_size=4), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(_commits, st.integers(0, 10), st.randoms(use_true_random=False))
def test_merge_is_order_independent_and_s_is_lowest_unprocessed(commits, start, rng):
    state = CommitState(start)
    for commit in commits:
        state = apply_ranges(state, commit)
        _well_formed(state)
    shuffled = list(commits)
    rng.shuffle(shuffled)
    other = CommitState(start)
    for commit in shuffled:
        other = apply_ranges(other, commit)
    assert other == state
    processed = set(range(start)) | {o for c in commits for a, b in c for o in range(a, b + 1)}
    assert _expand(state, 100) == {o for o in processed if o < 100}
    # S is the lowest unprocessed offset.
    assert state.stable not in processed
    assert all(o in processed for o in range(state.stable))


@settings(max_examples=200, deadline=None)
@given(_commits)
def test_merging_one_commit_at_a_time_equals_merging_their_union(commits):
    one_by_one = CommitState(0)
    for commit in commits:
        one_by_one = apply_ranges(one_by_one, commit)
    at_once = apply_ranges(CommitState(0), [r for c in commits for r in c])
    assert one_by_one == at_once


@settings(max_examples=200, deadline=None)
@given(_commits, st.integers(0, 80))
def test_plain_commit_sets_s_and_clears_r(commits, offset):
    state = CommitState(0)
    for commit in commits:
        state = apply_ranges(state, commit)
    assert apply_plain(offset) == CommitState(offset, ())


@settings(max_examples=200, deadline=None)
@given(_commits, st.integers(0, 80))
def test_rebase_keeps_the_union_above_the_coordinators_offset(commits, coordinator):
    state = CommitState(0)
    for commit in commits:
        state = apply_ranges(state, commit)
    rebased = rebase(state, coordinator)
    _well_formed(rebased)
    assert rebased.stable >= max(state.stable, coordinator)
    for offset in range(100):
        assert rebased.processed(offset) == (offset < coordinator or state.processed(offset))


def test_seed_worked_example_stable_offset_ranges_and_gap_amending():
    # "Offset: stable: 40, IC: [43-45], [48-49]". Our S is the first unprocessed offset,
    # so "stable 40 with 40 itself not yet processed" is S = 40.
    state = apply_ranges(CommitState(40), [(43, 45), (48, 49)])
    assert state == CommitState(40, ((43, 45), (48, 49)))
    # A consumer fetched [40-50]; it skips what is committed and, having processed the
    # rest, commits only the gaps: [41-42], [46-47], [50-50] ("gap amending").
    fetched = range(40, 51)
    gaps = normalise([(o, o) for o in fetched if not state.processed(o)])
    assert gaps == [(40, 42), (46, 47), (50, 50)]
    # The proposal's literal commit [41-42], [46-47], [50-50] leaves 40 open: S stays 40
    # and the ranges coalesce into one: [41-50].
    literal = apply_ranges(state, [(41, 42), (46, 47), (50, 50)])
    assert literal == CommitState(40, ((41, 50),))
    # Once 40 is processed too, everything through 50 is: S moves to 51, R is empty.
    assert apply_ranges(literal, [(40, 40)]) == CommitState(51, ())
    assert apply_ranges(state, gaps) == CommitState(51, ())
    # The proposal's compaction examples: an IC [46-47] joins [43-45] and [48-49] into one
    # range; an IC [41-42] after 40 is processed moves S past 45.
    assert apply_ranges(state, [(46, 47)]) == CommitState(40, ((43, 49),))
    assert apply_ranges(apply_ranges(state, [(40, 40)]), [(41, 42)]) == CommitState(46, ((48, 49),))


def test_ranges_below_s_are_dropped_and_straddling_ranges_advance_s():
    assert apply_ranges(CommitState(10), [(2, 5)]) == CommitState(10)
    assert apply_ranges(CommitState(10), [(5, 12)]) == CommitState(13)
    assert apply_ranges(CommitState(10), [(5, 9), (11, 11)]) == CommitState(10, ((11, 11),))


def test_validation_errors():
    assert validate(-1, [(0, 5)], 10) is None
    assert "must be -1" in validate(7, [(0, 5)], 10)
    assert "above its end" in validate(-1, [(6, 5)], 10)
    assert "negative" in validate(-1, [(-3, 5)], 10)
    assert "overlap" in validate(-1, [(0, 5), (5, 9)], 10)
    assert "overlap" in validate(-1, [(8, 9), (0, 8)], 10)
    assert validate(-1, [(0, 5), (6, 9)], 10) is None  # adjacent is fine
    assert "at most 2" in validate(-1, [(0, 1), (3, 4), (6, 7)], 2)


def test_random_interleavings_match_a_set_model():
    rng = random.Random(7)
    for _ in range(50):
        state, model = CommitState(0), set()
        for _ in range(40):
            start = rng.randrange(0, 300)
            commit = [(start, start + rng.randrange(0, 5))]
            state = apply_ranges(state, commit)
            model.update(range(commit[0][0], commit[0][1] + 1))
            _well_formed(state)
            assert _expand(state, 400) == model | set(range(state.stable))
            assert state.stable == min(set(range(401)) - model)


def test_java_string_hash_and_group_partition():
    # Values of Java's String.hashCode.
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -2147483648  # Integer.MIN_VALUE
    assert java_string_hash("\U0001F600") == 0xD83D * 31 + 0xDE00  # two UTF-16 code units
    # Kafka's Utils.abs maps Integer.MIN_VALUE to 0 (Math.abs would keep it negative).
    assert group_partition("polygenelubricants", 50) == 0
    assert group_partition("hello", 50) == 99162322 % 50
    assert group_partition("Aa", 7) == group_partition("BB", 7)  # equal Java hashes


def test_stable_after_is_the_stable_offset_of_the_merge():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from proxy.commits.packed import pack
    from proxy.commits.state import check, check_packed, normalise, stable_after

    ranges = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 8)).map(lambda r: (r[0], r[0] + r[1])),
                      max_size=12)

    @settings(max_examples=500, deadline=None)
    @given(st.integers(0, 40), ranges, ranges)
    def run(stable, held, commit):
        state = apply_ranges(CommitState(stable), held)  # a reachable state
        commit = normalise(commit)
        if not commit:
            return
        reason, ordered = check(-1, commit, 1000)
        assert reason is None and ordered == commit
        assert check_packed(-1, pack(commit), 1000) == (None, pack(commit))
        assert stable_after(state, pack(ordered)) == apply_ranges(state, commit).stable

    run()


def test_validation_accepts_exactly_the_sorted_disjoint_non_negative_ranges():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from proxy.commits.state import MAX_OFFSET

    offsets = st.one_of(st.integers(-3, 40), st.sampled_from([MAX_OFFSET - 1, MAX_OFFSET, MAX_OFFSET + 1]))

    @settings(max_examples=1000, deadline=None)
    @given(st.lists(st.tuples(offsets, offsets), min_size=1, max_size=8))
    def run(ranges):
        valid = all(0 <= s <= e < MAX_OFFSET for s, e in ranges) and all(
            a[1] < b[0] or b[1] < a[0] for i, a in enumerate(ranges) for b in ranges[i + 1:])
        assert (validate(-1, ranges, 100) is None) == valid, validate(-1, ranges, 100)

    run()


def test_join_unites_one_epoch_and_a_reset_replaces():
    from proxy.commits.state import join

    a = apply_ranges(CommitState(0), [(0, 3), (7, 7)])  # S 4, R [7]
    b = apply_ranges(CommitState(0), [(5, 5), (9, 12)])  # S 0, R [5], [9-12]
    assert join(a, b) == join(b, a) == CommitState(4, ((5, 5), (7, 7), (9, 12)))
    assert join(a, a) == a
    reset = CommitState(2, (), epoch=1)
    assert join(a, reset) == join(reset, a) == reset  # the higher epoch wins, in either order


@settings(max_examples=300, deadline=None)
@given(_commits, st.randoms(use_true_random=False))
def test_joining_states_written_from_stale_reads_loses_no_commit(commits, rng):
    """Writers that each saw only some of the commits: joining their states in any order
    holds every commit, as one writer that saw them all would."""
    from proxy.commits.state import join

    states = []
    for commit in commits:
        seen = [s for s in states if rng.random() < 0.5]  # what this writer had read
        base = CommitState(0)
        for s in seen:
            base = join(base, s)
        states.append(apply_ranges(base, commit))
    rng.shuffle(states)
    joined = CommitState(0)
    for s in states:
        joined = join(joined, s)
    assert joined == apply_ranges(CommitState(0), [r for c in commits for r in c])


def test_rebase_commit_joins_in_an_epoch_and_reapplies_after_a_reset_or_a_deletion():
    from proxy.commits.packed import pack
    from proxy.commits.state import rebase_commit

    commit = pack([(10, 10)])
    ours = apply_ranges(CommitState(0, ((1, 1),)), [(10, 10)])  # held 1, committed 10
    theirs = CommitState(0, ((5, 5),))  # written from a read that lacked ours
    assert rebase_commit(ours, theirs, [commit]) == CommitState(0, ((1, 1), (5, 5), (10, 10)))
    reset = CommitState(8, (), epoch=1)  # a plain commit of 8 meanwhile: the commit follows it
    assert rebase_commit(ours, reset, [commit]) == CommitState(8, ((10, 10),), epoch=1)
    assert rebase_commit(ours, None, [commit]) == CommitState(0, ((10, 10),), epoch=1)  # deleted meanwhile
    stale = CommitState(0, ((3, 3),), epoch=0)
    newer_ours = CommitState(8, ((10, 10),), epoch=1)
    assert rebase_commit(newer_ours, stale, [commit]) == newer_ours  # from before the reset: nothing to add


def test_a_plain_commit_starts_a_new_epoch():
    assert apply_plain(5) == CommitState(5, (), epoch=0)
    assert apply_plain(5, CommitState(9, ((11, 12),), epoch=2)) == CommitState(5, (), epoch=3)


# -- the bound on one key's state (max.individual.commit.ranges.held) ------------------------------
def _isolated(count: int, first: int = 10) -> CommitState:
    """S = 0 and ``count`` one-offset ranges two apart from ``first``: every gap a lagging
    share's record."""
    return CommitState(0, tuple((first + 2 * i, first + 2 * i) for i in range(count)))


def test_a_commit_may_fill_the_state_to_the_bound_and_not_one_range_beyond():
    state = _isolated(3)  # [10], [12], [14]
    at_bound = apply_ranges(state, [(20, 20)])
    assert at_bound.held() == 4 and check_held(state, at_bound, 4) is None
    over = apply_ranges(state, [(20, 20), (22, 22)])
    reason = check_held(state, over, 4)
    assert reason is not None and "5 ranges" in reason and "at most 4" in reason
    assert "max.individual.commit.ranges.held" in reason
    # A commit merging some ranges and adding others counts what it leaves, not what it sends.
    mixed = apply_ranges(state, [(11, 11), (20, 20), (22, 22)])  # [10-12], [14], [20], [22]
    assert mixed.held() == 4 and check_held(state, mixed, 4) is None


def test_closing_gaps_is_accepted_even_over_the_bound():
    state = _isolated(6)  # the setting was lowered to 4 after this was stored
    assert check_held(state, state, 4) is None  # nothing added (a commit of what it held)
    closes = apply_ranges(state, [(11, 11), (13, 13)])  # three ranges become one: 4 held
    assert closes.held() == 4 and check_held(state, closes, 4) is None
    moves_s = apply_ranges(state, [(0, 9)])  # S moves past [10]: 5 held, still over 4
    assert moves_s.stable == 11 and moves_s.held() == 5 and check_held(state, moves_s, 4) is None
    extends = apply_ranges(state, [(21, 25)])  # [20] becomes [20-25]: the count stays 6
    assert extends.held() == 6 and check_held(state, extends, 4) is None
    adds = apply_ranges(state, [(11, 11), (30, 30), (40, 40)])  # one gap closed, two opened: 7
    assert adds.held() == 7 and "7 ranges" in check_held(state, adds, 4)


@settings(max_examples=200, deadline=None)
@given(_commits, st.integers(1, 12))
def test_the_bound_refuses_exactly_the_commits_that_grow_a_state_past_it(commits, bound):
    state = CommitState(0)
    for commit in commits:
        after = apply_ranges(state, commit)
        reason = check_held(state, after, bound)
        assert (reason is None) == (after.held() <= max(bound, state.held()))
        if reason is None:
            state = after  # a refused commit leaves the state as it was
        assert state.held() <= bound  # starting empty, no accepted commit passes it
