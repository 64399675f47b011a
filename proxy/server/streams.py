"""Frames over trio streams: the thin I/O edge around the sans-IO ``FrameSplitter``."""

from __future__ import annotations

import ssl

import trio

from proxy.protocol.framing import SIZE_PREFIX, FrameSplitter

_RECEIVE_CHUNK = 256 * 1024
_COALESCE_LIMIT = 64 * 1024


class FrameStream:
    """Reads whole frames from, and writes whole frames to, one trio stream."""

    __slots__ = ("stream", "_splitter")

    def __init__(self, stream: trio.abc.Stream, max_frame_bytes: int) -> None:
        self.stream = stream
        self._splitter = FrameSplitter(max_frame_bytes)

    async def receive_frame(self) -> bytes | None:
        """The next frame body, or None at a clean end of stream between frames.

        Raises ProtocolError for an oversized or negative size prefix (before buffering
        it) and trio.BrokenResourceError when the stream ends inside a frame.
        """
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
