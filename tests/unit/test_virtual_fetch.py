"""Fetch of virtual partitions through the feature, without a broker: a client's Fetch goes
into ``VirtualFetchFeature.on_fetch``, a made-up broker answers the read it sends, and the
client's answer comes out. Covers what one connection's read means for its other shares
(an out-of-range position), and which reads a consumer may be served from (its isolation
level)."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import trio
import trio.testing

from harness.batches import Rec, control_batch, kafka_python_batch
from proxy.keyrange.engine import KeyRangeEngine, SharedReads
from proxy.pipeline.cluster import ClusterView
from proxy.pipeline.context import ConnectionContext
from proxy.pipeline.request import Request
from proxy.pipeline.route import DecodedResponse, Route
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import ErrorCode
from proxy.protocol.framing import peek_request_header
from proxy.records.batch import RecordBatch, iter_batches
from proxy.records.keyhash import key_hash
from proxy.records.transactions import TransactionFilter, Verdict
from proxy.server.config import build_config
from proxy.virtual.fetch_feature import VirtualFetchFeature
from proxy.virtual.names import share_ranges
from proxy.virtual.resolver import VirtualResolver

READ_UNCOMMITTED, READ_COMMITTED = 0, 1
VERSION = 12
OUT_OF_RANGE = int(ErrorCode.OFFSET_OUT_OF_RANGE)


@functools.cache
def key_of(shares: int, share: int, n: int = 0) -> bytes:
    """The ``n``-th key (in a fixed order) that falls into ``share`` of ``shares``."""
    wanted = share_ranges(shares)[share]
    found = 0
    for i in range(1_000_000):
        key = b"key-%d" % i
        if wanted.start <= key_hash(key, 0) <= wanted.end:
            if found == n:
                return key
            found += 1
    raise AssertionError("no such key")


@dataclass
class Answer:
    """The broker's answer for the one real partition read."""

    records: bytes = b""
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted: list[tuple[int, int]] = field(default_factory=list)
    error_code: int = 0


Broker = Callable[[int, int], Answer]  # (fetch offset, isolation level) -> answer


def striped_log(shares: int, log_start: int, high_watermark: int) -> Broker:
    """A partition holding [log_start, high_watermark) in batches of ten, the record at
    offset o in share o % shares; Kafka's answers, OFFSET_OUT_OF_RANGE included (with -1
    for the log start and high watermark, as Kafka sends it)."""
    def answer(offset: int, isolation: int) -> Answer:
        if offset < log_start or offset > high_watermark:
            return Answer(error_code=OUT_OF_RANGE)
        first = max(log_start, offset - offset % 10)
        records = b"".join(
            kafka_python_batch([Rec(o - base, key_of(shares, o % shares), b"v")
                                for o in range(base, min(base + 10, high_watermark))], base_offset=base)
            for base in range(first, high_watermark, 10) if base >= log_start)
        return Answer(records, high_watermark, high_watermark, log_start)
    return answer


