"""Cooperative fetch in the consumer (docs/wire-contract.md section 3.7), without a broker:
the request's tag 10001, taking chunks in (records, gaps, the token), the per-partition
state, the consumer's checks and the fetcher against scripted connections."""

from __future__ import annotations

import uuid
from collections import Counter
from types import SimpleNamespace

import pytest
import trio

from harness.batches import Rec, control_batch, kafka_python_batch
from proxy.client import (
    ConfigError,
    Consumer,
    ConsumerRecord,
    CooperativeFetchNotSupportedError,
    IllegalStateError,
    TopicPartition,
    equal_shares,
)
from proxy.client.assignment import AssignmentState, EndOffsets, PendingReset
from proxy.client.errors import CorruptRecordError, IllegalGenerationError, UnknownMemberIdError
from proxy.client.fetch_protocol import (
    CooperativeMember,
    FetchLimits,
    FetchPosition,
    apply_cooperative,
    apply_fetch_response,
    fetch_request,
)
from proxy.client.fetcher import Fetcher
from proxy.client.metadata import ClusterMetadata
from proxy.client.progress import PartitionProgress
from proxy.commits.state import CommitState, apply_ranges
from proxy.protocol import messages
from proxy.protocol.constants import EXTENSION_TAG_BYTES, FETCH_SESSION_FINAL_EPOCH, FETCH_SESSIONLESS_ID, ErrorCode
from proxy.protocol.messages import ApiKey
from proxy.records.batch import iter_batches
from proxy.records.builder import rebuild_batch
from tests.unit.test_consumer_modules import _metadata_response

TP = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)
NS = SimpleNamespace
MEMBER = CooperativeMember("g", "m-1", 4)
ASSIGN_MODE = CooperativeMember("g", "c-1", -1)
LIMITS = FetchLimits(max_wait_ms=250, max_bytes=1000, partition_max_bytes=100, isolation_level=0)
COOPERATIVE_TAG = 10001


def batch(base: int, count: int) -> bytes:
    return kafka_python_batch([Rec(i, f"k{base + i}".encode(), b"v") for i in range(count)], base_offset=base)


def chunk(start: int, end: int):
    return NS(chunk_start=start, chunk_end=end)


def part(blob=b"", cooperative_chunk=None, *, code=0, high_watermark=100, aborted=None):
    return NS(partition_index=0, error_code=code, records=blob, high_watermark=high_watermark,
              last_stable_offset=high_watermark, log_start_offset=0, aborted_transactions=aborted,
              key_ranges_applied=None, cooperative_chunk=cooperative_chunk)


def shared_state(token: int = 0, stable: int | None = 0) -> AssignmentState:
    """A partition fetched cooperatively, at ``token``, the group's S at ``stable``."""
    state = AssignmentState(read_committed=False, tracking=True)
    state.assign({TP: []}, [TP])
    state.positions[TP] = token
    state.progress[TP] = PartitionProgress(stable, [])
    return state


def take(state: AssignmentState, answer, metrics: Counter | None = None, member=MEMBER, fenced=None) -> list[int]:
    """One answer taken in at the partition's token; the offsets handed out (all drained)."""
    apply_cooperative(state, TP, answer, state.positions[TP], member, received_time=1.0, received=set(),
                      metrics=metrics if metrics is not None else Counter(), fenced=fenced)
    return [r.offset for r in state.drain(10_000, set())]


