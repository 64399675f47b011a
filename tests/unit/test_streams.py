"""FrameStream over real loopback TCP: whole frames in, whole frames out, and relaying a
response while it arrives (opaque, or a Fetch response whose leader hints are rewritten
in place)."""

from __future__ import annotations

import os
import random
import socket
import struct
import uuid

import pytest
import trio

from proxy.features.addresses import PADDING_TAG, rewrite_fetch_tail
from proxy.net.streams import OPAQUE, FrameStream, PartialFrame, Relay
from proxy.protocol import messages
from proxy.protocol.errors import ProtocolError
from proxy.protocol.framing import GatheredFrame
from proxy.protocol.messages import ApiKey
from proxy.protocol.peek import fetch_response_tail, has_tag, walk_fetch_response
from proxy.protocol.primitives import GATHER_MIN_BYTES

FETCH = messages.body_class(ApiKey.FETCH, "response")


async def tcp_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    server = await listeners[0].accept()
    await listeners[0].aclose()
    return client, server


def framed(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


async def dribble(stream: trio.SocketStream, data: bytes, seed: int = 1) -> None:
    """Send ``data`` in uneven pieces, yielding between them, so frames arrive split."""
    rng = random.Random(seed)
    pos = 0
    while pos < len(data):
        step = rng.choice((1, 3, 700, 65536, 300_000))
        await stream.send_all(data[pos : pos + step])
        pos += step
        await trio.sleep(0)


class Book:
    """Advertises every node at a proxy address of a given length."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.learned: dict[int, tuple[str, int]] = {}

    def learn(self, node_id: int, host: str, port: int) -> None:
        self.learned[node_id] = (host, port)

    def advertised(self, node_id: int) -> tuple[str, int]:
        return self.host, 19000 + node_id


def fetch_response(version: int, *, hints: list[tuple[int, str, int]] | None, partitions: int = 3,
                   record_bytes: int = 200_000, correlation_id: int = 7) -> bytes:
    parts = [
        FETCH.PartitionData(
            partition_index=i, error_code=0, high_watermark=100, last_stable_offset=100, log_start_offset=0,
            aborted_transactions=[FETCH.AbortedTransaction(producer_id=5, first_offset=9)] if i % 2 else None,
            preferred_read_replica=-1, records=bytes(random.Random(i).randbytes(record_bytes)))
        for i in range(partitions)
    ]
    extra = {}
    if hints is not None:
        extra["node_endpoints"] = [FETCH.NodeEndpoint(node_id=n, host=h, port=p, rack=None) for n, h, p in hints]
    body = messages.new_body(ApiKey.FETCH, version, "response", throttle_time_ms=0, error_code=0, session_id=1,
                             responses=[FETCH.FetchableTopicResponse(topic="t", topic_id=uuid.uuid4(),
                                                                     partitions=parts)],
                             **extra)
    return bytes(messages.encode_response(ApiKey.FETCH, version, messages.new_response_header(correlation_id), body))


# -- whole frames ------------------------------------------------------------------------------

async def test_frames_of_every_size_survive_arbitrary_splits():
    a, b = await tcp_pair()
    bodies = [b"", b"x", bytes(100), random.Random(3).randbytes(70_000), random.Random(4).randbytes(3_000_000), b"end"]
    reader = FrameStream(b, 10 * 1024 * 1024)
    received = []
    async with trio.open_nursery() as nursery:
        async def send() -> None:
            await dribble(a, b"".join(framed(body) for body in bodies))
            await a.aclose()

        nursery.start_soon(send)
        with trio.fail_after(30):
            while (frame := await reader.receive_frame()) is not None:
                received.append(bytes(frame))
    assert received == bodies
    await b.aclose()


async def test_oversized_frame_is_refused_before_its_body():
    a, b = await tcp_pair()
    await a.send_all(struct.pack(">i", 2048))  # only the prefix: nothing to buffer
    with trio.fail_after(10), pytest.raises(ProtocolError, match="exceeds the 1024-byte limit"):
        await FrameStream(b, 1024).receive_frame()
    await a.aclose()
    await b.aclose()


async def test_stream_ending_inside_a_frame_is_an_error():
    a, b = await tcp_pair()
    await a.send_all(struct.pack(">i", 100_000) + bytes(500))
    await a.aclose()
    with trio.fail_after(10), pytest.raises(trio.BrokenResourceError, match="inside a frame"):
        await FrameStream(b, 1024 * 1024).receive_frame()
    await b.aclose()


async def through_a_small_send_buffer(body) -> bytes:
    """``body`` sent with ``send_frame`` through a 4 KiB send buffer; the frame received."""
    a, b = await tcp_pair()
    a.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    writer, reader = FrameStream(a, 4 * 1024 * 1024), FrameStream(b, 4 * 1024 * 1024)
    got = []
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.send_frame, body)
            with trio.fail_after(30):
                got.append(await reader.receive_frame())
    finally:
        await a.aclose()
        await b.aclose()
    return bytes(got[0])


async def test_send_frame_completes_through_a_small_send_buffer():
    body = random.Random(5).randbytes(2_000_000)
    assert await through_a_small_send_buffer(body) == body


@pytest.mark.parametrize("version", [12, 16])
async def test_a_gathered_fetch_answer_arrives_as_the_copied_one_would(version):
    """Record sets above GATHER_MIN_BYTES stay out of the encoded buffer and go out in the
    same writev; what the client reads is the frame ``encode_response`` makes."""
    raw = fetch_response(version, hints=None, partitions=4, record_bytes=100_000)
    header, body = messages.decode_response(ApiKey.FETCH, version, raw)
    body.responses[0].partitions[1].records = b"\x00" * 100  # small: copied in place
    expected = messages.encode_response(ApiKey.FETCH, version, header, body)
    gathered = messages.encode_response_gathered(ApiKey.FETCH, version, header, body)
    assert isinstance(gathered, GatheredFrame) and len(gathered) == len(expected)
    assert bytes(gathered) == expected
    assert sum(1 for part in gathered.parts if len(part) >= GATHER_MIN_BYTES) == 3, "the large ones not copied"
    assert await through_a_small_send_buffer(gathered) == expected


async def test_send_buffers_writes_more_buffers_than_one_writev_takes(monkeypatch):
    monkeypatch.setattr(streams_module, "_IOV_MAX", 7)
    writev = os.writev

    def kernel_writev(fd, buffers):  # a kernel whose IOV_MAX is 7
        if len(buffers) > 7:
            raise OSError(22, "Invalid argument")
        return writev(fd, buffers)

    monkeypatch.setattr(os, "writev", kernel_writev)
    a, b = await tcp_pair()
    a.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    rng = random.Random(3)
    buffers = [rng.randbytes(rng.choice((0, 1, 900, 70_000))) for _ in range(40)]
    expected = b"".join(buffers)
    received = bytearray()
    async with trio.open_nursery() as nursery:
        async def collect() -> None:
            while len(received) < len(expected):
                received.extend(await b.receive_some(1 << 16))

        nursery.start_soon(collect)
        with trio.fail_after(30):
            await streams_module.send_buffers(a.socket, buffers)
    assert bytes(received) == expected
    await a.aclose()
    await b.aclose()


# -- relaying ----------------------------------------------------------------------------------

async def relay_once(frame: bytes, correlation_id: int, relay: Relay, *, seed: int = 1) -> tuple[int | None, bytes]:
    """Broker -> (upstream FrameStream) -> relay -> (client FrameStream) -> client; what the
    client received, raw."""
    broker, upstream = await tcp_pair()
    proxy_side, client = await tcp_pair()
    source, destination = FrameStream(upstream, 10 * 1024 * 1024), FrameStream(proxy_side, 10 * 1024 * 1024)
    received = bytearray()
    result: list = []
    try:
        async with trio.open_nursery() as nursery:
            feeding = trio.CancelScope()

            async def feed() -> None:
                with feeding:  # a refused frame is never read to its end
                    await dribble(broker, framed(frame), seed)

            nursery.start_soon(feed)

            async def collect() -> None:
                while chunk := await client.receive_some(1 << 20):
                    received.extend(chunk)

            nursery.start_soon(collect)
            with trio.fail_after(30):
                try:
                    result.append(await source.relay_frame(destination, correlation_id, relay))
                except ProtocolError as exc:
                    result.append(exc)
                finally:
                    feeding.cancel()
                    await proxy_side.aclose()
    finally:
        for stream in (broker, upstream, client):
            await stream.aclose()
    if isinstance(result[0], ProtocolError):
        assert received == b"", "nothing may be forwarded before the frame is known to be good"
        raise result[0]
    return result[0], bytes(received)


async def test_opaque_relay_forwards_the_frame_unchanged():
    frame = struct.pack(">i", 42) + random.Random(6).randbytes(1_500_000)
    size, received = await relay_once(frame, 42, OPAQUE)
    assert size == len(frame)
    assert received == framed(frame)


async def test_relay_checks_the_correlation_id_before_forwarding_anything():
    frame = struct.pack(">i", 41) + bytes(500_000)
    with pytest.raises(ProtocolError, match="correlation id 41, expected 42"):
        await relay_once(frame, 42, OPAQUE)


def fetch_relay(version: int, book: Book) -> Relay:
    return Relay(lambda frame, size, filled: walk_fetch_response(frame, size, version, filled),
                 lambda frame, tail: rewrite_fetch_tail(frame, tail, version, book))


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_fetch_relay_without_hints_is_byte_for_byte(seed):
    frame = fetch_response(17, hints=None)
    size, received = await relay_once(frame, 7, fetch_relay(17, Book("proxy")), seed=seed)
    assert size == len(frame) and received == framed(frame)


@pytest.mark.parametrize("proxy_host", ["p", "broker-9", "a-much-longer-proxy-host.example.internal"])
async def test_fetch_relay_rewrites_leader_hints_in_place(proxy_host):
    frame = fetch_response(17, hints=[(1, "broker-1", 9092), (2, "broker-2", 9092)])
    book = Book(proxy_host)
    size, received = await relay_once(frame, 7, fetch_relay(17, book))
    assert size == len(frame)
    assert received[:4] == struct.pack(">i", len(frame)) and len(received) == 4 + len(frame)
    assert b"broker-1" not in received and b"broker-2" not in received
    assert book.learned == {1: ("broker-1", 9092), 2: ("broker-2", 9092)}
    _, original = messages.decode_response(ApiKey.FETCH, 17, frame)
    _, body = messages.decode_response(ApiKey.FETCH, 17, received[4:])
    assert [bytes(p.records) for t in body.responses for p in t.partitions] == \
        [bytes(p.records) for t in original.responses for p in t.partitions]
    hints = [(e.node_id, e.host, e.port) for e in body.node_endpoints or ()]
    if len(proxy_host) <= len("broker-1"):
        assert hints == [(1, proxy_host, 19001), (2, proxy_host, 19002)]
    else:  # the proxy's addresses do not fit where the broker's were: no hints at all
        assert hints == []


@pytest.mark.parametrize("version", [12, 13, 15, 16, 17, 18])
def test_walk_finds_the_tagged_fields_at_any_arrival_pattern(version):
    hints = [(1, "h", 1)] if version >= 16 else None
    frame = fetch_response(version, hints=hints, partitions=5, record_bytes=3000)
    tail = fetch_response_tail(frame, version)
    assert has_tag(frame, tail, 0) == (hints is not None)
    for step in (1, 7, 1000, len(frame)):
        walk = walk_fetch_response(frame, len(frame), version, 0)
        filled = 0
        need, safe = next(walk)
        while True:
            assert safe <= tail  # nothing of the rewritable tail is ever declared safe
            filled = min(len(frame), filled + step)
            if filled < need:
                continue
            try:
                need, safe = walk.send(filled)
            except StopIteration as done:
                assert done.value == tail
                break


def test_walk_refuses_a_truncated_response():
    frame = fetch_response(17, hints=None)
    with pytest.raises(ProtocolError):
        fetch_response_tail(frame[:-300], 17)


def test_rewritten_tail_keeps_its_length_and_pads_with_an_unknown_tag():
    frame = fetch_response(16, hints=[(3, "broker-three", 9092)], partitions=1, record_bytes=10)
    tail = fetch_response_tail(frame, 16)
    end = rewrite_fetch_tail(frame, tail, 16, Book("px"))
    assert len(end) == len(frame) - tail
    rebuilt = frame[:tail] + end
    assert has_tag(rebuilt, tail, PADDING_TAG)
    _, body = messages.decode_response(ApiKey.FETCH, 16, rebuilt)
    assert [(e.node_id, e.host, e.port) for e in body.node_endpoints] == [(3, "px", 19003)]


# -- splicing ------------------------------------------------------------------------------------
#
# On Linux the parts of a relayed frame the proxy never reads go from socket to socket
# through a pipe; these check that the bytes still arrive exactly, in order, whatever the
# pieces they come in, and that a stream ending half way is still an error.

from proxy.net import streams as streams_module  # noqa: E402

needs_splice = pytest.mark.skipif(streams_module._SPLICE is None, reason="no os.splice on this platform")


@needs_splice
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
async def test_spliced_opaque_relay_is_exact_for_a_frame_larger_than_the_pipe(seed):
    frame = struct.pack(">i", 9) + random.Random(seed).randbytes(3 * streams_module._PIPE_SIZE + 12345)
    size, received = await relay_once(frame, 9, OPAQUE, seed=seed)
    assert size == len(frame) and received == framed(frame)


@needs_splice
async def test_spliced_relay_through_a_small_client_send_buffer():
    broker, upstream = await tcp_pair()
    proxy_side, client = await tcp_pair()
    proxy_side.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    frames = [struct.pack(">i", n) + random.Random(n).randbytes(n * 300_001) for n in (1, 2, 3)]
    source, destination = FrameStream(upstream, 10 * 1024 * 1024), FrameStream(proxy_side, 10 * 1024 * 1024)
    received = bytearray()
    expected = b"".join(framed(f) for f in frames)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(dribble, broker, expected, 5)

        async def collect() -> None:
            while len(received) < len(expected):
                received.extend(await client.receive_some(5000))

        nursery.start_soon(collect)
        with trio.fail_after(60):
            for n, frame in enumerate(frames, 1):
                assert await source.relay_frame(destination, n, OPAQUE) == len(frame)
    assert received == expected
    for stream in (broker, upstream, proxy_side, client):
        await stream.aclose()


@needs_splice
@pytest.mark.parametrize("seed", [1, 2])
async def test_spliced_fetch_relay_rewrites_hints_after_record_sets_it_never_read(seed):
    frame = fetch_response(17, hints=[(1, "broker-1", 9092)], partitions=4, record_bytes=700_000)
    book = Book("p")
    size, received = await relay_once(frame, 7, fetch_relay(17, book), seed=seed)
    assert size == len(frame) and len(received) == 4 + len(frame)
    _, original = messages.decode_response(ApiKey.FETCH, 17, frame)
    _, body = messages.decode_response(ApiKey.FETCH, 17, received[4:])
    assert [bytes(p.records) for t in body.responses for p in t.partitions] == \
        [bytes(p.records) for t in original.responses for p in t.partitions]
    assert [(e.node_id, e.host, e.port) for e in body.node_endpoints] == [(1, "p", 19001)]


@needs_splice
async def test_spliced_relay_of_a_stream_ending_mid_frame_is_an_error():
    broker, upstream = await tcp_pair()
    proxy_side, client = await tcp_pair()
    source, destination = FrameStream(upstream, 10 * 1024 * 1024), FrameStream(proxy_side, 10 * 1024 * 1024)
    body = struct.pack(">i", 3) + random.Random(8).randbytes(2_000_000)
    cut = 1_500_000
    received = bytearray()
    async with trio.open_nursery() as nursery:
        async def feed() -> None:
            await dribble(broker, framed(body)[:cut], 6)
            await broker.aclose()

        nursery.start_soon(feed)

        async def collect() -> None:
            while chunk := await client.receive_some(1 << 20):
                received.extend(chunk)

        nursery.start_soon(collect)
        with trio.fail_after(30), pytest.raises(trio.BrokenResourceError, match="inside a frame"):
            await source.relay_frame(destination, 3, OPAQUE)
        await proxy_side.aclose()
    # In order and nothing more; the last piece may stay behind (the frame is lost anyway,
    # and the client's connection is closed next).
    assert framed(body)[:cut].startswith(bytes(received))
    assert len(received) >= cut - streams_module._PIPE_SIZE
    for stream in (upstream, client):
        await stream.aclose()


def test_walk_never_reads_what_it_declared_unread():
    """What a walk steps over (before ``min(need, safe)``) may never enter the buffer: the
    walk must find the same tail when those bytes are garbage."""
    frame = fetch_response(17, hints=[(1, "h", 1)], partitions=5, record_bytes=3000)
    tail = fetch_response_tail(frame, 17)
    buffer = bytearray(len(frame))
    walk = walk_fetch_response(buffer, len(frame), 17, 0)
    filled = 0
    need, safe = next(walk)
    while True:
        unread = min(need, safe)
        if unread > filled:
            buffer[filled:unread] = b"\xff" * (unread - filled)  # never arrives in the buffer
            filled = unread
        take = min(len(frame), max(need, filled + 1))
        buffer[filled:take] = frame[filled:take]
        filled = take
        try:
            need, safe = walk.send(filled)
        except StopIteration as done:
            assert done.value == tail
            break


@needs_splice
async def test_splice_pipe_is_kept_empty_between_frames_and_dropped_after_a_failure():
    broker, upstream = await tcp_pair()
    proxy_side, client = await tcp_pair()
    source, destination = FrameStream(upstream, 10 * 1024 * 1024), FrameStream(proxy_side, 10 * 1024 * 1024)
    frames = [fetch_response(17, hints=None, partitions=2, record_bytes=300_000, correlation_id=n) for n in (1, 2)]
    expected = b"".join(framed(f) for f in frames)
    received = bytearray()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(dribble, broker, expected, 3)

        async def collect() -> None:
            while len(received) < len(expected):
                received.extend(await client.receive_some(1 << 20))

        nursery.start_soon(collect)
        with trio.fail_after(30):
            assert await source.relay_frame(destination, 1, fetch_relay(17, Book("p"))) == len(frames[0])
            pipe = source._pipe
            assert pipe is not None
            assert await source.relay_frame(destination, 2, fetch_relay(17, Book("p"))) == len(frames[1])
            assert source._pipe == pipe  # the same pipe, reused
    assert received == expected
    # A stream that ends inside a spliced region leaves no pipe behind (it might hold bytes).
    await broker.send_all(framed(struct.pack(">i", 3) + bytes(400_000))[:200_000])
    await broker.aclose()
    with trio.fail_after(30), pytest.raises(trio.BrokenResourceError, match="inside a frame"):
        await source.relay_frame(destination, 3, OPAQUE)
    assert source._pipe is None
    await source.aclose()
    for stream in (proxy_side, client):
        await stream.aclose()


@needs_splice
async def test_a_fetch_response_that_has_all_arrived_reaches_the_client_in_one_write(monkeypatch):
    """Head, spliced record sets and rewritten tail leave together: each write to the
    client is a wake-up of the client."""
    frame = fetch_response(17, hints=[(1, "broker-1", 9092)], partitions=2, record_bytes=20_000)
    monkeypatch.setattr(streams_module, "_SPLICE_MIN", 1024)  # splice record sets this small
    broker, upstream = await tcp_pair()
    proxy_side, client = await tcp_pair()
    source, destination = FrameStream(upstream, 10 * 1024 * 1024), FrameStream(proxy_side, 10 * 1024 * 1024)
    await broker.send_all(framed(frame))
    # The kernel wakes us only once the whole frame is in the upstream socket.
    upstream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 4 + len(frame))
    await trio.lowlevel.wait_readable(upstream.socket)
    upstream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
    writes = []
    real_splice, real_writev = streams_module._SPLICE, os.writev

    def splice(source_fd, target_fd, count, **kwargs):
        writes.append(target_fd)
        return real_splice(source_fd, target_fd, count, **kwargs)

    def writev(fd, buffers):
        writes.append(fd)
        return real_writev(fd, buffers)

    monkeypatch.setattr(streams_module, "_SPLICE", splice)
    monkeypatch.setattr(os, "writev", writev)
    with trio.fail_after(30):
        assert await source.relay_frame(destination, 7, fetch_relay(17, Book("p"))) == len(frame)
    monkeypatch.undo()
    assert writes.count(proxy_side.socket.fileno()) == 1
    received = bytearray()
    while len(received) < 4 + len(frame):
        received.extend(await client.receive_some(1 << 20))
    _, body = messages.decode_response(ApiKey.FETCH, 17, received[4:])
    assert [(e.node_id, e.host, e.port) for e in body.node_endpoints] == [(1, "p", 19001)]
    await source.aclose()
    for stream in (broker, proxy_side, client):
        await stream.aclose()


# -- large requests passed on while they arrive ------------------------------------------------

@needs_splice
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_requests_of_every_size_reach_the_broker_exactly(seed):
    """Small requests come back whole; large ones as a head, with the body spliced on."""
    client, proxy_side = await tcp_pair()
    upstream, broker = await tcp_pair()
    rng = random.Random(seed)
    sizes = [20, 4000, 70_000, 64 * 1024 + 5000, 300_000, 3 * streams_module._PIPE_SIZE + 17, 100]
    frames = [rng.randbytes(size) for size in sizes]
    expected = b"".join(framed(f) for f in frames)
    source, destination = FrameStream(proxy_side, 10 * 1024 * 1024), FrameStream(upstream, 10 * 1024 * 1024)
    received = bytearray()
    kinds = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(dribble, client, expected, seed)

        async def collect() -> None:
            while len(received) < len(expected):
                received.extend(await broker.receive_some(65536))

        nursery.start_soon(collect)
        with trio.fail_after(60):
            for frame in frames:
                got = await source.receive_request(64 * 1024)
                if isinstance(got, PartialFrame):
                    kinds.append("partial")
                    assert got.size == len(frame)
                    assert frame.startswith(got.head) and len(got.head) >= min(len(frame), 4096)
                    await source.pass_on(got, destination)
                else:
                    kinds.append("whole")
                    assert bytes(got) == frame
                    await destination.send_frame(got)
    assert received == expected
    assert kinds[0] == kinds[-1] == "whole" and "partial" in kinds
    for stream in (client, proxy_side, upstream, broker):
        await stream.aclose()


@needs_splice
async def test_the_rest_of_a_partial_request_can_still_be_read():
    client, proxy_side = await tcp_pair()
    frame = random.Random(9).randbytes(500_000)
    source = FrameStream(proxy_side, 10 * 1024 * 1024)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(dribble, client, framed(frame) + framed(b"next"), 4)
        with trio.fail_after(30):
            got = await source.receive_request(64 * 1024)
            if isinstance(got, PartialFrame):
                got = await source.receive_rest(got)
            assert bytes(got) == frame
            assert bytes(await source.receive_request(64 * 1024)) == b"next"
    await client.aclose()
    await proxy_side.aclose()


@needs_splice
async def test_a_request_ending_early_while_passed_on_is_an_error():
    client, proxy_side = await tcp_pair()
    upstream, broker = await tcp_pair()
    source, destination = FrameStream(proxy_side, 10 * 1024 * 1024), FrameStream(upstream, 10 * 1024 * 1024)

    async def send_half_then_close() -> None:
        await client.send_all(struct.pack(">i", 400_000) + bytes(200_000))
        await client.aclose()

    async def drain() -> None:
        while await broker.receive_some(65536):
            pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_half_then_close)
        nursery.start_soon(drain)
        with trio.fail_after(30):
            got = await source.receive_request(64 * 1024)
            assert isinstance(got, PartialFrame)
            with pytest.raises(trio.BrokenResourceError):
                await source.pass_on(got, destination)
        await upstream.aclose()
    for stream in (proxy_side, broker):
        await stream.aclose()
