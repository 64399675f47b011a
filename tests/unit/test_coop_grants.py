"""Cooperative grants replicated through a log (proxy.coop.grants): asks name no offsets,
every reader assigns their chunks as it applies them. Any interleaving of asks from several
instances, applied in one log order, yields chunks that never overlap a live lease; every
reader, a restarted one and one that reads a compacted log included, assigns the same.
Instances ask for their next chunk before the last is assigned (``KeyGrants.hold``), as
the proxy does, and place only their own asks, noting the others' (``KeyGrants.note``), as
the proxy does too: the log they write and the chunks they get are those of instances that
place every ask. Records of version 0 (a fixed chunk) still decode and are judged as before."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.coop.feature import generation_error
from proxy.coop.grants import (
    COMMITTED,
    LEASED,
    STALE,
    TAKEN,
    Applied,
    Committed,
    Decision,
    Grant,
    GrantFormatError,
    KeyGrants,
    Lease,
    Span,
    _stale,
    _taking,
    assign,
    decode_grant,
    decode_key,
    encode_grant,
    encode_key,
    overlapping,
    peek_instance,
    place,
)

NOTHING = Committed()
LEASE_MS = 1000
BATCH = 4  # offsets per batch of the tests' partition: [4k, 4k + 3]
BATCH_BYTES = 100


def grant(start: int, end: int, *, base: int = -1, base_ms: int = -1, held=(), floor: int = -1, member="m",
          token: int = 0, proposal: int = 0, lease_ms: int = LEASE_MS, reset=False, read_from=None) -> Grant:
    """A version 0 record: the fixed chunk [start, end]."""
    return Grant(proposal, "i", member, token, start, end, start if read_from is None else read_from, lease_ms,
                 base, base_ms, floor, end + 1, reset, tuple(held), version=0)


def verdict(state: KeyGrants, offset: int, ms: int, record: Grant) -> str | None:
    return state.apply(offset, ms, record).reason


def batches(start: int, end: int) -> list[tuple[int, int]]:
    """The batches a read from ``start`` holds up to ``end`` (as ``chunks.batch_bounds``)."""
    out, at = [], start
    while at <= end:
        last = min((at // BATCH + 1) * BATCH - 1, end)
        out.append((last, BATCH_BYTES))
        at = last + 1
    return out


def ask(state: KeyGrants, span: Span, end: int, *, member="m", token=0, batch_limit=2, committed=NOTHING,
        instance="i", proposal=0, now_ms=1000, view=(-1, -1), before_read=False) -> Grant:
    """``state``'s ask for ``member`` from ``span``, its read holding batches up to ``end``,
    chunks of ``batch_limit`` batches at most; ``before_read``: asked before the read, the
    partition known to hold offsets up to ``end``, chunks of ``batch_limit`` batches' offsets."""
    if before_read:
        return state.ask(span, member, token, (), end, batch_limit * BATCH_BYTES, committed, lease_ms=LEASE_MS,
                         instance=instance, proposal=proposal, now_ms=now_ms, view=view,
                         offsets=batch_limit * BATCH)
    return state.ask(span, member, token, batches(span.start, end), end, batch_limit * BATCH_BYTES, committed,
                     lease_ms=LEASE_MS, instance=instance, proposal=proposal, now_ms=now_ms, view=view)


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
    record = Grant(42, "instance-1", "member-é", 30, 30, 39, 30, 45000, 17, 140, 5, 40, True, held,
                   1 << 20, 3, ((31, 16384), (39, 9000)))
    assert record.version == 2 and decode_grant(encode_grant(record)) == record
    before_read = Grant(42, "instance-1", "member-é", 30, 30, 900, 30, 45000, 17, 140, 5, 40, False, held,
                        1 << 20, 3, (), offsets=9000)
    assert decode_grant(encode_grant(before_read)) == before_read
    batched = Grant(42, "instance-1", "member-é", 30, 30, 39, 30, 45000, 17, 140, 5, 40, True, held,
                    1 << 20, 3, ((31, 16384), (39, 9000)), version=1)
    assert decode_grant(encode_grant(batched)) == batched  # version 1 still reads
    old = Grant(42, "instance-1", "member-é", 30, 30, 39, 30, 45000, 17, 140, 5, 40, True, held, version=0)
    assert decode_grant(encode_grant(old)) == old and decode_grant(encode_grant(old)).fixed  # version 0 still reads
    for value in (record, before_read, batched, old):
        with pytest.raises(GrantFormatError):
            decode_grant(encode_grant(value)[:-1])
    with pytest.raises(GrantFormatError):
        decode_grant(b"\x00\x03" + encode_grant(record)[2:])  # a version this build does not know
    with pytest.raises(GrantFormatError):
        decode_grant(encode_grant(before_read)[:-4] + b"\xff\xff\xff\xff")  # a negative count of offsets
    with pytest.raises(GrantFormatError):
        decode_key(b"\x00\x07")


