"""Slow, silent and surplus clients: the setup rule, the idle rule and the refusal log
throttle, on trio's mock clock (a deadline is checked to the millisecond, in no time)."""

from __future__ import annotations

import math
import struct

import pytest
import trio
import trio.testing

from proxy.net import streams as streams_module
from proxy.net.streams import FrameStream
from proxy.pipeline import FeatureChain
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.framing import frame_bytes, peek_correlation_id, peek_request_header
from proxy.server.config import ConfigError, build_config
from proxy.server.connection import ClientConnection
from proxy.server.limits import ConnectionSetup, LogThrottle
from proxy.server.metrics import ProxyMetrics

from .test_produce_passthrough import MAX_FRAME, Broker, produce_request
from .test_streams import tcp_pair

SETUP = 30.0  # seconds, as the default connections.setup.timeout.ms


# -- the setup rule ---------------------------------------------------------------------------
def _setup_after(*keys: int) -> ConnectionSetup:
    setup = ConnectionSetup()
    for key in keys:
        setup.on_request(key)
    return setup


def test_a_connection_without_sasl_is_set_up_by_its_first_complete_request():
    assert not ConnectionSetup().complete
    assert ConnectionSetup().describe() == "no complete request"
    assert _setup_after(ApiKey.API_VERSIONS).complete
    assert _setup_after(ApiKey.METADATA).complete
    assert _setup_after(ApiKey.PRODUCE).past_authentication


def test_sasl_begun_before_any_other_request_must_finish():
    for keys in ([ApiKey.SASL_HANDSHAKE], [ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE],
                 [ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE, ApiKey.SASL_AUTHENTICATE],
                 [ApiKey.SASL_AUTHENTICATE]):
        setup = _setup_after(*keys)
        assert not setup.complete, keys
        assert setup.describe() == f"SASL authentication not finished after {len(keys)} requests"
    # The first request outside authentication is the proof: the broker serves nothing else before.
    done = _setup_after(ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE,
                        ApiKey.SASL_AUTHENTICATE, ApiKey.METADATA)
    assert done.complete and done.past_authentication


def test_reauthentication_on_an_established_connection_is_not_setup():
    setup = _setup_after(ApiKey.API_VERSIONS, ApiKey.METADATA, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE)
    assert setup.complete


# -- the refusal log throttle ----------------------------------------------------------------
def test_log_throttle_logs_at_once_then_once_per_interval_with_the_count_it_held_back():
    throttle = LogThrottle(10.0)
    assert throttle.allow(100.0) == 0
    assert [throttle.allow(100.0 + i / 10) for i in range(1, 50)] == [None] * 49
    assert throttle.allow(110.0) == 49
    assert throttle.allow(115.0) is None
    assert throttle.allow(500.0) == 1  # the one at 115 s
    assert throttle.allow(510.0) == 0


# -- the setting -----------------------------------------------------------------------------
def test_setup_timeout_setting_defaults_to_30_s_and_is_at_least_one_second():
    assert build_config({"bootstrap.servers": "h:1"}).limits.setup_timeout_ms == 30000
    assert build_config({"bootstrap.servers": "h:1",
                         "connections.setup.timeout.ms": "1000"}).limits.setup_timeout_ms == 1000
    with pytest.raises(ConfigError, match=r"connections.setup.timeout.ms: must be at least 1000 \(got '999'\)"):
        build_config({"bootstrap.servers": "h:1", "connections.setup.timeout.ms": "999"})


# -- a connection on the mock clock ----------------------------------------------------------
def _request(api_key: int, version: int, correlation_id: int, **fields) -> bytes:
    header = messages.new_request_header(api_key, version, correlation_id, "probe")
    return frame_bytes(messages.encode_request(header, messages.new_body(api_key, version, "request", **fields)))


def _metadata(correlation_id: int, topics: int = 0) -> bytes:
    """A Metadata request; naming ``topics`` topics makes it about 20 bytes longer each."""
    topic_class = messages.body_class(ApiKey.METADATA, "request").MetadataRequestTopic
    return _request(ApiKey.METADATA, 12, correlation_id,
                    topics=[topic_class(name=f"topic-{i:012d}") for i in range(topics)])


def _api_versions(correlation_id: int) -> bytes:
    return _request(ApiKey.API_VERSIONS, 3, correlation_id, client_software_name="x", client_software_version="1")


def _sasl_handshake(correlation_id: int) -> bytes:
    return _request(ApiKey.SASL_HANDSHAKE, 1, correlation_id, mechanism="SCRAM-SHA-256")


def _sasl_authenticate(correlation_id: int) -> bytes:
    return _request(ApiKey.SASL_AUTHENTICATE, 2, correlation_id, auth_bytes=b"n,,n=user,r=nonce")


