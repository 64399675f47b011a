"""Key-range answers the native relay sends itself (proxy/keyrange/native.py, the answers
section of proxy/net/_cpump.c): for the same cache state and request, the loop's answer
is byte for byte the event loop's, or the loop leaves the request to the event loop; what
the loop may hand out follows the cache (published, pending a read-ahead, withdrawn,
removed with the share), and what it took is accounted for as the event loop's hits are.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import uuid

import pytest

from proxy.keyrange.cache import CachedShare
from proxy.keyrange.engine import ConnectionRanges, KeyRangeEngine
from proxy.keyrange.native import NativeShares, answer_key, native_bytes, served_entry
from proxy.keyrange.settings import KeyRangeTopicSettings
from proxy.net import native_checks
from proxy.net.native_table import KEYS, VERSIONS, NativeClass, entry, guard_blob, known_blob
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.message_types import FetchRequest, FetchResponse
from proxy.ranges import KeyRange
from tests.unit.test_native_relay import _read_exactly

_cpump = pytest.importorskip("proxy.net._cpump")
if not hasattr(_cpump, "Answers"):
    pytest.skip("the native relay was built without answers", allow_module_level=True)

NAMES = {uuid.uuid5(uuid.NAMESPACE_DNS, name): name for name in ("orders", "events", "quiet")}
IDS = {name: topic_id for topic_id, name in NAMES.items()}
HALF = 1 << 62
LOW, HIGH = (KeyRange(0, HALF - 1),), (KeyRange(HALF, (1 << 63) - 1),)
TWO = (KeyRange(0, 99), KeyRange(1000, 1999))
ABORTED = [FetchResponse.AbortedTransaction(producer_id=7, first_offset=120),
           FetchResponse.AbortedTransaction(producer_id=9, first_offset=130)]
NOW = 100.0


class Setup:
    """An engine whose cache the loop's table follows, and one connection's state."""

    def __init__(self, *, reads_ahead: bool = False, settings: KeyRangeTopicSettings | None = None) -> None:
        topic_settings = settings or KeyRangeTopicSettings()
        self.engine = KeyRangeEngine(cache_bytes=1 << 30, topic_settings=lambda name: topic_settings,
                                     topic_name=NAMES.get)
        self.in_flight: set[tuple[str, int, int, int]] = set()
        self.native = NativeShares(_cpump.Answers(), self.engine.cache, topic_id=IDS.get,
                                   topic_settings=self.engine.topic_settings, reads_ahead=reads_ahead,
                                   in_flight=self.in_flight.__contains__)
        self.engine.cache.listener = self.native
        self.conn = ConnectionRanges()

    @property
    def table(self):
        return self.native.table

    def serve(self, name: str, partition: int) -> None:
        """The broker served this connection the partition (the loop answers only then)."""
        self.conn.served.add((name, partition))
        self.conn.served_ids.add(served_entry(IDS[name], partition))

    def put(self, name: str, partition: int, ranges, start: int, next_offset: int, *, level: int = 0,
            records: bytes | None = None, high_watermark: int = 10_000, last_stable_offset: int = 9_000,
            aborted=()) -> CachedShare:
        share = CachedShare((name, partition), ranges, start, next_offset, level,
                            records=os.urandom(300) if records is None else records,
                            high_watermark=high_watermark, last_stable_offset=last_stable_offset,
                            log_start_offset=5, aborted_transactions=list(aborted))
        assert self.engine.cache.put(share)
        self.engine.active.touch((name, partition), ranges, NOW)
        return share

    def native_answer(self, frame: bytes, take: bool = False) -> bytes | None:
        return _cpump.answer(frame, self.table, self.conn.served_blob(), take)

    def python_answer(self, frame: bytes) -> bytes | None:
        """The event loop's answer to ``frame`` when it is made of cached shares alone."""
        header, body = messages.decode_request(frame[4:])
        engine = self.engine
        plan = engine.plan(self.conn, header.request_api_version, body, NOW)
        if plan is None:
            return None
        engine.upstream_reads(plan)
        engine.finish(plan)
        if plan.upstream_body is not None:
            return None
        response = engine.complete(self.conn, plan, None, NOW)
        encoded = messages.encode_response(ApiKey.FETCH, header.request_api_version,
                                           messages.new_response_header(header.correlation_id), response)
        return struct.pack(">i", len(encoded)) + encoded