def test_the_first_grant_is_valid_and_a_concurrent_overlap_is_not():
    state = KeyGrants()
    assert verdict(state, 0, 1000, grant(0, 9)) is None
    # proposed with the same (empty) view, appended after: overlaps the first
    assert verdict(state, 1, 1001, grant(5, 14)) == LEASED
    # proposed before applying record 1: its proposal counts against it, valid or not
    assert verdict(state, 2, 1002, grant(10, 19, base=0, base_ms=1000, held=state.leases)) == LEASED
    # proposed after applying both: the snapshot holds the lease
    assert verdict(state, 3, 1003, grant(10, 19, base=2, base_ms=1002, held=state.leases)) is None
    assert [(lease.start, lease.end) for lease in state.leases] == [(0, 9), (10, 19)]
    assert state.frontier == 20


def test_expiry_is_decided_by_log_append_times():
    state = KeyGrants()
    verdict(state, 0, 1000, grant(0, 9))
    held = list(state.leases)
    # the lease ends at 2000: a grant of its offsets appended at 1999 is refused, at 2000 valid
    assert verdict(state, 1, 1999, grant(0, 9, base=0, base_ms=1000, held=held)) == LEASED
    assert verdict(state, 2, 2000, grant(0, 9, base=1, base_ms=1999, held=held)) is None


def test_a_stale_proposal_is_refused():
    state = KeyGrants()
    verdict(state, 0, 1000, grant(0, 9))
    assert verdict(state, 1, 2001, grant(10, 19, base=0, base_ms=1000, held=state.leases)) == STALE


def test_the_committed_floor_refuses_offsets_below_it_and_releases_leases():
    state = KeyGrants()
    verdict(state, 0, 1000, grant(0, 9))
    verdict(state, 1, 1001, grant(10, 19, base=0, base_ms=1000, held=state.leases, floor=10))
    assert [(lease.start, lease.end) for lease in state.leases] == [(10, 19)]  # [0, 9] committed
    # a proposer that read an older committed offset: refused by the floor the log carries
    assert verdict(state, 2, 1002, grant(5, 9, base=0, base_ms=1000, floor=0)) == COMMITTED


def test_a_reset_drops_the_leases_below_its_read():
    state = KeyGrants()
    verdict(state, 0, 1000, grant(0, 9))
    assert verdict(state, 1, 1001, grant(0, 104, base=0, base_ms=1000, held=state.leases, reset=True,
                                      read_from=100)) is None
    assert [(lease.start, lease.end) for lease in state.leases] == [(0, 104)]
    assert state.frontier == 105


def test_spans_skip_live_leases_and_committed_ranges_and_retries_get_their_chunk():
    state = KeyGrants()
    assert state.next_span("a", 50, NOTHING, 0, 10).start == 50  # nothing yet: the reset policy's offset
    verdict(state, 0, 1000, grant(0, 9, member="a", token=50, read_from=50))
    span = state.next_span("b", 0, NOTHING, 1000, 10)
    assert (span.start, span.end) == (10, None)
    verdict(state, 1, 1001, grant(10, 19, member="b", base=0, base_ms=1000, held=state.leases))
    verdict(state, 2, 1002, grant(30, 39, member="c", base=1, base_ms=1001, held=state.leases))
    span = state.next_span("d", 0, Committed(-1, ((20, 24),)), 1002, 10)
    assert (span.start, span.end) == (25, 29)
    retry = state.next_span("a", 50, NOTHING, 1002, 10)
    assert retry.lease is not None and (retry.start, retry.end) == (0, 9)
    assert state.next_span("a", 10, NOTHING, 1002, 1) is None  # at its limit
    # a's lease expired (by the proposer's clock): its offsets come first again
    span = state.next_span("d", 0, NOTHING, 2000, 10)
    assert (span.start, span.end) == (0, 9) and state.redelivery(span)


# -- asks: chunks assigned as the log is applied -------------------------------------------------
def chunk_of(state: KeyGrants, offset: int, ms: int, record: Grant):
    return state.apply(offset, ms, record).chunk


