"""The consumer's parts without a broker: version negotiation, metadata, the per-partition
state, Fetch, ListOffsets, OffsetCommit and OffsetFetch requests and responses, the
coordinator's answers, the committer and the fetcher against scripted peers, and the
background nursery."""

from __future__ import annotations

import uuid
from collections import Counter
from types import SimpleNamespace

import pytest
import trio

from harness.batches import Rec, kafka_python_batch
from proxy.client import IllegalStateError, KafkaError, NoOffsetForPartitionError, TopicPartition, equal_shares
from proxy.client.assignment import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    AssignmentState,
    EndOffsets,
    PendingReset,
    check_assignment,
    reset_timestamp,
)
from proxy.client.commit_protocol import (
    MemberIdentity,
    accepted_partitions,
    committed_state,
    first_commit_error,
    offset_commit_request,
    offset_fetch_request,
)
from proxy.client.committer import Committer
from proxy.client.connection import INDIVIDUAL_COMMIT_FEATURE, RANGE_FETCH_FEATURE, NodeConnection, negotiate
from proxy.client.consumer import Consumer, background_nursery
from proxy.client.coordinator import coordinator_address, must_find_again
from proxy.client.errors import RangeFetchNotSupportedError, UnsupportedVersionError
from proxy.client.fetch_protocol import FetchLimits, FetchPosition, apply_fetch_response, fetch_request, rotated
from proxy.client.fetcher import Fetcher
from proxy.client.metadata import ClusterMetadata
from proxy.client.offsets import OffsetQuery, apply_list_offsets, list_offsets_request
from proxy.client.progress import PartitionProgress
from proxy.client.records import ConsumerRecord
from proxy.commits.state import CommitState, apply_ranges, check_held
from proxy.net.broker_connection import BrokerConnectionError
from proxy.protocol import messages
from proxy.protocol.constants import EXTENSION_TAG_BYTES, FETCH_SESSION_FINAL_EPOCH, FETCH_SESSIONLESS_ID, ErrorCode
from proxy.protocol.messages import ApiKey

TP = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)
NS = SimpleNamespace


# -- version negotiation ---------------------------------------------------------------------
def _api_versions(keys: dict[int, tuple[int, int]], features=(), code=0):
    return NS(error_code=code, api_keys=[NS(api_key=k, min_version=lo, max_version=hi) for k, (lo, hi) in keys.items()],
              supported_features=[NS(name=name) for name in features])


FULL = {ApiKey.FETCH: (0, 17), ApiKey.LIST_OFFSETS: (0, 9), ApiKey.METADATA: (0, 12),
        ApiKey.FIND_COORDINATOR: (0, 6), ApiKey.OFFSET_COMMIT: (0, 9), ApiKey.OFFSET_FETCH: (0, 9)}


def test_negotiation_picks_the_newest_common_version_and_reads_the_features():
    theirs = {**FULL, ApiKey.FETCH: (4, 12)}
    negotiated = negotiate(_api_versions(theirs, [RANGE_FETCH_FEATURE, INDIVIDUAL_COMMIT_FEATURE]), "proxy:1")
    assert negotiated.versions[ApiKey.FETCH] == 12
    assert negotiated.versions[ApiKey.FIND_COORDINATOR] == 4  # our ceiling, below theirs
    assert negotiated.versions[ApiKey.OFFSET_COMMIT] == min(9, messages.supported_versions(ApiKey.OFFSET_COMMIT)[1])
    connection = NodeConnection(NS(closed=False), negotiated.versions, negotiated.features)  # type: ignore[arg-type]
    assert connection.filters_ranges and connection.commits_ranges


def test_a_feature_needs_a_flexible_fetch_and_group_apis_are_optional():
    theirs = {k: v for k, v in FULL.items() if k not in (ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH)}
    theirs[ApiKey.FETCH] = (4, 11)
    negotiated = negotiate(_api_versions(theirs, [RANGE_FETCH_FEATURE]), "proxy:1")
    assert ApiKey.OFFSET_COMMIT not in negotiated.versions
    connection = NodeConnection(NS(closed=False), negotiated.versions, negotiated.features)  # type: ignore[arg-type]
    assert not connection.filters_ranges  # advertised, but Fetch v11 has no tagged fields
    assert not connection.commits_ranges


def test_negotiation_failures_name_both_windows():
    with pytest.raises(UnsupportedVersionError, match="broker:9 serves FETCH v0-3; this consumer needs v4-"):
        negotiate(_api_versions({**FULL, ApiKey.FETCH: (0, 3)}), "broker:9")
    with pytest.raises(UnsupportedVersionError, match="LIST_OFFSETS v0--1"):
        negotiate(_api_versions({k: v for k, v in FULL.items() if k != ApiKey.LIST_OFFSETS}), "broker:9")
    with pytest.raises(KafkaError, match="ApiVersions from broker:9") as caught:
        negotiate(_api_versions(FULL, code=ErrorCode.UNSUPPORTED_VERSION), "broker:9")
    assert caught.value.code == ErrorCode.UNSUPPORTED_VERSION