def _wire(ranges):
    return None if ranges is None else [FetchRequest.KeyRange(start=r.start, end=r.end) for r in ranges]


def fetch(version: int, topics, *, top=None, level: int = 0, session=(0, -1), forgotten=(), correlation_id: int = 41,
          client_id: str | None = "consumer-1", rack: str = "", coop: bool = False, limit: int = 1 << 20) -> bytes:
    """A Fetch request frame (size prefix first). ``topics``: [(name, [(partition, offset,
    ranges)])], ranges None for none of its own; ``limit``: each partition's max bytes."""
    cls = messages.body_class(ApiKey.FETCH, "request")
    entries = []
    for name, partitions in topics:
        parts = []
        for partition, offset, ranges in partitions:
            part = cls.FetchPartition(partition=partition, fetch_offset=offset, partition_max_bytes=limit,
                                      key_ranges=_wire(ranges))
            if coop:
                part.cooperative = cls.CooperativeMember(group_id="g", member_id="m", generation_id=1)
            parts.append(part)
        entries.append(cls.FetchTopic(topic_id=IDS.get(name, uuid.uuid5(uuid.NAMESPACE_DNS, name)), topic=name
                                      if version < 13 else "", partitions=parts))
    body = messages.new_body(ApiKey.FETCH, version, "request", max_wait_ms=100, min_bytes=1, max_bytes=1 << 20,
                             isolation_level=level, session_id=session[0], session_epoch=session[1],
                             topics=entries, key_ranges=_wire(top), rack_id=rack,
                             forgotten_topics_data=[cls.ForgottenTopic(topic_id=IDS["quiet"], partitions=[0])]
                             if forgotten else [])
    header = messages.new_request_header(ApiKey.FETCH, version, correlation_id, client_id)
    frame = messages.encode_request(header, body)
    return struct.pack(">i", len(frame)) + frame


def _same_answer(setup: Setup, frame: bytes) -> bytes:
    native = setup.native_answer(frame)
    assert native is not None, "the loop leaves it to the event loop"
    python = setup.python_answer(frame)
    assert native == python
    return native


# -- byte for byte the event loop's -------------------------------------------------------------
@pytest.mark.parametrize("version", range(13, 18))
def test_one_partition_as_the_raw_client_asks(version):
    setup = Setup()
    setup.serve("orders", 0)
    setup.put("orders", 0, LOW, 500, 700)
    _same_answer(setup, fetch(version, [("orders", [(0, 500, LOW)])]))
    assert len(setup.table) == 0  # served by the event loop: taken out of the table with the share


@pytest.mark.parametrize("version", [13, 17])
def test_many_partitions_topics_top_level_ranges_aborted_and_read_committed(version):
    setup = Setup()
    for partition in (0, 1, 2):
        setup.serve("orders", partition)
    setup.serve("events", 4)
    setup.put("orders", 2, TWO, 10, 20, level=1, aborted=ABORTED, last_stable_offset=15)
    setup.put("orders", 0, HIGH, 30, 45, level=1)
    setup.put("orders", 1, TWO, 0, 3, level=1, records=b"")
    setup.put("events", 4, TWO, 77, 78, level=1, high_watermark=78, last_stable_offset=78)
    frame = fetch(version, [("orders", [(2, 10, None), (0, 30, HIGH), (1, 0, None)]), ("events", [(4, 77, None)])],
                  top=TWO, level=1, client_id=None, rack="rack-a")
    _same_answer(setup, frame)


def test_a_partition_with_a_null_own_list_takes_the_top_level_ranges():
    setup = Setup()
    setup.serve("orders", 0)
    setup.put("orders", 0, TWO, 5, 6)
    cls = messages.body_class(ApiKey.FETCH, "request")
    frame = fetch(17, [("orders", [(0, 5, None)])], top=TWO)
    assert cls  # the partition's own KeyRanges absent: the top level's apply
    _same_answer(setup, frame)


# -- left to the event loop ---------------------------------------------------------------------
@pytest.mark.parametrize("case", ["not served", "one missing", "other offset", "other level", "other ranges",
                                  "session", "forgotten", "cooperative", "v12", "whole partition", "named twice",
                                  "own empty list", "too many ranges", "above the limit"])