def test_two_instances_asking_from_the_same_state_get_chunks_that_never_overlap():
    a, b = KeyGrants(), KeyGrants()
    first = grant(0, 7, member="x")  # both instances applied the same record
    for state in (a, b):
        state.apply(0, 1000, first)
    span_a, span_b = a.next_span("m1", 0, NOTHING, 1000, 10), b.next_span("m2", 0, NOTHING, 1000, 10)
    assert span_a == span_b == Span(8, None)  # the same view: the same read
    ask_a = ask(a, span_a, 31, member="m1", instance="a", proposal=1)
    ask_b = ask(b, span_b, 31, member="m2", instance="b", proposal=1)
    assert a.expect(ask_a, 1001) == b.expect(ask_b, 1001) == (8, 15)  # each expects the same chunk
    log = KeyGrants()
    log.apply(0, 1000, first)
    assert chunk_of(log, 1, 1001, ask_a) == (8, 15)
    assert chunk_of(log, 2, 1002, ask_b) == (16, 23)  # the next one: no conflict
    # a third ask from the same read that reaches no further: everything it read is taken
    ask_c = ask(b, span_b, 15, member="m3", instance="b", proposal=2)
    decision = log.apply(3, 1003, ask_c)
    assert decision.chunk is None and decision.reason == TAKEN
    assert not overlapping(log.leases, 1003)


def test_expired_leases_go_out_again_first():
    state = KeyGrants()
    state.apply(0, 1000, grant(0, 7, member="a"))
    state.apply(1, 1500, grant(8, 15, member="b", base=0, base_ms=1000, held=state.leases))
    # at 2100 a's lease is over, b's is live: the read from the lowest free offset gets a's offsets
    span = state.next_span("c", 0, NOTHING, 2100, 10)
    assert (span.start, span.end) == (0, 7) and state.redelivery(span)
    record = ask(state, span, 7, member="c", batch_limit=8)
    decision = state.apply(2, 2100, record)
    assert decision.chunk == (0, 7) and decision.redelivered
    # an ask from above the expired lease (a proposer whose clock said it was live) gets what
    # lies above the live ones
    other = KeyGrants()
    other.apply(0, 1000, grant(0, 7, member="a"))
    other.apply(1, 1500, grant(8, 15, member="b", base=0, base_ms=1000, held=other.leases))
    late = ask(other, Span(16, None), 23, member="d")
    assert place(late, 2100, other.leases, -1) == (16, 23)


def test_an_ask_placed_at_apply_time_skips_the_expired_lease_it_did_not_read():
    state = KeyGrants()
    state.apply(0, 1000, grant(0, 7, member="a"))
    record = ask(state, Span(8, None), 31, member="b")
    # applied after a's lease ran out: still from its read (it has no records below 8)
    assert chunk_of(state, 1, 2000, record) == (8, 15)


def test_committed_offsets_are_skipped():
    state = KeyGrants()
    state.apply(0, 1000, grant(0, 7, member="a"))
    # the group committed below 20 and [24, 27]: the span stops before the range, the floor lifts the start
    committed = Committed(20, ((24, 27),))
    span = state.next_span("b", 0, committed, 1001, 10)
    assert (span.start, span.end) == (20, 23)
    record = ask(state, span, 23, member="b", committed=committed)
    assert chunk_of(state, 1, 1001, record) == (20, 23)
    # an ask of a proposer that read an older commit: the floor the log carries holds
    stale_view = ask(state, Span(8, None), 31, member="c")
    assert chunk_of(state, 2, 1002, stale_view)[0] >= 24 and state.floor == 20


def test_chunks_are_whole_batches_within_the_byte_limit():
    state = KeyGrants()
    state.apply(0, 1000, grant(0, 3, member="a"))
    record = ask(state, Span(4, None), 31, member="b", batch_limit=3)
    assert chunk_of(state, 1, 1001, record) == (4, 15)  # three batches of four
    # one batch even when it alone is above the limit
    big = state.ask(Span(16, None), "c", 0, [(19, 5000), (23, 5000)], 23, 100, NOTHING, lease_ms=LEASE_MS,
                    instance="i", proposal=1, now_ms=1002)
    assert chunk_of(state, 2, 1002, big) == (16, 19)
    # a live lease inside a batch: the chunk ends on the last whole batch before it, and the
    # next gets the rest of that batch (cut)
    state.apply(3, 1003, grant(26, 29, member="x", base=2, base_ms=1002, held=state.leases))
    whole = ask(state, Span(20, None), 31, member="d", batch_limit=4)
    assert chunk_of(state, 4, 1004, whole) == (20, 23)
    rest = ask(state, Span(24, None), 31, member="e", batch_limit=4)
    assert chunk_of(state, 5, 1005, rest) == (24, 25)


