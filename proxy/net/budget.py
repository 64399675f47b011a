"""One proxy-wide budget for the request bytes the proxy holds, like a broker's
``queued.max.request.bytes``.

A client decides how large a frame it declares, how fast its bytes arrive and how many
connections it opens; without a shared bound, a crowd of them decides how much memory
the proxy holds. Every frame read from a client is charged here, as its buffer grows with
the bytes that arrive (``proxy.net.streams``), until the reader is done with it (sent
upstream, or answered by the proxy). When the budget is spent the readers stop: the
clients' sockets fill and TCP slows them down, as a full broker does.

Charged by arrival, not by declaration: a crowd declaring huge frames and sending a few
bytes each holds a few bytes each, and spends nothing that others wait for. The rules
that keep it bounded without two readers ever waiting on each other:

- a frame starts (its size prefix is taken) only while the budget is not spent;
- a frame being received may grow while the budget is not spent, and the oldest frame
  being received may always grow: it finishes, is released, and the next oldest goes on.
  So what the proxy holds never exceeds the budget by more than one frame
  (``max.frame.bytes``), and no set of half-read frames can wait on each other forever;
  a client that stalls inside the oldest frame holds up the others only while the budget
  is spent, and only until its connection's timeouts close it.

Waiters are woken together whenever what they wait for may have changed; each looks again.
"""

from __future__ import annotations

import itertools

import trio


class RequestBudget:
    """Bytes of client frames held by the proxy, against ``limit``."""

    __slots__ = ("limit", "held", "waits", "_lot", "_receiving", "_tickets")

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError("the request budget must be positive")
        self.limit = limit
        self.held = 0  # bytes charged and not yet released
        self.waits = 0  # times a reader had to wait for the budget (a metric)
        self._lot = trio.lowlevel.ParkingLot()
        self._receiving: dict[int, None] = {}  # tickets of frames being received, oldest first
        self._tickets = itertools.count()

    def resize(self, limit: int) -> None:
        """A new limit (a reload), in force for the next frame and the next growth; readers
        waiting under the old one look again."""
        if limit <= 0:
            raise ValueError("the request budget must be positive")
        self.limit = limit
        self._lot.unpark_all()

    @property
    def spent(self) -> bool:
        return self.held >= self.limit

    @property
    def receiving(self) -> int:
        """Frames whose bytes are still arriving."""
        return len(self._receiving)

    def _oldest(self, ticket: int) -> bool:
        return next(iter(self._receiving)) == ticket

    async def start(self) -> int:
        """A frame begins: its ticket, once the budget is not spent. No checkpoint when it
        need not wait (the caller's receive is its checkpoint)."""
        if self.held >= self.limit:
            self.waits += 1
            while self.held >= self.limit:
                await self._lot.park()
        ticket = next(self._tickets)
        self._receiving[ticket] = None
        return ticket

    async def grow(self, ticket: int, count: int) -> None:
        """Charge ``count`` more bytes to the frame of ``ticket``, waiting while the budget
        is spent unless it is the oldest frame being received."""
        if self.held >= self.limit and not self._oldest(ticket):
            self.waits += 1
            while self.held >= self.limit and not self._oldest(ticket):
                await self._lot.park()
        self.held += count

    def received(self, ticket: int) -> None:
        """The frame of ``ticket`` has all its bytes (or was abandoned): it grows no more."""
        if ticket not in self._receiving:
            return
        del self._receiving[ticket]
        if self.held >= self.limit and self._receiving:
            self._lot.unpark_all()  # perhaps a new oldest frame: let it look

    def release(self, count: int) -> None:
        """``count`` charged bytes leave the proxy."""
        if count <= 0:
            return
        was_spent = self.held >= self.limit
        self.held -= count
        if was_spent and self.held < self.limit:
            self._lot.unpark_all()


__all__ = ["RequestBudget"]