def test_what_the_loop_leaves_to_the_event_loop(case):
    setup = Setup()
    setup.serve("orders", 0)
    setup.serve("orders", 1)
    setup.put("orders", 0, LOW, 100, 200)
    setup.put("orders", 1, LOW, 100, 200)
    ranges: tuple | None = LOW
    topics = [("orders", [(0, 100, LOW)])]
    options: dict = {}
    version = 17
    if case == "not served":
        setup.conn = ConnectionRanges()
    elif case == "one missing":
        topics = [("orders", [(0, 100, LOW), (2, 100, LOW)])]
    elif case == "other offset":
        topics = [("orders", [(0, 150, LOW)])]  # inside the share: the event loop's (it serves it)
    elif case == "other level":
        options["level"] = 1
    elif case == "other ranges":
        topics = [("orders", [(0, 100, HIGH)])]
    elif case == "session":
        options["session"] = (0, 0)
    elif case == "forgotten":
        options["forgotten"] = True
    elif case == "cooperative":
        options["coop"] = True
    elif case == "v12":
        version = 12
    elif case == "whole partition":
        topics = [("orders", [(0, 100, None)])]
    elif case == "named twice":
        topics = [("orders", [(0, 100, LOW), (0, 100, LOW)])]
    elif case == "own empty list":
        topics = [("orders", [(0, 100, ())])]
        options["top"] = LOW
    elif case == "above the limit":
        options["limit"] = 299  # the share's records: 300 bytes (the event loop serves it in parts)
    elif case == "too many ranges":
        ranges = tuple(KeyRange(i * 10, i * 10 + 5) for i in range(17))
        setup.put("orders", 0, ranges, 100, 200)
        topics = [("orders", [(0, 100, ranges)])]
    frame = fetch(version, topics, **options)
    assert setup.native_answer(frame) is None
    assert _cpump.answer(frame, setup.table, setup.conn.served_blob(), True) is None
    assert len(setup.table) >= 1  # nothing taken


def test_a_truncated_or_padded_request_is_never_answered():
    setup = Setup()
    setup.serve("orders", 0)
    setup.put("orders", 0, LOW, 100, 200)
    frame = fetch(17, [("orders", [(0, 100, LOW)])])
    for cut in range(0, len(frame) - 1, 3):
        assert setup.native_answer(frame[:cut]) is None
    padded = struct.pack(">i", len(frame) - 3) + frame[4:] + b"\0"
    assert setup.native_answer(padded) is None
    assert setup.native_answer(frame) is not None


# -- what the table holds ------------------------------------------------------------------------
def test_the_table_follows_the_cache_and_its_memory_is_charged():
    setup = Setup()
    cache = setup.engine.cache
    share = setup.put("orders", 0, LOW, 100, 200, aborted=ABORTED)
    assert len(setup.table) == 1 and setup.table.bytes > 0
    assert cache.bytes_held == share.size + native_bytes(share) + 336  # its set's index entry
    assert native_bytes(share) > 200 + 16 * 2 + 17 * 2  # the loop's entry, its key and its bytes
    cache.resize(0)  # evicted by the cap: taken out of the table too
    assert len(setup.table) == 0 and cache.bytes_held == 0
    cache.resize(1 << 30)
    setup.put("orders", 0, LOW, 100, 200)
    setup.engine.cache.drop_set(("orders", 0), LOW)  # the set's interest expired
    assert len(setup.table) == 0 and not setup.native.published and not setup.native.by_handle


def test_a_share_waits_for_the_read_ahead_of_the_position_it_leads_to():
    setup = Setup(reads_ahead=True)
    setup.serve("orders", 0)
    setup.put("orders", 0, LOW, 100, 200)
    setup.put("orders", 0, HIGH, 100, 200)
    frame = fetch(17, [("orders", [(0, 100, LOW)])])
    assert setup.native_answer(frame) is None  # its consumer's fetch reads 200 ahead: the event loop's
    setup.in_flight.add(("orders", 0, 200, 0))
    setup.native.covered(("orders", 0), 0, 200)  # the read of 200 announced
    assert setup.native_answer(frame) is not None
    setup.put("orders", 0, LOW, 300, 400)
    setup.put("orders", 0, LOW, 200, 300)  # a read of 300 is cached: the share of 200 needs none
    assert setup.native_answer(fetch(17, [("orders", [(0, 200, LOW)])])) is not None
    setup.put("orders", 0, HIGH, 900, 10_000)  # at the end of what there is: no read ahead
    assert setup.native_answer(fetch(17, [("orders", [(0, 900, HIGH)])])) is not None


