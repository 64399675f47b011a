"""Who gets which offsets of a cooperatively fetched partition (proxy.coop.leases)."""

from __future__ import annotations

import random

import pytest

from proxy.coop.leases import Committed, PartitionLeases, generation_error

NOTHING = Committed()


def fresh(marker: int = 0, *, lease: float = 10.0, limit: int = 100) -> PartitionLeases:
    return PartitionLeases.starting(NOTHING, marker, lease_seconds=lease, max_leases_per_member=limit)


TOKENS: dict[tuple[int, str], int] = {}


def take(state: PartitionLeases, member: str, token: int | None, chunk_end_of, now: float = 0.0,
         committed: Committed = NOTHING):
    """One fetch of ``member`` as a client makes it: FetchOffset ``token``, or (None) the
    end of its last chunk + 1; its span, and the chunk the read held (``chunk_end_of(span)``;
    None: nothing)."""
    if token is None:
        token = TOKENS.get((id(state), member), 0)
    span = state.next_span(member, token, committed)
    if span is None:
        return None
    end = chunk_end_of(span)
    if end is None:
        state.returned(span)
        return None
    lease = state.granted(span, member, token, end, now)
    TOKENS[(id(state), member)] = lease.end + 1
    return lease.start, lease.end


def ten(span):  # reads return ten offsets (a byte limit), within the span
    return span.start + 9 if span.end is None else min(span.end, span.start + 9)


def test_committed_uncommitted_parts():
    committed = Committed(10, ((15, 19), (25, 25)))
    assert committed.uncommitted(0, 9) == []
    assert committed.uncommitted(5, 30) == [(10, 14), (20, 24), (26, 30)]
    assert committed.uncommitted(15, 19) == []
    assert committed.covers(16, 19) and not committed.covers(16, 20)
    assert Committed().uncommitted(3, 4) == [(3, 4)]


def test_chunks_from_the_marker_are_disjoint_and_in_order():
    state = fresh(100)
    got = [take(state, m, None, ten) for m in ("a", "b", "a", "c")]
    # nothing committed: the first chunk claims the offsets the first member's reset skipped
    assert got == [(0, 109), (110, 119), (120, 129), (130, 139)]
    assert state.marker == 140


def test_out_of_range_starts_again_at_the_next_fetch_offset_and_claims_from_s():
    state = PartitionLeases.starting(Committed(50), 0, lease_seconds=10, max_leases_per_member=100)
    assert take(state, "a", 50, ten) == (50, 59)
    state.expire(100.0, Committed(50))  # [50, 59] to be handed out again
    state.out_of_range()  # retention deleted everything below 500
    span = state.next_span("b", 500, Committed(50))
    assert (span.start, span.end, span.chunk_start) == (500, None, 50)
    state.granted(span, "b", 500, 509, 101.0)
    assert state.outstanding("b")[0].start == 50 and state.marker == 510
    assert not state.redeliver and state.outstanding("a") == []
    span = state.next_span("b", 510, Committed(50))
    assert (span.start, span.chunk_start) == (510, 510)


def test_a_start_from_committed_state_hands_out_the_gaps_first():
    state = PartitionLeases.starting(Committed(10, ((15, 19), (30, 34))), 0, lease_seconds=10,
                                     max_leases_per_member=100)
    assert state.marker == 35
    assert take(state, "a", 10, ten) == (10, 14)
    assert take(state, "a", 15, ten) == (20, 29)
    assert take(state, "b", 0, ten) == (35, 44)


def test_nothing_committed_starts_where_the_first_fetch_asks():
    assert fresh(42).marker == 42


def test_a_retry_gets_the_same_chunk_and_the_marker_stays():
    state = fresh()
    assert take(state, "a", 0, ten) == (0, 9)
    span = state.next_span("a", 0, NOTHING)  # the answer was lost: same FetchOffset
    assert (span.start, span.end, span.lease is not None) == (0, 9, True)
    state.granted(span, "a", 0, 9, 1.0)
    assert state.marker == 10 and state.counts.retried == 1
    assert take(state, "a", 10, ten) == (10, 19)  # received: the next token moves on


def test_a_chunk_ending_below_its_token_is_not_taken_for_a_retry():
    # token 20 got a handed-out-again chunk [10, 19]; the member's next token is 20 again
    state = fresh()
    take(state, "a", 0, ten)
    take(state, "b", 0, ten)
    take(state, "a", 10, ten)  # a: [20, 29]
    state.expire(100.0, NOTHING)  # every lease expired: 0..29 to be handed out again
    assert take(state, "c", 20, ten, now=100.0) == (0, 9)
    assert take(state, "c", 10, ten, now=100.0) == (10, 19)
    assert take(state, "c", 20, ten, now=100.0) == (20, 29)  # not [10, 19] again
    assert take(state, "c", 30, ten, now=100.0) == (30, 39)