# -- metadata ----------------------------------------------------------------------------------
def _metadata_response(partitions, *, topic_code=0, brokers=((1, "a", 9001), (2, "b", 9002))):
    return NS(brokers=[NS(node_id=n, host=h, port=p) for n, h, p in brokers],
              topics=[NS(name="t", error_code=topic_code, topic_id="id-t", partitions=[
                  NS(partition_index=i, leader_id=leader, leader_epoch=epoch, error_code=code)
                  for i, (leader, epoch, code) in enumerate(partitions)])])


def test_metadata_leaders_and_what_is_still_missing():
    metadata = ClusterMetadata()
    assert metadata.stale
    missing = metadata.update(_metadata_response([(1, 7, 0), (2, 3, ErrorCode.LEADER_NOT_AVAILABLE)]), [TP, TP1])
    assert missing and metadata.stale
    assert metadata.leader(TP).leader == 1 and metadata.leader(TP).leader_epoch == 7
    assert metadata.leader(TP1) is None  # the partition's error leaves it without a leader
    assert metadata.topic_names() == {"id-t": "t"} and metadata.nodes[2] == ("b", 9002)
    assert metadata.update(_metadata_response([(1, 7, 0), (2, 4, 0)]), [TP, TP1]) is False
    assert not metadata.stale
    # a leader the broker list does not hold is no leader to fetch from
    metadata.update(_metadata_response([(3, 1, 0)], brokers=((1, "a", 9001),)), [TP])
    assert metadata.leader(TP) is None and metadata.stale


def test_metadata_errors():
    metadata = ClusterMetadata()
    assert metadata.update(_metadata_response([], topic_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), [TP]) is True
    with pytest.raises(KafkaError, match="metadata for topic 't'") as caught:
        metadata.update(_metadata_response([], topic_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED), [TP])
    assert caught.value.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    with pytest.raises(KafkaError, match="t has no partition 1"):
        metadata.update(_metadata_response([(1, 0, 0)]), [TP1])


# -- the per-partition state -------------------------------------------------------------------
def _records(start: int, count: int) -> list[ConsumerRecord]:
    return [ConsumerRecord("t", 0, o, 0, None, b"") for o in range(start, start + count)]


def test_check_assignment():
    assert check_assignment([TP]) == {TP: []}
    assert check_assignment({("t", 1): equal_shares(2)[:1]}) == {TP1: equal_shares(2)[:1]}
    with pytest.raises(ValueError, match="not a TopicPartition"):
        check_assignment([("t", -1)])
    with pytest.raises(ValueError, match="ranges must be KeyRange values"):
        check_assignment({TP: [(0, 5)]})


def test_changed_ranges_and_resets_drop_the_buffer_and_removal_forgets_the_partition():
    state = AssignmentState(read_committed=False, tracking=False)
    state.assign({TP: [], TP1: []})
    assert state.positions == {TP: None, TP1: None}
    assert state.wants_group_offsets() == [TP, TP1] and state.pending_resets() == [TP, TP1]
    state.seek(TP, 3)
    state.seek(TP1, 0)
    state.buffers.add(TP, _records(3, 2), 5)
    state.assign({TP: [], TP1: []})  # unchanged: the buffer stays
    assert state.buffers.has_buffered(TP) and state.fetchable(lambda tp: True) == [TP1]
    state.assign({TP: equal_shares(2)[1:], TP1: []})  # narrowed: the kept range's records stay
    assert [r.offset for r in state.buffers.buffers[TP].records] == [3, 4] and state.position(TP) == 3
    state.assign({TP: equal_shares(2)[:1], TP1: []})  # moved ranges start over
    assert not state.buffers.has_buffered(TP) and state.position(TP) == 3
    state.buffers.add(TP, _records(3, 2), 5)
    state.reset_later(TP, LATEST_TIMESTAMP)
    assert state.position(TP) is None and state.positions[TP] == PendingReset(LATEST_TIMESTAMP)
    assert not state.buffers.has_buffered(TP) and state.pending_resets() == [TP]
    state.ends[TP1] = EndOffsets(1.0, 10, 8, 0)
    state.assign({TP: []})
    assert TP1 not in state and TP1 not in state.ends and state.partitions() == [TP]


def test_a_resolved_reset_amends_the_skipped_offsets_with_individual_commit():
    state = AssignmentState(read_committed=False, tracking=True)
    state.assign({TP: []})
    state.reset_to(TP, 40)
    assert state.position(TP) == 40 and list(state.progress[TP].pending) == [(0, 39)]
    plain = AssignmentState(read_committed=False, tracking=False)
    plain.assign({TP: []})
    plain.reset_to(TP, 40)
    assert plain.position(TP) == 40 and not plain.progress