class World:
    """One proxy's virtual-topics feature over a cluster of one topic ``t`` with one partition."""

    def __init__(self) -> None:
        config = build_config({"bootstrap.servers": "127.0.0.1:9092", "virtual.topics.enabled": "true"})
        cluster = ClusterView()
        meta = messages.body_class(ApiKey.METADATA, "response")
        cluster.learn_metadata(messages.new_body(ApiKey.METADATA, 9, "response", brokers=[], topics=[
            meta.MetadataResponseTopic(error_code=0, name="t", partitions=[
                meta.MetadataResponsePartition(error_code=0, partition_index=0, leader_id=0)])]))
        engine = KeyRangeEngine(cache_bytes=1 << 30, topic_settings=config.keyrange.topics.of, topic_name=lambda key: None)
        self.feature = VirtualFetchFeature(VirtualResolver(config.virtual, cluster), None, SharedReads(engine))
        self.reads: list[tuple[int, int]] = []  # (fetch offset, isolation level) of every broker read
        self._connections = 0

    def connection(self) -> ConnectionContext:
        self._connections += 1
        return ConnectionContext(self._connections, "peer", "node-0")

    async def send(self, ctx: ConnectionContext, topic: str, positions: dict[int, int], *, isolation: int,
                   max_wait_ms: int = 0) -> Route:
        """A sessionless Fetch of ``topic`` at ``positions`` (virtual partition -> offset)."""
        cls = messages.body_class(ApiKey.FETCH, "request")
        body = messages.new_body(ApiKey.FETCH, VERSION, "request", replica_id=-1, max_wait_ms=max_wait_ms,
                                 min_bytes=1, max_bytes=1 << 20, isolation_level=isolation, session_id=0,
                                 session_epoch=-1, topics=[cls.FetchTopic(topic=topic, partitions=[
                                     cls.FetchPartition(partition=v, current_leader_epoch=-1, fetch_offset=o,
                                                        last_fetched_epoch=-1, log_start_offset=-1,
                                                        partition_max_bytes=1 << 20)
                                     for v, o in sorted(positions.items())])],
                                 forgotten_topics_data=[], rack_id="")
        frame = messages.encode_request(messages.new_request_header(ApiKey.FETCH, VERSION, 7, "c"), body)
        route = await self.feature.on_fetch(ctx, Request(peek_request_header(frame), frame))
        assert route is not None
        return route

    async def finish(self, route: Route, broker: Broker) -> dict[int, object]:
        """The client's answer, by virtual partition, once ``broker`` answered the route's read."""
        if route.local is not None:
            _, body = messages.decode_response(ApiKey.FETCH, VERSION, await route.local.wait())
        else:
            _, upstream = messages.decode_request(route.upstream_frame)
            ((read,),) = [topic.partitions for topic in upstream.topics]
            self.reads.append((read.fetch_offset, upstream.isolation_level))
            got = broker(read.fetch_offset, upstream.isolation_level)
            cls = messages.body_class(ApiKey.FETCH, "response")
            body = messages.new_body(ApiKey.FETCH, VERSION, "response", session_id=0, responses=[
                cls.FetchableTopicResponse(topic="t", partitions=[cls.PartitionData(
                    partition_index=0, error_code=got.error_code, high_watermark=got.high_watermark,
                    last_stable_offset=got.last_stable_offset, log_start_offset=got.log_start_offset,
                    aborted_transactions=[cls.AbortedTransaction(producer_id=p, first_offset=f)
                                          for p, f in got.aborted],
                    preferred_read_replica=-1, records=got.records)])])
            decoded = DecodedResponse(ApiKey.FETCH, VERSION, messages.new_response_header(7), body)
            assert route.on_response is not None
            await route.on_response(decoded)
            body = decoded.body
        if route.settle is not None:
            route.settle()
        return {p.partition_index: p for topic in body.responses for p in topic.partitions}

    async def fetch(self, ctx: ConnectionContext, topic: str, positions: dict[int, int], broker: Broker, *,
                    isolation: int = READ_UNCOMMITTED) -> dict[int, object]:
        return await self.finish(await self.send(ctx, topic, positions, isolation=isolation), broker)


def batches(part) -> list[RecordBatch]:
    return [b for b in iter_batches(part.records or b"") if isinstance(b, RecordBatch)]


def delivered(part, position: int, *, read_committed: bool) -> list[int]:
    """The offsets a Kafka consumer at ``position`` hands out of one partition's answer."""
    verdicts = TransactionFilter([(a.producer_id, a.first_offset) for a in part.aborted_transactions or ()],
                                 read_committed)
    return [record.offset for batch in batches(part) if verdicts.verdict(batch) is Verdict.DELIVER
            for record in batch.records() if record.offset >= position]


def next_position(part, position: int) -> int:
    return max([position] + [batch.header.last_offset + 1 for batch in batches(part)])


# -- an out-of-range position costs only its own share ----------------------------------------


