"""Sans-IO framing of the Kafka wire protocol.

Kafka frames every request and response as a 4-byte big-endian size followed by that
many bytes. The proxy splits a byte stream into frames without copying more than it must,
and peeks at a request's header (api key, version, correlation id, client id) without
decoding its body, so that frames of API keys no feature needs are forwarded untouched.

Nothing here does I/O: feed bytes in, take frames out.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from proxy.protocol.errors import ProtocolError
from proxy.protocol.primitives import check_tag_count, read_uvarint
from proxy.protocol.walks import Walk

# What the peeks read: request headers v1 and v2 share their head (the client id is never
# compact), response headers v0 and v1 start with the correlation id.
REQUEST_HEADER_HEAD = Walk("RequestHeader", "", 1, None, (
    "RequestApiKey int16", "RequestApiVersion int16", "CorrelationId int32", "ClientId nullable string"), prefix=True)
RESPONSE_HEADER_HEAD = Walk("ResponseHeader", "", 0, None, ("CorrelationId int32",), prefix=True)
WALKS = (REQUEST_HEADER_HEAD, RESPONSE_HEADER_HEAD)

SIZE_PREFIX = struct.Struct(">i")
_REQUEST_HEADER_FIXED = struct.Struct(">hhih")  # api key, version, correlation id, client id length
_CORRELATION_ID = struct.Struct(">i")
_API_KEY = struct.Struct(">h")

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024  # the broker's socket.request.max.bytes default


@dataclass(frozen=True, slots=True)
class RequestHeaderPeek:
    """The fixed head of a request header, read without touching the body.

    ``header_end_v1`` is where a v1 request header ends (after the client id). A flexible
    request (header v2) continues with tagged fields there; the caller that needs the body
    knows the header version from the (api key, version) pair.
    """

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header_end_v1: int


def peek_request_header(frame: bytes | bytearray | memoryview) -> RequestHeaderPeek:
    """Read api key, version, correlation id and client id from a request frame body.

    ``frame`` is the frame without its size prefix. Request header v1 and v2 share this
    prefix, so no schema is needed.
    """
    n = len(frame)
    if n < _REQUEST_HEADER_FIXED.size:
        raise ProtocolError(f"request header truncated: {n} bytes", offset=n)
    api_key, version, correlation_id, client_len = _REQUEST_HEADER_FIXED.unpack_from(frame, 0)
    pos = _REQUEST_HEADER_FIXED.size
    if client_len == -1:
        client_id = None
    elif client_len < 0:
        raise ProtocolError(
            f"negative client id length {client_len}", api_key=api_key, version=version, offset=6
        )
    else:
        end = pos + client_len
        if end > n:
            raise ProtocolError(
                f"client id length {client_len} exceeds the {n - pos} bytes left",
                api_key=api_key,
                version=version,
                offset=pos,
            )
        try:
            client_id = bytes(frame[pos:end]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(
                "client id is not valid UTF-8", api_key=api_key, version=version, offset=pos
            ) from exc
        pos = end
    return RequestHeaderPeek(api_key, version, correlation_id, client_id, pos)


def peek_correlation_id(frame: bytes | bytearray | memoryview) -> int:
    """The correlation id that starts every response header (v0 and v1 alike)."""
    if len(frame) < 4:
        raise ProtocolError(f"response header truncated: {len(frame)} bytes", offset=len(frame))
    return _CORRELATION_ID.unpack_from(frame, 0)[0]


def frame_bytes(body: bytes | bytearray | memoryview) -> bytes:
    """Prefix ``body`` with its size, ready to write to a socket."""
    return SIZE_PREFIX.pack(len(body)) + bytes(body)


class GatheredFrame:
    """A frame body held as several buffers to be written in order (one writev): the
    encoded fields, and between them the large record sets left where they were
    (``primitives.GatheringBuffer``). ``len`` is the body's size; ``bytes`` joins it."""

    __slots__ = ("parts", "size")

    def __init__(self, parts: tuple) -> None:
        self.parts = parts
        self.size = sum(map(len, parts))

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)


# A frame body on its way out: one buffer, or several (``GatheredFrame``).
OutgoingFrame = bytes | bytearray | GatheredFrame


class FrameTooLarge(ProtocolError):
    """A size prefix over the limit in force: the connection is closed before a byte of
    the body is read. ``limit_name`` says which limit (a setting's name), for the log
    line and the metric that count such closures."""

    def __init__(self, size: int, limit: int, limit_name: str) -> None:
        super().__init__(f"frame of {size} bytes exceeds the {limit}-byte limit ({limit_name})", offset=0)
        self.size = size
        self.limit = limit
        self.limit_name = limit_name


def check_frame_size(size: int, max_frame_bytes: int, limit_name: str = "max.frame.bytes") -> None:
    """Refuse a size prefix before a single byte of its body is buffered."""
    if size < 0:
        raise ProtocolError(f"negative frame size {size}", offset=0)
    if size > max_frame_bytes:
        raise FrameTooLarge(size, max_frame_bytes, limit_name)