def _ranged_member(share) -> AssignmentState:
    state = AssignmentState(read_committed=False, tracking=True)
    state.assign({TP: [share]})
    state.progress[TP] = PartitionProgress(None, [])  # the group has nothing committed
    return state


def _fetch_into(state: AssignmentState, fetch_offset: int, blob: bytes, end: int, metrics: Counter) -> list[int]:
    """One fetch response of ``blob`` at ``fetch_offset`` taken in; the offsets handed out."""
    from proxy.client.fetch_protocol import apply_partition

    part = NS(error_code=0, records=blob, high_watermark=end, last_stable_offset=end, log_start_offset=0,
              aborted_transactions=[], key_ranges_applied=None)
    apply_partition(state, TP, part, fetch_offset, received_time=1.0, received=set(), auto_offset_reset="latest",
                    metrics=metrics)
    return [r.offset for r in state.drain(10_000, set())]


def test_key_range_members_resetting_to_the_log_end_apart_commit_only_their_own_records():
    """A resets to the log end at 100, B at 110 (ten records later). Neither may commit the
    other's records: B amending [0, 110) as a gap would claim A's records 100-109 that
    nobody processed. Each reads from S and commits its own records below its reset point
    as skipped; together they move S to 100 (A's records from there on are A's to process)."""
    from proxy.commits.state import CommitState, apply_ranges
    from proxy.records.keyhash import key_hash

    halves = equal_shares(2)
    keys = {o: f"key-{o}".encode() for o in range(110)}
    blob = kafka_python_batch([Rec(o, keys[o], b"v") for o in range(110)], base_offset=0)
    mine = {i: [o for o in range(110) if halves[i].start <= key_hash(keys[o], o) <= halves[i].end] for i in (0, 1)}
    a, b = _ranged_member(halves[0]), _ranged_member(halves[1])
    a.reset_to(TP, 100, log_start=0)
    b.reset_to(TP, 110, log_start=0)
    assert (a.position(TP), b.position(TP)) == (100, 110)  # where records are handed out from
    assert not a.progress[TP].pending and not b.progress[TP].pending  # no gap claimed for anyone
    metrics: Counter = Counter()
    assert _fetch_into(a, 0, blob, 110, metrics) == [o for o in mine[0] if o >= 100]
    assert _fetch_into(b, 0, blob, 110, metrics) == []
    assert metrics["records_skipped_by_reset"] == sum(o < 100 for o in mine[0]) + len(mine[1])
    group = CommitState(0)
    group = apply_ranges(group, list(b.progress[TP].pending))
    assert not any(group.processed(o) for o in mine[0]), "B's commit claims none of A's records"
    group = apply_ranges(group, list(a.progress[TP].pending))
    assert [o for o in range(110) if not group.processed(o)] == [o for o in mine[0] if o >= 100]
    assert not a.reset_points and not b.reset_points  # the reads reached the reset points


def test_a_key_range_member_amends_only_what_lies_below_the_log_start():
    """Records below the log start are deleted: nobody can process them, so they are
    amended as a gap by any member; from the log start on only its own records count."""
    state = _ranged_member(equal_shares(2)[0])
    state.reset_to(TP, 60, log_start=40)
    assert list(state.progress[TP].pending) == [(0, 39)]
    assert state.positions[TP] == 40 and state.position(TP) == 60 and state.reset_points == {TP: 60}
    earliest = _ranged_member(equal_shares(2)[0])
    earliest.reset_to(TP, 40, log_start=40)  # an earliest reset
    assert list(earliest.progress[TP].pending) == [(0, 39)] and earliest.position(TP) == 40
    assert not earliest.reset_points
    state.seek(TP, 70)  # the application positions it: no reset point any more
    assert state.position(TP) == 70 and not state.reset_points
    unknown = _ranged_member(equal_shares(2)[0])
    unknown.reset_to(TP, 60)  # log start unknown: nothing amended, own records read up to 60
    assert not unknown.progress[TP].pending and unknown.positions[TP] == 0 and unknown.reset_points == {TP: 60}


def test_a_key_range_member_resolving_a_reset_to_the_end_asks_for_the_log_start_first():
    """The resolver looks the log start up in a request of its own (one ListOffsets cannot
    name a partition twice), then the reset itself."""
    from proxy.client.offsets import OffsetResolver

    state = _ranged_member(equal_shares(2)[0])
    state.reset_later(TP, LATEST_TIMESTAMP)
    asked: list[list[int]] = []

    class Connections:
        async def node(self, node_id, address):
            return NS(versions={ApiKey.LIST_OFFSETS: 9})

        async def request(self, connection, key, version, body):
            timestamps = [p.timestamp for t in body.topics for p in t.partitions]
            asked.append(timestamps)
            offset = 40 if timestamps == [EARLIEST_TIMESTAMP] else 60
            return NS(topics=[NS(name="t", partitions=[NS(partition_index=0, error_code=0, offset=offset)])])

    metadata = NS(leader=lambda tp: NS(leader=1, leader_epoch=0), nodes={1: ("127.0.0.1", 1)}, stale=False)
    resolver = OffsetResolver(state, metadata, Connections(), None, auto_offset_reset="latest",
                              isolation_level=0, timeout_ms=1000, metrics=Counter())
    assert trio.run(resolver.resolve) is False
    assert asked == [[EARLIEST_TIMESTAMP], [LATEST_TIMESTAMP]]
    assert state.positions[TP] == 40 and state.position(TP) == 60
    assert list(state.progress[TP].pending) == [(0, 39)]
    asked.clear()
    state.reset_later(TP, EARLIEST_TIMESTAMP)  # an earliest reset's answer is the log start itself
    assert trio.run(resolver.resolve) is False
    assert asked == [[EARLIEST_TIMESTAMP]] and state.positions[TP] == 40 and not state.reset_points