def test_an_ask_before_its_read_spans_its_count_of_offsets_up_to_what_is_known():
    a, b, log = KeyGrants(), KeyGrants(), KeyGrants()
    for state in (a, b, log):
        state.apply(0, 1000, grant(0, 3, member="x"))  # every instance applied the same record
    span = a.next_span("m1", 0, NOTHING, 1000, 10)
    first = ask(a, span, 99, member="m1", instance="a", proposal=1, before_read=True, batch_limit=5)
    second = ask(b, b.next_span("m2", 0, NOTHING, 1000, 10), 99, member="m2", instance="b", proposal=1,
                 before_read=True, batch_limit=5)
    assert first.batches == () and first.offsets == 20 and a.expect(first, 1000) == (4, 23)
    assert chunk_of(log, 1, 1001, first) == (4, 23)
    assert chunk_of(log, 2, 1002, second) == (24, 43)  # the same view: placed after it, nothing read in vain
    # the partition known to end at 48: a chunk stops there, and the next ask finds nothing
    near_end = ask(log, log.next_span("m3", 0, NOTHING, 1003, 10), 48, member="m3", before_read=True,
                   batch_limit=5)
    assert chunk_of(log, 3, 1003, near_end) == (44, 48)
    beyond = log.ask(Span(44, None), "m4", 0, (), 48, 500, NOTHING, lease_ms=LEASE_MS, instance="c", proposal=1,
                     now_ms=1004, offsets=20)
    assert log.apply(4, 1004, beyond).reason == TAKEN
    with pytest.raises(ValueError):
        log.ask(Span(45, None), "m4", 0, [(47, 100)], 47, 500, NOTHING, lease_ms=LEASE_MS, instance="c",
                proposal=2, now_ms=1003, offsets=20)  # batches read and a count: one or the other


def test_a_member_that_got_its_chunk_in_part_reads_the_rest_of_it():
    state = KeyGrants()
    state.apply(0, 1000, grant(10, 29, member="a", token=5))
    # a got [10, 17] (its read came back short): its next fetch, from 18, reads the rest
    rest = state.next_span("a", 18, NOTHING, 1001, 1)
    assert (rest.start, rest.end) == (18, 29) and rest.lease is not None
    # the same fetch again (its answer lost): the whole chunk again
    again = state.next_span("a", 5, NOTHING, 1001, 1)
    assert (again.start, again.end) == (10, 29)
    # past its chunk: a new chunk (here none: a holds its one lease, not committed)
    assert state.next_span("a", 30, NOTHING, 1001, 1) is None


def test_a_claim_takes_the_skipped_offsets_only_when_nobody_holds_them():
    a, b = KeyGrants(), KeyGrants()
    span = a.next_span("m1", 40, NOTHING, 1000, 10)
    assert (span.start, span.claim_from) == (40, 0)
    # both instances have applied record 5 of the log partition (another key's)
    claim = ask(a, span, 47, member="m1", token=40, batch_limit=8, instance="a", view=(5, 999))
    again = ask(b, b.next_span("m2", 40, NOTHING, 1000, 10), 55, member="m2", token=40, batch_limit=8, instance="b",
                view=(5, 999))
    log = KeyGrants()
    assert chunk_of(log, 6, 1000, claim) == (0, 47)
    assert chunk_of(log, 7, 1001, again) == (48, 55)  # no second claim of [0, 39]
    # a claim whose skipped offsets someone holds asks from its read
    other = ask(a, Span(40, None, claim_from=0), 55, member="m3", token=40, batch_limit=8, instance="a")
    assert place(other, 1003, log.leases, -1) is None  # [40, 55] all held
    wide = ask(a, Span(40, None, claim_from=0), 63, member="m3", token=40, batch_limit=8, instance="a")
    assert place(wide, 1003, log.leases, -1) == (56, 63)


def test_a_reset_claims_its_chunk_whole_or_nothing():
    state = KeyGrants()
    state.apply(0, 1000, grant(0, 9))
    state.reset_pending = True
    span = state.next_span("m", 100, NOTHING, 1000, 10)
    assert span.reset and (span.start, span.claim_from) == (100, 0)
    record = ask(state, span, 107, batch_limit=8)
    assert chunk_of(state, 1, 1001, record) == (0, 107)
    assert [(lease.start, lease.end) for lease in state.leases] == [(0, 107)] and state.frontier == 108


