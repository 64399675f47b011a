"""Cooperative grants replicated through a log (proxy.coop.grants): any interleaving of
proposals from several instances, applied in one log order, never yields two valid
overlapping live leases; every reader, a restarted one and one that reads a compacted log
included, decides the same. Instances propose their next chunk before the verdict on their
last (``KeyGrants.hold``), as the proxy does."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.coop.feature import generation_error
from proxy.coop.grants import (
    COMMITTED,
    LEASED,
    STALE,
    Committed,
    Grant,
    GrantFormatError,
    KeyGrants,
    Lease,
    decode_grant,
    decode_key,
    encode_grant,
    encode_key,
    overlapping,
)

NOTHING = Committed()
LEASE_MS = 1000


def grant(start: int, end: int, *, base: int = -1, base_ms: int = -1, held=(), floor: int = -1, member="m",
          token: int = 0, proposal: int = 0, lease_ms: int = LEASE_MS, reset=False, read_from=None) -> Grant:
    return Grant(proposal, "i", member, token, start, end, start if read_from is None else read_from, lease_ms,
                 base, base_ms, floor, end + 1, reset, tuple(held))


def test_committed_uncommitted_parts():
    committed = Committed(10, ((15, 19), (25, 25)))
    assert committed.uncommitted(0, 9) == []
    assert committed.uncommitted(5, 30) == [(10, 14), (20, 24), (26, 30)]
    assert committed.uncommitted(15, 19) == []
    assert committed.covers(16, 19) and not committed.covers(16, 20)
    assert Committed().uncommitted(3, 4) == [(3, 4)]


def test_a_member_of_an_older_generation_is_refused():
    assert generation_error(3, 3) == 0
    assert generation_error(3, 4) == 0
    assert generation_error(3, 2) == 22
    assert generation_error(3, -1) == 0  # assign mode


def test_key_and_value_round_trip():
    assert decode_key(encode_key("g", "orders", 7)) == ("g", "orders", 7)
    held = (Lease("a", 3, 0, 9, 100, 500), Lease("b", 10, 10, 19, 120, 500), Lease("a", 20, 20, 29, 130, 500))
    record = Grant(42, "instance-1", "member-é", 30, 30, 39, 30, 45000, 17, 140, 5, 40, True, held)
    assert decode_grant(encode_grant(record)) == record
    with pytest.raises(GrantFormatError):
        decode_grant(encode_grant(record)[:-1])
    with pytest.raises(GrantFormatError):
        decode_key(b"\x00\x07")


def test_the_first_grant_is_valid_and_a_concurrent_overlap_is_not():
    state = KeyGrants()
    assert state.apply(0, 1000, grant(0, 9)) is None
    # proposed with the same (empty) view, appended after: overlaps the first
    assert state.apply(1, 1001, grant(5, 14)) == LEASED
    # proposed before applying record 1: its proposal counts against it, valid or not
    assert state.apply(2, 1002, grant(10, 19, base=0, base_ms=1000, held=state.leases)) == LEASED
    # proposed after applying both: the snapshot holds the lease
    assert state.apply(3, 1003, grant(10, 19, base=2, base_ms=1002, held=state.leases)) is None
    assert [(lease.start, lease.end) for lease in state.leases] == [(0, 9), (10, 19)]
    assert state.frontier == 20


def test_expiry_is_decided_by_log_append_times():
    state = KeyGrants()
    state.apply(0, 1000, grant(0, 9))
    held = list(state.leases)
    # the lease ends at 2000: a grant of its offsets appended at 1999 is refused, at 2000 valid
    assert state.apply(1, 1999, grant(0, 9, base=0, base_ms=1000, held=held)) == LEASED
    assert state.apply(2, 2000, grant(0, 9, base=1, base_ms=1999, held=held)) is None


def test_a_stale_proposal_is_refused():
    state = KeyGrants()
    state.apply(0, 1000, grant(0, 9))
    assert state.apply(1, 2001, grant(10, 19, base=0, base_ms=1000, held=state.leases)) == STALE


def test_the_committed_floor_refuses_offsets_below_it_and_releases_leases():
    state = KeyGrants()
    state.apply(0, 1000, grant(0, 9))
    state.apply(1, 1001, grant(10, 19, base=0, base_ms=1000, held=state.leases, floor=10))
    assert [(lease.start, lease.end) for lease in state.leases] == [(10, 19)]  # [0, 9] committed
    # a proposer that read an older committed offset: refused by the floor the log carries
    assert state.apply(2, 1002, grant(5, 9, base=0, base_ms=1000, floor=0)) == COMMITTED


def test_a_reset_drops_the_leases_below_its_read():
    state = KeyGrants()
    state.apply(0, 1000, grant(0, 9))
    assert state.apply(1, 1001, grant(0, 104, base=0, base_ms=1000, held=state.leases, reset=True,
                                      read_from=100)) is None
    assert [(lease.start, lease.end) for lease in state.leases] == [(0, 104)]
    assert state.frontier == 105


def test_spans_go_around_proposals_on_their_way_until_their_verdict():
    state = KeyGrants()
    first = state.next_span("a", 50, NOTHING, 0, 10)
    assert (first.start, first.claim_from) == (50, 0)
    proposal = state.propose(first, "a", 50, 59, NOTHING, lease_ms=LEASE_MS, instance="i", proposal=1, now_ms=0)
    state.hold(proposal)  # on its way: the next span starts beyond it, not at the reset policy's offset again
    span = state.next_span("b", 0, NOTHING, 0, 10)
    assert (span.start, span.end, span.claim_from) == (60, None, None) and not state.redelivery(span)
    state.settle(1)  # lost (or never written): nothing is handed out, as before it
    span = state.next_span("b", 70, NOTHING, 0, 10)
    assert (span.start, span.claim_from) == (70, 0)


def test_spans_skip_live_leases_and_committed_ranges_and_retries_get_their_chunk():
    state = KeyGrants()
    assert state.next_span("a", 50, NOTHING, 0, 10).start == 50  # nothing yet: the reset policy's offset
    state.apply(0, 1000, grant(0, 9, member="a", token=50, read_from=50))
    span = state.next_span("b", 0, NOTHING, 1000, 10)
    assert (span.start, span.end) == (10, None)
    state.apply(1, 1001, grant(10, 19, member="b", base=0, base_ms=1000, held=state.leases))
    state.apply(2, 1002, grant(30, 39, member="c", base=1, base_ms=1001, held=state.leases))
    span = state.next_span("d", 0, Committed(-1, ((20, 24),)), 1002, 10)
    assert (span.start, span.end) == (25, 29)
    retry = state.next_span("a", 50, NOTHING, 1002, 10)
    assert retry.lease is not None and (retry.start, retry.end) == (0, 9)
    assert state.next_span("a", 10, NOTHING, 1002, 1) is None  # at its limit
    # a's lease expired (by the proposer's clock): its offsets come first again
    span = state.next_span("d", 0, NOTHING, 2000, 10)
    assert (span.start, span.end) == (0, 9) and state.redelivery(span)


# -- several instances, any interleaving ---------------------------------------------------------
@dataclass
class Instance:
    name: str
    state: KeyGrants = field(default_factory=KeyGrants)
    applied: int = 0  # log records applied
    proposals: int = 0


def replay(log: list[tuple[int, int, Grant]]) -> tuple[KeyGrants, dict[int, str | None]]:
    state = KeyGrants()
    verdicts = {offset: state.apply(offset, ms, record) for offset, ms, record in log}
    return state, verdicts


steps = st.lists(st.tuples(st.sampled_from(["propose", "read", "tick", "commit"]), st.integers(0, 2),
                           st.integers(0, 6), st.integers(1, 8), st.integers(0, 400)), min_size=1, max_size=80)


def run(script, instances: int = 3, members: int = 4, retries: bool = True):
    """The log a script makes: each step an instance proposes from what it has applied and
    its own proposals still on their way, reads some more of the log, time passes, or it
    learns of the group's commits. ``retries``: a member's retry proposes its chunk again
    (the proxy hands it out again without a record)."""
    fleet = [Instance(f"i{n}") for n in range(instances)]
    log: list[tuple[int, int, Grant]] = []
    now = 10_000
    committed = NOTHING
    granted: list[tuple[int, Lease]] = []  # valid, for the commit step
    for action, who, member, size, amount in script:
        node = fleet[who % instances]
        if action == "read":
            upto = min(len(log), node.applied + 1 + amount % 5)
            for offset, ms, record in log[node.applied:upto]:
                node.state.apply(offset, ms, record)
                if record.instance == node.name:
                    node.state.settle(record.proposal)
            node.applied = upto
        elif action == "tick":
            now += amount
        elif action == "commit" and granted:
            # the group commits a prefix of what was handed out; instances read it at once
            ends = sorted(lease.end for _, lease in granted)
            committed = Committed(max(committed.stable, ends[amount % len(ends)] + 1 if amount % 3 == 0 else -1))
        else:
            name = f"m{member % members}"
            span = node.state.next_span(name, 0, committed, now, 3)
            if span is None or (span.lease is not None and not retries):
                continue
            end = span.chunk_start + size - 1 if span.end is None else min(span.end, span.chunk_start + size - 1)
            node.proposals += 1
            record = node.state.propose(span, name, 0, end, committed, lease_ms=LEASE_MS, instance=node.name,
                                        proposal=node.proposals, now_ms=now)
            offset = len(log)
            log.append((offset, now, record))
            if node.applied == offset and amount % 3:  # the proposer sometimes reads its own record at once
                node.state.apply(offset, now, record)
                node.applied += 1
            else:  # on its way: the next proposals go around it
                node.state.hold(record)
        _, verdicts = replay(log)
        granted = [(offset, Lease(r.member, r.token, r.start, r.end, ms, r.lease_ms))
                   for offset, ms, r in log if verdicts[offset] is None]
    return fleet, log, now


def valid_leases(log, verdicts) -> list[Lease]:
    return [Lease(r.member, r.token, r.start, r.end, ms, r.lease_ms) for offset, ms, r in log
            if verdicts[offset] is None]


@settings(max_examples=300, deadline=None)
@given(steps)
def test_no_two_valid_live_leases_overlap_whatever_the_interleaving(script):
    fleet, log, _ = run(script)
    _, verdicts = replay(log)
    valid = valid_leases(log, verdicts)
    for number, lease in enumerate(valid):  # at each grant's time, against everything granted before
        assert not [other for other in valid[:number]
                    if other.live_at(lease.granted_ms) and other.overlaps(lease.start, lease.end)], (lease, log)
    for node in fleet:  # every instance decided as the replay does
        for offset, ms, record in log[node.applied:]:
            node.state.apply(offset, ms, record)
        assert node.state.leases == replay(log)[0].leases or all(
            lease in valid for lease in node.state.leases)
        assert not overlapping(node.state.leases, node.state.ms)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["propose", "read"]), st.just(0), st.integers(0, 6), st.integers(1, 8),
                          st.integers(0, 400)), min_size=1, max_size=80))
def test_one_instance_proposing_ahead_of_its_verdicts_loses_none(script):
    """Alone, an instance whose proposals go around those still on their way has every one
    found valid: proposing ahead costs no conflicts."""
    _, log, _ = run(script, instances=1, retries=False)
    _, verdicts = replay(log)
    assert all(verdict is None for verdict in verdicts.values()), (verdicts, log)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_every_reader_decides_the_same(script):
    fleet, log, _ = run(script)
    first, verdicts = replay(log)
    for node in fleet:
        state = node.state
        for offset, ms, record in log[node.applied:]:
            state.apply(offset, ms, record)
        # what it decided while running equals what a restarted instance decides
        again = KeyGrants()
        assert [again.apply(offset, ms, record) for offset, ms, record in log] == list(verdicts.values())
        assert {(lease.start, lease.end, lease.granted_ms) for lease in state.live(state.ms)} <= \
            {(lease.start, lease.end, lease.granted_ms) for lease in again.live(again.ms)}


@settings(max_examples=300, deadline=None)
@given(steps, st.integers(0, 6))
def test_a_reader_of_the_compacted_log_reaches_the_same_live_leases(script, later):
    _, log, now = run(script)
    if not log:
        return
    _, verdicts = replay(log)
    # compaction keeps the newest record and every record younger than the lag (2 x lease)
    lag = 2 * LEASE_MS
    at = now + later * 200
    kept = [entry for entry in log[:-1] if entry[1] >= at - lag] + [log[-1]]
    compacted_state = KeyGrants()
    compacted = {offset: compacted_state.apply(offset, ms, record) for offset, ms, record in kept}
    for offset, ms, _record in kept:
        if ms >= at - lag + LEASE_MS:  # young enough that its lease may still be live
            assert compacted[offset] == verdicts[offset], (offset, log)
    full_live = {lease for lease in valid_leases(log, verdicts) if lease.live_at(at)}
    assert {lease for lease in valid_leases(kept, compacted) if lease.live_at(at)} == full_live