def test_lag_and_fetch_metadata_come_from_the_cached_end_offsets():
    state = AssignmentState(read_committed=True, tracking=False)
    state.assign({TP: []})
    assert state.lag(TP) is None
    state.seek(TP, 2)
    state.ends[TP] = EndOffsets(5.0, high_watermark=20, last_stable_offset=12, log_start_offset=1)
    assert state.lag(TP) == 10  # read_committed: to the last stable offset
    state.buffers.add(TP, _records(2, 4), 6)
    records = state.drain(3, set())
    assert [r.offset for r in records] == [2, 3, 4] and state.position(TP) == 5
    assert records.metadata()[TP] == records.fetch_metadata[TP]
    meta = records.metadata()[TP]
    assert (meta.received_time, meta.position, meta.lag, meta.log_start_offset, meta.end_offset) == (5.0, 5, 7, 1, 12)
    assert EndOffsets(0.0, 20, -1, 0).end(read_committed=True) == 20  # no stable offset known


def test_reset_timestamps_follow_the_policy():
    assert reset_timestamp("earliest", TP) == EARLIEST_TIMESTAMP
    assert reset_timestamp("latest", TP) == LATEST_TIMESTAMP
    with pytest.raises(NoOffsetForPartitionError, match="t-0 has no position"):
        reset_timestamp("none", TP)


# -- Fetch -------------------------------------------------------------------------------------
LIMITS = FetchLimits(max_wait_ms=250, max_bytes=1000, partition_max_bytes=100, isolation_level=1)


def test_rotation_of_the_request_order():
    assert rotated([1, 2, 3], 0) == [1, 2, 3]
    assert rotated([1, 2, 3], 4) == [2, 3, 1]
    assert rotated([], 5) == []


@pytest.mark.parametrize("version", [12, 13, 17])
def test_fetch_request_carries_ranges_only_on_ranged_partitions(version):
    share = equal_shares(4)[2]
    body = fetch_request(version, [FetchPosition(TP1, 3, 50, [share]), FetchPosition(TP, 2, 7, [])],
                         {"t": uuid.UUID(int=1) if version >= 13 else None}, LIMITS)
    assert (body.session_id, body.session_epoch) == (FETCH_SESSIONLESS_ID, FETCH_SESSION_FINAL_EPOCH)
    assert (body.max_wait_ms, body.max_bytes, body.isolation_level) == (250, 1000, 1)
    (topic,) = body.topics
    ranged, whole = topic.partitions
    assert (ranged.partition, ranged.current_leader_epoch, ranged.fetch_offset) == (1, 3, 50)
    assert [(r.start, r.end) for r in ranged.key_ranges] == [(share.start, share.end)]
    assert whole.key_ranges is None and whole.partition_max_bytes == 100
    encoded = messages.encode_body(ApiKey.FETCH, version, "request", body)
    assert EXTENSION_TAG_BYTES in encoded
    plain = fetch_request(version, [FetchPosition(TP, 2, 7, [])], {"t": uuid.UUID(int=1)}, LIMITS)
    assert EXTENSION_TAG_BYTES not in messages.encode_body(ApiKey.FETCH, version, "request", plain)


def _fetch_response(parts, *, code=0, by_id=False):
    return NS(error_code=code, responses=[NS(topic=None if by_id else "t", topic_id="id-t" if by_id else None,
                                             partitions=parts)])


def _fetched(partition, blob=b"", code=0):
    return NS(partition_index=partition, error_code=code, records=blob, high_watermark=9, last_stable_offset=9,
              log_start_offset=0, aborted_transactions=None, key_ranges_applied=None)