def test_only_the_share_below_the_log_start_is_told_it_is_out_of_range():
    """Retention moved the log start to 100 past share 0 (at 50); share 1 is at 200, valid.
    The connection's one read starts at 50 and is refused: share 1 must not get the error
    (a consumer resets on it, to the log end by default, and skips [200, 300))."""
    broker = striped_log(2, log_start=100, high_watermark=300)

    async def main():
        world = World()
        ctx = world.connection()
        first = await world.fetch(ctx, "t.kr2", {0: 50, 1: 200}, broker)
        assert first[0].error_code == OUT_OF_RANGE
        assert first[1].error_code == 0 and not first[1].records
        # The client has not reset share 0 yet and asks for both again: the read starts at
        # share 1's position, and share 0 is told again (the read reported the log start).
        second = await world.fetch(ctx, "t.kr2", {0: 50, 1: 200}, broker)
        assert world.reads[-1] == (200, READ_UNCOMMITTED)
        assert second[0].error_code == OUT_OF_RANGE
        assert second[1].error_code == 0
        assert delivered(second[1], 200, read_committed=False) == list(range(201, 300, 2))
        # Share 0 reset to the log start: one read from there serves both again.
        third = await world.fetch(ctx, "t.kr2", {0: 100, 1: 300}, broker)
        assert world.reads[-1] == (100, READ_UNCOMMITTED)
        assert third[0].error_code == 0 and delivered(third[0], 100, read_committed=False) == list(range(100, 300, 2))

    trio.run(main)


def test_a_valid_share_is_read_after_every_lower_position_was_refused():
    """Shares 0 and 1 (at 10 and 50) are both below the log start (100), share 2 (at 150)
    is not, and the client keeps asking for all three: each round trip moves the read
    above one refused position, share 2 never gets the error and gets every record."""
    broker = striped_log(4, log_start=100, high_watermark=300)

    async def main():
        world = World()
        ctx = world.connection()
        positions = {0: 10, 1: 50, 2: 150}
        errors: dict[int, list[int]] = {0: [], 1: [], 2: []}
        got: list[int] = []
        for _ in range(3):
            answers = await world.fetch(ctx, "t.kr4", positions, broker)
            for share, part in answers.items():
                errors[share].append(part.error_code)
            got += delivered(answers[2], positions[2], read_committed=False)
        assert [offset for offset, _ in world.reads] == [10, 50, 150]
        assert errors[2] == [0, 0, 0] and got == list(range(150, 300, 4))
        assert errors[0][0] == OUT_OF_RANGE and errors[1][1] == OUT_OF_RANGE
        assert errors[0][-1] == errors[1][-1] == OUT_OF_RANGE  # the successful read told the log start

    trio.run(main)


def test_a_read_above_the_log_end_refuses_every_share_in_turn():
    """Both shares are past the log end (say, after a truncation): each is told, the lower
    one first; no share waits for ever on empty answers."""
    broker = striped_log(2, log_start=0, high_watermark=100)

    async def main():
        world = World()
        ctx = world.connection()
        first = await world.fetch(ctx, "t.kr2", {0: 150, 1: 170}, broker)
        assert (first[0].error_code, first[1].error_code) == (OUT_OF_RANGE, 0)
        second = await world.fetch(ctx, "t.kr2", {1: 170}, broker)
        assert second[1].error_code == OUT_OF_RANGE

    trio.run(main)


# -- a consumer is served only from reads of its own isolation level ----------------------------


def _aborted_log(offset: int, isolation: int) -> Answer:
    """Offsets 0-4: a share-1 record at 0, an aborted transaction of producer 7 holding
    share-1 records at 1 and 2, its ABORT marker at 3, a share-0 record at 4 (HW = LSO = 5)."""
    if offset >= 5:
        return Answer(b"", 5, 5, 0)
    log = (kafka_python_batch([Rec(0, key_of(2, 1), b"v")])
           + kafka_python_batch([Rec(0, key_of(2, 1), b"v"), Rec(1, key_of(2, 1, 1), b"v")], base_offset=1,
                                transactional=True, producer_id=7, producer_epoch=0, base_sequence=0)
           + control_batch(base_offset=3, commit=False, producer_id=7)
           + kafka_python_batch([Rec(0, key_of(2, 0), b"v")], base_offset=4))
    return Answer(log, 5, 5, 0, [(7, 1)] if isolation == READ_COMMITTED else [])