# -- the request ------------------------------------------------------------------------------
@pytest.mark.parametrize("version", [12, 13, 17])
def test_fetch_request_carries_the_member_on_cooperative_partitions_only(version):
    body = fetch_request(version, [FetchPosition(TP1, 3, 57, [], MEMBER), FetchPosition(TP, 2, 7, [])],
                         {"t": uuid.UUID(int=1) if version >= 13 else None}, LIMITS)
    assert (body.session_id, body.session_epoch) == (FETCH_SESSIONLESS_ID, FETCH_SESSION_FINAL_EPOCH)
    encoded = messages.encode_body(ApiKey.FETCH, version, "request", body)
    assert EXTENSION_TAG_BYTES not in encoded  # no key ranges anywhere
    decoded = messages.decode_body(ApiKey.FETCH, version, "request", encoded)
    shared, whole = decoded.topics[0].partitions
    assert (shared.partition, shared.fetch_offset, shared.key_ranges) == (1, 57, None)
    member = shared.cooperative
    assert (member.group_id, member.member_id, member.generation_id) == ("g", "m-1", 4)
    assert whole.cooperative is None and whole.key_ranges is None
    # a stock decoder skips it as an unknown tagged field of the partition
    standard = messages.decode_body(ApiKey.FETCH, version, "request", encoded, view="standard")
    partitions = standard.topics[0].partitions
    assert [tag for tag, _ in partitions[0]._unknown_tagged] == [COOPERATIVE_TAG]
    assert partitions[1]._unknown_tagged == ()
    # assign mode: generation -1
    body = fetch_request(version, [FetchPosition(TP, 2, 0, [], ASSIGN_MODE)], {"t": uuid.UUID(int=1)}, LIMITS)
    again = messages.decode_body(ApiKey.FETCH, version, "request", messages.encode_body(ApiKey.FETCH, version,
                                                                                        "request", body))
    assert again.topics[0].partitions[0].cooperative.generation_id == -1


def test_a_request_never_mixes_key_ranges_and_cooperative_partitions():
    share = equal_shares(2)[0]
    with pytest.raises(ValueError, match=r"one Fetch cannot carry key ranges \(t-0\) and cooperative partitions "
                                         r"\(t-1\)"):
        fetch_request(12, [FetchPosition(TP, 0, 0, [share]), FetchPosition(TP1, 0, 0, [], MEMBER)], {"t": None},
                      LIMITS)
    with pytest.raises(ValueError, match="t-0 cannot be fetched both by key range and cooperatively"):
        fetch_request(12, [FetchPosition(TP, 0, 0, [share], MEMBER)], {"t": None}, LIMITS)


# -- taking chunks in -------------------------------------------------------------------------
def test_a_chunk_hands_out_its_records_and_moves_the_token_past_it():
    state = shared_state(token=10, stable=10)
    metrics: Counter = Counter()
    assert take(state, part(batch(10, 10), chunk(10, 19)), metrics) == list(range(10, 20))
    assert state.position(TP) == 20 and state.chunks_reached[TP] == 20
    assert not state.progress[TP].pending  # every offset is a record: nothing is a gap
    assert (metrics["cooperative_chunks"], metrics["cooperative_records"]) == (1, 10)
    assert state.lag(TP) == 80


def test_handing_records_out_never_moves_the_token():
    state = shared_state(token=10, stable=10)
    apply_cooperative(state, TP, part(batch(10, 10), chunk(10, 19)), 10, MEMBER, received_time=1.0,
                      received=set(), metrics=Counter())
    records = state.drain(3, {TP})
    assert [r.offset for r in records] == [10, 11, 12]
    assert state.position(TP) == 20 and records.metadata()[TP].position == 20
    assert records.metadata()[TP].lag == 80


def test_no_chunk_hands_out_nothing_and_keeps_the_token():
    state = shared_state(token=30)
    metrics: Counter = Counter()
    assert take(state, part(), metrics) == []
    assert state.position(TP) == 30 and TP not in state.chunks_reached and state.lag(TP) is None
    # records without a chunk (the proxy must not send them) are dropped and counted
    assert take(state, part(batch(30, 4)), metrics) == []
    assert state.position(TP) == 30 and not state.progress[TP].pending
    assert metrics["cooperative_records_outside_chunk"] == 4 and metrics["cooperative_chunks"] == 0


def test_records_outside_the_chunk_are_dropped_and_counted():
    state = shared_state(token=0)
    metrics: Counter = Counter()
    assert take(state, part(batch(0, 10), chunk(3, 6)), metrics) == [3, 4, 5, 6]
    assert metrics["cooperative_records_outside_chunk"] == 6 and metrics["cooperative_records"] == 4
    assert state.position(TP) == 7
    assert not state.progress[TP].pending  # nothing outside the chunk is claimed as a gap


def test_a_control_batch_inside_the_chunk_is_marked_as_a_gap():
    # records 0-4, a transaction marker at 5, records 6-9
    blob = batch(0, 5) + control_batch(base_offset=5, commit=True) + batch(6, 4)
    state = shared_state(token=0)
    assert take(state, part(blob, chunk(0, 9))) == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert list(state.progress[TP].pending) == [(5, 5)]