def test_fetch_response_skips_partitions_moved_meanwhile_and_names_topics_by_id():
    state = AssignmentState(read_committed=False, tracking=False)
    state.assign({TP: [], TP1: []})
    state.seek(TP, 0)
    state.seek(TP1, 4)
    blob = kafka_python_batch([Rec(i, b"k", b"v") for i in range(3)], base_offset=0)
    received: set = set()
    metrics: Counter = Counter()
    refresh = apply_fetch_response(
        state, _fetch_response([_fetched(0, blob), _fetched(1, blob)], by_id=True), version=13, node_id=1,
        offsets={TP: 0, TP1: 2}, topic_names={"id-t": "t"}, received_time=1.0, received=received,
        auto_offset_reset="latest", metrics=metrics)
    assert refresh is False
    assert received == {TP}  # TP1 was sought to 4 after the request asked for 2: stale
    assert [r.offset for r in state.drain(10, received)] == [0, 1, 2] and state.position(TP1) == 4
    # an unknown topic id is not a partition this consumer asked for
    assert apply_fetch_response(
        state, _fetch_response([_fetched(1)], by_id=True), version=13, node_id=1, offsets={TP1: 4},
        topic_names={}, received_time=1.0, received=received, auto_offset_reset="latest", metrics=metrics) is False


def test_fetch_response_top_level_errors():
    state = AssignmentState(read_committed=False, tracking=False)
    kwargs = dict(version=12, node_id=3, offsets={}, topic_names={}, received_time=1.0, received=set(),
                  auto_offset_reset="latest", metrics=Counter())
    assert apply_fetch_response(state, _fetch_response([], code=ErrorCode.NOT_LEADER_OR_FOLLOWER), **kwargs)
    with pytest.raises(KafkaError, match="Fetch from node 3") as caught:
        apply_fetch_response(state, _fetch_response([], code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED), **kwargs)
    assert caught.value.name == "CLUSTER_AUTHORIZATION_FAILED"


# -- ListOffsets -------------------------------------------------------------------------------
def test_list_offsets_request():
    body = list_offsets_request(9, [OffsetQuery(TP, 4, EARLIEST_TIMESTAMP), OffsetQuery(TP1, 5, LATEST_TIMESTAMP)],
                                isolation_level=1, timeout_ms=3000)
    assert (body.replica_id, body.isolation_level, body.timeout_ms) == (-1, 1, 3000)
    (topic,) = body.topics
    assert [(p.partition_index, p.current_leader_epoch, p.timestamp) for p in topic.partitions] == [
        (0, 4, EARLIEST_TIMESTAMP), (1, 5, LATEST_TIMESTAMP)]
    messages.encode_body(ApiKey.LIST_OFFSETS, 9, "request", body)


def test_list_offsets_response_resolves_pending_resets_only():
    state = AssignmentState(read_committed=False, tracking=False)
    state.assign({TP: [], TP1: []})
    state.reset_later(TP, EARLIEST_TIMESTAMP)
    state.seek(TP1, 77)  # sought while the request was out
    metrics: Counter = Counter()
    response = NS(topics=[NS(name="t", partitions=[NS(partition_index=0, error_code=0, offset=12),
                                                   NS(partition_index=1, error_code=0, offset=3)])])
    assert apply_list_offsets(state, response, metrics) is False
    assert (state.position(TP), state.position(TP1), metrics["offset_resets"]) == (12, 77, 1)
    state.reset_later(TP, LATEST_TIMESTAMP)
    retry = NS(topics=[NS(name="t", partitions=[NS(partition_index=0, error_code=ErrorCode.FENCED_LEADER_EPOCH,
                                                   offset=-1)])])
    assert apply_list_offsets(state, retry, metrics) is True and state.position(TP) is None
    fatal = NS(topics=[NS(name="t", partitions=[NS(partition_index=0, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                                   offset=-1)])])
    with pytest.raises(KafkaError, match="ListOffsets t-0"):
        apply_list_offsets(state, fatal, metrics)


# -- OffsetCommit and OffsetFetch --------------------------------------------------------------
def test_offset_commit_request_plain_and_ranges():
    body = offset_commit_request(9, "g", {TP: 42, TP1: [(3, 5), (9, 9)]}, {TP: 6})
    assert (body.group_id, body.generation_id_or_member_epoch, body.member_id) == ("g", -1, "")
    (topic,) = body.topics
    plain, ranged = topic.partitions
    assert (plain.committed_offset, plain.committed_leader_epoch, plain.offset_ranges) == (42, 6, None)
    assert (ranged.committed_offset, ranged.committed_leader_epoch) == (-1, -1)
    assert [(r.start, r.end) for r in ranged.offset_ranges] == [(3, 5), (9, 9)]
    assert EXTENSION_TAG_BYTES in messages.encode_body(ApiKey.OFFSET_COMMIT, 9, "request", body)
    member = offset_commit_request(9, "g", {TP: 1}, {}, MemberIdentity(generation=4, member_id="m-1"))
    assert (member.generation_id_or_member_epoch, member.member_id) == (4, "m-1")
    assert member.topics[0].partitions[0].committed_leader_epoch == -1


def test_offset_commit_response():
    response = NS(topics=[NS(name="t", partitions=[
        NS(partition_index=0, error_code=0, stable_offset=10),
        NS(partition_index=1, error_code=ErrorCode.ILLEGAL_GENERATION, stable_offset=-1)])])
    assert list(accepted_partitions(response, {TP: 1, TP1: 2})) == [TP]
    assert accepted_partitions(response, {TP1: 2}) == {}
    error = first_commit_error(response, "g")
    assert error is not None and error.name == "ILLEGAL_GENERATION" and "t-1 for group 'g'" in str(error)


