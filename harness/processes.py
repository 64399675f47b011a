"""Children that die with this process, whichever thread starts them.

``proxy.local_kafka.spawn`` has the kernel SIGKILL a child when the *thread* that forked it
ends (PR_SET_PDEATHSIG): the demo forks from its main thread, but tests and benchmarks also
start children from worker threads (trio.to_thread, pools), and such a child would die when
its worker retires. ``spawn`` here forks every child on one daemon thread per process, which
lives as long as the process does.

``tree``, ``cpu_seconds``, ``rss_bytes`` and ``open_fds`` measure a process together with
every process under it: the proxy command of more than one worker is a supervisor that
holds no client connection, and the proxy's work, memory and sockets are in its workers.
"""

from __future__ import annotations

import concurrent.futures
import os
import queue
import subprocess
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from proxy import local_kafka

if TYPE_CHECKING:
    import psutil

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


# -- a process and its descendants, measured as one ------------------------------------------------
# psutil is imported where used: it comes with the benchmarks' dependencies, and the tests
# that spawn through this module do not install it.
_T = TypeVar("_T")


def tree(pid: int) -> list[psutil.Process]:
    """``pid`` and its descendants, each after its parent: a proxy of several workers is a
    supervisor with its workers (and anything they start) under it, and what the proxy costs
    is what all of them cost. Raises ``psutil.NoSuchProcess`` when ``pid`` is gone."""
    import psutil

    root = psutil.Process(pid)
    pids = _descendant_pids(pid)
    if pids is None:
        return [root, *root.children(recursive=True)]
    found = [root]
    for child in pids:
        try:
            found.append(psutil.Process(child))
        except psutil.NoSuchProcess:
            continue
    return found


def _descendant_pids(pid: int) -> list[int] | None:
    """From the tree's own ``/proc/<pid>/task/<tid>/children`` files, parents first; None where
    the kernel has none (then psutil's ``children``). psutil reads every process's stat file
    on the machine for one call, some milliseconds: too much for a sampler that reads a
    proxy's RSS every 20 ms on the cores the benchmark measures."""
    if not os.path.exists(f"/proc/{pid}/task/{pid}/children"):
        return None
    found: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop(0)
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except OSError:  # gone
            continue
        for thread in threads:
            try:
                with open(f"/proc/{parent}/task/{thread}/children") as file:
                    children = [int(word) for word in file.read().split()]
            except OSError:  # the thread ended
                continue
            found += children
            pending += children
    return found


def _over_tree(pid: int, read: Callable[[psutil.Process], _T]) -> list[_T]:
    """``read`` of each process of ``pid``'s tree. A descendant gone by the time it is read
    is left out (see ``user_system_seconds`` for why that loses no CPU); the root gone raises:
    a measurement of a proxy that is not running is a fault of the benchmark, not a zero."""
    import psutil

    root, *descendants = tree(pid)
    values = [read(root)]
    for process in descendants:
        try:
            values.append(read(process))
        except psutil.NoSuchProcess:  # ZombieProcess too: it holds no memory and no descriptor
            continue
    return values


def user_system_seconds(pids: Iterable[int]) -> tuple[float, float]:
    """User and system CPU seconds of every process in the tree of each of ``pids``, those
    of descendants that have exited included.

    A worker can exit and be restarted between two readings (the supervisor restarts one
    that dies), so counting only the living would make a difference of two readings lose
    the CPU of the one that left, or go negative. Each process is counted with its own
    times plus its reaped children's (``children_user``/``children_system``: the kernel adds
    a child's times, its own reaped children's included, to its parent when the parent
    reaps it): a descendant that has exited counts as it was last seen while it is a
    zombie, and in full through its parent once reaped, and the supervisor reaps its
    workers. Parents are read before their children, so a descendant reaped in between is
    missing from that one reading, never counted twice. Only a descendant that exits
    orphaned (reaped by init, outside the tree) is lost; the workers die with the
    supervisor. A pid that is gone raises ``psutil.NoSuchProcess``."""
    user = system = 0.0
    for pid in pids:
        for times in _over_tree(pid, lambda process: process.cpu_times()):
            user += times.user + times.children_user
            system += times.system + times.children_system
    return user, system


def cpu_seconds(pids: Iterable[int]) -> float:
    """User plus system CPU seconds of the trees of ``pids``, as ``user_system_seconds``
    counts them (the difference of two readings is what the proxy spent in between,
    however many workers it runs and whether one restarted)."""
    user, system = user_system_seconds(pids)
    return user + system


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid``'s tree, summed: a supervisor holds next to nothing, each
    worker its own connections and caches. Pages shared between the processes (the
    interpreter's and the libraries' code) count once per process, as they would for as many
    separate proxies; a slope over connections held is unaffected."""
    return sum(_over_tree(pid, lambda process: process.memory_info().rss))


def open_fds(pid: int) -> int:
    """Open file descriptors of ``pid``'s tree, summed: the client and broker sockets are
    the workers', not the supervisor's."""
    return sum(_over_tree(pid, lambda process: process.num_fds()))
