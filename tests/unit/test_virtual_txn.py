"""Transactional commits of virtual partitions without I/O: the shadow commits and the
carrier a TxnOffsetCommit becomes, the client's answer, and how committed shadow
watermarks rank against the log's (proxy.virtual.txn, proxy.commits.watermarks)."""

from __future__ import annotations

from proxy.commits import shadows, watermarks
from proxy.commits.state import CommitState, MarkEdit, apply_marks
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import ErrorCode
from proxy.virtual import txn
from tests.unit.test_virtual_core import _Resolver

REQUEST = messages.body_class(ApiKey.TXN_OFFSET_COMMIT, "request")
RESPONSE = messages.body_class(ApiKey.TXN_OFFSET_COMMIT, "response")


def _request(topics: dict[str, list[tuple[int, int, str]]]):
    return messages.new_body(
        ApiKey.TXN_OFFSET_COMMIT, 5, "request", transactional_id="tx", group_id="g", producer_id=7,
        producer_epoch=3, generation_id=4, member_id="m-1", group_instance_id="i-1",
        topics=[REQUEST.TxnOffsetCommitRequestTopic(name=name, partitions=[
            REQUEST.TxnOffsetCommitRequestPartition(partition_index=index, committed_offset=offset,
                                                    committed_leader_epoch=2, committed_metadata=meta)
            for index, offset, meta in parts]) for name, parts in topics.items()])


def _response(body, errors: dict[tuple[str, int], int]):
    topics: dict[str, list] = {}
    for (name, index), code in errors.items():
        topics.setdefault(name, []).append(RESPONSE.TxnOffsetCommitResponsePartition(partition_index=index,
                                                                                     error_code=code))
    return messages.new_body(ApiKey.TXN_OFFSET_COMMIT, 5, "response", topics=[
        RESPONSE.TxnOffsetCommitResponseTopic(name=name, partitions=parts) for name, parts in topics.items()])


def _planned():
    body = _request({"t.kr2": [(0, 40, "streams-time"), (1, 25, ""), (3, 9, "")], "u": [(0, 5, "")]})
    plan = txn.commit_plan(body, _Resolver())
    assert plan is not None
    plan.shadows = {(2, 0): "g.kr2/0#1", (2, 1): "g.kr2/1#4"}
    return body, plan


def test_a_request_without_virtual_partitions_is_left_alone():
    assert txn.commit_plan(_request({"u": [(0, 5, "")]}), _Resolver()) is None


def test_the_plan_groups_watermarks_by_real_partition():
    _, plan = _planned()
    assert plan.edits == {("t", 0): {2: {0: 40, 1: 25}}, ("t", 1): {2: {1: 9}}}
    assert plan.slots() == [(2, 0), (2, 1)]
    assert plan.refused == {}


def test_a_real_partition_named_plainly_and_through_its_virtual_topic_is_refused():
    plan = txn.commit_plan(_request({"t.kr2": [(0, 40, "")], "t": [(0, 3, "")]}), _Resolver())
    assert plan is not None and plan.refused == {("t", 0): ErrorCode.INVALID_REQUEST}


def test_one_shadow_commit_per_share_in_the_clients_transaction_without_a_member():
    body, plan = _planned()
    sequences = {("t", 0): (3, {(2, 0): 11, (2, 1): 11}), ("t", 1): (3, {(2, 1): 12})}
    out = dict(txn.shadow_requests(body, plan, sequences, {}))
    assert sorted(out) == [(2, 0), (2, 1)]
    share0, share1 = out[(2, 0)], out[(2, 1)]
    for shadow, name in ((share0, "g.kr2/0#1"), (share1, "g.kr2/1#4")):
        assert (shadow.group_id, shadow.transactional_id, shadow.producer_id, shadow.producer_epoch) == (name, "tx", 7, 3)
        assert (shadow.generation_id, shadow.member_id, shadow.group_instance_id) == (-1, "", None)
    assert [(t.name, [(p.partition_index, p.committed_offset, p.committed_leader_epoch, p.committed_metadata)
                      for p in t.partitions]) for t in share0.topics] == \
        [("t", [(0, 40, 2, "keyrange.txn/1:3:11:streams-time")])]
    assert [(t.name, [(p.partition_index, p.committed_offset, p.committed_metadata) for p in t.partitions])
            for t in share1.topics] == [("t", [(0, 25, "keyrange.txn/1:3:11:"), (1, 9, "keyrange.txn/1:3:12:")])]
    # the client's request is untouched until the carrier is made from it
    assert body.group_id == "g" and body.generation_id == 4


def test_client_metadata_too_long_for_the_shadow_refuses_that_partition():
    body = _request({"t.kr2": [(0, 40, "x" * 4090), (2, 8, "")]})
    plan = txn.commit_plan(body, _Resolver())
    assert plan is not None
    plan.shadows = {(2, 0): "g.kr2/0#1"}
    refused: dict = {}
    out = txn.shadow_requests(body, plan, {("t", 0): (0, {(2, 0): 1}), ("t", 1): (0, {(2, 0): 1})}, refused)
    assert refused == {("t", 0): ErrorCode.OFFSET_METADATA_TOO_LARGE}
    assert [(slot, [(t.name, [p.partition_index for p in t.partitions]) for t in b.topics]) for slot, b in out] == \
        [((2, 0), [("t", [1])])]