def test_offset_fetch_request_and_committed_state():
    body = offset_fetch_request(9, "g", [TP, TP1])
    (group,) = body.groups
    assert group.group_id == "g" and group.topics[0].partition_indexes == [0, 1] and body.require_stable
    response = NS(groups=[NS(error_code=0, topics=[NS(name="t", partitions=[
        NS(partition_index=0, error_code=0, committed_offset=-1, committed_range_offsets=None),
        NS(partition_index=1, error_code=0, committed_offset=8, committed_range_offsets=[NS(start=10, end=12)]),
        NS(partition_index=2, error_code=0, committed_offset=3, committed_range_offsets=None)])])])
    assert committed_state(response, [TP, TP1], "g") == {TP: (None, []), TP1: (8, [(10, 12)])}
    failed = NS(groups=[NS(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, topics=[])])
    with pytest.raises(KafkaError, match="OffsetFetch for group 'g'"):
        committed_state(failed, [TP], "g")


# -- the coordinator's answers -----------------------------------------------------------------
def test_coordinator_answers():
    found = NS(coordinators=[NS(error_code=0, host="h", port=5)])
    assert coordinator_address(found, "g") == ("h", 5)
    loading = NS(coordinators=[NS(error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE, host="", port=-1)])
    with pytest.raises(BrokerConnectionError, match="COORDINATOR_NOT_AVAILABLE"):
        coordinator_address(loading, "g")  # retried like a lost connection
    denied = NS(coordinators=[NS(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, host="", port=-1)])
    with pytest.raises(KafkaError, match="FindCoordinator for group 'g'"):
        coordinator_address(denied, "g")
    moved = NS(topics=[NS(partitions=[NS(error_code=0), NS(error_code=ErrorCode.NOT_COORDINATOR)])])
    assert must_find_again(moved)
    assert must_find_again(NS(groups=[NS(error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)]))
    assert not must_find_again(NS(topics=[NS(partitions=[NS(error_code=ErrorCode.ILLEGAL_GENERATION)])]))


# -- lifecycle ---------------------------------------------------------------------------------
async def test_the_background_nursery_cancels_its_tasks_and_lets_the_block_error_through():
    cancelled = trio.Event()

    async def background() -> None:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    error = KeyError("the block's own")
    with trio.fail_after(5):
        with pytest.raises(KeyError) as caught:
            async with background_nursery() as nursery:
                nursery.start_soon(background)
                await trio.sleep(0)
                raise error
    assert caught.value is error and cancelled.is_set()
    with trio.fail_after(5):
        async with background_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
    # leaving without an error cancels the background task too (or this would hang)


async def test_a_consumer_that_cannot_connect_leaves_no_task_and_can_be_used_once():
    consumer = Consumer("127.0.0.1:1", request_timeout_ms=2000)
    with trio.fail_after(10):
        with pytest.raises(Exception, match="no bootstrap server answered"):
            async with consumer:
                pass  # pragma: no cover
    assert consumer._running is None
    closes = []

    class FakeConnection:
        closed = False

        async def aclose(self) -> None:
            closes.append(self)

    started = Consumer("127.0.0.1:1")
    started._started = True
    started._connections.bootstrap = NS(filters_ranges=True, commits_ranges=False, conn=FakeConnection())
    async with started:
        with pytest.raises(IllegalStateError, match="already in an `async with` block"):
            await started.__aenter__()
    assert len(closes) == 1  # leaving the block closed the connection
    with pytest.raises(IllegalStateError, match="closed"):
        started.assign([TP])


# -- the committer, against a scripted coordinator ---------------------------------------------
class ScriptedCoordinator:
    """Answers each OffsetCommit with ``answer(body)``; keeps every body sent."""

    group = "g"

    def __init__(self, answer) -> None:
        self.answer = answer
        self.sent: list = []

    async def request(self, api_key, build):
        body = build(9)
        self.sent.append(body)
        return self.answer(body)


def _acknowledge(stable: int, code: int = 0):
    def answer(body):
        return NS(topics=[NS(name=t.name, partitions=[NS(partition_index=p.partition_index, error_code=code,
                                                         stable_offset=stable) for p in t.partitions])
                          for t in body.topics])
    return answer