def test_expired_leases_are_handed_out_again_less_what_was_committed():
    state = fresh(lease=5.0)
    assert take(state, "a", 0, lambda s: s.start + 19) == (0, 19)
    assert take(state, "b", 0, ten) == (20, 29)
    committed = Committed(-1, ((0, 4), (10, 12)))
    assert state.expire(4.9, committed) == 0
    assert state.expire(5.0, committed) == 2
    assert state.counts.expired == 2
    got = [take(state, "c", None, ten, now=6.0, committed=committed) for _ in range(4)]
    assert got == [(5, 9), (13, 22), (23, 29), (30, 39)]  # adjacent spans handed out as one


def test_a_span_cut_short_by_the_byte_limit_keeps_its_rest():
    state = fresh(lease=1.0)
    take(state, "a", 0, lambda s: s.start + 29)  # [0, 29]
    state.expire(2.0, NOTHING)
    assert take(state, "b", 0, ten, now=2.0) == (0, 9)
    assert take(state, "b", 10, ten, now=2.0) == (10, 19)
    assert take(state, "b", 20, ten, now=2.0) == (20, 29)
    assert take(state, "b", 30, ten, now=2.0) == (30, 39)


def test_a_read_with_nothing_returns_its_span():
    state = fresh(lease=1.0)
    take(state, "a", 0, ten)
    state.expire(2.0, NOTHING)
    assert take(state, "b", 0, lambda s: None, now=2.0) is None
    assert take(state, "b", 0, ten, now=2.0) == (0, 9)
    assert take(state, "b", 10, lambda s: None) is None  # at the marker: nothing moves
    assert state.marker == 10


def test_committed_leases_are_released_and_the_limit_waits_for_commits():
    state = fresh(limit=2)
    assert take(state, "a", 0, ten) == (0, 9)
    assert take(state, "a", 10, ten) == (10, 19)
    assert state.next_span("a", 20, NOTHING) is None  # at its limit
    assert take(state, "b", 0, ten) == (20, 29)  # others are not held up
    committed = Committed(10)
    assert state.release_committed(committed, "a") == 1
    assert take(state, "a", 20, ten, committed=committed) == (30, 39)
    assert state.leases == 3


def test_generation_rule():
    assert generation_error(3, 3) == 0
    assert generation_error(3, 4) == 0
    assert generation_error(3, 2) == 22
    assert generation_error(3, -1) == 0


@pytest.mark.parametrize("seed", range(20))
def test_random_histories_hand_out_every_offset_and_overlap_only_after_expiry(seed):
    """Members fetch, commit, stall and die at random: every offset below the marker is
    handed out, committed chunks never come back, and a chunk is handed out twice only
    after its lease expired."""
    rng = random.Random(seed)
    state = fresh(lease=5.0, limit=4)
    log_end = 2000
    committed: set[int] = set()
    tokens: dict[str, int] = {}
    held: dict[str, list[tuple[int, int]]] = {}
    handed: dict[int, int] = {}
    now = 0.0
    view = _as_committed(committed)
    for _ in range(1500):
        now += rng.random()
        state.expire(now, view)
        member = rng.choice("abcdef")
        if rng.random() < 0.4 and held.get(member):
            start, end = held[member].pop(0)
            if rng.random() < 0.9:  # commits it; sometimes it died first
                committed.update(range(start, end + 1))
                view = _as_committed(committed)
            state.release_committed(view, member)
            continue
        span = state.next_span(member, tokens.get(member, 0), view)
        if span is None:
            continue
        if span.start >= log_end:
            state.returned(span)
            continue
        top = min(log_end - 1, span.start + rng.randint(0, 30))
        end = top if span.end is None else min(top, span.end)
        lease = state.granted(span, member, tokens.get(member, 0), end, now)
        if span.lease is None:
            for offset in range(lease.start, lease.end + 1):
                assert offset not in committed, "a committed offset was handed out again"
                handed[offset] = handed.get(offset, 0) + 1
            held.setdefault(member, []).append((lease.start, lease.end))
        tokens[member] = lease.end + 1
    assert set(handed) == set(range(state.marker))
    again = sum(count - 1 for count in handed.values())
    assert again <= sum(1 for _ in range(state.counts.expired)) * 31


def _as_committed(offsets: set[int]) -> Committed:
    ranges = []
    for offset in sorted(offsets):
        if ranges and ranges[-1][1] == offset - 1:
            ranges[-1] = (ranges[-1][0], offset)
        else:
            ranges.append((offset, offset))
    return Committed(-1, tuple(ranges))