def test_aborted_records_and_compaction_holes_inside_the_chunk_are_gaps():
    source = next(iter_batches(batch(20, 10)))
    kept = [r.raw for r in source.records() if r.offset in (21, 25, 26)]
    compacted = rebuild_batch(source.header, kept, len(kept))  # spans 20-29, three records left
    state = shared_state(token=20, stable=20)
    assert take(state, part(compacted, chunk(20, 29))) == [21, 25, 26]
    assert list(state.progress[TP].pending) == [(20, 20), (22, 24), (27, 29)]
    # read_committed: a transaction aborted in the chunk is the member's gap too
    aborted = kafka_python_batch([Rec(i, b"k", b"v") for i in range(3)], base_offset=40, transactional=True,
                                 producer_id=7, producer_epoch=0, base_sequence=0)
    marker = control_batch(base_offset=43, commit=False, producer_id=7)
    state = shared_state(token=40, stable=40)
    state.read_committed = True
    metrics: Counter = Counter()
    assert take(state, part(aborted + marker + batch(44, 2), chunk(40, 45), aborted=[NS(producer_id=7,
                                                                                        first_offset=40)]),
                metrics) == [44, 45]
    assert list(state.progress[TP].pending) == [(40, 43)] and metrics["aborted_records_dropped"] == 3


def test_a_redelivered_chunk_below_moves_the_token_down():
    state = shared_state(token=0)
    assert take(state, part(batch(50, 10), chunk(50, 59))) == list(range(50, 60))
    assert state.position(TP) == 60
    # another member's lease expired: its chunk 10-14 comes to this member
    assert take(state, part(batch(10, 5), chunk(10, 14))) == list(range(10, 15))
    assert state.position(TP) == 15  # the proxy's retry detector, not a position
    assert state.chunks_reached[TP] == 60 and state.lag(TP) == 40  # the lag follows the highest chunk
    assert state.last_handed(TP) == 59


def test_records_the_group_already_committed_are_never_handed_out():
    state = shared_state(token=10)
    state.progress[TP] = PartitionProgress(12, [(15, 16)])
    metrics: Counter = Counter()
    assert take(state, part(batch(10, 10), chunk(10, 19)), metrics) == [12, 13, 14, 17, 18, 19]
    assert metrics["records_already_committed"] == 4


def test_members_committing_their_chunks_move_s_past_every_offset():
    """Three members take turns at chunks of a log with markers and a compaction hole;
    each marks its records processed; their commits together move S to the end."""
    log = [batch(0, 5), control_batch(base_offset=5, commit=True), batch(6, 4), batch(14, 6),
           control_batch(base_offset=20, commit=True)]  # 10-13 compacted away
    chunks = [(0, 5), (6, 13), (14, 20)]
    members = [shared_state(token=0) for _ in chunks]
    handed: list[int] = []
    for member, (start, end), blob in zip(members, chunks, [log[0] + log[1], log[2], log[3] + log[4]]):
        offsets = take(member, part(blob, chunk(start, end)))
        handed += offsets
        for offset in offsets:
            member.progress[TP].mark(offset)
    assert sorted(handed) == [0, 1, 2, 3, 4, 6, 7, 8, 9, 14, 15, 16, 17, 18, 19]
    group = CommitState(0)
    for member in reversed(members):
        group = apply_ranges(group, list(member.progress[TP].pending))
    assert group == CommitState(21, ())


def test_a_cut_batch_is_taken_only_as_far_as_its_whole_batches_reach():
    blob = batch(0, 5) + batch(5, 5)
    state = shared_state(token=0)
    assert take(state, part(blob[:-7], chunk(0, 9))) == [0, 1, 2, 3, 4]
    assert list(state.progress[TP].pending) == []  # 5-9 are neither handed out nor claimed
    assert state.position(TP) == 10