async def test_range_commits_go_in_rounds_and_a_failure_keeps_everything_pending():
    state = AssignmentState(read_committed=False, tracking=True)
    state.assign({TP: []})
    state.progress[TP] = PartitionProgress(0)
    for offset in (1, 3, 5, 7, 9):
        state.progress[TP].mark(offset)
    failing = ScriptedCoordinator(_acknowledge(-1, ErrorCode.ILLEGAL_GENERATION))
    metrics: Counter = Counter()
    committer = Committer(failing, state, ClusterMetadata(), max_ranges=2, metrics=metrics)  # type: ignore[arg-type]
    with pytest.raises(KafkaError, match="ILLEGAL_GENERATION"):
        await committer.commit_processed(ranges_supported=True)
    assert list(state.progress[TP].pending) == [(1, 1), (3, 3), (5, 5), (7, 7), (9, 9)]
    working = ScriptedCoordinator(_acknowledge(0))
    committer = Committer(working, state, ClusterMetadata(), max_ranges=2, metrics=metrics)  # type: ignore[arg-type]
    await committer.commit_processed(ranges_supported=True)
    sent = [[(r.start, r.end) for r in body.topics[0].partitions[0].offset_ranges] for body in working.sent]
    assert sent == [[(1, 1), (3, 3)], [(5, 5), (7, 7)], [(9, 9)]]
    assert not state.progress[TP].pending and metrics["range_commits"] == 3


async def test_offsets_marked_while_a_range_commit_is_out_wait_for_the_next_commit():
    """A consumer keeps processing while its commit is out; those marks must not turn one
    commit_processed into a stream of requests (each a write of the proxy's log)."""
    state = AssignmentState(read_committed=False, tracking=True)
    state.assign({TP: []})
    state.progress[TP] = PartitionProgress(0)
    state.progress[TP].mark(1)
    acknowledge = _acknowledge(0)
    marked = iter(range(3, 40, 2))

    def answer(body):
        state.progress[TP].mark(next(marked))  # processed while the request was out
        return acknowledge(body)

    coordinator = ScriptedCoordinator(answer)
    committer = Committer(coordinator, state, ClusterMetadata(), max_ranges=10, metrics=Counter())  # type: ignore[arg-type]
    await committer.commit_processed(ranges_supported=True)
    assert len(coordinator.sent) == 1
    assert list(state.progress[TP].pending) == [(3, 3)]
    await committer.commit_processed(ranges_supported=True)
    assert len(coordinator.sent) == 2 and list(state.progress[TP].pending) == [(5, 5)]


async def test_without_individual_commit_the_contiguous_prefix_is_committed_plainly():
    state = AssignmentState(read_committed=False, tracking=True)
    state.assign({TP: [], TP1: equal_shares(2)[:1]})
    state.progress[TP] = PartitionProgress(10)
    state.progress[TP].mark(10, 14)
    state.progress[TP].mark(20)
    coordinator = ScriptedCoordinator(_acknowledge(-1))
    committer = Committer(coordinator, state, ClusterMetadata(), max_ranges=10,  # type: ignore[arg-type]
                          metrics=Counter())
    await committer.commit_processed(ranges_supported=False)
    (body,) = coordinator.sent
    assert body.topics[0].partitions[0].committed_offset == 15
    assert state.progress[TP].stable == 15 and list(state.progress[TP].pending) == [(20, 20)]
    state.progress[TP1] = PartitionProgress(0)
    state.progress[TP1].mark(0)
    with pytest.raises(IllegalStateError, match="t-1 is assigned key ranges"):
        await committer.commit_processed(ranges_supported=False)


class BoundedProxy:
    """Answers range commits as the proxy does with max.individual.commit.ranges.held =
    ``bound``: the partition's state (``state``, shared with the other members' commits)
    takes a commit unless it would hold more ranges than the bound and than it holds."""

    group = "g"

    def __init__(self, state: CommitState, bound: int) -> None:
        self.state, self.bound = state, bound
        self.sent: list[list[tuple[int, int]]] = []

    async def request(self, api_key, build):
        body = build(9)
        (topic,) = body.topics
        (part,) = topic.partitions
        ranges = [(r.start, r.end) for r in part.offset_ranges]
        self.sent.append(ranges)
        after = apply_ranges(self.state, ranges)
        code = ErrorCode.INVALID_COMMIT_OFFSET_SIZE if check_held(self.state, after, self.bound) else ErrorCode.NONE
        if code == ErrorCode.NONE:
            self.state = after
        return NS(topics=[NS(name=topic.name, partitions=[NS(partition_index=part.partition_index, error_code=code,
                                                             stable_offset=self.state.stable if not code else -1)])])


