"""The engine splits a read with one plan per set of active range sets, whatever order the
sets were last asked for in: keying plans by that order made a plan per permutation and
grew memory under steady load."""

from __future__ import annotations

import itertools

from harness.batches import Rec, kafka_python_batch
from proxy.keyrange.engine import MAX_PLANS, KeyRangeEngine, SharedReads, canonical_sets
from proxy.keyrange.settings import KeyRangeTopicSettings
from proxy.records.batch import iter_batches
from proxy.records.keyhash import key_hash
from proxy.virtual.names import share_ranges

RECORDS_CACHED = KeyRangeTopicSettings()  # the default: reserve.message.value.range.fetch=true

PARTITION = ("orders", 0)
SHARES = [(r,) for r in share_ranges(4)]


def _engine() -> KeyRangeEngine:
    return KeyRangeEngine(cache_bytes=1 << 20, topic_settings=lambda name: RECORDS_CACHED, topic_name=lambda key: None)


def _log() -> bytes:
    records = [Rec(offset_delta=i, key=b"k%d" % i, value=b"v%d" % i) for i in range(64)]
    return kafka_python_batch(records)


def _keys(blob: bytes) -> list[bytes]:
    return [record.key for batch in iter_batches(blob) for record in batch.records()]


def _expected(share: tuple) -> list[bytes]:
    return [b"k%d" % i for i in range(64) if key_hash(b"k%d" % i, 0) in share[0]]


def test_canonical_sets_ignore_order_and_repeats():
    for order in itertools.permutations(SHARES):
        assert canonical_sets([*order, order[0]]) == canonical_sets(SHARES)


def test_every_recency_order_of_the_active_sets_shares_one_plan():
    engine = _engine()
    reads = SharedReads(engine)
    now = 0.0
    for order in itertools.permutations(range(4)):
        for share in order:
            reads.interest(PARTITION, SHARES[share], now)
        for wanted in (order[:1], order[:2]):
            now += 0.001
            outputs, next_offset = reads.split(PARTITION, [SHARES[i] for i in wanted], 0, _log(), {},
                                               now, isolation_level=0)
            assert next_offset == 64
            assert [_keys(blob) for blob in outputs] == [_expected(SHARES[i]) for i in wanted]
    assert len(engine._plans) == 1


def test_plans_beyond_the_cap_drop_the_least_recently_used():
    engine = _engine()
    ranges = [(r,) for r in share_ranges(MAX_PLANS + 2)]
    first = engine._plan_for((ranges[0],))
    for r in ranges[1:MAX_PLANS]:
        engine._plan_for((r,))
    assert engine._plan_for((ranges[0],)) is first  # used again: now the most recent
    engine._plan_for((ranges[MAX_PLANS],))
    assert len(engine._plans) == MAX_PLANS
    assert (ranges[1],) not in engine._plans and (ranges[0],) in engine._plans