def test_stale_asks_get_nothing_and_fresh_views_of_the_partition_keep_asks_fresh():
    state = KeyGrants()
    state.apply(0, 1000, grant(0, 7))
    late = ask(state, Span(8, None), 15)
    assert verdict(state, 1, 2001, late) == STALE  # its view (record 0) is older than the lease
    # the same ask made after applying a record of another key of the partition, at 1900
    fresh = state.ask(Span(8, None), "m", 0, batches(8, 15), 15, 200, NOTHING, lease_ms=LEASE_MS, instance="i",
                      proposal=1, now_ms=1900, view=(5, 1900))
    assert (fresh.base, fresh.base_ms) == (5, 1900)
    assert state.apply(6, 2001, fresh).chunk == (8, 15)
    # an empty partition: no base, the proposer's clock is the time of its view
    blind = ask(KeyGrants(), Span(0, None), 15, now_ms=1000)
    assert blind.base == -1 and verdict(KeyGrants(), 0, 2001, blind) == STALE
    assert KeyGrants().apply(0, 1500, blind).chunk == (0, 7)


def test_an_ask_with_no_base_gets_a_chunk_only_as_its_keys_first_record():
    # i0 asks twice from an empty view, both from nothing; its second ask cannot know the first
    i0 = KeyGrants()
    first = ask(i0, Span(0, None), 3, member="m0", now_ms=10_000, instance="i0")
    i0.hold(first.proposal, (0, 3))
    second = ask(i0, i0.next_span("m0", 0, NOTHING, 10_000, 3), 7, member="m0", now_ms=10_000, instance="i0",
                 proposal=1)
    log = KeyGrants()
    assert chunk_of(log, 0, 10_000, first) == (0, 3)
    assert verdict(log, 1, 10_000, second) == STALE
    # i1, which applied nothing, asks at 10350 and again at 11001, when the first lease has
    # expired: placing the key's records again from nothing would hand m1 what m0 holds
    i1 = KeyGrants()
    assert verdict(log, 2, 10_350, ask(i1, Span(0, None), 11, member="m0", now_ms=10_350, instance="i1")) == STALE
    assert verdict(log, 3, 11_001, ask(i1, Span(8, None), 11, member="m1", now_ms=11_001, instance="i1")) == STALE
    # the same ask from a view of the key's latest record gets the offsets nobody holds
    fresh = ask(log, Span(0, None), 15, member="m1", now_ms=11_001, instance="i1", batch_limit=4)
    assert chunk_of(log, 4, 11_002, fresh) == (0, 15)


def test_an_ask_after_version_0_records_goes_around_their_chunks():
    state = KeyGrants()
    state.apply(0, 1000, grant(0, 7, member="a"))
    state.apply(1, 1001, grant(8, 15, member="b", base=0, base_ms=1000, held=state.leases))
    record = ask(state, Span(16, None), 31, member="c")
    assert chunk_of(state, 2, 1002, record) == (16, 23)
    # a version 0 record proposed alongside, judged by the ask's chunk
    assert verdict(state, 3, 1003, grant(20, 27, base=1, base_ms=1001, held=())) == LEASED


def test_a_version_0_record_is_judged_by_the_chunk_of_an_ask_noted_unplaced():
    state = KeyGrants()
    state.apply(0, 1000, grant(0, 7, member="a"))
    record = replace(ask(state, Span(8, None), 31, member="c", instance="other"), proposal=1)
    raw = encode_grant(record)
    state.note(1, 1001, decode_grant(raw, held=False), raw)
    assert verdict(state, 2, 1002, grant(12, 19, base=0, base_ms=1000, held=state.leases)) == LEASED
    assert [(lease.start, lease.end) for lease in state.leases] == [(0, 7), (8, 15)]


def test_a_record_decoded_without_its_snapshot_is_the_record_but_its_snapshot():
    state = KeyGrants()
    state.apply(0, 1000, grant(0, 7, member="a"))
    record = ask(state, Span(8, None), 31, member="c", instance="other")
    assert record.held
    assert decode_grant(encode_grant(record), held=False) == replace(record, held=())
    assert peek_instance(encode_grant(record)) == "other"
    with pytest.raises(ValueError):  # a snapshot decoded: not what note takes
        state.note(1, 1001, record, encode_grant(record))


# -- several instances, any interleaving ---------------------------------------------------------
@dataclass
class Instance:
    name: str
    state: KeyGrants = field(default_factory=KeyGrants)
    applied: int = 0  # log records applied
    proposals: int = 0
    decisions: dict = field(default_factory=dict)  # offset -> the chunk it assigned
    expected: dict = field(default_factory=dict)  # offset -> the chunk it expected for its own ask