async def test_a_commit_past_the_proxys_state_bound_sends_its_lowest_ranges_and_keeps_the_rest():
    state = AssignmentState(read_committed=False, tracking=True)
    state.assign({TP: equal_shares(2)[:1]})
    progress = state.progress[TP] = PartitionProgress(0)
    for offset in (0, 2, 10, 12, 14, 16):
        progress.mark(offset)
    # The other member committed 1, 3, 30 and 32: the state is at the bound of 4.
    proxy = BoundedProxy(CommitState(0, ((1, 1), (3, 3), (30, 30), (32, 32))), bound=4)
    metrics: Counter = Counter()
    committer = Committer(proxy, state, ClusterMetadata(), max_ranges=10, metrics=metrics)  # type: ignore[arg-type]
    await committer.commit_processed(ranges_supported=True)  # no error: nothing is lost
    # All six would leave [10], [12], [14], [16], [30], [32]; the lowest three fit.
    assert proxy.sent == [[(0, 0), (2, 2), (10, 10), (12, 12), (14, 14), (16, 16)], [(0, 0), (2, 2), (10, 10)]]
    assert proxy.state == CommitState(4, ((10, 10), (30, 30), (32, 32)))
    assert list(progress.pending) == [(12, 12), (14, 14), (16, 16)] and progress.stable == 4
    assert metrics["range_commits"] == 1 and metrics["range_commits_deferred"] == 1
    # The next commit halves down to one range, which fits, and leaves the rest.
    proxy.sent.clear()
    await committer.commit_processed(ranges_supported=True)
    assert proxy.sent == [[(12, 12), (14, 14), (16, 16)], [(12, 12)]]
    assert list(progress.pending) == [(14, 14), (16, 16)] and metrics["range_commits_deferred"] == 2
    # The other member's share catches up and closes the gaps: everything goes at once.
    proxy.state = apply_ranges(proxy.state, [(4, 9), (11, 11), (13, 13)])
    proxy.sent.clear()
    await committer.commit_processed(ranges_supported=True)
    assert proxy.sent == [[(14, 14), (16, 16)]]
    assert not list(progress.pending) and progress.stable == 15 and metrics["range_commits_deferred"] == 2


async def test_a_single_range_past_the_bound_stays_pending_without_an_error():
    state = AssignmentState(read_committed=False, tracking=True)
    state.assign({TP: equal_shares(2)[:1]})
    progress = state.progress[TP] = PartitionProgress(0)
    progress.mark(40)
    proxy = BoundedProxy(CommitState(0, ((1, 1), (3, 3))), bound=2)
    metrics: Counter = Counter()
    committer = Committer(proxy, state, ClusterMetadata(), max_ranges=10, metrics=metrics)  # type: ignore[arg-type]
    await committer.commit_processed(ranges_supported=True)
    assert proxy.sent == [[(40, 40)]] and list(progress.pending) == [(40, 40)]
    assert metrics["range_commits_deferred"] == 1 and metrics["range_commits"] == 0


# -- the fetcher, against scripted connections -------------------------------------------------
class ScriptedConnections:
    """Opens a node's connection only when ``opened`` is set; answers every Fetch empty."""

    timeout = 5.0

    def __init__(self) -> None:
        self.opened = trio.Event()
        self.asked = trio.Event()
        self.bodies: list = []

    async def node(self, node_id, address):
        self.asked.set()
        await self.opened.wait()
        return NS(versions={ApiKey.FETCH: 12}, filters_ranges=True)

    async def request(self, connection, api_key, version, body, *, timeout=None):
        self.bodies.append(body)
        return NS(error_code=0, responses=[])


def _fetcher_setup():
    state = AssignmentState(read_committed=False, tracking=False)
    state.assign({TP: [], TP1: []})
    state.seek(TP, 5)
    state.seek(TP1, 6)
    metadata = ClusterMetadata()
    metadata.update(_metadata_response([(1, 0, 0), (1, 0, 0)]), [TP, TP1])
    connections = ScriptedConnections()
    fetcher = Fetcher(state, metadata, connections, max_wait_ms=100, max_bytes=1000,  # type: ignore[arg-type]
                      partition_max_bytes=100, isolation_level=0, auto_offset_reset="latest", metrics=Counter())
    return state, connections, fetcher


async def test_a_partition_reset_while_the_fetch_waits_for_its_connection_is_left_out():
    state, connections, fetcher = _fetcher_setup()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            fetcher.attach(nursery)
            fetcher.start_background()
            assert fetcher.background_running
            await connections.asked.wait()
            state.reset_later(TP, EARLIEST_TIMESTAMP)  # the application, meanwhile
            connections.opened.set()
            await fetcher.wait_background(trio.current_time() + 5)
            received: set = set()
            fetcher.take_background(received)
    assert not fetcher.background_running
    (body,) = connections.bodies
    assert [(p.partition, p.fetch_offset) for p in body.topics[0].partitions] == [(1, 6)]


async def test_the_background_fetch_error_is_raised_by_the_taker():
    state, connections, fetcher = _fetcher_setup()
    state.assign({TP: equal_shares(2)[:1]})
    state.seek(TP, 5)

    async def refuse(node_id, address):
        return NS(versions={ApiKey.FETCH: 11}, filters_ranges=False)

    connections.node = refuse  # type: ignore[method-assign]
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            fetcher.attach(nursery)
            fetcher.start_background()
            await fetcher.wait_background(trio.current_time() + 5)
    with pytest.raises(RangeFetchNotSupportedError, match="node 1 at a:9001 does not advertise keyrange.fetch"):
        fetcher.take_background(set())
    assert not fetcher.background_running and not connections.bodies
