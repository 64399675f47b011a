"""The two clocks of a client connection that does not do its part (the module docstring
of ``proxy.server.connection`` says what each bounds): when each runs out, and the log
line and metric of a connection closed on one.

``ConnectionSetup`` (``proxy.server.limits``) decides whether the connection has set up;
this holds its deadlines and the time of its last activity.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import trio

from proxy.server.limits import ConnectionSetup, LogThrottle
from proxy.server.metrics import ProxyMetrics

log = logging.getLogger("proxy.connection")


class ConnectionWatch:
    """Setup deadline, idle timeout and last activity of one connection."""

    __slots__ = ("setup", "setup_deadline", "idle_timeout", "last_activity", "_setup_closed", "_setup_log",
                 "_metrics", "_names")

    def __init__(self, *, setup_deadline: float, idle_timeout: float, setup_log: LogThrottle | None,
                 metrics: ProxyMetrics,
                 names: tuple[int, str, str]) -> None:
        self.setup = ConnectionSetup()
        self.setup_deadline = setup_deadline  # on trio's clock
        self.idle_timeout = idle_timeout
        self.last_activity = trio.current_time()  # a request began arriving, or a response left
        self._setup_closed = False  # counted and logged as a setup timeout
        self._setup_log = setup_log  # shared by the server's connections; None logs every closure
        self._metrics = metrics
        self._names = names  # (connection id, peer, target), for the log lines

    @property
    def idle_deadline(self) -> float:
        return self.last_activity + self.idle_timeout

    async def run(self, scope: trio.CancelScope, idle: Callable[[], bool]) -> None:
        """Cancel ``scope`` at the setup deadline if the connection has not set up by then,
        or once it has been idle (``idle()``: nothing in flight) for ``idle_timeout``; one
        task for both (it costs every connection)."""
        setup_pending = math.isfinite(self.setup_deadline) and not self.setup.past_authentication
        while True:
            now = trio.current_time()
            if setup_pending and now >= self.setup_deadline:
                if not self.setup.complete:
                    self.closing_unset_up()
                    scope.cancel()
                    return
                setup_pending = False  # a SASL begun later is caught as it arrives (set_up_by)
            idle_deadline = self.idle_deadline
            if now >= idle_deadline and idle():
                self.closing_idle()
                scope.cancel()
                return
            wake = max(idle_deadline, now + 1.0)  # in flight past the deadline: look again each second
            if setup_pending:
                wake = min(wake, self.setup_deadline)
            if not math.isfinite(wake):
                return
            await trio.sleep_until(wake)

    def set_up_by(self, api_key: int, now: float) -> bool:
        """One more request while the connection may still be setting up (the reader's).
        False when it must close: SASL begun after the deadline, on a connection not yet
        past authentication (logged and counted here)."""
        self.setup.on_request(api_key)
        if not self.setup.complete and now >= self.setup_deadline:
            self.closing_unset_up()
            return False
        return True

    def closing_idle(self) -> None:
        self._metrics.connections_closed.labels("idle").inc()
        conn, peer, _ = self._names
        log.info("closing idle connection conn=%s peer=%s idle_s=%.0f", conn, peer, self.idle_timeout)

    def closing_unset_up(self) -> None:
        if self._setup_closed:
            return
        self._setup_closed = True
        self._metrics.connections_closed.labels("setup_timeout").inc()
        unlogged = 0 if self._setup_log is None else self._setup_log.allow(trio.current_time())
        if unlogged is not None:  # a crowd of them (a slow-loris attack) is logged a line at a time
            conn, peer, target = self._names
            log.info("closing connection not set up in time conn=%s peer=%s target=%s lacking=%r "
                     "closed_unlogged=%s", conn, peer, target, self.setup.describe(), unlogged)
