"""Runs of frames no feature reads, moved by a native loop on a worker thread.

Why: what the proxy spends beyond a bare relay is the interpreter's time per frame (about
180 us of Python and trio for a 256 KB Produce request), not its work on the bytes. A run
of requests that no feature reads, whose responses no feature rewrites, needs none of it:
``_cpump.relay`` moves them between the two sockets with the GIL released (so on the
second core), and returns to the event loop at the first frame that needs it. The
contract it keeps (frame boundaries, order, what it hands back) is in ``_cpump.c``.

With virtual topics on, a Produce naming one must reach the event loop, which refuses it:
the table flags Produce GUARDED, and each run (and each peek) gets the guard as it stands
(``guard``: the virtual-topic suffixes and the ids handed out so far), against which the
loop checks every Produce's topic names. An id handed out while a run goes on is in the
next run's guard, at most ``slice_ms`` later; a Produce naming it before then reaches the
broker, which knows no such id and answers UNKNOWN_TOPIC_ID, and the client's retry is
refused. A plain Fetch (no tagged field in its body) is carried the same way, and by topic
id only when it names topics the proxy knows (``known``, also asked at each run's start);
the table a run gets is the connection's (``classes``): a connection holding a fetch
session of a feature's has its every Fetch read by the event loop.

A key-range Fetch whose every partition's share the cache holds (and the key-range feature
published in the loop's answers table, ``NativeAnswers``: ``proxy.keyrange.native``) is
answered by the loop itself; the handles of the shares it took come back with the run
(``RunResult.taken``) for the feature's bookkeeping, and a peek says such a request may
start a run too.

A run starts only when a thread of the shared ``NativeRelayThreads`` is free; a connection
that finds none goes on in the event loop, which is never worse than before. A run lasts
at most ``slice_ms`` (so counters and the idle clock move on) and is continued only if no
connection was refused a thread meanwhile (so busy connections take turns); it ends after
``idle_ms`` without a request, so a quiet connection does not hold a thread.

Cancelling a run: the loop polls an eventfd. A cancel of the reader alone (the connection
drains) asks it to stop at the next frame boundaries, with what is in flight handed back
for the event loop to answer; a cancel of the whole connection aborts it at once.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from proxy import accelerators
from proxy.net import native_table
from proxy.net.streams import FrameStream
from proxy.protocol.constants import MAX_ARRAY_ELEMENTS, MAX_TAGGED_FIELDS

STARTERS = (0, 1)  # Produce and Fetch: the API keys a run starts on (``NativeRelay.starters``)
# How a run ended (``RunResult.reason``), as metric labels.
ENDINGS = ("slice", "idle", "request", "response", "woken", "aborted", "upstream_closed", "protocol", "broken")
SLICE, IDLE, PYTHON_REQUEST, PYTHON_RESPONSE, WOKEN, ABORTED, UPSTREAM_CLOSED, PROTOCOL, BROKEN = range(9)


def _load() -> Any:
    """The C loop, if built, not refused (KEYRANGE_PURE_PYTHON) and built with the numbers
    this side uses: the table's (``native_table``), the run endings above and the
    protocol limits. A stale build is refused rather than trusted."""
    module = accelerators.optional("proxy.net._cpump")
    if module is None:
        return None
    native_table.check_extension(module)
    expected = {name.upper(): value for value, name in enumerate(ENDINGS)}
    expected.update(PYTHON_REQUEST=PYTHON_REQUEST, PYTHON_RESPONSE=PYTHON_RESPONSE,
                    MAX_ARRAY_ELEMENTS=MAX_ARRAY_ELEMENTS, MAX_TAGGED_FIELDS=MAX_TAGGED_FIELDS)
    del expected["REQUEST"], expected["RESPONSE"]
    wrong = {name: getattr(module, name, None) for name, value in expected.items()
             if getattr(module, name, None) != value}
    if wrong:
        raise ImportError(f"proxy.net._cpump was built with other constants: {wrong}; rebuild it")
    return module


_cpump: Any = _load()
AVAILABLE = _cpump is not None and hasattr(os, "eventfd") and hasattr(os, "splice")
# The loop answers key-range Fetches from a table the event loop fills (a build from before
# that has no ``Answers``: every such Fetch stays the event loop's).
ANSWERS = AVAILABLE and hasattr(_cpump, "Answers")


def answers_table() -> Any:
    """A new, empty table of answers (``_cpump.Answers``); only when ``ANSWERS``."""
    return _cpump.Answers()


class NativeAnswers(Protocol):
    """What a run needs to answer key-range Fetches itself (``proxy.keyrange.native``):
    the table (``_cpump.Answers``), the partitions the broker served a connection (the
    loop answers only for those), and where the handles of the answers it sent go."""

    @property
    def table(self) -> Any: ...

    def served(self, ctx: Any) -> bytes: ...

    def taken(self, handles: list[int]) -> None: ...


@dataclass(slots=True)
class RunResult:
    reason: int
    # requests forwarded whose response has not begun, oldest first:
    # (api_key, version, correlation_id, class, request_bytes, started_ns)
    flights: list = field(default_factory=list)
    # requests answered: (api_key, request_bytes, response_bytes, latency_ns)
    answered: list = field(default_factory=list)
    # PYTHON_RESPONSE: the response body of flights[0]; of a FETCH one, its size prefix,
    # correlation id and top-level tagged fields (the loop sent the rest)
    held: bytes | None = None
    forwarded: int = 0
    spliced: int = 0  # of them, those of 64 KiB or more (counted as the event loop counts its splices)
    message: str = ""
    # the handles of the answers the loop sent from the answers table (``NativeAnswers``), in order
    taken: list = field(default_factory=list)


class NativeRelayThreads:
    """The worker threads native runs may use, shared by every connection. A run never
    waits for one: ``try_take`` fails and the connection carries on in the event loop."""

    def __init__(self, threads: int, *, slice_ms: int = 200, idle_ms: int = 20) -> None:
        self.threads = threads if AVAILABLE else 0
        self.slice_ms = slice_ms
        self.idle_ms = idle_ms
        self._tokens = trio.CapacityLimiter(self.threads) if self.threads else None
        self._unlimited = trio.CapacityLimiter(math.inf)  # the tokens above are the limit
        # Connections refused a thread so far: a run that sees this move at the end of a
        # slice gives its thread up, so busy connections take turns.
        self.refusals = 0

    def try_take(self, borrower: object) -> bool:
        if self._tokens is None:
            return False
        try:
            self._tokens.acquire_on_behalf_of_nowait(borrower)
        except trio.WouldBlock:
            self.refusals += 1
            return False
        return True

    def give_back(self, borrower: object) -> None:
        if self._tokens is not None:
            self._tokens.release_on_behalf_of(borrower)


def native_now_ns() -> int:
    """The clock the native loop stamps requests with (CLOCK_MONOTONIC)."""
    return time.monotonic_ns()


class NativeRelay:
    """One connection's native runs: its client and upstream streams (plain TCP both)."""

    def __init__(self, client: FrameStream, upstream: FrameStream, threads: NativeRelayThreads,
                 classes: Callable[[], bytes], *, max_frame_bytes: int, max_inflight: int,
                 guard: Callable[[], bytes] | None = None, known: Callable[[], bytes] | None = None,
                 answers: NativeAnswers | None = None, served: Callable[[], bytes] | None = None) -> None:
        """``classes``: the table for the connection's next run. ``guard``: the current guard
        of requests the table flags GUARDED (``native_table.guard_blob``), and ``known``: the
        ids of the topics the proxy knows (``native_table.known_blob``); without them, the
        loop leaves every such request naming a topic (by id) to the event loop.
        ``answers``: the key-range answers the loop may send itself, and ``served``: the
        partitions the broker served this connection (``NativeAnswers.served``)."""
        self.client = client
        self.answers = answers if ANSWERS else None
        self.served = served
        self.upstream = upstream
        self.threads = threads
        self.classes = classes
        self.guard = guard
        self.known = known
        self.max_frame_bytes = max_frame_bytes
        self.max_inflight = max_inflight
        self._starters: dict[bytes, bytes] = {}  # a table -> its starters (tables are the chain's, few)
        self._wake = -1  # the eventfd a run polls, made on the first run
        self.last: RunResult | None = None

    @staticmethod
    def usable(client: FrameStream, upstream: FrameStream, threads: NativeRelayThreads) -> bool:
        return threads.threads > 0 and client.splices and upstream.splices

    def close(self) -> None:
        if self._wake >= 0:
            os.close(self._wake)
            self._wake = -1

    def at_boundaries(self) -> bool:
        """Neither stream holds bytes of a frame the event loop has begun to read."""
        return self.client.buffered == 0 and self.upstream.buffered == 0

    def starters(self, table: bytes) -> bytes:
        """The part of ``table`` a run may start on: Produce and Fetch, the traffic whose
        rate makes the event loop's cost per frame matter (a consumer never produces). Once
        running, a run carries every request the table allows, so a client's occasional
        other requests do not end it. A connection that only heartbeats never takes a
        thread, a pipe or an eventfd."""
        starters = self._starters.get(table)
        if starters is None:
            starters = self._starters[table] = native_table.only_keys(table, STARTERS)
        return starters

    def peek(self) -> int | None:
        """How the native loop may carry the client's next request (0: it may not), or
        None when nothing of it has arrived. Reads nothing from the socket."""
        if self.answers is None:
            return _cpump.peek(self.client.socket.fileno(), self.starters(self.classes()), self.max_frame_bytes,
                               self._guard(), self._known())
        return _cpump.peek(self.client.socket.fileno(), self.starters(self.classes()), self.max_frame_bytes,
                           self._guard(), self._known(), self.answers.table, self._served())

    def _served(self) -> bytes:
        return self.served() if self.served is not None else b""

    def _guard(self) -> bytes:
        return self.guard() if self.guard is not None else b""

    def _known(self) -> bytes:
        return self.known() if self.known is not None else b""

    async def run(self, flights: list, nursery: trio.Nursery) -> RunResult:
        """One run, carrying ``flights`` on. ``nursery``: the connection's (outside the
        reader's cancel scope), where the watch for an abort lives.

        It may raise Cancelled, before the run began or after it ended; whatever ran is in
        ``self.last`` either way (None if nothing did), for the caller to account for."""
        self.last = None
        if self._wake < 0:
            self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            os.eventfd_read(self._wake)  # a wake-up left from an earlier run
        except BlockingIOError:
            pass
        request_pipe = self.client.splice_pipe()
        response_pipe = self.upstream.splice_pipe()
        holder: list = []
        client_fd, upstream_fd = self.client.socket.fileno(), self.upstream.socket.fileno()
        threads = self.threads
        classes, guard, known = self.classes(), self._guard(), self._known()
        extra = {} if self.answers is None else {"answers": self.answers.table, "served": self._served()}

        def relay() -> None:
            holder.append(_cpump.relay(client=client_fd, upstream=upstream_fd, wake=self._wake,
                                       classes=classes, flights=flights, max_frame=self.max_frame_bytes,
                                       max_inflight=self.max_inflight, slice_ms=threads.slice_ms,
                                       idle_ms=threads.idle_ms, request_pipe=request_pipe,
                                       response_pipe=response_pipe, guard=guard, known=known, **extra))

        aborts, stops = trio.CancelScope(), trio.CancelScope()
        nursery.start_soon(self._wake_when_cancelled, aborts, 2)
        try:
            async with trio.open_nursery() as own:
                own.start_soon(self._wake_when_cancelled, stops, 1)
                try:
                    await trio.to_thread.run_sync(relay, limiter=threads._unlimited, abandon_on_cancel=False)
                finally:
                    stops.cancel()
        finally:
            aborts.cancel()
            if holder:
                reason, left, answered, held, forwarded, spliced, _, message, *rest = holder[0]
                result = RunResult(reason, left, answered, held, forwarded, spliced, message,
                                   rest[0] if rest else [])
                if reason in (ABORTED, BROKEN, PROTOCOL):
                    self.client.drop_pipe()  # they may hold part of a frame
                    self.upstream.drop_pipe()
                self.last = result
        return result

    async def _wake_when_cancelled(self, scope: trio.CancelScope, value: int) -> None:
        with scope:
            try:
                await trio.sleep_forever()
            finally:
                if not scope.cancel_called and self._wake >= 0:
                    os.eventfd_write(self._wake, value)