def _open_transaction_log(offset: int, isolation: int) -> Answer:
    """Producer 7's transaction is open from offset 1 (LSO 1, HW 4): a share-1 record at 0,
    the open transaction's share-1 records at 1 and 2, a share-0 record at 3. A
    read_committed answer stops at the last stable offset."""
    if offset >= 4:
        return Answer(b"", 4, 1, 0)
    committed = kafka_python_batch([Rec(0, key_of(2, 1), b"v")])
    if isolation == READ_COMMITTED:
        return Answer(committed, 4, 1, 0)
    return Answer(committed
                  + kafka_python_batch([Rec(0, key_of(2, 1), b"v"), Rec(1, key_of(2, 1, 1), b"v")], base_offset=1,
                                       transactional=True, producer_id=7, producer_epoch=0, base_sequence=0)
                  + kafka_python_batch([Rec(0, key_of(2, 0), b"v")], base_offset=3), 4, 1, 0)


def test_a_read_committed_member_gets_no_aborted_record_from_a_read_uncommitted_read():
    """A (read_uncommitted) reads share 0; the split caches share 1 with A's answer, which
    lists no aborted transaction. B (read_committed, share 1, same position) must read for
    itself and get the aborted transactions listed."""
    async def main():
        world = World()
        await world.fetch(world.connection(), "t.kr2", {0: 0}, _aborted_log, isolation=READ_UNCOMMITTED)
        answers = await world.fetch(world.connection(), "t.kr2", {1: 0}, _aborted_log, isolation=READ_COMMITTED)
        assert delivered(answers[1], 0, read_committed=True) == [0]
        assert (0, READ_COMMITTED) in world.reads

    trio.run(main)


def test_a_read_committed_member_never_moves_past_the_last_stable_offset():
    async def main():
        world = World()
        await world.fetch(world.connection(), "t.kr2", {0: 0}, _open_transaction_log, isolation=READ_UNCOMMITTED)
        answers = await world.fetch(world.connection(), "t.kr2", {1: 0}, _open_transaction_log,
                                    isolation=READ_COMMITTED)
        part = answers[1]
        assert delivered(part, 0, read_committed=True) == [0]
        assert next_position(part, 0) <= part.last_stable_offset == 1

    trio.run(main)


def test_a_read_uncommitted_member_is_not_served_a_read_committed_read():
    async def main():
        world = World()
        await world.fetch(world.connection(), "t.kr2", {0: 0}, _open_transaction_log, isolation=READ_COMMITTED)
        answers = await world.fetch(world.connection(), "t.kr2", {1: 0}, _open_transaction_log,
                                    isolation=READ_UNCOMMITTED)
        assert delivered(answers[1], 0, read_committed=False) == [0, 1, 2]  # up to the high watermark

    trio.run(main)


def test_members_at_the_same_isolation_level_still_share_a_read():
    async def main():
        world = World()
        await world.fetch(world.connection(), "t.kr2", {0: 0}, _aborted_log, isolation=READ_COMMITTED)
        answers = await world.fetch(world.connection(), "t.kr2", {1: 0}, _aborted_log, isolation=READ_COMMITTED)
        assert delivered(answers[1], 0, read_committed=True) == [0]
        assert answers[1].records
        assert world.reads == [(0, READ_COMMITTED), (5, READ_COMMITTED)]  # a read, then B's probe

    trio.run(main)


