"""``harness.processes``: a process measured with everything under it, as a proxy of several
workers must be (its command is a supervisor; the work is in its children)."""

from __future__ import annotations

import select
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from harness import processes

psutil = pytest.importorskip("psutil")

# A parent that starts a busy child (at most 60 s, should everything else fail), prints its
# pid, and on each line read ends it and reaps it; it ends when its stdin closes.
PARENT = r"""
import subprocess, sys
busy = subprocess.Popen([sys.executable, "-c",
                         "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass"])
print(busy.pid, flush=True)
for _ in sys.stdin:
    busy.kill()
    busy.wait()
    print("reaped", flush=True)
busy.kill()
busy.wait()
"""


def _line(process: subprocess.Popen[str], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    assert process.stdout is not None
    while True:
        ready, _, _ = select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if ready:
            return process.stdout.readline().strip()
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no line from pid {process.pid} within {timeout} s")


def _own_cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


@pytest.fixture
def parent() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """The parent process and its busy child's pid; both killed by pid afterwards."""
    process = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    busy: int | None = None
    try:
        busy = int(_line(process, 30))
        yield process, busy
    finally:
        if busy is not None:
            try:
                child = psutil.Process(busy)
                if child.ppid() == process.pid:  # still ours, not a reused pid
                    child.kill()
            except psutil.NoSuchProcess:
                pass
        process.kill()
        process.wait(timeout=30)


def _burned(pid: int, seconds: float, timeout: float) -> float:
    """Until ``pid`` has used ``seconds`` of CPU (polled); what it has used then."""
    deadline = time.monotonic() + timeout
    while (used := _own_cpu(pid)) < seconds:
        if time.monotonic() > deadline:
            raise TimeoutError(f"pid {pid} used {used:.2f} s of CPU, not {seconds} s, within {timeout} s")
        time.sleep(0.05)
    return used


@pytest.mark.parametrize("walk", ["proc children files", "psutil"])
def test_the_tree_holds_the_process_and_its_child(parent, monkeypatch, walk):
    process, busy = parent
    if walk == "psutil":  # a kernel without /proc/<pid>/task/<tid>/children
        monkeypatch.setattr(processes, "_descendant_pids", lambda pid: None)
    assert [p.pid for p in processes.tree(process.pid)] == [process.pid, busy]


def test_cpu_seconds_count_a_grandchild_of_the_measured_process(parent):
    process, busy = parent
    busy_cpu = _burned(busy, 0.5, timeout=30)
    own = _own_cpu(process.pid)
    total = processes.cpu_seconds([process.pid])
    assert own < 0.5 <= busy_cpu  # what the parent alone would have reported misses most of it
    assert total >= own + busy_cpu

    # once the child has exited and been reaped, its CPU still counts (in the parent's
    # children's times), as a worker's does after it exited and the supervisor restarted it
    busy_cpu = _own_cpu(busy)
    assert process.stdin is not None
    process.stdin.write("reap\n")
    process.stdin.flush()
    assert _line(process, 30) == "reaped"
    assert [p.pid for p in processes.tree(process.pid)] == [process.pid]
    assert processes.cpu_seconds([process.pid]) >= busy_cpu
    user, system = processes.user_system_seconds([process.pid])
    assert user + system == pytest.approx(processes.cpu_seconds([process.pid]), abs=0.1)


def test_rss_and_descriptors_add_up_over_the_tree(parent):
    process, busy = parent
    _burned(busy, 0.05, timeout=30)  # running: its interpreter is in memory
    own_rss = psutil.Process(process.pid).memory_info().rss
    busy_rss = psutil.Process(busy).memory_info().rss
    total = processes.rss_bytes(process.pid)
    assert total > own_rss
    assert total == pytest.approx(own_rss + busy_rss, rel=0.2)
    assert processes.open_fds(process.pid) > psutil.Process(process.pid).num_fds()


def test_a_process_that_is_gone_raises():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait(timeout=30)
    with pytest.raises(psutil.NoSuchProcess):
        processes.cpu_seconds([process.pid])
