"""The individual-commit log's records: key/value layout (proxy.commits.codec), the producer's record
encoder (proxy.commits.producer) and how memory folds them (proxy.commits.table)."""

from __future__ import annotations

from proxy.commits.codec import decode_key, decode_value, encode_key, encode_value
from proxy.commits.state import CommitState
from proxy.commits.table import StateTable


def test_key_and_value_roundtrip_with_a_version_prefix():
    key = encode_key("group-α", "topic", 7)
    assert key[:2] == b"\x00\x00"
    assert decode_key(key) == ("group-α", "topic", 7)
    assert encode_key("group-α", "topic", 7) == key  # compaction needs identical key bytes
    state = CommitState(40, ((43, 45), (48, 49)))
    value = encode_value(state)
    assert value[:2] == b"\x00\x01"  # version 1: R as varint deltas
    assert decode_value(value) == state


def test_reader_keeps_the_newest_record_per_key_and_tombstones_delete():
    table = StateTable()
    table.apply(0, encode_key("g", "t", 0), encode_value(CommitState(0, ((3, 4),))))
    table.apply(1, encode_key("g", "t", 1), encode_value(CommitState(5, ((7, 7), (9, 9)))))
    table.apply(2, encode_key("g", "t", 0), encode_value(CommitState(6, ())))
    assert table.groups["g"] == {("t", 0): (2, CommitState(6, ())), ("t", 1): (1, CommitState(5, ((7, 7), (9, 9))))}
    assert table.held == 2
    # An older record read after a newer one (re-reading the log) changes nothing.
    table.apply(0, encode_key("g", "t", 0), encode_value(CommitState(0, ((3, 4),))))
    assert table.groups["g"][("t", 0)] == (2, CommitState(6, ()))
    table.apply(3, encode_key("g", "t", 1), None)
    assert table.groups["g"] == {("t", 0): (2, CommitState(6, ()))}
    assert table.held == 0
    table.apply(4, encode_key("g", "t", 0), None)
    assert "g" not in table.groups
    # Unreadable records are skipped, not fatal.
    table.apply(5, b"\x7f\x7fgarbage", b"")
    assert table.groups == {}


def test_fast_value_encoder_writes_exactly_what_the_schema_codec_writes():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from proxy.commits.codec import encode_value_generic
    from proxy.commits.state import apply_ranges

    offsets = st.integers(0, (1 << 62))
    @settings(max_examples=300, deadline=None)
    @given(offsets, st.lists(st.tuples(offsets, st.integers(0, 1 << 40)).map(lambda r: (r[0], r[0] + r[1])),
                             max_size=200))
    def check(stable, ranges):
        state = apply_ranges(CommitState(stable), ranges)  # a state: canonical R above S
        assert encode_value(state) == encode_value_generic(state)
        assert decode_value(encode_value(state)) == state
        assert decode_value(encode_value_generic(state, version=0)) == state  # earlier releases wrote v0

    check()


def test_memory_joins_records_of_one_epoch_in_any_order_and_a_reset_replaces():
    table = StateTable()
    key = encode_key("g", "t", 0)
    table.apply(5, key, encode_value(CommitState(0, ((3, 4),))))
    table.apply(4, key, encode_value(CommitState(0, ((7, 7),))))  # older, from a stale read: joins
    assert table.groups["g"][("t", 0)] == (5, CommitState(0, ((3, 4), (7, 7))))
    table.apply(6, key, encode_value(CommitState(2, (), epoch=1)))  # a reset replaces
    assert table.groups["g"][("t", 0)] == (6, CommitState(2, (), epoch=1))
    table.apply(3, key, encode_value(CommitState(0, ((9, 9),))))  # before the reset: nothing
    assert table.groups["g"][("t", 0)] == (6, CommitState(2, (), epoch=1))
    table.apply(2, key, None)  # an older tombstone: ignored
    assert ("t", 0) in table.groups["g"]
    table.apply(7, key, None)
    assert table.groups == {}


def test_values_with_tagged_fields_are_read_through_the_codec():
    from proxy.commits.codec import encode_value_generic

    state = CommitState(7, ((9, 9), (12, 20)))
    compact = encode_value_generic(state)
    assert decode_value(compact[:-1] + b"\x01\x05\x02ab") == state  # v1 with a tagged field
    plain = encode_value_generic(state, version=0)
    # A newer writer's tagged field (tag 3, one byte) on the first range, then one on the value.
    ranged = plain[:11 + 16] + b"\x01\x03\x01x" + plain[11 + 17:]
    assert decode_value(ranged) == state
    assert decode_value(plain[:-1] + b"\x01\x05\x02ab") == state
    assert decode_value(memoryview(plain)) == state


def test_fast_key_and_record_encoders_write_exactly_what_the_generic_ones_write():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from proxy.commits.codec import encode_key_generic
    from proxy.commits.producer import encode_records
    from proxy.records.builder import encode_record

    @settings(max_examples=200, deadline=None)
    @given(st.text(max_size=300), st.text(max_size=300), st.integers(-(1 << 31), (1 << 31) - 1))
    def keys(group, topic, partition):
        assert encode_key(group, topic, partition) == encode_key_generic(group, topic, partition)
        assert decode_key(encode_key(group, topic, partition)) == (group, topic, partition)

    @settings(max_examples=100, deadline=None)
    @given(st.lists(st.tuples(st.binary(max_size=200), st.one_of(st.none(), st.binary(max_size=20000))),
                    max_size=40))
    def records(items):
        assert encode_records(items) == [encode_record(offset_delta=n, key=k, value=v)
                                         for n, (k, v) in enumerate(items)]

    keys()
    records()
    many = [(b"k", b"v" * 70)] * 9000  # offset deltas beyond the small-number table
    assert encode_records(many) == [encode_record(offset_delta=n, key=k, value=v) for n, (k, v) in enumerate(many)]
