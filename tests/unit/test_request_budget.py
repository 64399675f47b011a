"""What a client's frames may cost the proxy: buffers that grow with the bytes that arrive,
a smaller cap before authentication, and one budget that makes readers wait when spent.

Over real loopback TCP and the TLS-style path (a stream without a socket), no broker."""

from __future__ import annotations

import random
import struct
import tracemalloc

import pytest
import trio
import trio.testing

from proxy.net.budget import RequestBudget
from proxy.net.streams import ClientFrameStream, PartialFrame
from proxy.protocol.framing import FrameTooLarge
from tests.unit.test_streams import dribble, framed, tcp_pair

MIB = 1024 * 1024
EARLY = (512 * 1024, "max.frame.bytes.unauthenticated", frozenset({18, 17, 36}))  # ApiVersions, SASL


async def wait_until(predicate, seconds: float = 10.0) -> None:
    with trio.fail_after(seconds):
        while not predicate():
            await trio.sleep(0.005)


async def test_a_frame_starts_only_while_the_budget_is_not_spent():
    budget = RequestBudget(100)
    first = await budget.start()
    await budget.grow(first, 150)  # the only frame being received: it may overdraw
    budget.received(first)
    assert budget.spent
    got = trio.Event()

    async def second() -> None:
        ticket = await budget.start()
        await budget.grow(ticket, 10)
        got.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(second)
        await trio.testing.wait_all_tasks_blocked()
        assert not got.is_set() and budget.waits == 1
        budget.release(60)  # 90 held: no longer spent
        with trio.fail_after(5):
            await got.wait()
    assert budget.held == 100


async def test_when_spent_only_the_oldest_frame_grows_and_the_next_follows_it():
    budget = RequestBudget(100)
    old, young = await budget.start(), await budget.start()
    await budget.grow(young, 60)
    await budget.grow(old, 60)  # spent now
    grown: list[str] = []

    async def grow(name: str, ticket: int) -> None:
        await budget.grow(ticket, 10)
        grown.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(grow, "young", young)
        await trio.testing.wait_all_tasks_blocked()
        assert grown == []
        await grow("old", old)  # the oldest never waits
        assert grown == ["old"]
        budget.received(old)  # the young frame is the oldest now
        with trio.fail_after(5):
            while grown != ["old", "young"]:
                await trio.sleep(0.001)


@pytest.mark.parametrize("authenticated", [False, True])
async def test_client_frames_of_every_size_survive_arbitrary_splits(authenticated):
    a, b = await tcp_pair()
    bodies = [b"", b"x", bytes(100), random.Random(3).randbytes(17_000), random.Random(4).randbytes(70_000),
              random.Random(5).randbytes(3_000_000), b"end"]
    budget = RequestBudget(64 * MIB)
    reader = ClientFrameStream(b, 10 * MIB, budget=budget, early_limit=EARLY)
    if authenticated:
        reader.authenticated()
    received = []
    async with trio.open_nursery() as nursery:
        async def send() -> None:
            await dribble(a, b"".join(framed(body) for body in bodies))
            await a.aclose()

        nursery.start_soon(send)
        with trio.fail_after(30):
            while (frame := await reader.receive_frame()) is not None:
                received.append(bytes(frame))
                assert len(frame) <= reader.held <= max(2 * len(frame), 70_000)
                reader.release_frame()
                assert budget.held == 0
    assert received == bodies
    await b.aclose()


async def test_a_declared_size_is_never_allocated_before_its_bytes_arrive():
    """A client declaring 100 MiB and sending eight bytes costs kilobytes, and holds no more
    of the budget than that."""
    budget = RequestBudget(1024 * MIB)
    pairs = [await tcp_pair() for _ in range(20)]
    readers = [ClientFrameStream(server, 200 * MIB, budget=budget) for _, server in pairs]
    for reader in readers[10:]:
        reader.authenticated()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        async with trio.open_nursery() as nursery:
            for reader in readers:
                nursery.start_soon(reader.receive_frame)
            for client, _ in pairs:
                await client.send_all(struct.pack(">i", 100 * MIB) + bytes(8))
            await wait_until(lambda: budget.receiving == 20)
            await trio.testing.wait_all_tasks_blocked()
            held = tracemalloc.get_traced_memory()[0] - before
            nursery.cancel_scope.cancel()
    finally:
        tracemalloc.stop()
    assert held < 20 * 64 * 1024, held  # a few KiB each, not 100 MiB
    assert budget.held == sum(r.held for r in readers) <= 20 * 64 * 1024
    for reader in readers:
        await reader.aclose()
    assert budget.held == 0
    for client, _ in pairs:
        await client.aclose()


