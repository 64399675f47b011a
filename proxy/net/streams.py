"""Frames over trio streams: the thin I/O edge around the sans-IO ``FrameSplitter``.

On a plain TCP stream the proxy moves most of its bytes in large frames (Fetch responses,
Produce requests), and what it costs per MB is decided by how many system calls and event
loop wake-ups each frame takes, not by Python work on the bytes. So the plain TCP path
talks to the socket's file descriptor itself:

- a frame body is received straight into a buffer of its exact size, each byte copied
  once, from the kernel; while a large body is still arriving, ``SO_RCVLOWAT`` tells the
  kernel not to wake the proxy before a good piece of it (or all of the rest) is there,
  so a 1 MB frame takes a few reads instead of one per TCP window;
- a response that needs no rewriting (or only in its tail, see ``Relay``) is passed on
  while it arrives (``relay_frame``) rather than after its last byte, so the proxy adds
  little more than one piece's worth of latency to a 1 MB Fetch;
- the size prefix and the body leave in one ``writev``: one system call, no copy, no
  four-byte segment of its own;
- the large parts of a relayed frame that the proxy never looks at (the record sets of
  a Fetch response, the body of a response relayed opaquely) do not pass through user
  space at all: where the walk of the frame (see ``Relay``) is about to step over at least
  ``_SPLICE_MIN`` bytes it will never read, they are ``splice``d from the upstream socket
  into a pipe and from the pipe into the client's socket (Linux; ``_Outbox.splice_from_source``). A
  spliced region moves on in pieces of about ``_SPLICE_CHUNK`` as it arrives, so the
  client is receiving the start of a record set while its end is still on its way from
  the broker. The pipe belongs to the upstream stream and is reused: it is empty between
  frames, and dropped with its contents on any error;
- a large request the proxy only peeks at (Produce) is handed over with its first bytes
  read (``receive_request``) and the rest spliced on as it arrives (``pass_on``): the
  same, in the other direction, through the client stream's pipe;
- a relayed frame reaches the client in as few writes as its arrival allows (see
  ``_Outbox``): the bytes read into user space (the size prefix, a Fetch response's head
  and tail) join the spliced ones in the pipe, so a 1 MB Fetch response whose bytes are
  all there leaves in one write, not three;
- the event loop is entered only when the socket would block, and once per frame
  received: ``receive_frame``, ``receive_request`` and ``relay_frame`` are always a
  checkpoint (one explicit checkpoint when nothing had to wait, none more when something
  did), ``send_frame`` and ``pass_on`` only when they wait. Every loop of the proxy
  receives a frame per turn, so a connection that never blocks still lets the others run
  and can be cancelled; and a turn costs one trip through the scheduler, not two.

Both paths parse frames with one sans-IO ``FrameSplitter``: TLS streams feed it what
``receive_some`` returns and take whole frames; the plain TCP path feeds it what it reads
and takes only the start of each body from it (``take_start``), reading the rest in place.

A client's stream (``ClientFrameStream``) never trusts a declared size with memory: its
frame buffer grows with the bytes that arrive, so a client declaring 100 MiB and sending
eight bytes costs kilobytes, not 100 MiB, and what its frames hold is charged to the
proxy-wide budget (see ``proxy.net.budget``). A broker's stream keeps exact-size buffers:
the proxy chose to connect to it, and its large responses are the hot path.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

import trio

from proxy import accelerators
from proxy.net.budget import RequestBudget
from proxy.protocol.errors import ProtocolError
from proxy.protocol.framing import SIZE_PREFIX, FrameSplitter, GatheredFrame, peek_correlation_id

_RECEIVE_CHUNK = 256 * 1024
_HEADER_READ = 64 * 1024  # small frames arrive whole in one read; large ones are read in place
_COALESCE_LIMIT = 64 * 1024  # TLS path: below this, prefix and body are joined into one write
_LOWAT_MIN = 64 * 1024  # bodies with less than this left are read as they come
_LOWAT_CAP = 1024 * 1024  # never ask the kernel to hold back more than this before waking us
_RELAY_CHUNK = 256 * 1024  # a relayed frame moves on in pieces of about this size
_REUSE_MAX = 2 * 1024 * 1024  # relayed frames up to this size share one buffer per stream
_SO_RCVLOWAT = getattr(socket, "SO_RCVLOWAT", None)
_SPLICE: Any = getattr(os, "splice", None) if fcntl is not None and hasattr(os, "pipe2") else None
_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)
_SPLICE_MIN = 64 * 1024  # regions the proxy never reads are spliced from this size on
_PIPE_SIZE = 1024 * 1024  # asked of the kernel for the splice pipe (it may give less)
_SPLICE_CHUNK = 256 * 1024  # while splicing, the kernel wakes the proxy for no less than this
_SPLICE_LOOKAHEAD = 4096  # when splicing, a relay reads no further than this past what the walk needs
_GROW_FIRST = 16 * 1024  # a client's frame buffer starts no smaller than this (or its whole size)
_ZEROS = memoryview(bytes(1024 * 1024))  # what a growing frame buffer is extended with


class Relay:
    """How a response may be relayed while it arrives (see ``FrameStream.relay_frame``).

    ``walk(frame, size, filled)``: a generator as ``proxy.protocol.peek.walk_fetch_response``,
    yielding ``(need, safe)`` and returning where the frame's rewritable tail begins; None
    means no part of the frame is ever rewritten. A walk must never read a byte of the
    frame before ``min(need, safe)`` of its latest yield: such bytes may have been
    forwarded without ever entering the frame's buffer. ``finish(frame, tail)`` returns
    the tail to send instead of ``frame[tail:]``, of exactly the same length (the size
    prefix is gone by then); it may read the frame's first four bytes and its tail only.
    """

    __slots__ = ("walk", "finish")

    def __init__(self, walk=None, finish=None) -> None:
        self.walk = walk
        self.finish = finish


OPAQUE = Relay()


class PartialFrame:
    """A large request of which only the first bytes have been read (see
    ``FrameStream.receive_request``); the rest is still in the socket."""

    __slots__ = ("size", "head")

    def __init__(self, size: int, head: bytes | bytearray) -> None:
        self.size = size  # the whole frame's, without its size prefix
        self.head = head  # its first bytes: at least the request header, or all of a short frame


class FrameStream:
    """Reads whole frames from, and writes whole frames to, one trio stream.

    Not safe for two tasks receiving (or two sending) at once; the proxy has one reader
    and one writer per stream.
    """

    __slots__ = ("stream", "_splitter", "_socket", "_max_frame_bytes", "_lowat", "_waits", "_relay_buffer", "_pipe")

    def __init__(self, stream: trio.abc.Stream, max_frame_bytes: int) -> None:
        self.stream = stream
        self._splitter = FrameSplitter(max_frame_bytes)
        # The plain TCP socket, or None (TLS): every method of the direct path runs only
        # when it is set, so it is typed for that path.
        self._socket: Any = stream.socket if isinstance(stream, trio.SocketStream) else None
        self._max_frame_bytes = max_frame_bytes
        self._lowat = 1  # the socket's SO_RCVLOWAT as we last set it
        self._waits = 0  # times a receive waited for the socket (each wait is a checkpoint)
        self._relay_buffer = bytearray()  # see _receive_head
        self._pipe: tuple[int, int, int] | None = None  # (read end, write end, capacity), see _Outbox.splice_from_source

    # -- what a frame's buffer may cost: exact sizes here (see ClientFrameStream) ------------------
    def _room(self, size: int, arrived: int) -> int:
        """The first buffer for a frame of ``size`` bytes of which ``arrived`` are here."""
        return size

    def _more_room(self, room: int, size: int) -> int:
        """How much a full buffer of ``room`` bytes grows by, for a frame of ``size``."""
        return size - room

    async def _charge(self, count: int) -> None:
        """``count`` more bytes are held for the frame being received."""

    def _frame_done(self) -> None:
        """The frame being received has all its bytes (or is abandoned)."""

    @property
    def splices(self) -> bool:
        """Whether bytes can be spliced into (or out of) this stream's socket."""
        return self._socket is not None and _SPLICE is not None

    # -- for the native relay (proxy/net/native_relay.py), on plain TCP streams only --------
    @property
    def socket(self) -> Any:
        return self._socket

    @property
    def buffered(self) -> int:
        """Bytes read from the socket and not yet handed out as (part of) a frame."""
        return self._splitter.buffered

    def splice_pipe(self) -> tuple[int, int, int]:
        """This stream's splice pipe (read end, write end, capacity); empty between frames."""
        return self._open_pipe()

    def drop_pipe(self) -> None:
        """Close the splice pipe with whatever it holds (after a failure mid-frame)."""
        self._close_pipe()

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
                self._frame_done()
                return frame
            chunk = await self.stream.receive_some(_RECEIVE_CHUNK)
            if not chunk:
                if splitter.buffered:
                    raise trio.BrokenResourceError(f"stream ended inside a frame ({splitter.buffered} bytes buffered)")
                return None
            # Charged by the piece as it arrives (a piece may hold the start of the next
            # frame too: it is released with this one, the next frame's first piece
            # uncharged, which bounds the error to one piece per connection).
            await self._charge(len(chunk))
            splitter.feed(chunk)

    async def _receive_direct(self, waits: int | None = None) -> bytearray | None:
        """``waits``: the wait count when the receive began, if it began before this call."""
        if waits is None:
            waits = self._waits
        size, frame, filled = await self._receive_head()
        if frame is None:
            return None
        await self._read_rest(frame, filled, size)
        self._frame_done()
        if self._waits == waits:
            await trio.lowlevel.checkpoint()  # every receive is a checkpoint, even when nothing waited
        return frame

    async def receive_request(self, pass_on_min: int | None) -> bytes | bytearray | PartialFrame | None:
        """The next frame, as ``receive_frame``; except that a frame of which at least
        ``pass_on_min`` bytes have not arrived yet comes back as a ``PartialFrame``: the
        bytes that had (at least ``_SPLICE_LOOKAHEAD`` of them), the rest left in the socket for
        ``pass_on``, which splices it into another socket without reading it. Only
        between plain TCP sockets with ``splice``; ``pass_on_min`` None means never."""
        if pass_on_min is None or self._socket is None or _SPLICE is None:
            return await self.receive_frame()
        splitter = self._splitter
        waits = self._waits
        # Most requests are small and arrive whole in this one read. Of a large one it takes
        # no more than the head that routing needs: every byte read here is copied through
        # user space and back into the pipe, while the rest is spliced without a copy.
        size = await self._next_size(4 + _SPLICE_LOOKAHEAD)
        if size is None:
            return None
        if size - (splitter.buffered - 4) < pass_on_min:
            return await self._receive_direct(waits)  # one checkpoint in all, waited or not
        await self._fill_splitter(4 + min(size, _SPLICE_LOOKAHEAD), 0)  # never False: bytes are buffered
        head = bytearray(min(splitter.buffered - 4, size))
        await self._charge(len(head))  # only the head is held: the body goes on without entering the proxy
        self._frame_done()
        splitter.take_start(head)
        if self._waits == waits:
            await trio.lowlevel.checkpoint()
        return PartialFrame(size, head)

    async def _next_size(self, read: int) -> int | None:
        """The next frame's size, reading (up to ``read`` bytes a read) until the splitter
        can tell it; None at a clean end of stream before any byte of a frame."""
        splitter = self._splitter
        count = 4
        while True:
            if not await self._fill_splitter(count, read):
                return None
            size = splitter.next_size()
            if size is not None:
                return size
            count = splitter.buffered + 1  # it needs the API key after the size (limit_early)

    async def _fill_splitter(self, count: int, read: int) -> bool:
        """Read until the splitter holds ``count`` bytes, taking up to ``read`` bytes a
        read if that is more; False at a clean end of stream before any byte of a frame."""
        splitter = self._splitter
        sock = self._socket
        while splitter.buffered < count:
            try:
                chunk = os.read(sock.fileno(), max(count - splitter.buffered, read))
            except BlockingIOError:
                self._waits += 1
                await trio.lowlevel.wait_readable(sock)
                continue
            if not chunk:
                if splitter.buffered:
                    raise trio.BrokenResourceError(f"stream ended inside a frame ({splitter.buffered} bytes buffered)")
                return False
            splitter.feed(chunk)
        return True

    async def receive_rest(self, partial: PartialFrame) -> bytearray:
        """The whole frame of a ``PartialFrame``, read into memory after all (its head is
        charged already; the rest as it arrives, see ``_grow``)."""
        frame = bytearray(partial.head)
        await self._read_rest(frame, len(partial.head), partial.size)
        self._frame_done()
        return frame

    async def _read_rest(self, frame: bytearray, filled: int, size: int) -> None:
        """Read the rest of ``frame`` (its first ``filled`` bytes are there) in place, up to
        ``size`` bytes, making room as the buffer fills (``_grow``)."""
        if filled == size:
            return
        try:
            while filled < size:
                if filled == len(frame):
                    await self._grow(frame, size)
                view = memoryview(frame)  # none may be held while the buffer grows
                filled += await self._read_some(view, filled, len(frame), _LOWAT_CAP)
                del view
        finally:
            if self._lowat != 1:
                self._set_lowat(1)

    async def _grow(self, frame: bytearray, size: int) -> None:
        """Make room in a frame buffer whose room is all filled (``_more_room``)."""
        more = self._more_room(len(frame), size)
        await self._charge(more)
        while more:
            piece = min(more, len(_ZEROS))
            frame += _ZEROS[:piece]
            more -= piece

    async def pass_on(self, partial: PartialFrame, destination: FrameStream) -> None:
        """Send a ``PartialFrame`` to ``destination`` (a plain TCP stream): its size prefix
        and head, then the rest spliced from this socket as it arrives."""
        out = _Outbox(self, destination)
        with self._passing(out):
            out.add(SIZE_PREFIX.pack(partial.size))
            out.add(partial.head)
            await out.splice_from_source(partial.size - len(partial.head))
            await out.flush()

    @contextlib.contextmanager
    def _passing(self, out: _Outbox):
        """Around passing a frame on through ``out``: on any failure the pipe is dropped
        with what it holds; the socket's wake-up threshold is reset either way."""
        try:
            yield
        except BaseException:
            out.abandon()
            raise
        finally:
            if self._lowat != 1:
                self._set_lowat(1)

    def _set_lowat(self, lowat: int) -> None:
        if _SO_RCVLOWAT is None:
            return
        try:
            self._socket.setsockopt(socket.SOL_SOCKET, _SO_RCVLOWAT, lowat)
        except OSError:
            return  # closed under us; the next read reports it
        self._lowat = lowat

    async def relay_frame(self, destination: FrameStream, correlation_id: int, relay: Relay) -> int | None:
        """Forward the next frame to ``destination`` while it arrives; its size, or None at a
        clean end of stream between frames.

        Nothing is sent before the frame's correlation id is checked against
        ``correlation_id`` (ProtocolError otherwise). Bytes go on as soon as ``relay.walk``
        has shown that they lie before the tail; the tail goes last, through
        ``relay.finish``. Streams that are not plain TCP receive the whole frame first.
        Like ``receive_frame``, always a checkpoint, and only one when nothing had to wait.
        """
        if self._socket is None or destination._socket is None:
            whole = await self.receive_frame()
            if whole is None:
                return None
            _check_correlation(whole, correlation_id)
            if relay.walk is not None:
                tail = _run_walk(relay.walk(whole, len(whole), len(whole)))
                if tail < len(whole):
                    whole = bytes(whole[:tail]) + relay.finish(whole, tail)
            await destination.send_frame(whole)
            return len(whole)
        splicing = _SPLICE is not None
        head = _SPLICE_LOOKAHEAD if splicing else _HEADER_READ  # splicing: leave the body in the socket
        waits = self._waits
        size, buffer, filled = await self._receive_head(reuse=True, head=head)
        if buffer is None:
            return None
        if size < 4:
            raise ProtocolError(f"response header truncated: {size} bytes", offset=size)
        frame = view = memoryview(buffer)[:size]
        out = _Outbox(self, destination)
        passed = 0  # bytes of the body handed to ``out`` so far
        tail = size  # where the tail that ``relay.finish`` may rewrite begins
        with self._passing(out):
            while filled < 4:
                filled += await self._read_some(view, filled, size, _RELAY_CHUNK)
            _check_correlation(frame, correlation_id)
            out.add(SIZE_PREFIX.pack(size))
            walk = None
            need = safe = size
            if relay.walk is not None:
                walk = relay.walk(frame, size, filled)
                need, safe, finished = _step(walk, None)
                if finished:
                    walk, tail = None, need
            while True:
                while walk is not None and filled >= need:
                    need, safe, finished = _step(walk, filled)
                    if finished:
                        walk, tail = None, need
                if walk is None and filled == size:
                    break  # the rest goes below, with the tail
                ready = min(filled, safe, tail)
                if ready > passed:
                    out.add(view[passed:ready])
                    passed = ready
                unread = min(need, safe, tail)  # nothing from filled to here is ever read
                if splicing and unread - filled >= _SPLICE_MIN:
                    await out.splice_from_source(unread - filled)
                    filled = passed = unread
                    continue
                if out.buffered >= _RELAY_CHUNK:
                    await out.flush()
                # While splicing, read little past what the walk needs, so that what it
                # will step over is still in the socket to be spliced.
                limit = min(size, max(need, filled) + _SPLICE_LOOKAHEAD) if splicing and walk is not None else size
                filled += await self._read_some(view, filled, limit, _RELAY_CHUNK, out)
            if tail < size:
                end = relay.finish(frame, tail)
                if len(end) != size - tail:
                    raise AssertionError("a relayed tail must keep its length")
                out.add(view[passed:tail])
                out.add(end)
            else:
                out.add(view[passed:size])
            await out.flush()
        if self._waits == waits:
            await trio.lowlevel.checkpoint()
        return size

    def _open_pipe(self) -> tuple[int, int, int]:
        """This stream's splice pipe, opened on first use: (read end, write end, capacity)."""
        if self._pipe is None:
            read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                capacity = fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
            except OSError:  # over the user's pipe quota: take what the pipe has
                capacity = fcntl.fcntl(write_end, fcntl.F_GETPIPE_SZ)
            self._pipe = (read_end, write_end, capacity)
        return self._pipe

    def _close_pipe(self) -> None:
        if self._pipe is not None:
            read_end, write_end, _ = self._pipe
            self._pipe = None
            os.close(read_end)
            os.close(write_end)

    async def _receive_head(self, reuse: bool = False, head: int = _HEADER_READ):
        """(size, frame buffer, bytes of it filled), or (None, None, 0) at a clean end.

        With ``reuse`` the buffer is this stream's relay buffer (frames up to
        ``_REUSE_MAX``), which holds a frame only until it has been passed on: no
        allocation and no zeroing of a megabyte per frame.
        """
        splitter = self._splitter
        size = await self._next_size(head)
        if size is None:
            return None, None, 0
        if reuse and size <= _REUSE_MAX:
            frame = self._relay_buffer
            if len(frame) < size:
                frame = self._relay_buffer = bytearray(size)
        else:
            room = self._room(size, splitter.buffered - 4)
            await self._charge(room)
            # a buffer of the frame's exact size is filled whole before it is read: not zeroed
            frame = _unfilled_bytearray(room) if room == size else bytearray(room)
        available = splitter.take_start(memoryview(frame)[:size])
        return size, frame, available

    async def _read_some(self, view: memoryview, filled: int, size: int, chunk: int, out: _Outbox | None = None) -> int:
        """Read at least one byte into ``view[filled:size]``. When it has to wait, it first
        flushes ``out`` (a relay never holds bytes back while it waits), and asks the kernel
        (SO_RCVLOWAT) not to wake it before ``chunk`` bytes, or the rest of the frame, are
        there."""
        sock = self._socket
        while True:
            try:
                received = os.readv(sock.fileno(), (view[filled:size],))
            except BlockingIOError:
                if out is not None and out.pending:
                    await out.flush()
                    continue  # flushing may have waited: look again before asking for a wake-up
                remaining = size - filled
                lowat = min(remaining, chunk) if remaining >= _LOWAT_MIN else 1
                if lowat != self._lowat:
                    self._set_lowat(lowat)
                self._waits += 1
                await trio.lowlevel.wait_readable(sock)
                continue
            if not received:
                raise trio.BrokenResourceError(f"stream ended inside a frame ({filled} of {size} bytes)")
            return received

    async def send_frame(self, body: bytes | bytearray | memoryview | GatheredFrame) -> None:
        prefix = SIZE_PREFIX.pack(len(body))
        if isinstance(body, GatheredFrame):
            if self._socket is None:
                await self.stream.send_all(prefix)
                for part in body.parts:
                    await self.stream.send_all(part)
                return
            await send_buffers(self._socket, (prefix, *body.parts))
            return
        if self._socket is None:
            if len(body) < _COALESCE_LIMIT:
                await self.stream.send_all(prefix + body)
            else:  # large bodies: two writes beat copying megabytes to prepend four bytes
                await self.stream.send_all(prefix)
                await self.stream.send_all(body)
            return
        await send_buffers(self._socket, (prefix, body))

    async def send_rest(self, data: bytes | bytearray | memoryview) -> None:
        """The end of a frame whose start went out already (the native relay's), as it is."""
        if self._socket is None:
            await self.stream.send_all(data)
            return
        await send_buffers(self._socket, (data,))

    async def aclose(self) -> None:
        self._close_pipe()
        with trio.CancelScope(shield=True):
            try:
                await self.stream.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError):
                pass