def replay(log: list[tuple[int, int, Grant]]) -> tuple[KeyGrants, dict]:
    state = KeyGrants()
    decisions = {offset: state.apply(offset, ms, record) for offset, ms, record in log}
    return state, decisions


steps = st.lists(st.tuples(st.sampled_from(["propose", "read", "tick", "commit"]), st.integers(0, 2),
                           st.integers(0, 6), st.integers(1, 8), st.integers(0, 400)), min_size=1, max_size=80)


def read(node: Instance, log, upto: int, *, lazily: bool = False) -> None:
    """``node`` applies the log up to ``upto``; ``lazily``: as the proxy does, it places
    only its own asks (and resets) and notes the others' (``KeyGrants.note``)."""
    for offset, ms, record in log[node.applied:upto]:
        if lazily and record.instance != node.name and not record.fixed and not record.reset:
            raw = encode_grant(record)
            node.state.note(offset, ms, decode_grant(raw, held=False), raw)
        else:
            node.decisions[offset] = node.state.apply(offset, ms, record)
        if record.instance == node.name:
            node.state.settle(record.proposal)
    node.applied = max(node.applied, upto)


def run(script, instances: int = 3, members: int = 4, *, lazily: bool = False):
    """The log a script makes: each step an instance asks from what it has applied and its
    own asks still on their way (its read holding ``size`` more offsets than the span's
    start, chunks of at most two batches; or, every other ask, before its read, the
    partition known to reach as far, chunks of two batches' offsets), reads some more of
    the log, time passes, or the
    group commits a prefix of what was handed out."""
    fleet = [Instance(f"i{n}") for n in range(instances)]
    log: list[tuple[int, int, Grant]] = []
    now = 10_000
    committed = NOTHING
    for action, who, member, size, amount in script:
        node = fleet[who % instances]
        if action == "read":
            read(node, log, min(len(log), node.applied + 1 + amount % 5), lazily=lazily)
        elif action == "tick":
            now += amount
        elif action == "commit":
            handed = sorted(d.chunk[1] for d in replay(log)[1].values() if d.chunk is not None)
            if handed and amount % 3 == 0:
                committed = Committed(max(committed.stable, handed[amount % len(handed)] + 1))
            for each in fleet:
                each.state.release(committed)
        else:
            name = f"m{member % members}"
            span = node.state.next_span(name, 0, committed, now, 3)
            if span is None or span.lease is not None:  # a retry gets its chunk again: no record
                continue
            end = span.start + size * BATCH - 1 if span.end is None else min(span.end, span.start + size * BATCH - 1)
            node.proposals += 1
            record = ask(node.state, span, end, member=name, committed=committed, instance=node.name,
                         proposal=node.proposals, now_ms=now, before_read=amount % 2 == 1)
            offset = len(log)
            log.append((offset, now, record))
            node.expected[offset] = node.state.expect(record, now)
            if node.applied == offset and amount % 3:  # the proposer sometimes reads its own record at once
                read(node, log, offset + 1, lazily=lazily)
            elif node.expected[offset] is not None:  # on its way: the next asks go around it
                node.state.hold(record.proposal, node.expected[offset])
    for node in fleet:
        read(node, log, len(log), lazily=lazily)
    return fleet, log, now


def granted(log, decisions) -> list[Lease]:
    return [Lease(r.member, r.token, *decisions[offset].chunk, ms, r.lease_ms) for offset, ms, r in log
            if decisions[offset].chunk is not None]


@settings(max_examples=300, deadline=None)
@given(steps)
def test_no_chunk_overlaps_a_live_lease_whatever_the_interleaving(script):
    fleet, log, _ = run(script)
    final, decisions = replay(log)
    leases = granted(log, decisions)
    # At each grant's time, against everything granted before, to another member (or another
    # fetch of it): an ask the member makes again at its lease's start, from an instance that
    # has not read the lease yet, is a retry and gets its own chunk again.
    for number, lease in enumerate(leases):
        assert not [other for other in leases[:number]
                    if other.live_at(lease.granted_ms) and other.overlaps(lease.start, lease.end)
                    and (other.member, other.token) != (lease.member, lease.token)], (lease, log)
    for offset, _ms, record in log:  # within what the proposer read (a claim reaches below it)
        chunk = decisions[offset].chunk
        if chunk is not None:
            assert (record.start if chunk[0] < record.read_from else record.read_from) <= chunk[0] <= chunk[1]
            assert chunk[1] <= record.end
    for node in fleet:  # every instance assigned as the replay does, in the same order
        assert node.decisions == decisions
        assert node.state.leases == final.leases and not overlapping(node.state.leases, node.state.ms)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["propose", "read", "tick"]), st.just(0), st.integers(0, 6),
                          st.integers(1, 8), st.integers(0, 400)), min_size=1, max_size=80))