async def test_before_authentication_frames_are_capped_and_the_cap_rises_after():
    """Authentication requests are held to the early limit until ``authenticated``; a large
    first request of another API (a Produce from a client that skips ApiVersions) is not."""
    a, b = await tcp_pair()
    reader = ClientFrameStream(b, 2 * MIB, budget=RequestBudget(64 * MIB), early_limit=EARLY)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(a.send_all, framed(struct.pack(">h", 0) + bytes(600 * 1024)))
        with trio.fail_after(10):
            assert len(await reader.receive_frame()) == 2 + 600 * 1024
    reader.release_frame()
    await a.send_all(struct.pack(">i", 600 * 1024))
    await trio.sleep(0.05)
    await a.send_all(struct.pack(">h", 18))  # the API key arrives after the size: ApiVersions
    with trio.fail_after(5), pytest.raises(FrameTooLarge, match="max.frame.bytes.unauthenticated") as refused:
        await reader.receive_frame()
    assert refused.value.limit == 512 * 1024
    await a.aclose()
    await reader.aclose()

    a, b = await tcp_pair()
    reader = ClientFrameStream(b, 2 * MIB, budget=RequestBudget(64 * MIB), early_limit=EARLY)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(a.send_all, framed(b"first") + framed(struct.pack(">h", 36) + bytes(600 * 1024)))
        with trio.fail_after(10):
            assert bytes(await reader.receive_frame()) == b"first"
            reader.authenticated()
            assert len(await reader.receive_frame()) == 2 + 600 * 1024
    await a.aclose()
    await reader.aclose()


async def test_a_spent_budget_stops_other_readers_until_a_frame_is_released():
    budget = RequestBudget(2 * MIB)
    (a1, b1), (a2, b2) = await tcp_pair(), await tcp_pair()
    first = ClientFrameStream(b1, 8 * MIB, budget=budget)
    second = ClientFrameStream(b2, 8 * MIB, budget=budget)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(a1.send_all, framed(bytes(3 * MIB)))
        with trio.fail_after(10):
            assert len(await first.receive_frame()) == 3 * MIB  # one frame over the budget passes alone
    assert budget.spent
    got: list[int] = []

    async def read_second() -> None:
        got.append(len(await second.receive_frame()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_second)
        await a2.send_all(framed(b"small"))
        await trio.testing.wait_all_tasks_blocked()
        assert not got and budget.waits >= 1
        first.release_frame()
        await wait_until(lambda: got == [5])
    for stream in (a1, a2):
        await stream.aclose()
    for reader in (first, second):
        await reader.aclose()


async def test_a_partial_frame_holds_its_head_only_and_its_rest_grows():
    budget = RequestBudget(64 * MIB)
    a, b = await tcp_pair()
    reader = ClientFrameStream(b, 8 * MIB, budget=budget)
    body = random.Random(9).randbytes(2 * MIB)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(dribble, a, framed(body))
        with trio.fail_after(10):
            got = await reader.receive_request(64 * 1024)
            assert isinstance(got, PartialFrame)
            whole = await reader.receive_rest(got)
    assert bytes(whole) == body
    assert len(body) <= reader.held <= 2 * len(body)
    reader.release_frame()
    assert budget.held == 0
    await a.aclose()
    await reader.aclose()


class _Chunks(trio.abc.Stream):
    """A stream without a socket (as TLS is to FrameStream) fed from a list of chunks."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def receive_some(self, max_bytes=None) -> bytes:
        await trio.lowlevel.checkpoint()
        return self.chunks.pop(0) if self.chunks else b""

    async def send_all(self, data) -> None:
        raise NotImplementedError

    async def wait_send_all_might_not_block(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        pass


async def test_tls_path_charges_the_budget_too():
    budget = RequestBudget(64 * MIB)
    data = framed(bytes(300_000)) + framed(b"x")
    reader = ClientFrameStream(_Chunks([data[i:i + 70_000] for i in range(0, len(data), 70_000)]), 1 * MIB, budget=budget)
    assert len(await reader.receive_frame()) == 300_000
    assert reader.held >= 300_000
    reader.release_frame()
    assert bytes(await reader.receive_frame()) == b"x"
    reader.release_frame()
    assert await reader.receive_frame() is None
    assert budget.held == 0 and budget.receiving == 0