def test_what_the_loop_took_is_served_and_counted_as_the_event_loops_hits():
    setup = Setup()
    setup.serve("orders", 0)
    cache = setup.engine.cache
    share = setup.put("orders", 0, LOW, 100, 200)
    frame = fetch(17, [("orders", [(0, 100, LOW)])])
    expected = setup.native_answer(frame)
    handle = setup.native.published[("orders", 0), LOW, 0, 100][0]
    assert _cpump.answer(frame, setup.table, setup.conn.served_blob(), True) == expected
    assert len(setup.table) == 0 and len(cache) == 1  # the event loop hears of it in the run's report
    cache.resize(0)  # evicted meanwhile: the report still counts it
    touched = []
    assert setup.native.taken([handle, 12345], lambda *args: touched.append(args), NOW) == 1
    assert touched == [(("orders", 0), LOW, NOW)] and cache.stats.hits == 1
    assert not setup.native.by_handle and cache.bytes_held == 0
    assert share.records is not None


def test_withdrawn_when_the_settings_change_and_not_published_for_a_refusing_topic():
    setup = Setup(settings=KeyRangeTopicSettings(fetch_enabled=False))
    setup.put("orders", 0, LOW, 100, 200)
    assert len(setup.table) == 0
    setup = Setup()
    setup.put("orders", 0, LOW, 100, 200)
    setup.native.withdraw()
    assert len(setup.table) == 0 and not setup.native.published


def test_the_key_is_the_loops():
    setup = Setup()
    setup.serve("orders", 3)
    frame = fetch(15, [("orders", [(3, 2**40, TWO)])], level=1)
    keys = _cpump.answer_keys(frame, False, setup.conn.served_blob())
    assert keys == [answer_key(IDS["orders"], 3, 1, 2**40, TWO)]
    assert native_checks.answer_keys(frame, False, setup.conn.served_blob()) == keys


# -- the loop over sockets ------------------------------------------------------------------------
def _pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        near = socket.create_connection(listener.getsockname())
        far, _ = listener.accept()
    near.setblocking(False)
    return near, far


def _fetch_table(guarded: bool = False) -> bytes:
    table = bytearray(KEYS * VERSIONS)
    for version in range(12, 18):
        table[ApiKey.FETCH * VERSIONS + version] = entry(NativeClass.FETCH, True, guarded)
    return bytes(table)


class Loop:
    """The loop on a thread between a client socket pair and an upstream socket pair."""

    def __init__(self, setup: Setup, **options) -> None:
        self.client_near, self.client = _pair()
        self.upstream_near, self.broker = _pair()
        self.wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.pipes = [os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC) for _ in range(2)]
        self.options = {"classes": _fetch_table(), "answers": setup.table, "served": setup.conn.served_blob(),
                        **options}
        self.result: list = []
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        self.result.append(_cpump.relay(client=self.client_near.fileno(), upstream=self.upstream_near.fileno(),
                                        wake=self.wake, flights=[], max_frame=1 << 26, max_inflight=8,
                                        slice_ms=5000, idle_ms=2000, request_pipe=(*self.pipes[0], 65536),
                                        response_pipe=(*self.pipes[1], 65536), **self.options))

    def join(self):
        self.thread.join(10)
        assert not self.thread.is_alive(), "the loop did not stop"
        return self.result[0]

    def close(self) -> None:
        if self.thread.is_alive():
            os.eventfd_write(self.wake, 2)
            self.thread.join(10)
        for sock in (self.client_near, self.client, self.upstream_near, self.broker):
            sock.close()
        os.close(self.wake)
        for read_end, write_end in self.pipes:
            os.close(read_end)
            os.close(write_end)


@pytest.fixture
def loops():
    made: list[Loop] = []

    def make(setup: Setup, **options) -> Loop:
        made.append(Loop(setup, **options))
        return made[-1]

    yield make
    for loop in made:
        loop.close()


