"""A minimal request/response connection to one broker, for the proxy's own requests.

The proxy sometimes needs to ask the cluster something itself (metadata at start-up, the
individual-commit log, ...). Those requests never share a client's upstream connection,
whose correlation ids belong to the client; they go over a connection like this one.
One request at a time; a timeout or failure closes the connection, so a late response
can never be mistaken for the next one's.
"""

from __future__ import annotations

import itertools
import ssl
from typing import Any

import trio

from proxy.net.connect import connect
from proxy.net.streams import FrameStream
from proxy.protocol import messages
from proxy.protocol.errors import ProtocolError
from proxy.protocol.framing import peek_correlation_id


class BrokerConnectionError(Exception):
    """The broker connection failed; the request may or may not have reached it."""


class BrokerConnection:
    def __init__(self, stream: trio.abc.Stream, *, client_id: str, max_frame_bytes: int = 100 * 1024 * 1024) -> None:
        self._frames = FrameStream(stream, max_frame_bytes)
        self._client_id = client_id
        self._correlation = itertools.count(1)
        self._lock = trio.Lock()  # one request at a time: these are rare control requests
        self.closed = False

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        *,
        client_id: str = "keyrange-proxy",
        timeout: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> BrokerConnection:
        stream = await connect(host, port, timeout=timeout, ssl_context=ssl_context)
        return cls(stream, client_id=client_id)

    async def request(self, api_key: int, version: int, body: Any, *, timeout: float = 30.0) -> Any:
        """Send one request and return the decoded response body."""
        if self.closed:
            raise BrokerConnectionError("connection is closed")
        correlation_id = next(self._correlation) & 0x7FFFFFFF
        header = messages.new_request_header(
            api_key, version, correlation_id=correlation_id, client_id=self._client_id
        )
        frame = messages.encode_request(header, body)
        try:
            with trio.fail_after(timeout):
                async with self._lock:
                    await self._frames.send_frame(frame)
                    response = await self._frames.receive_frame()
                    if response is None:
                        raise BrokerConnectionError("broker closed the connection")
                    got = peek_correlation_id(response)
                    if got != correlation_id:
                        raise BrokerConnectionError(f"correlation id {got} where {correlation_id} was due")
                    _header, decoded = messages.decode_response(api_key, version, response)
                    return decoded
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ProtocolError, ssl.SSLError) as exc:
            await self.aclose()
            raise BrokerConnectionError(str(exc)) from exc
        except trio.TooSlowError:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            await self._frames.aclose()

    async def __aenter__(self) -> BrokerConnection:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()