class ClientFrameStream(FrameStream):
    """A client's stream: it never trusts a declared size with memory. A frame's buffer
    starts at what has arrived (or ``_GROW_FIRST``) and doubles only when the bytes already
    there fill it, so it never holds more than twice what has arrived, whatever the client
    declared; and every byte is charged to the proxy-wide ``RequestBudget`` until the
    reader calls ``release_frame`` (see ``proxy.net.budget`` for when a charge waits).
    ``early_limit``: a lower size limit for some API keys until ``authenticated``
    (``FrameSplitter.limit_early``)."""

    __slots__ = ("_budget", "_ticket", "_held")

    def __init__(self, stream: trio.abc.Stream, max_frame_bytes: int, *, budget: RequestBudget,
                 early_limit: tuple[int, str, frozenset[int]] | None = None) -> None:
        super().__init__(stream, max_frame_bytes)
        self._splitter.limit_early(early_limit)
        self._budget = budget
        self._ticket: int | None = None  # the budget's ticket of the frame being received
        self._held = 0  # bytes of the budget this stream holds for the frame it is reading or last read

    def authenticated(self) -> None:
        """The connection has authenticated: the early limit no longer applies from its
        next size prefix on."""
        self._splitter.limit_early(None)

    @property
    def held(self) -> int:
        """Budget bytes held for the frame being read or last read."""
        return self._held

    def release_frame(self) -> None:
        """The reader is done with the frame it last received: its bytes leave the budget."""
        self._frame_done()
        if self._held:
            held, self._held = self._held, 0
            self._budget.release(held)

    def _room(self, size: int, arrived: int) -> int:
        return min(size, max(arrived, _GROW_FIRST))

    def _more_room(self, room: int, size: int) -> int:
        return min(size, max(2 * room, _GROW_FIRST)) - room

    async def _charge(self, count: int) -> None:
        """The first charge of a frame starts it in the budget."""
        if self._ticket is None:
            self._ticket = await self._budget.start()
        await self._budget.grow(self._ticket, count)
        self._held += count

    def _frame_done(self) -> None:
        if self._ticket is not None:
            ticket, self._ticket = self._ticket, None
            self._budget.received(ticket)

    async def aclose(self) -> None:
        self.release_frame()
        await super().aclose()