def test_the_carrier_commits_the_real_partitions_at_s_with_the_clients_generation():
    body, plan = _planned()
    assert txn.carrier_request(body, plan, {("t", 0): (25, "wm0"), ("t", 1): (-1, "wm1")}, {})
    assert (body.group_id, body.generation_id, body.member_id, body.group_instance_id) == ("g", 4, "m-1", "i-1")
    assert sorted((t.name, p.partition_index, p.committed_offset, p.committed_metadata)
                  for t in body.topics for p in t.partitions) == \
        [("t", 0, 25, "wm0"), ("t", 1, -1, "wm1"), ("u", 0, 5, "")]


def test_nothing_is_sent_when_every_partition_is_refused():
    body = _request({"t.kr2": [(0, 40, "")]})
    plan = txn.commit_plan(body, _Resolver())
    assert plan is not None
    refused = {("t", 0): int(ErrorCode.INVALID_REQUEST)}
    assert not txn.carrier_request(body, plan, {("t", 0): (1, "")}, refused)
    response = messages.new_body(ApiKey.TXN_OFFSET_COMMIT, 5, "response")
    txn.commit_response(response, plan, refused)
    assert [(t.name, [(p.partition_index, p.error_code) for p in t.partitions]) for t in response.topics] == \
        [("t.kr2", [(0, ErrorCode.INVALID_REQUEST)])]


def test_the_answer_takes_the_carriers_error_first_then_the_shadows():
    body, plan = _planned()
    txn.carrier_request(body, plan, {("t", 0): (25, ""), ("t", 1): (-1, "")}, {})
    plan.answers = {(2, 0): _response(None, {("t", 0): 0}),
                    (2, 1): _response(None, {("t", 0): 0, ("t", 1): int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)})}
    response = _response(body, {("t", 0): int(ErrorCode.ILLEGAL_GENERATION), ("t", 1): 0, ("u", 0): 0})
    outcome = txn.commit_response(response, plan, {})
    assert [(t.name, [(p.partition_index, p.error_code) for p in t.partitions]) for t in response.topics] == [
        ("t.kr2", [(0, ErrorCode.ILLEGAL_GENERATION), (1, ErrorCode.ILLEGAL_GENERATION),
                   (3, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)]),
        ("u", [(0, 0)])]
    assert outcome == {("t", 0): ErrorCode.ILLEGAL_GENERATION, ("t", 1): ErrorCode.COORDINATOR_LOAD_IN_PROGRESS}


def test_a_shadow_mark_needs_proxy_metadata_and_an_offset():
    assert shadows.shadow_mark(2, 1, 30, "keyrange.txn/1:0:4:meta") == (2, 1, 30, 0, 4)
    assert shadows.shadow_mark(2, 1, 30, "someone else's") is None
    assert shadows.shadow_mark(2, 1, -1, shadows.encode_share_metadata(0, 4, "")) is None


def test_a_shadow_counts_only_when_newer_than_the_logs_watermark_of_its_share():
    state = CommitState(10, (), 2, ((2, 0, 20, 5), (2, 1, 15, 7)))
    assert watermarks.newer(state, (2, 0, 30, 2, 6))  # higher sequence, same epoch
    assert not watermarks.newer(state, (2, 0, 30, 2, 5))  # a tie goes to the log (the fold of that shadow)
    assert not watermarks.newer(state, (2, 0, 30, 1, 9))  # an epoch since reset
    assert watermarks.newer(state, (4, 3, 30, 2, 1))  # a share the log has no watermark of
    overlaid = watermarks.overlay(state, [(2, 0, 30, 2, 6), (2, 1, 99, 2, 7)])
    assert watermarks.per_share(overlaid.marks) == {2: [30, 15]}
    assert overlaid.stable == 15  # both shares at or above 15 now
    assert watermarks.fold(state, [(2, 0, 30, 2, 6), (2, 1, 99, 2, 7)]) == {2: {0: (30, 6)}}


def test_a_fold_written_after_the_next_transaction_began_does_not_hide_it():
    """Transaction 27 of share 2 commits W=774 (its shadow numbered 6); transaction 28 of the
    same share begins before 27's fold is in the log and commits W=900: its shadow must
    rank above the folded 27, or the share reads 774 after a rebalance and redoes work."""
    log = CommitState(-1, (), 0, ((4, 2, 700, 5), (4, 3, 650, 2)))
    txn27 = apply_marks(log, MarkEdit(4, {2: 774}))
    shadow27 = (4, 2, 774, 0, watermarks.sequences(txn27)[(4, 2)])
    # the instance remembers 27's sequence; 28 is planned from the log without 27's fold
    txn28 = apply_marks(log, MarkEdit(4, {2: 900}, at_least={2: shadow27[4] + 1}))
    shadow28 = (4, 2, 900, 0, watermarks.sequences(txn28)[(4, 2)])
    assert shadow28[4] > shadow27[4]
    # 27's follow-up folds its shadow into the log, keeping the shadow's sequence
    folded = watermarks.fold(log, [shadow27])
    assert folded == {4: {2: (774, shadow27[4])}}
    after = apply_marks(log, MarkEdit(4, {2: 774}, exact={2: shadow27[4]}))
    assert watermarks.newer(after, shadow28)
    assert watermarks.per_share(watermarks.overlay(after, [shadow28]).marks)[4][2] == 900
    # without the floor and the kept sequence, the fold would have outranked 28
    unfloored = apply_marks(log, MarkEdit(4, {2: 900}))
    refolded = apply_marks(apply_marks(log, MarkEdit(4, {3: 651})), MarkEdit(4, {2: 774}))
    assert not watermarks.newer(refolded, (4, 2, 900, 0, watermarks.sequences(unfloored)[(4, 2)]))