class FrameSplitter:
    """Accumulates stream bytes and yields complete frames (without their size prefix).

    The size prefix is checked against ``max_frame_bytes`` as soon as it arrives, before
    any buffering of the body, so a hostile length can never make us allocate: the caller
    gets a ``ProtocolError`` and should close the connection.
    """

    __slots__ = ("_buffer", "_max_frame_bytes", "_limit_name", "_need", "_early")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_frame_bytes <= 0:
            raise ValueError("max_frame_bytes must be positive")
        self._buffer = bytearray()
        self._max_frame_bytes = max_frame_bytes
        self._limit_name = "max.frame.bytes"
        self._need: int | None = None  # body size of the frame being assembled
        self._early: tuple[int, str, frozenset[int]] | None = None  # see limit_early

    @property
    def max_frame_bytes(self) -> int:
        return self._max_frame_bytes

    def limit(self, max_frame_bytes: int, limit_name: str) -> None:
        """Change the size limit for frames whose prefix has not been read yet (a
        connection's limit rises once it has authenticated); ``limit_name`` is the setting
        named when a frame is refused."""
        if max_frame_bytes <= 0:
            raise ValueError("max_frame_bytes must be positive")
        self._max_frame_bytes = max_frame_bytes
        self._limit_name = limit_name

    def limit_early(self, early: tuple[int, str, frozenset[int]] | None) -> None:
        """A lower limit, ``(max_frame_bytes, limit_name, api_keys)``, for the frames whose
        API key is one of ``api_keys`` (None: none). A connection's authentication
        requests are held to what a broker reads before it knows the client; their API key
        follows the size prefix, so a frame over this limit waits for two more bytes
        before its size is taken."""
        self._early = early
    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a frame."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._buffer += data

    def next_size(self) -> int | None:
        """The body size of the next frame once its prefix is buffered (checked against
        the limit), else None."""
        if self._need is None:
            buf = self._buffer
            if len(buf) < 4:
                return None
            size = SIZE_PREFIX.unpack_from(buf, 0)[0]
            early = self._early
            if early is not None and size > early[0]:
                if len(buf) < 6:
                    return None
                if _API_KEY.unpack_from(buf, 4)[0] in early[2]:
                    raise FrameTooLarge(size, early[0], early[1])
            check_frame_size(size, self._max_frame_bytes, self._limit_name)
            self._need = size
        return self._need

    def take_start(self, into: bytearray | memoryview) -> int:
        """Move what is buffered of the next frame's body (up to ``len(into)`` bytes) into
        ``into`` and forget that frame: its prefix is consumed, and the caller reads the
        rest of the body straight from its source. How many bytes were moved.

        This is how a reader that receives large bodies in place (no copy through this
        buffer) still parses every size prefix here. ``next_size`` must have returned a size.
        """
        size = self._need
        if size is None:
            raise AssertionError("take_start before next_size found a frame")
        buf = self._buffer
        available = min(len(buf) - 4, size, len(into))
        into[:available] = memoryview(buf)[4 : 4 + available]
        del buf[: 4 + available]
        self._need = None
        return available

    def next_frame(self) -> bytes | None:
        """The next complete frame body, or None until more bytes arrive."""
        need = self.next_size()
        if need is None:
            return None
        buf = self._buffer
        if len(buf) < 4 + need:
            return None
        frame = bytes(buf[4 : 4 + need])
        del buf[: 4 + need]
        self._need = None
        return frame

    def frames(self) -> list[bytes]:
        """All complete frames buffered so far."""
        out = []
        while (frame := self.next_frame()) is not None:
            out.append(frame)
        return out


# -- the tagged fields of a request header --------------------------------------------------------


def check_request_header_tags(frame: bytes | bytearray | memoryview, flexible: bool) -> int | None:
    """How many tagged fields a request header declares, refused above MAX_TAGGED_FIELDS
    before any of them is read (see ``constants.MAX_TAGGED_FIELDS``).

    ``frame`` is a request frame without its size prefix, or its first bytes; ``flexible``
    says whether its header is v2, where a tagged-field section follows the client id
    (``messages.request_header_flexible(api_key, version)``). Returns 0 for a v1 header,
    and None when ``frame`` ends before the count does: a head cut short, or a whole frame
    that declares no count at all (the broker refuses it). It reads the client id's
    length and the count's bytes (at most five) and allocates nothing, so it can be asked
    of every request. Raises ``ProtocolError`` for a count over the limit, a count that is
    not a canonical unsigned varint of at most 32 bits (as every codec of the proxy reads
    varints), and a client id length below -1.
    """
    if not flexible:
        return 0
    n = len(frame)
    if n < _REQUEST_HEADER_FIXED.size:
        return None
    api_key, version, _, client_len = _REQUEST_HEADER_FIXED.unpack_from(frame, 0)
    if client_len < -1:
        raise ProtocolError(
            f"negative client id length {client_len}", api_key=api_key, version=version, offset=6
        )
    pos = _REQUEST_HEADER_FIXED.size + max(client_len, 0)
    end = pos
    while True:  # the count's last byte is the first without the continuation bit
        if end >= n:
            return None
        if frame[end] < 0x80 or end - pos == 4:
            break
        end += 1
    try:
        count, _ = read_uvarint(frame, pos, end + 1)
        check_tag_count(count, pos)
    except ProtocolError as exc:
        raise ProtocolError(
            f"request header: {exc.reason}", api_key=api_key, version=version, offset=exc.offset
        ) from None
    return count