class _Harness:
    """One ClientConnection between a memory-stream client and a fake broker that answers
    every request with a frame of its correlation id and an error code 0 (no feature reads
    anything, so every response but ApiVersions' is relayed as it is; that one is real)."""

    def __init__(self, *, idle: float = math.inf, setup: float = SETUP) -> None:
        self.client, proxy_side = trio.testing.memory_stream_pair()
        self.upstream, self.broker = trio.testing.memory_stream_pair()
        self.metrics = ProxyMetrics()
        self.upstream_opened = False
        self.broker_saw: list[int] = []
        self.started = trio.current_time()
        self.connection = ClientConnection(
            proxy_side, "127.0.0.1:1", open_upstream=self._open_upstream, chain=FeatureChain([]),
            metrics=self.metrics, max_frame_bytes=1 << 20, max_inflight=8, idle_timeout=idle,
            target="bootstrap", setup_deadline=self.started + setup)
        self.closed_after: float | None = None
        self.answers: list[int] = []

    async def _open_upstream(self) -> trio.abc.Stream:
        self.upstream_opened = True
        return self.upstream

    async def _serve_broker(self) -> None:
        frames = FrameStream(self.broker, 1 << 20)
        try:
            while (frame := await frames.receive_frame()) is not None:
                peek = peek_request_header(frame)
                self.broker_saw.append(peek.api_key)
                if peek.api_key == ApiKey.API_VERSIONS:
                    body = messages.new_body(ApiKey.API_VERSIONS, peek.api_version, "response", api_keys=[])
                    header = messages.new_response_header(peek.correlation_id)
                    await frames.send_frame(messages.encode_response(ApiKey.API_VERSIONS, peek.api_version,
                                                                     header, body))
                else:
                    await frames.send_frame(struct.pack(">ih", peek.correlation_id, 0))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _run(self) -> None:
        await self.connection.run()
        self.closed_after = trio.current_time() - self.started

    async def answer(self) -> int:
        """The correlation id of the next response the client receives."""
        frames = FrameStream(self.client, 1 << 20)
        frame = await frames.receive_frame()
        assert frame is not None
        return struct.unpack(">i", frame[:4])[0]

    async def send(self, data: bytes) -> None:
        await self.client.send_all(data)

    async def trickle(self, data: bytes, every: float) -> None:
        """``data`` a byte at a time, ``every`` seconds apart, until the proxy closes."""
        try:
            for index in range(len(data)):
                await self.client.send_all(data[index:index + 1])
                await trio.sleep(every)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    def closed(self, reason: str) -> float:
        return self.metrics.registry.get_sample_value("kafka_proxy_client_connections_closed_total",
                                                      {"reason": reason}) or 0


async def _run(harness: _Harness, client) -> None:
    with trio.fail_after(3600):  # mock clock: an hour of it passes in no time
        async with trio.open_nursery() as nursery:
            nursery.start_soon(harness._run)
            nursery.start_soon(harness._serve_broker)
            await client(harness)
            await harness.connection.closed.wait()
            nursery.cancel_scope.cancel()


async def test_a_silent_connection_is_closed_at_the_setup_deadline(autojump_clock):
    harness = _Harness()

    async def silent(h: _Harness) -> None:
        pass

    await _run(harness, silent)
    assert harness.closed_after == pytest.approx(SETUP, abs=1e-6)
    assert harness.closed("setup_timeout") == 1
    assert not harness.upstream_opened  # it never cost the broker a connection


async def test_a_first_frame_trickled_byte_by_byte_is_closed_at_the_setup_deadline(autojump_clock):
    harness = _Harness()
    frame = _metadata(1, topics=20)
    assert len(frame) * 0.2 > SETUP  # it would have taken longer than the deadline

    async def trickler(h: _Harness) -> None:
        await h.trickle(frame, 0.2)

    await _run(harness, trickler)
    assert harness.closed_after == pytest.approx(SETUP, abs=1e-6)
    assert harness.closed("setup_timeout") == 1
    assert not harness.upstream_opened


async def test_idle_before_the_first_request_is_closed_by_the_shorter_of_the_two_timeouts(autojump_clock):
    harness = _Harness(idle=5.0)

    async def silent(h: _Harness) -> None:
        pass

    await _run(harness, silent)
    assert harness.closed_after == pytest.approx(5.0, abs=1e-6)
    assert harness.closed("idle") == 1 and harness.closed("setup_timeout") == 0


async def test_sasl_not_finished_by_the_deadline_is_closed(autojump_clock):
    harness = _Harness()

    async def stalls_in_sasl(h: _Harness) -> None:
        await h.send(_sasl_handshake(1))
        assert await h.answer() == 1
        await h.send(_sasl_authenticate(2))
        assert await h.answer() == 2  # error code 0, and authentication still not over (SCRAM)

    await _run(harness, stalls_in_sasl)
    assert harness.closed_after == pytest.approx(SETUP, abs=1e-6)
    assert harness.closed("setup_timeout") == 1
    assert harness.broker_saw == [ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE]