class _Outbox:
    """The bytes of one relayed frame that are on their way to the client, in order: first
    those in the source stream's pipe (``held``, spliced from the source socket or stashed
    there), then those in user space (``buffers``, added with ``add``).

    A relay hands bytes over as the walk clears them and flushes only when it is about to
    wait for the source, when a good piece has gathered, and at the end of the frame. So
    the head of a Fetch response leaves with the first piece of its record set, and its
    tail with the last piece, in one write each: every write to the client is a wake-up
    of the client and a trip through its TCP stack. A frame that is never spliced leaves
    in one ``writev`` with its size prefix, as ``send_frame`` would send it.
    """

    __slots__ = ("source", "target", "destination", "buffers", "buffered", "held", "read_end", "write_end",
                 "capacity")

    def __init__(self, source: FrameStream, destination: FrameStream) -> None:
        self.source = source
        self.destination = destination
        self.target = destination._socket
        self.buffers: list = []
        self.buffered = 0  # bytes in ``buffers``
        self.held = 0  # bytes in the pipe
        self.read_end = self.write_end = -1
        self.capacity = 0

    @property
    def pending(self) -> bool:
        return bool(self.held or self.buffered)

    def add(self, data) -> None:
        if len(data):
            self.buffers.append(data)
            self.buffered += len(data)

    def _pipe(self) -> None:
        if self.capacity == 0:
            self.read_end, self.write_end, self.capacity = self.source._open_pipe()

    async def stash(self) -> None:
        """Move ``buffers`` into the pipe, so that spliced bytes can follow them."""
        if not self.buffered:
            return
        self._pipe()
        for data in self.buffers:
            data = memoryview(data)
            while data:
                try:
                    written = os.write(self.write_end, data)
                except BlockingIOError:
                    written = 0
                self.held += written
                data = data[written:]
                if data and not self.give():
                    await trio.lowlevel.wait_writable(self.target)
        self.buffers.clear()
        self.buffered = 0

    def take(self, count: int) -> int:
        """Splice up to ``count`` bytes from the source socket into the pipe; 0 when none
        are there (or the pipe is full). ``stash`` must have run since the last ``add``."""
        self._pipe()
        room = self.capacity - self.held
        if room <= 0:
            return 0
        try:
            taken = _SPLICE(self.source._socket.fileno(), self.write_end, min(count, room), flags=_SPLICE_FLAGS)
        except BlockingIOError:
            return 0
        if taken == 0:
            raise trio.BrokenResourceError(f"stream ended inside a frame ({count} relayed bytes missing)")
        self.held += taken
        return taken

    def give(self) -> int:
        """Splice what the client's socket takes now from the pipe; how much."""
        if not self.held:
            return 0
        try:
            given = _SPLICE(self.read_end, self.target.fileno(), self.held, flags=_SPLICE_FLAGS)
        except BlockingIOError:
            return 0
        self.held -= given
        return given

    async def flush(self) -> None:
        """Everything to the client's socket (waiting for room when it is full)."""
        if self.held:
            if self.buffered and self.buffered <= _SPLICE_LOOKAHEAD:
                await self.stash()  # a few bytes after the spliced ones: one write for both
            while self.held:
                if not self.give():
                    await trio.lowlevel.wait_writable(self.target)
        if self.buffered:
            buffers, self.buffers, self.buffered = self.buffers, [], 0
            await send_buffers(self.target, buffers)

    async def splice_from_source(self, count: int) -> None:
        """Move the next ``count`` bytes of the source's socket into this outbox through
        the source's pipe, without copying them into user space. The pipe is passed on to
        the client whenever a good piece (``_SPLICE_CHUNK``) has gathered and before
        waiting for more; what is left of it at the end goes out later, with the bytes that
        follow. Waits (and so checkpoints) only when a socket would block; raises
        trio.BrokenResourceError when the stream ends first."""
        out, source = self, self.source
        await out.stash()
        remaining = count  # bytes still to take from the source's socket
        while remaining:
            taken = out.take(remaining)
            remaining -= taken
            if out.held >= _SPLICE_CHUNK or (out.held and not taken):
                if out.give() or taken:
                    continue
                await trio.lowlevel.wait_writable(out.target)  # the pipe and the client's socket are full
            elif not taken:  # the pipe is empty and nothing more has arrived
                lowat = min(remaining, _SPLICE_CHUNK, out.capacity) if remaining >= _LOWAT_MIN else 1
                if lowat != source._lowat:
                    source._set_lowat(lowat)
                source._waits += 1
                await trio.lowlevel.wait_readable(source._socket)

    def abandon(self) -> None:
        """After a failure: a pipe that still holds bytes is dropped with them, so that
        none can reach a later frame."""
        self.buffers.clear()
        self.buffered = 0
        if self.held:
            self.held = 0
            self.source._close_pipe()