def test_cooperative_errors():
    state = shared_state(token=7)
    metrics: Counter = Counter()
    # assign mode is never fenced by the proxy: ILLEGAL_GENERATION is raised
    with pytest.raises(IllegalGenerationError, match="member 'c-1' \\(generation -1\\) of group 'g'"):
        take(state, part(code=ErrorCode.ILLEGAL_GENERATION), member=ASSIGN_MODE, fenced=[])
    # a group member is told to rejoin
    fenced: list = []
    assert take(state, part(code=ErrorCode.ILLEGAL_GENERATION), metrics, fenced=fenced) == []
    assert fenced == [TP] and state.position(TP) == 7
    with pytest.raises(UnknownMemberIdError):
        take(state, part(code=ErrorCode.UNKNOWN_MEMBER_ID))
    # out of range: the reset policy gives the next token, which the proxy takes as its marker
    assert take(state, part(code=ErrorCode.OFFSET_OUT_OF_RANGE), metrics) == []
    assert isinstance(state.positions[TP], PendingReset)
    state.positions[TP] = 7
    assert apply_cooperative(state, TP, part(code=ErrorCode.NOT_LEADER_OR_FOLLOWER), 7, MEMBER,
                             received_time=1.0, received=set(), metrics=metrics) is True
    with pytest.raises(CorruptRecordError, match=r"the chunk \[9, 8\], which is no offset range"):
        take(state, part(cooperative_chunk=chunk(9, 8)))


def test_a_response_for_a_partition_whose_mode_changed_meanwhile_is_stale():
    state = shared_state(token=5)
    response = NS(error_code=0, responses=[NS(topic="t", topic_id=None, partitions=[part(batch(5, 3), chunk(5, 7))])])
    kwargs = dict(version=12, node_id=1, topic_names={}, received_time=1.0, auto_offset_reset="latest")
    received: set = set()
    # fetched plainly at 5, but the partition is cooperative now
    apply_fetch_response(state, response, offsets={TP: 5}, received=received, metrics=Counter(), **kwargs)
    assert not received and state.position(TP) == 5
    apply_fetch_response(state, response, offsets={TP: 5}, received=received, metrics=Counter(),
                         cooperative={TP: MEMBER}, **kwargs)
    assert received == {TP} and [r.offset for r in state.drain(10, received)] == [5, 6, 7]


# -- the partition's state --------------------------------------------------------------------
def test_switching_a_partition_to_or_from_cooperative_starts_it_again_from_the_group():
    state = AssignmentState(read_committed=False, tracking=True)
    state.assign({TP: [], TP1: []})
    state.seek(TP, 40)
    state.seek(TP1, 8)
    state.progress[TP] = PartitionProgress(30, [])
    state.progress[TP1] = PartitionProgress(8, [])
    state.progress[TP].mark(35)
    state.buffers.add(TP, [ConsumerRecord("t", 0, 40, 0, None, b"")], 41)
    state.assign({TP: [], TP1: []}, [TP])
    assert state.cooperative == {TP} and state.positions[TP] is None and state.position(TP1) == 8
    assert not state.buffers.has_buffered(TP)  # fetched plainly: the proxy hands those offsets to others
    assert list(state.progress[TP].pending) == [(35, 35)]  # the member's own marks stay
    assert state.wants_group_offsets() == [TP]
    state.positions[TP] = 30
    state.chunks_reached[TP] = 60
    state.assign({TP: [], TP1: []})
    assert not state.cooperative and state.positions[TP] is None and TP not in state.chunks_reached
    state.assign({TP: []}, [TP1])  # only partitions assigned can be cooperative
    assert not state.cooperative
    with pytest.raises(ValueError, match="t-0: a partition fetched cooperatively is shared whole"):
        state.assign({TP: equal_shares(2)[:1]}, [TP])


def test_lag_of_a_cooperative_partition_follows_the_highest_chunk():
    state = shared_state(token=10)
    state.ends[TP] = EndOffsets(1.0, high_watermark=100, last_stable_offset=90, log_start_offset=0)
    assert state.lag(TP) is None  # no chunk yet
    state.chunks_reached[TP] = 70
    state.positions[TP] = 20
    assert state.lag(TP) == 30
    state.read_committed = True
    assert state.lag(TP) == 20


# -- the consumer -----------------------------------------------------------------------------
def _consumer(*, cooperative=True, **settings) -> Consumer:
    settings = {"group_id": "g", "allow_individual_commit": True, "client_id": "app", **settings}
    consumer = Consumer("127.0.0.1:1", **settings)
    consumer._started = True
    consumer._connections.bootstrap = NS(filters_ranges=True, commits_ranges=True,  # type: ignore[assignment]
                                         fetches_cooperatively=cooperative)
    return consumer