def test_one_instance_asking_ahead_gets_the_chunks_it_expects(script):
    """Alone, an instance whose asks go around those still on their way gets every one the
    chunk it expected: asking ahead costs nothing (only an ask whose view is older than the
    lease, the proposer having stalled, is refused)."""
    fleet, log, _ = run(script, instances=1)
    _, decisions = replay(log)
    expected = fleet[0].expected
    assert all(decisions[offset].chunk == expected[offset] or decisions[offset].reason == STALE
               for offset in expected), (decisions, expected, log)
    assert all(decision.reason != TAKEN for decision in decisions.values())


@settings(max_examples=400, deadline=None)
@given(steps)
def test_instances_that_place_only_their_own_asks_write_and_get_what_placing_every_ask_does(script):
    """Instances that note the other instances' asks and rebuild the state when they read
    it write the same log as instances that place every ask (the frontier each record
    carries aside: it may lag), get the same chunks, and end in the same state."""
    eager, log, _ = run(script)
    lazy, lazy_log, _ = run(script, lazily=True)
    assert [(offset, ms, replace(record, frontier=-1)) for offset, ms, record in lazy_log] == \
        [(offset, ms, replace(record, frontier=-1)) for offset, ms, record in log]
    for placing, noting in zip(eager, lazy):
        assert noting.decisions == {offset: placing.decisions[offset] for offset in noting.decisions}
        assert noting.expected == placing.expected
        assert (noting.state.leases, noting.state.floor, noting.state.offset, noting.state.ms) == \
            (placing.state.leases, placing.state.floor, placing.state.offset, placing.state.ms)
        assert noting.state.frontier is None or noting.state.frontier <= placing.state.frontier


@settings(max_examples=300, deadline=None)
@given(steps)
def test_every_reader_assigns_the_same(script):
    _, log, _ = run(script)
    _, decisions = replay(log)
    again, twice = replay(log)  # a restarted instance, the whole log
    assert twice == decisions
    assert [d.chunk for d in replay(list(log))[1].values()] == [d.chunk for d in decisions.values()]


@settings(max_examples=300, deadline=None)
@given(steps, st.integers(0, 6))
def test_a_reader_of_the_compacted_log_reaches_the_same_live_leases(script, later):
    _, log, now = run(script)
    if not log:
        return
    _, decisions = replay(log)
    # compaction keeps the newest record and every record younger than the lag (2 x lease)
    lag = 2 * LEASE_MS
    at = now + later * 200
    kept = [entry for entry in log[:-1] if entry[1] >= at - lag] + [log[-1]]
    _, compacted = replay(kept)
    for offset, ms, _record in kept:
        if ms >= at - lag + LEASE_MS:  # young enough that its lease may still be live
            assert compacted[offset].chunk == decisions[offset].chunk, (offset, log)
    full_live = {lease for lease in granted(log, decisions) if lease.live_at(at)}
    assert {lease for lease in granted(kept, compacted) if lease.live_at(at)} == full_live


def test_reads_reach_as_far_ahead_as_other_instances_took_chunks_lately():
    alone = KeyGrants()
    alone.apply(0, 1000, ask(alone, Span(0, None), 7, instance="a", now_ms=1000))
    alone.apply(1, 1001, ask(alone, Span(8, None), 15, instance="a", proposal=1))
    assert alone.ahead("a") == 1  # one instance reads what the member asked for
    a, b = KeyGrants(), KeyGrants()
    log = KeyGrants()
    asks = [ask(b, Span(0, None), 63, member=f"b{n}", instance="b", proposal=n, view=(9, 999)) for n in range(3)]
    asks.append(ask(a, Span(0, None), 63, member="a0", instance="a", view=(9, 999)))
    for offset, record in enumerate(asks, 10):
        log.apply(offset, 1000 + offset, record)
    # three chunks of b took a's read before it was applied: a's next read holds four chunks
    assert log.ahead("a") == 4 and log.ahead("b") == 3  # b's second and third asks were pushed too
    assert log.ahead("c") == 2  # not asked yet: one per instance asking


