"""Frames over trio streams: the thin I/O edge around the sans-IO ``FrameSplitter``."""

from __future__ import annotations

import ssl

import trio

from proxy.protocol.framing import SIZE_PREFIX, FrameSplitter, check_frame_size

_RECEIVE_CHUNK = 256 * 1024
_HEADER_READ = 64 * 1024  # small frames arrive whole in one read; large ones are read in place
_COALESCE_LIMIT = 64 * 1024


class FrameStream:
    """Reads whole frames from, and writes whole frames to, one trio stream.

    On a plain TCP stream a frame body is received straight into a buffer of its exact
    size (``recv_into``), so each byte is copied once, from the kernel, and never again
    on its way through; TLS streams go through the ``FrameSplitter``.
    """

    __slots__ = ("stream", "_splitter", "_socket", "_max_frame_bytes", "_pending")

    def __init__(self, stream: trio.abc.Stream, max_frame_bytes: int) -> None:
        self.stream = stream
        self._splitter = FrameSplitter(max_frame_bytes)
        self._socket = stream.socket if isinstance(stream, trio.SocketStream) else None
        self._max_frame_bytes = max_frame_bytes
        self._pending = bytearray()  # bytes read past the last frame (plain TCP path)

    async def receive_frame(self) -> bytes | bytearray | None:
        """The next frame body, or None at a clean end of stream between frames.

        Raises ProtocolError for an oversized or negative size prefix (before buffering
        it) and trio.BrokenResourceError when the stream ends inside a frame.
        """
        if self._socket is not None:
            return await self._receive_direct()
        splitter = self._splitter
        while True:
            frame = splitter.next_frame()
            if frame is not None:
                return frame
            chunk = await self.stream.receive_some(_RECEIVE_CHUNK)
            if not chunk:
                if splitter.buffered:
                    raise trio.BrokenResourceError(f"stream ended inside a frame ({splitter.buffered} bytes buffered)")
                return None
            splitter.feed(chunk)

    async def _receive_direct(self) -> bytearray | None:
        pending = self._pending
        sock = self._socket
        while len(pending) < 4:
            chunk = await sock.recv(_HEADER_READ)
            if not chunk:
                if pending:
                    raise trio.BrokenResourceError(f"stream ended inside a frame ({len(pending)} bytes buffered)")
                return None
            pending += chunk
        size = SIZE_PREFIX.unpack_from(pending, 0)[0]
        check_frame_size(size, self._max_frame_bytes)
        available = len(pending) - 4
        if available >= size:
            frame = pending[4 : 4 + size]
            del pending[: 4 + size]
            return frame
        frame = bytearray(size)
        frame[:available] = memoryview(pending)[4:]
        pending.clear()
        view = memoryview(frame)
        filled = available
        while filled < size:
            received = await sock.recv_into(view[filled:])
            if not received:
                raise trio.BrokenResourceError(f"stream ended inside a frame ({filled} of {size} bytes)")
            filled += received
        return frame

    async def send_frame(self, body: bytes) -> None:
        prefix = SIZE_PREFIX.pack(len(body))
        if len(body) < _COALESCE_LIMIT:
            await self.stream.send_all(prefix + body)
        else:  # large bodies: two writes beat copying megabytes to prepend four bytes
            await self.stream.send_all(prefix)
            await self.stream.send_all(body)

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            try:
                await self.stream.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError):
                pass