def test_assign_cooperatively_needs_a_group_individual_commit_whole_partitions_and_the_feature():
    with pytest.raises(ConfigError, match=r"assign\(\.\.\., cooperative=True\) needs a group_id"):
        _consumer(group_id=None, allow_individual_commit=False).assign([TP], cooperative=True)
    with pytest.raises(ConfigError, match="needs allow_individual_commit=True"):
        _consumer(allow_individual_commit=False).assign([TP], cooperative=True)
    with pytest.raises(ValueError, match="t-0 is given key ranges: list the partitions without ranges"):
        _consumer().assign({TP: equal_shares(2)[:1], TP1: []}, cooperative=True)
    with pytest.raises(CooperativeFetchNotSupportedError, match="does not advertise cooperative.fetch"):
        _consumer(cooperative=False).assign([TP, TP1], cooperative=True)
    with pytest.raises(ValueError, match="cooperative must be a bool"):
        _consumer().assign([TP], cooperative="yes")  # type: ignore[arg-type]
    consumer = _consumer()
    assert consumer.cooperative_fetch_supported
    consumer.assign([TP, TP1], cooperative=True)
    assert consumer.cooperative_partitions() == {TP, TP1} and consumer.assignment() == {TP: [], TP1: []}
    consumer.assign([TP])
    assert consumer.cooperative_partitions() == set()


def test_partition_sharing_is_checked():
    with pytest.raises(ConfigError, match="partition_sharing must be one of keyrange, cooperative; got 'chunks'"):
        Consumer("127.0.0.1:1", group_id="g", allow_individual_commit=True, partition_sharing="chunks")
    with pytest.raises(ConfigError, match="partition_sharing='cooperative' needs allow_individual_commit=True"):
        Consumer("127.0.0.1:1", group_id="g", partition_sharing="cooperative")
    consumer = _consumer(partition_sharing="cooperative", cooperative=False)
    with pytest.raises(CooperativeFetchNotSupportedError, match="partition_sharing='cooperative'"):
        consumer.subscribe(["t"])
    assert Consumer("127.0.0.1:1").config.partition_sharing == "keyrange"


def test_a_cooperative_partition_cannot_be_sought_nor_committed_plainly():
    consumer = _consumer()
    consumer.assign([TP, TP1], cooperative=True)
    for call, args in ((consumer.seek, (TP, 5)), (consumer.seek_to_beginning, (TP1,)),
                       (consumer.seek_to_end, ())):
        with pytest.raises(ValueError, match="fetched cooperatively: the proxy decides which offsets each member"):
            call(*args)
    with pytest.raises(IllegalStateError, match="t-0 is fetched cooperatively: a plain committed offset"):
        trio.run(consumer.commit, {TP: 3})


def test_position_is_the_token_and_the_metrics_are_listed():
    consumer = _consumer()
    consumer.assign([TP], cooperative=True)
    state = consumer._state
    state.positions[TP] = 0
    state.progress[TP] = PartitionProgress(0, [])
    apply_cooperative(state, TP, part(batch(40, 5), chunk(40, 44)), 0, MEMBER, received_time=1.0, received=set(),
                      metrics=consumer._metrics)
    assert consumer.position(TP) == 45 and consumer.current_lag(TP) == 55
    metrics = consumer.metrics()
    assert (metrics["cooperative_chunks"], metrics["cooperative_records"],
            metrics["cooperative_records_outside_chunk"]) == (1, 5, 0)
    assert "cooperative_records_outside_chunk" in Consumer("127.0.0.1:1").metrics()


def test_the_assign_mode_member_is_the_client_id_and_a_uuid_with_generation_minus_one():
    consumer = _consumer()
    member = consumer._cooperative_member()
    assert member is not None and member.group_id == "g" and member.generation_id == -1
    prefix, _, rest = member.member_id.partition("-")
    assert prefix == "app" and uuid.UUID(rest)
    assert consumer._cooperative_member() == member  # one id per consumer
    assert _consumer()._cooperative_member() != member


# -- the fetcher ------------------------------------------------------------------------------
class Connections:
    """One node; answers every Fetch with the chunks of ``answers`` (by partition)."""

    timeout = 5.0

    def __init__(self, *, cooperative: bool = True) -> None:
        self.cooperative = cooperative
        self.bodies: list = []
        self.answers: dict[int, object] = {}

    async def node(self, node_id, address):
        return NS(versions={ApiKey.FETCH: 12}, filters_ranges=True, fetches_cooperatively=self.cooperative)

    async def request(self, connection, api_key, version, body, *, timeout=None):
        self.bodies.append(body)
        parts = [self.answers.get(p.partition, part()) for t in body.topics for p in t.partitions]
        for p, answer in zip([p for t in body.topics for p in t.partitions], parts):
            answer.partition_index = p.partition
        return NS(error_code=0, responses=[NS(topic="t", topic_id=None, partitions=parts)])