# bytearray(n) without zeroing its n bytes, where the native relay's module is built
_unfilled_bytearray = getattr(accelerators.optional("proxy.net._cpump"), "unfilled_bytearray", bytearray)
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024  # buffers one writev takes


async def send_buffers(sock: Any, buffers) -> None:
    """Write the buffers to a plain TCP socket in order, with one system call when it
    takes them all (up to the kernel's IOV_MAX buffers a call)."""
    offered = buffers[:_IOV_MAX]
    try:
        done = os.writev(sock.fileno(), offered)
    except BlockingIOError:
        done = 0
    if done == sum(map(len, buffers)):
        return
    full = done < sum(map(len, offered))  # else it took all it was offered: offer the rest at once
    remaining = [memoryview(buffer) for buffer in buffers if len(buffer)]
    while True:
        while remaining and done >= len(remaining[0]):
            done -= len(remaining.pop(0))
        if not remaining:
            return
        if done:
            remaining[0] = remaining[0][done:]
        if full:
            await trio.lowlevel.wait_writable(sock)
        offered = remaining[:_IOV_MAX]
        try:  # the descriptor is looked up again after every wait: never a stale one
            done = os.writev(sock.fileno(), offered)
        except BlockingIOError:
            done = 0
        full = done < sum(map(len, offered))



def _check_correlation(frame, expected: int) -> None:
    correlation_id = peek_correlation_id(frame)
    if correlation_id != expected:
        raise ProtocolError(f"broker answered correlation id {correlation_id}, expected {expected}")


def _step(walk, filled):
    """Resume a walk: (need, safe, False), or (tail, tail, True) once it has finished."""
    try:
        need, safe = walk.send(filled)
    except StopIteration as done:
        return done.value, done.value, True
    return need, safe, False


def _run_walk(walk) -> int:
    """Run a walk over a complete frame to its end."""
    try:
        next(walk)
    except StopIteration as done:
        return done.value
    raise ProtocolError("response ends inside a field")