def test_a_fetch_waits_only_for_a_read_in_flight_at_its_own_isolation_level():
    """A's read of offset 0 is on its way and never answered. B (other level, same position)
    reads at once; C (A's level) waits for A's read, at most its max_wait_ms plus a second."""
    async def main():
        world = World()
        await world.send(world.connection(), "t.kr2", {0: 0}, isolation=READ_UNCOMMITTED)
        start = trio.current_time()
        await world.send(world.connection(), "t.kr2", {1: 0}, isolation=READ_COMMITTED, max_wait_ms=500)
        assert trio.current_time() == start
        await world.send(world.connection(), "t.kr2", {1: 0}, isolation=READ_UNCOMMITTED, max_wait_ms=500)
        assert trio.current_time() - start >= 0.5

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_refused_probe_is_not_sent_again():
    """B's probe at the high watermark another connection's read saw (5) is refused: the
    high watermark went back. B's next fetch reads from its own position instead of
    probing the same offset again."""
    def shrunk(offset: int, isolation: int) -> Answer:
        return Answer(error_code=OUT_OF_RANGE) if offset > 3 else _aborted_log(offset, isolation)

    async def main():
        world = World()
        await world.fetch(world.connection(), "t.kr2", {0: 0}, _aborted_log)
        b = world.connection()
        first = await world.fetch(b, "t.kr2", {1: 0}, shrunk)
        assert first[1].error_code == 0 and not first[1].records
        await world.fetch(b, "t.kr2", {1: 0}, shrunk)
        assert world.reads[1:] == [(5, READ_UNCOMMITTED), (0, READ_UNCOMMITTED)]

    trio.run(main)


# -- a full fetch naming an id the proxy cannot name opens no broker session ------------------

def _full_fetch_by_id(topic_id, session_id: int) -> Request:
    cls = messages.body_class(ApiKey.FETCH, "request")
    body = messages.new_body(ApiKey.FETCH, 13, "request", replica_id=-1, max_wait_ms=500, min_bytes=1,
                             max_bytes=1 << 20, isolation_level=READ_UNCOMMITTED, session_id=session_id,
                             session_epoch=0, topics=[cls.FetchTopic(topic_id=topic_id, partitions=[
                                 cls.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])])
    frame = messages.encode_request(messages.new_request_header(ApiKey.FETCH, 13, 7, "c"), body)
    return Request(peek_request_header(frame), frame)


@pytest.mark.parametrize("session_id", [0, 1234], ids=["new", "closing-its-last"])
def test_a_full_fetch_by_an_id_the_proxy_cannot_name_goes_sessionless(session_id):
    """Epoch 0 opens a broker session, also with the id of the session it had: a Java
    consumer whose proxy restarted sends that (its connection closed, it closes the session
    and opens a new one). In a broker session a virtual topic's id, which a just started
    instance may not know yet, would be answered UNKNOWN_TOPIC_ID for good (a rolling
    restart of the sidecars stalled Java consumers of T.kr4 so). Sessionless (epoch -1,
    which also closes the session named), the next fetch names the id again."""
    async def main():
        world = World()
        route = await world.feature.on_fetch(world.connection(), _full_fetch_by_id(uuid.uuid4(), session_id))
        assert route is not None and route.upstream_frame is not None
        _, upstream = messages.decode_request(route.upstream_frame)
        assert (upstream.session_id, upstream.session_epoch) == (session_id, -1)

    trio.run(main)


def test_fetches_coming_while_a_topic_id_lookup_is_on_its_way_wait_for_it():
    """Clients reconnecting to a proxy that just started come at once: the first one's
    lookup (every topic's metadata) answers them all, and no other is sent meanwhile."""
    topic_id = uuid.uuid4()
    meta = messages.body_class(ApiKey.METADATA, "response")
    reads: list[float] = []

    async def reader(topics):
        reads.append(trio.current_time())
        await trio.sleep(1.0)  # a slow broker
        return messages.new_body(ApiKey.METADATA, 12, "response", brokers=[], topics=[meta.MetadataResponseTopic(
            error_code=0, name="t", topic_id=topic_id, partitions=[
                meta.MetadataResponsePartition(error_code=0, partition_index=0, leader_id=0)])])

    async def main():
        cluster = ClusterView()
        cluster.reader = reader
        named: list[str | None] = []

        async def fetch_naming_the_id() -> None:
            await cluster.look_up_ids([topic_id])
            named.append(cluster.name_of(topic_id))

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(fetch_naming_the_id)
        assert named == ["t", "t", "t"] and len(reads) == 1

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