def fetcher_setup(member=MEMBER, **kwargs):
    state = AssignmentState(read_committed=False, tracking=True)
    state.assign({TP: [], TP1: []}, [TP])
    state.seek(TP1, 6)
    state.positions[TP] = 5
    state.progress[TP] = PartitionProgress(5, [])
    metadata = ClusterMetadata()
    metadata.update(_metadata_response([(1, 0, 0), (1, 0, 0)]), [TP, TP1])
    connections = Connections(**kwargs)
    fenced: list[int] = []
    fetcher = Fetcher(state, metadata, connections, max_wait_ms=100, max_bytes=1000,  # type: ignore[arg-type]
                      partition_max_bytes=100, isolation_level=0, auto_offset_reset="latest", metrics=Counter(),
                      member=lambda: member, on_fenced=fenced.append)
    return state, connections, fetcher, fenced


def test_the_fetcher_sends_the_member_and_takes_the_chunk_in():
    state, connections, fetcher, _ = fetcher_setup()
    connections.answers[0] = part(batch(5, 3), chunk(5, 7))
    received: set = set()
    assert trio.run(fetcher.fetch, fetcher.fetchable(), 100, received) is False
    (body,) = connections.bodies
    sent = {p.partition: p for p in body.topics[0].partitions}
    assert sent[0].cooperative.member_id == "m-1" and sent[0].fetch_offset == 5
    assert sent[1].cooperative is None and sent[1].fetch_offset == 6  # plain partitions may go along
    assert [r.offset for r in state.drain(10, received)] == [5, 6, 7] and state.position(TP) == 8


def test_key_ranges_and_cooperative_partitions_of_one_leader_go_in_two_requests():
    state, connections, fetcher, _ = fetcher_setup()
    state.assign({TP: [], TP1: equal_shares(2)[:1]}, [TP])
    state.seek(TP1, 6)
    trio.run(fetcher.fetch, fetcher.fetchable(), 100, set())
    first, second = connections.bodies
    assert [(p.partition, p.cooperative is not None) for p in first.topics[0].partitions] == [(0, True)]
    assert [(p.partition, bool(p.key_ranges)) for p in second.topics[0].partitions] == [(1, True)]
    assert (first.max_wait_ms, second.max_wait_ms) == (100, 0)  # the second does not wait again


def test_the_fetcher_refuses_a_node_without_the_feature():
    state, connections, fetcher, _ = fetcher_setup(cooperative=False)
    with pytest.raises(CooperativeFetchNotSupportedError, match="node 1 at a:9001 does not advertise "
                                                                "cooperative.fetch .*chunks of t-0"):
        trio.run(fetcher.fetch, fetcher.fetchable(), 100, set())
    assert not connections.bodies


def test_without_a_member_cooperative_partitions_wait():
    state, connections, fetcher, _ = fetcher_setup(member=None)
    assert fetcher.fetchable() == [TP1]


def test_a_fenced_cooperative_fetch_asks_the_group_to_rejoin_and_backs_off():
    state, connections, fetcher, fenced = fetcher_setup()
    connections.answers[0] = part(code=ErrorCode.ILLEGAL_GENERATION)
    assert trio.run(fetcher.fetch, fetcher.fetchable(), 100, set()) is True
    assert fenced == [4] and state.position(TP) == 5


def test_a_reset_of_a_cooperative_partition_amends_nothing():
    """No committed offset: the token starts at the reset's offset, and the offsets below it
    are left to the proxy's first chunk (its ChunkStart claims them): a member's own gap
    could claim what the proxy handed to another member."""
    state = AssignmentState(read_committed=False, tracking=True)
    state.assign({TP: []}, [TP])
    assert not state.needs_log_start(TP)
    state.reset_to(TP, 40)
    progress = state.progress.get(TP)
    assert state.position(TP) == 40 and not state.reset_points
    assert progress is None or not list(progress.pending)