def test_commits_end_leases_here_but_not_in_the_snapshots_this_instance_writes():
    state = KeyGrants()
    state.apply(0, 1000, grant(0, 7, member="a"))
    state.apply(1, 1001, grant(8, 15, member="b", base=0, base_ms=1000, held=state.leases))
    state.release(Committed(8))  # a's chunk is committed
    assert state.uncommitted() == 1 and [lease.member for lease in state.live(1002)] == ["b"]
    assert state.held_by("a", 1002) == 0
    # the snapshot stays the log's: another reader may not have read the commit yet
    record = ask(state, Span(16, None), 23, member="c")
    assert [(lease.start, lease.end) for lease in record.held] == [(0, 7), (8, 15)]


# -- placing a window again: the indexed placement decides as the rule does ----------------------
def _assign_by_the_rule(ask: Grant, ms: int, between: list[Applied]):
    """``assign`` as the module docstring states it: every record placed with ``place`` over
    the leases ``_taking`` leaves, sorted again each time (the oracle of the indexed one)."""
    if _stale(ask, ms, between):
        return Decision(None, STALE), None, ask.floor
    leases, floor = list(ask.held), ask.base_floor
    for record in between:
        floor = max(floor, record.grant.floor)
        placed = (record.chunk if record.grant.fixed else
                  None if record.reason == STALE else place(record.grant, record.ms, leases, floor))
        leases = _taking(leases, floor, record.grant, placed, record.ms)
    floor = max(floor, ask.floor)
    chunk = place(ask, ms, leases, floor)
    leases = [lease for lease in leases if lease.live_at(ms)]
    if chunk is None:
        return Decision(None, TAKEN), _taking(leases, floor, ask, None, ms), floor
    return Decision(chunk), _taking(leases, floor, ask, chunk, ms), floor


_offsets = st.integers(0, 60)


@st.composite
def _lease_strategy(draw) -> Lease:
    start = draw(_offsets)
    return Lease(draw(st.sampled_from("abc")), draw(st.integers(-1, 5)), start, start + draw(st.integers(0, 12)),
                 draw(st.integers(0, 40)), draw(st.integers(1, 30)))


@st.composite
def _ask_strategy(draw, ms: int) -> Grant:
    read_from = draw(_offsets)
    start = read_from - draw(st.sampled_from([0, 0, 0, 1, 5]))  # now and then a claim below the read
    end = read_from + draw(st.integers(0, 20))
    offsets = draw(st.sampled_from([0, 0, 1, 3, 8]))
    batches = () if offsets else tuple(sorted({(draw(st.integers(read_from, end)), draw(st.integers(1, 50)))
                                               for _ in range(draw(st.integers(0, 4)))}))
    return Grant(draw(st.integers(1, 1000)), draw(st.sampled_from(["i1", "i2"])), draw(st.sampled_from("abc")),
                 draw(st.integers(-1, 5)), start, end, read_from, draw(st.integers(1, 30)), 0, ms - 1,
                 draw(st.integers(-1, 30)), -1, reset=draw(st.sampled_from([False] * 9 + [True])),
                 held=tuple(draw(st.lists(_lease_strategy(), max_size=12))), max_bytes=draw(st.integers(1, 120)),
                 base_floor=draw(st.integers(-1, 20)), batches=batches, offsets=offsets)


@st.composite
def _windows(draw):
    between = []
    ms = 0
    for offset in range(draw(st.integers(0, 8))):
        ms += draw(st.integers(0, 6))
        grant = draw(_ask_strategy(ms))
        if draw(st.sampled_from([False] * 6 + [True])):  # a version 0 record: its chunk as judged
            chunk = draw(st.sampled_from([None, (grant.read_from, grant.end)]))
            grant = Grant(grant.proposal, grant.instance, grant.member, grant.token, grant.read_from, grant.end,
                          grant.read_from, grant.lease_ms, 0, ms - 1, grant.floor, -1, version=0)
            between.append(Applied(offset + 1, ms, grant, chunk, None if chunk else LEASED))
        else:
            reason = draw(st.sampled_from([None, None, None, STALE, TAKEN]))
            between.append(Applied(offset + 1, ms, grant, None, reason))
    ms += draw(st.integers(0, 6))
    return draw(_ask_strategy(ms)), ms, between


@settings(max_examples=400, deadline=None)
@given(_windows())
def test_the_indexed_placement_decides_what_the_rule_decides(window):
    ask, ms, between = window
    assert assign(ask, ms, between) == _assign_by_the_rule(ask, ms, between)
