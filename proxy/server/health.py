"""Liveness and readiness, as an orchestrator probes them (``/livez``, ``/readyz`` on the
metrics port).

Live: the event loop answers (the probe's handler runs in it, so an answer is the proof).
Ready: the proxy can do its job for a new client right now, which needs three things:

- the cluster's metadata is known (a first broker answered), so Metadata can be answered
  with the proxy's addresses;
- every broker this instance fronts accepts a TCP connection (port-per-broker: each broker
  of the cluster; sidecar: its own), checked every ``CHECK_INTERVAL`` seconds, because a
  client routed to a proxy whose broker is down can only fail;
- the proxy is not draining (after SIGTERM it finishes what is in flight and takes no new
  work; a load balancer should stop sending it clients first).

``Health`` is the state, pure; ``watch_brokers`` is the trio task that keeps its broker part
current. Each change of readiness is logged once, with its reasons, so the log tells the
same story as the probe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import trio

log = logging.getLogger("proxy.health")

CHECK_INTERVAL = 2.0  # seconds between two checks of the fronted brokers
CHECK_TIMEOUT = 2.0  # seconds a broker has to accept a connection
# Until the cluster's metadata is known, the next check comes this soon: a proxy that
# starts is ready as soon as a broker answered, not a whole CHECK_INTERVAL later (a rolling
# restart waits for each instance's readiness before the next).
UNKNOWN_INTERVAL = 0.1


class Health:
    """What readiness depends on, and the last verdict logged."""

    __slots__ = ("cluster_known", "draining", "unreachable", "_logged")

    def __init__(self) -> None:
        self.cluster_known = False
        self.draining = False
        self.unreachable: dict[int, str] = {}  # fronted broker id -> why it is not reachable
        self._logged: tuple[bool, tuple[str, ...]] | None = None

    def reasons(self) -> list[str]:
        """Why the proxy is not ready; empty when it is."""
        out = []
        if self.draining:
            out.append("draining")
        if not self.cluster_known:
            out.append("cluster metadata not known yet")
        out += [f"broker {node} unreachable: {why}" for node, why in sorted(self.unreachable.items())]
        return out

    @property
    def ready(self) -> bool:
        return not self.reasons()

    def note(self) -> None:
        """Log the verdict if it changed since the last line."""
        reasons = tuple(self.reasons())
        verdict = (not reasons, reasons)
        if verdict == self._logged:
            return
        self._logged = verdict
        if reasons:
            log.warning("not ready reasons=%r", "; ".join(reasons))
        else:
            log.info("ready")


async def watch_brokers(health: Health, fronted: Callable[[], Mapping[int, tuple[str, int]]],
                        known: Callable[[], bool] = lambda: True, interval: float = CHECK_INTERVAL,
                        task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Check every ``interval`` seconds that each broker ``fronted()`` names accepts a TCP
    connection, and keep ``health`` current (``known()``: whether the cluster's metadata
    is known; until it is, every ``UNKNOWN_INTERVAL``)."""
    task_status.started()
    while True:
        health.cluster_known = known()
        unreachable: dict[int, str] = {}
        for node, (host, port) in sorted(fronted().items()):
            with trio.move_on_after(CHECK_TIMEOUT) as scope:
                try:
                    stream = await trio.open_tcp_stream(host, port)
                    await stream.aclose()
                except OSError as exc:
                    unreachable[node] = exc.strerror or str(exc)
            if scope.cancelled_caught:
                unreachable[node] = f"no answer within {CHECK_TIMEOUT:g} s"
        health.unreachable = unreachable
        health.note()
        await trio.sleep(interval if health.cluster_known else min(interval, UNKNOWN_INTERVAL))
