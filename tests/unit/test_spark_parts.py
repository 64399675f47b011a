"""The pure parts of the ``keyrange`` Spark source: option checks, streaming offsets and
admission control, and decoding a fetched blob into a share's rows (no Spark, no broker)."""

from __future__ import annotations

import pytest

from harness.batches import Rec, control_batch, kafka_python_batch
from proxy.ranges import FULL_RANGE, equal_share
from proxy.records.keyhash import key_hash
from proxy.spark import offsets
from proxy.spark.decode import decode_partition
from proxy.spark.options import KeyRangeSourceError, parse_options

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9192", "subscribe": "orders,payments"}


# -- options --------------------------------------------------------------------------------

def test_defaults_follow_sparks_kafka_source():
    batch = parse_options(BASE, streaming=False)
    assert batch.topics == ("orders", "payments")
    assert (batch.starting_offsets, batch.ending_offsets, batch.splits) == ("earliest", "latest", 1)
    assert not batch.read_committed and not batch.include_headers
    stream = parse_options({**BASE, "MAXOFFSETSPERTRIGGER": "50", "commit.group.id": "g"}, streaming=True)
    assert (stream.starting_offsets, stream.max_offsets_per_trigger, stream.commit_group_id) == ("latest", 50, "g")


@pytest.mark.parametrize("extra, streaming, message", [
    ({"kafka.bootstrap.servers": "nohost"}, False, "'nohost' is not 'host:port'"),
    ({"subscribe": "a,,b"}, False, "holds an empty topic name"),
    ({"subscribe": "a,a"}, False, "names a topic twice"),
    ({"splits.per.partition": "0"}, False, "between 1 and 1024, got 0"),
    ({"splits.per.partition": "1025"}, False, "between 1 and 1024, got 1025"),
    ({"endingOffsets": "latest"}, True, "only for batch reads"),
    ({"commit.group.id": "g"}, False, "only for streaming reads"),
    ({"maxOffsetsPerTrigger": "-3"}, True, "must be positive, got -3"),
    ({"includeHeaders": "maybe"}, False, "includeHeaders must be one of true, false"),
    ({"failOnDataLoss": "false"}, False, "unknown option(s) failondataloss"),
])
def test_bad_options_name_the_option_and_value(extra, streaming, message):
    with pytest.raises(KeyRangeSourceError, match=None) as caught:
        parse_options({**BASE, **extra}, streaming=streaming)
    assert message in str(caught.value)


def test_required_options():
    with pytest.raises(KeyRangeSourceError, match="option kafka.bootstrap.servers is required"):
        parse_options({"subscribe": "t"}, streaming=False)
    with pytest.raises(KeyRangeSourceError, match="option subscribe is required"):
        parse_options({"kafka.bootstrap.servers": "h:1"}, streaming=False)


# -- streaming offsets ----------------------------------------------------------------------

def test_offsets_round_trip_through_json_and_refuse_another_k():
    start = offsets.spread({("t", 0): 5, ("t", 1): 9}, 3)
    doc = offsets.to_json(start)
    assert doc == {"t": {"0": {"0": 5, "1": 5, "2": 5}, "1": {"0": 9, "1": 9, "2": 9}}}
    assert offsets.from_json(doc, 3) == start
    with pytest.raises(KeyRangeSourceError, match="splits.per.partition is 4"):
        offsets.from_json(doc, 4)
    with pytest.raises(KeyRangeSourceError, match="not an integer"):
        offsets.from_json({"t": {"0": {"0": "x"}}}, 1)


def test_advance_without_limit_goes_to_latest_and_never_back():
    start = {("t", 0, 0): 10, ("t", 0, 1): 30}
    assert offsets.advance(start, {("t", 0): 20}, 2, None) == {("t", 0, 0): 20, ("t", 0, 1): 30}


def test_advance_shares_the_limit_in_proportion_and_always_progresses():
    start = {("t", 0, s): 0 for s in range(4)} | {("t", 1, s): 0 for s in range(4)}
    end = offsets.advance(start, {("t", 0): 1000, ("t", 1): 1000}, 4, 100)
    # 8 shares with 1000 offsets each, about 250 records a share: 100 records = 50 offsets each
    assert set(end.values()) == {50}
    assert sum(end.values()) / 4 == 100
    tiny = offsets.advance({("t", 0, 0): 0, ("t", 0, 1): 0}, {("t", 0): 10**6}, 2, 1)
    assert all(v >= 1 for v in tiny.values())
    lopsided = offsets.advance({("t", 0, 0): 0, ("t", 1, 0): 990}, {("t", 0): 1000, ("t", 1): 1000}, 1, 101)
    # 1010 offsets left in all, 101 allowed: each share gets a tenth of what it has left
    assert lopsided == {("t", 0, 0): 100, ("t", 1, 0): 991}


def test_new_partitions_start_at_their_earliest_offset():
    end = offsets.advance({("t", 0, 0): 4}, {("t", 0): 8, ("t", 1): 6}, 1, None, {("t", 1): 2})
    assert end == {("t", 0, 0): 8, ("t", 1, 0): 6}


def test_partition_minimums():
    assert offsets.partition_minimums({("t", 0, 0): 7, ("t", 0, 1): 3, ("u", 2, 0): 9}) == {("t", 0): 3, ("u", 2): 9}


# -- decoding ---------------------------------------------------------------------------------

def _blob(base: int, keys, codec: int = 0, **kwargs) -> bytes:
    return kafka_python_batch([Rec(i, k, f"v{base + i}".encode()) for i, k in enumerate(keys)], codec=codec,
                              base_offset=base, **kwargs)


def test_decode_keeps_the_share_in_offset_order_within_the_window():
    keys = [None if i % 4 == 0 else f"k{i}".encode() for i in range(40)]
    blob = _blob(100, keys[:20]) + _blob(120, keys[20:], codec=1)  # the second batch gzip
    share = equal_share(1, 3)
    decoded = decode_partition(blob, fetch_offset=105, end_offset=133, share=share)
    expected = [100 + i for i, k in enumerate(keys)
                if 105 <= 100 + i < 133 and share.start <= key_hash(k, 100 + i) <= share.end]
    assert decoded.columns.offsets == expected
    assert decoded.next_offset == 133
    whole = decode_partition(blob, fetch_offset=100, end_offset=1000, share=FULL_RANGE)
    assert whole.columns.offsets == list(range(100, 140)) and whole.next_offset == 140
    assert whole.columns.values[0] == b"v100" and whole.columns.keys[0] is None


def test_decode_drops_aborted_transactions_under_read_committed():
    aborted = _blob(0, [b"a", b"b"], transactional=True, producer_id=7, producer_epoch=0, base_sequence=0)
    marker = control_batch(base_offset=2, commit=False, producer_id=7)
    committed = _blob(3, [b"c"], transactional=True, producer_id=8, producer_epoch=0, base_sequence=0)
    blob = aborted + marker + committed
    got = decode_partition(blob, fetch_offset=0, end_offset=10, share=FULL_RANGE, read_committed=True,
                           aborted_transactions=[(7, 0)])
    assert got.columns.offsets == [3] and got.next_offset == 4
    raw = decode_partition(blob, fetch_offset=0, end_offset=10, share=FULL_RANGE)
    assert raw.columns.offsets == [0, 1, 3]


def test_decode_reports_a_truncated_tail():
    blob = _blob(0, [b"a", b"b"]) + _blob(2, [b"c"])[:30]
    got = decode_partition(blob, fetch_offset=0, end_offset=10, share=FULL_RANGE)
    assert got.truncated and got.columns.offsets == [0, 1] and got.next_offset == 2
