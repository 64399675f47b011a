"""Striped virtual topics (``orders.coop4``): names, stripes of whole batches, and their
watermarks kept apart from key shares'. Pure functions, no broker."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from proxy.commits.shadows import parse_share_shadow, share_shadow
from proxy.commits.state import MAX_SHARES, CommitState, checked_marks, settle, share_count, watermark_floor
from proxy.commits.watermarks import decode_metadata, encode_metadata, per_share
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.records.batch import RecordBatch, iter_batches
from proxy.records.builder import build_batch, encode_record
from proxy.records.stripes import STRIPED_MARKS, Stripe, split_stripes, stripe_of
from proxy.server.config import ConfigError, build_config
from proxy.virtual import commits
from proxy.virtual.fetch import compose
from proxy.virtual.names import VirtualNames, virtual_topic_id
from proxy.virtual.precheck import Precheck


def _batch(base: int, count: int, *, control: bool = False) -> bytes:
    records = [encode_record(offset_delta=i, key=b"hot", value=b"v") for i in range(count)]
    return build_batch(base_offset=base, last_offset_delta=count - 1, records=records, record_count=count,
                       base_timestamp=1, max_timestamp=1, attributes=0x30 if control else 0)


def _bases(blob: bytes) -> list[int]:
    return [e.header.base_offset for e in iter_batches(blob) if isinstance(e, RecordBatch)]


def test_names_parse_both_kinds_and_the_last_suffix_wins():
    names = VirtualNames(".kr", 64, ".coop")
    vt = names.parse("orders.coop4")
    assert (vt.real, vt.shares, vt.striped) == ("orders", 4, True)
    assert names.parse("orders.kr4").striped is False
    assert names.parse("a.kr2.coop8").real == "a.kr2" and names.parse("a.coop2.kr8").real == "a.coop2"
    assert names.parse("orders.coop1") is None and names.parse("orders.coop") is None
    assert "stripes" in names.out_of_bounds("orders.coop65")
    assert names.name("orders", 4, True) == "orders.coop4"
    assert names.name_of_marks("orders", STRIPED_MARKS + 4) == "orders.coop4"
    assert names.name_of_marks("orders", 4) == "orders.kr4"
    with pytest.raises(ValueError, match="must differ"):
        VirtualNames(".kr", 64, ".kr")


def test_a_striped_topic_has_its_own_id_and_watermark_k():
    real = uuid.UUID("12345678-1234-5678-1234-567812345678")
    names = VirtualNames()
    striped, keyed = names.parse("t.coop4"), names.parse("t.kr4")
    assert striped.topic_id(real) != keyed.topic_id(real) == virtual_topic_id(real, 4)
    assert striped.topic_id(real) == virtual_topic_id(real, 4, True)
    assert (striped.mark_k, keyed.mark_k) == (STRIPED_MARKS + 4, 4)
    assert striped.share_of(6) == Stripe(4, 2) and keyed.share_of(6) == (keyed.share_range(6),)


def test_stripes_balance_batches_whose_size_is_in_step_with_k():
    # 100 records a batch and K = 4: base offsets 0, 100, 200, ... are all 0 mod 4, yet
    # every stripe gets close to a quarter.
    counts = Counter(stripe_of(base, 4) for base in range(0, 400_000, 100))
    assert sorted(counts) == [0, 1, 2, 3]
    assert min(counts.values()) > 0.9 * 1000 and max(counts.values()) < 1.1 * 1000


def test_split_stripes_moves_whole_batches_and_gives_control_batches_to_every_stripe():
    blob = b"".join([_batch(0, 5), _batch(5, 3), _batch(8, 1, control=True), _batch(9, 4), _batch(13, 2)])
    read = split_stripes(blob + _batch(15, 3)[:-7], 3)  # the broker cut the last batch short
    assert read.next_offset == 15
    placed = {base: stripe_of(base, 3) for base in (0, 5, 9, 13)}
    for index, output in enumerate(read.outputs):
        assert _bases(output) == sorted([b for b, s in placed.items() if s == index] + [8])
        assert read.records[index] == sum({0: 5, 5: 3, 9: 4, 13: 2}[b] for b, s in placed.items() if s == index)
    assert bytes(_batch(5, 3)) in read.outputs[placed[5]]  # the batch's bytes as they came


def test_a_stripe_answer_ends_past_the_other_stripes_records():
    blob = b"".join(_batch(base, 10) for base in range(0, 200, 10))
    read = split_stripes(blob, 4)
    for output in read.outputs:
        composed = compose(output, 0, read.next_offset, 0)
        assert composed.next_offset == 200  # a control record at 199 when the stripe's last batch is earlier


def test_share_count_keeps_stripes_apart_from_key_shares():
    assert share_count(4) == 4 and share_count(STRIPED_MARKS + 4) == 4
    assert share_count(MAX_SHARES + 1) == 0 and share_count(STRIPED_MARKS) == 0
    assert share_count(STRIPED_MARKS + MAX_SHARES + 1) == 0
    # Key shares 0-3 of K=4 all at 100, stripes 0-2 of K=4 at 500: the stripes are not complete,
    # so only the key shares decide S (a stripe's watermark is not a key share's).
    marks = checked_marks([(4, i, 100, 1) for i in range(4)] + [(STRIPED_MARKS + 4, i, 500, 1) for i in range(3)])
    assert watermark_floor(marks) == 100
    marks = checked_marks([(STRIPED_MARKS + 2, 0, 70, 1), (STRIPED_MARKS + 2, 1, 60, 1)])
    assert watermark_floor(marks) == 60
    assert per_share(marks) == {STRIPED_MARKS + 2: [70, 60]}
    with pytest.raises(ValueError):
        checked_marks([(STRIPED_MARKS + 2, 2, 70, 1)])  # a stripe outside its K


def test_striped_watermarks_survive_the_offset_metadata_round_trip():
    state = settle(CommitState(10, (), 3, checked_marks([(STRIPED_MARKS + 2, 0, 70, 1), (STRIPED_MARKS + 2, 1, 60, 2)])))
    assert state.stable == 60
    epoch, marks = decode_metadata(encode_metadata(state))
    assert (epoch, marks) == (3, state.marks)


class _Resolver:
    def virtual(self, name):
        return VirtualNames().parse(name)

    def real_id(self, real):
        return None


def test_a_striped_commit_edits_its_own_watermark_k():
    cls = messages.body_class(ApiKey.OFFSET_COMMIT, "request")
    body = messages.new_body(ApiKey.OFFSET_COMMIT, 8, "request", group_id="g", topics=[
        cls.OffsetCommitRequestTopic(name="t.coop2", partitions=[
            cls.OffsetCommitRequestPartition(partition_index=0, committed_offset=40),
            cls.OffsetCommitRequestPartition(partition_index=3, committed_offset=9)])])
    plan = commits.commit_plan(body, _Resolver())
    assert plan.edits == {("t", 0): {STRIPED_MARKS + 2: {0: 40}}, ("t", 1): {STRIPED_MARKS + 2: {1: 9}}}


def test_shadow_groups_of_stripes_are_apart_from_key_shares():
    striped = share_shadow("g", STRIPED_MARKS + 4, 3, 50)
    assert striped != share_shadow("g", 4, 3, 50)
    parsed = parse_share_shadow(striped, 50)
    assert (parsed.shares, parsed.share) == (STRIPED_MARKS + 4, 3)


def test_precheck_sees_either_suffix():
    check = Precheck((".kr", ".coop"))
    assert check.may_name_virtual(b"\x00\x0corders.coop4") and check.may_name_virtual(b"orders.kr2")
    assert not check.may_name_virtual(b"orders.coop") and not check.may_name_virtual(b"orders")


def test_config_refuses_one_suffix_for_both_kinds():
    with pytest.raises(ConfigError, match="virtual.coop.suffix"):
        build_config({"bootstrap.servers": "127.0.0.1:9092", "virtual.coop.suffix": ".kr"})
    assert build_config({"bootstrap.servers": "127.0.0.1:9092"}).virtual.coop_suffix == ".coop"


def test_offset_fetch_of_every_topic_numbers_stripes_by_their_k():
    req_cls = messages.body_class(ApiKey.OFFSET_FETCH, "request")
    body = messages.new_body(ApiKey.OFFSET_FETCH, 8, "request", groups=[
        req_cls.OffsetFetchRequestGroup(group_id="g", topics=None)])
    plan = commits.offset_fetch_request(body, 8, _Resolver())
    cls = messages.body_class(ApiKey.OFFSET_FETCH, "response")
    response = messages.new_body(ApiKey.OFFSET_FETCH, 8, "response", groups=[
        cls.OffsetFetchResponseGroup(group_id="g", topics=[cls.OffsetFetchResponseTopics(name="t", partitions=[
            cls.OffsetFetchResponsePartitions(partition_index=1, committed_offset=20, metadata="")])])])

    def marks_of(group, real, partition, committed, metadata):
        return 20, {STRIPED_MARKS + 2: [30, -1]}

    commits.offset_fetch_response(response, 8, plan, marks_of, VirtualNames().name_of_marks)
    striped = [t for t in response.groups[0].topics if t.name == "t.coop2"]
    assert [(p.partition_index, p.committed_offset) for p in striped[0].partitions] == [(2, 30), (3, 20)]