@pytest.mark.parametrize("guarded", [False, True])
def test_the_loop_answers_after_the_response_it_owes(loops, guarded):
    setup = Setup()
    setup.serve("orders", 0)
    setup.put("orders", 0, LOW, 100, 200)
    setup.put("orders", 0, LOW, 200, 300)
    plain = fetch(17, [("orders", [(0, 300, None)])], correlation_id=1)
    first = fetch(17, [("orders", [(0, 100, LOW)])], correlation_id=2)
    second = fetch(17, [("orders", [(0, 200, LOW)])], correlation_id=3)
    expected = [setup.native_answer(first), setup.native_answer(second)]
    extra = {"guard": guard_blob([b".kr"], []), "known": known_blob([IDS["orders"].bytes]),
             "classes": _fetch_table(True)} if guarded else {}
    loop = loops(setup, **extra)
    loop.thread.start()
    loop.client.sendall(plain + first + second)
    assert _read_exactly(loop.broker, len(plain)) == plain  # forwarded: its answer comes first
    body = messages.encode_response(ApiKey.FETCH, 17, messages.new_response_header(1),
                                    FetchResponse(session_id=0))
    loop.broker.sendall(struct.pack(">i", len(body)) + body)
    got = [_read_exactly(loop.client, 4 + len(body))] + [_read_exactly(loop.client, len(e)) for e in expected]
    assert got == [struct.pack(">i", len(body)) + body, *expected]
    loop.client.shutdown(socket.SHUT_WR)  # its end: the run stops for the event loop to meet it
    reason, flights, answered, _, forwarded, _, _, _, taken = loop.join()
    assert reason == _cpump.PYTHON_REQUEST and flights == [] and forwarded == 1 and len(taken) == 2
    assert len(answered) == 3 and len(setup.table) == 0


def test_a_guarded_run_leaves_a_topic_it_does_not_know_to_the_event_loop(loops):
    setup = Setup()
    setup.serve("orders", 0)
    setup.put("orders", 0, LOW, 100, 200)
    loop = loops(setup, classes=_fetch_table(True), guard=guard_blob([b".kr"], []), known=known_blob([]))
    loop.thread.start()
    loop.client.sendall(fetch(17, [("orders", [(0, 100, LOW)])]))
    reason, _, answered, _, forwarded, _, _, _, taken = loop.join()
    assert reason == _cpump.PYTHON_REQUEST and answered == [] and taken == [] and len(setup.table) == 1


def test_the_loop_answers_big_answers_whole_and_reports_what_it_took(loops):
    setup = Setup()
    setup.serve("orders", 0)
    setup.put("orders", 0, LOW, 100, 200, records=os.urandom(3 << 20))  # more than a socket takes at once
    setup.put("orders", 0, LOW, 200, 300)
    first = fetch(17, [("orders", [(0, 100, LOW)])], correlation_id=1, limit=4 << 20)
    second = fetch(17, [("orders", [(0, 200, LOW)])], correlation_id=2)
    missing = fetch(17, [("orders", [(0, 300, LOW)])], correlation_id=3)
    expected = [setup.native_answer(first), setup.native_answer(second)]
    handles = [setup.native.published[("orders", 0), LOW, 0, start][0] for start in (100, 200)]
    loop = loops(setup)
    peek = [loop.client_near.fileno(), _fetch_table(), 1 << 26, b"", b"", setup.table, setup.conn.served_blob()]
    assert _cpump.peek(*peek) is None
    loop.client.sendall(first + second + missing)
    for _ in range(100):
        if _cpump.peek(*peek) is not None:
            break
        threading.Event().wait(0.01)
    assert _cpump.peek(*peek) == NativeClass.FETCH  # a run starts on it
    assert _cpump.peek(*peek[:3]) == 0  # without the table: the event loop's
    loop.thread.start()
    got = [_read_exactly(loop.client, len(expected[0])), _read_exactly(loop.client, len(expected[1]))]
    reason, flights, answered, _, forwarded, _, _, _, taken = loop.join()
    assert got == expected
    assert reason == _cpump.PYTHON_REQUEST and flights == [] and forwarded == 0  # the miss is the event loop's
    assert taken == handles
    assert [(key, request, response) for key, request, response, _ in answered] == [
        (ApiKey.FETCH, len(first), len(expected[0])), (ApiKey.FETCH, len(second), len(expected[1]))]
    assert setup.native.taken(taken, lambda *args: None, NOW) == 2
    assert len(setup.engine.cache) == 0 and setup.engine.cache.stats.hits == 2