async def test_sasl_begun_after_the_deadline_is_closed_at_once(autojump_clock):
    harness = _Harness()

    async def late_sasl(h: _Harness) -> None:
        await h.send(_api_versions(1))
        assert await h.answer() == 1
        await trio.sleep(SETUP + 5)
        await h.send(_sasl_handshake(2))

    await _run(harness, late_sasl)
    assert harness.closed_after == pytest.approx(SETUP + 5, abs=1e-6)
    assert harness.closed("setup_timeout") == 1


async def test_a_finished_authentication_and_a_request_outside_it_end_the_setup(autojump_clock):
    harness = _Harness(idle=100.0)

    async def authenticates(h: _Harness) -> None:
        for correlation_id, request in enumerate((_sasl_handshake, _sasl_authenticate, _sasl_authenticate,
                                                  _metadata), start=1):
            await h.send(request(correlation_id))
            assert await h.answer() == correlation_id
        await trio.sleep(SETUP + 10)
        assert h.closed_after is None  # well past the setup deadline, open
        await h.send(_metadata(9))
        assert await h.answer() == 9
        # Re-authentication later is not setup.
        await h.send(_sasl_handshake(10))
        assert await h.answer() == 10
        await h.client.aclose()

    await _run(harness, authenticates)
    assert harness.closed("setup_timeout") == 0 and harness.closed("idle") == 0


async def test_a_partial_frame_after_the_first_request_is_closed_by_the_idle_watch(autojump_clock):
    idle = 5.0
    harness = _Harness(idle=idle)
    answered_at: list[float] = []

    async def then_trickles(h: _Harness) -> None:
        await h.send(_metadata(1))
        assert await h.answer() == 1
        answered_at.append(trio.current_time() - h.started)
        second = _metadata(2, topics=20)
        assert len(second) * 0.2 > 2 * idle
        await h.send(second[:10])  # the size prefix and a little of the header
        await h.trickle(second[10:], 0.2)  # then a byte every 200 ms: not a complete frame before the timeout

    await _run(harness, then_trickles)
    assert harness.closed_after is not None
    # The watch wakes at least once a second: closed between the timeout and a second later.
    assert idle <= harness.closed_after - answered_at[0] <= idle + 1.0
    assert harness.closed("idle") == 1 and harness.closed("setup_timeout") == 0
    assert harness.broker_saw == [ApiKey.METADATA]


@pytest.mark.skipif(streams_module._SPLICE is None, reason="no os.splice on this platform")
async def test_a_large_request_trickled_after_the_first_is_closed_by_the_idle_watch():
    """A large request no feature reads goes on to the broker while it arrives (spliced);
    its exchange is queued from its first bytes, but a client trickling its body must not
    count as a request in flight, or the idle watch would never close it. Real loopback
    sockets (splicing needs them), real clock."""
    idle = 0.5
    client, proxy_side = await tcp_pair()
    upstream, broker_side = await tcp_pair()
    metrics = ProxyMetrics()
    broker = Broker(broker_side)

    async def open_upstream():
        return upstream

    connection = ClientConnection(proxy_side, "127.0.0.1:1", open_upstream=open_upstream, chain=FeatureChain([]),
                                  metrics=metrics, max_frame_bytes=MAX_FRAME, max_inflight=8, idle_timeout=idle,
                                  target="bootstrap", setup_deadline=trio.current_time() + SETUP)
    large = produce_request(2, 1024 * 1024)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(connection.run)
            nursery.start_soon(broker.serve)
            await client.send_all(produce_request(1, 100))
            frames = FrameStream(client, MAX_FRAME)
            assert peek_correlation_id(await frames.receive_frame()) == 1
            answered = trio.current_time()
            await client.send_all(large[:16 * 1024])  # enough for the proxy to route it and start passing it on
            sent = 16 * 1024
            with trio.move_on_after(10):  # then a byte every 50 ms, until the proxy closes
                while not connection.closed.is_set():
                    try:
                        await client.send_all(large[sent:sent + 1])
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        break
                    sent += 1
                    await trio.sleep(0.05)
            await connection.closed.wait()
            closed_after = trio.current_time() - answered
            nursery.cancel_scope.cancel()
    await client.aclose()
    assert idle <= closed_after <= idle + 1.5, closed_after
    assert metrics.registry.get_sample_value("kafka_proxy_client_connections_closed_total", {"reason": "idle"}) == 1
    assert metrics.spliced_requests._value.get() == 0  # it never finished
    assert broker.answered == [1]
