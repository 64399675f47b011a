"""Children that die with this process, whichever thread starts them.

``proxy.local_kafka.spawn`` has the kernel SIGKILL a child when the *thread* that forked it
ends (PR_SET_PDEATHSIG): the demo forks from its main thread, but tests and benchmarks also
start children from worker threads (trio.to_thread, pools), and such a child would die when
its worker retires. ``spawn`` here forks every child on one daemon thread per process, which
lives as long as the process does.
"""

from __future__ import annotations

import concurrent.futures
import os
import queue
import subprocess
import threading
from collections.abc import Sequence
from typing import Any

from proxy import local_kafka

_requests: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Sequence[str], dict[str, Any]]] = (
    queue.SimpleQueue())
_spawner_of = [0]  # the process whose spawner thread runs: a forked child has none of its own
_lock = threading.Lock()


def _spawner() -> None:
    while True:
        reply, cmd, kwargs = _requests.get()
        try:
            reply.set_result(local_kafka.spawn(cmd, **kwargs))
        except BaseException as exc:  # handed back to the caller
            reply.set_exception(exc)


def spawn(cmd: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """``proxy.local_kafka.spawn`` on the long-lived spawner thread: ``cmd`` in its own session,
    to be SIGKILLed if this process dies."""
    with _lock:
        if _spawner_of[0] != os.getpid():
            threading.Thread(target=_spawner, name="harness-spawner", daemon=True).start()
            _spawner_of[0] = os.getpid()
    reply: concurrent.futures.Future[subprocess.Popen[Any]] = concurrent.futures.Future()
    _requests.put((reply, cmd, kwargs))
    return reply.result()
