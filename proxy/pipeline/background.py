"""Follow-up work a request leaves behind that must not end with the client's connection.

After a transactional commit is answered, the proxy waits for the transaction to end and
then folds what it committed into the individual-commit log and moves S at the coordinator
(the *settle*). A client commonly closes its connection right after its last commit; tied
to the connection, that settle would be cancelled and S would lag until some later commit.
So settles run here: one nursery for the proxy's life, under the server's root nursery,
cancelled at shutdown after the connections (a settle is a follow-up: the next commit or
OffsetFetch of the key redoes it).

Bounded: at most ``limit`` follow-ups run at once; beyond that ``start`` refuses (and
counts it) rather than let a burst of commits queue without end. ``start_soon`` (what a
task started here uses for its own helpers, as it would a connection's) always starts.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

log = logging.getLogger("proxy.background")


class Background:
    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self.running = 0
        self.refused = 0
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the nursery until cancelled (the server's shutdown)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

    def start(self, task: Callable[..., Awaitable[Any]], *args: Any) -> bool:
        """Run a follow-up; False (nothing started) when ``limit`` run already or the
        proxy is not running."""
        if self._nursery is None or self.running >= self.limit:
            self.refused += 1
            log.warning("follow-up not started task=%s running=%d limit=%d", getattr(task, "__qualname__", task),
                        self.running, self.limit)
            return False
        self.running += 1
        self._nursery.start_soon(self._counted, task, args, name=getattr(task, "__qualname__", None))
        return True

    def start_soon(self, task: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """A helper of a follow-up (a lock holder): always started, not counted."""
        if self._nursery is None:
            raise RuntimeError("the proxy's background tasks are not running")
        self._nursery.start_soon(self._guarded, task, args, name=getattr(task, "__qualname__", None))

    async def _counted(self, task: Callable[..., Awaitable[Any]], args: tuple) -> None:
        try:
            await self._guarded(task, args)
        finally:
            self.running -= 1

    @staticmethod
    async def _guarded(task: Callable[..., Awaitable[Any]], args: tuple) -> None:
        try:
            await task(*args)
        except Exception:
            log.exception("a follow-up task failed task=%s", getattr(task, "__qualname__", task))
