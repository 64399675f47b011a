"""The ``spark-stream`` chaos workload's kills and event reading, on stand-in processes.

A stand-in driver starts a stand-in ``python -m pyspark.daemon pyspark.worker`` (a Python
process with those words in its command line) that forks a busy worker (connected to a
loopback listener, as a worker reading a share through the proxy is, or spinning on CPU)
and an idle one; and a daemon of another worker module with a fork of its own, which a
task kill must leave alone. No
Spark runs here; the real thing is ``python -m chaos 'spark-stream:*'``.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

psutil = pytest.importorskip("psutil")

from chaos.spark_workload import SparkStream, _task_daemon  # noqa: E402
from chaos.workloads import CellContext, wait_for  # noqa: E402

# Each stand-in lives at most a minute (the test kills it long before).
_DAEMON = """
import os, socket, sys, time
if sys.argv[-1] == "cpu":
    if os.fork() == 0:  # a worker running a task: on CPU
        end = time.monotonic() + 60
        while time.monotonic() < end:
            pass
        os._exit(0)
elif sys.argv[-1] != "-":
    if os.fork() == 0:  # a worker running a task: connected to the proxy
        connection = socket.create_connection(("127.0.0.1", int(sys.argv[-1])))
        time.sleep(60)
        os._exit(0)
if os.fork() == 0:  # an idle worker
    time.sleep(60)
    os._exit(0)
time.sleep(60)
"""
_DRIVER = """
import subprocess, sys
daemon, port = sys.argv[1], sys.argv[2]
tasks = subprocess.Popen([sys.executable, "-c", daemon, "-m", "pyspark.daemon", "pyspark.worker", port])
planner = subprocess.Popen([sys.executable, "-c", daemon, "-m", "pyspark.daemon",
                            "pyspark.sql.worker.plan_data_source_read", "-"])
tasks.wait(60)
"""


@pytest.fixture
def proxy_port() -> Iterator[socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(30)
    yield listener
    listener.close()


@pytest.fixture
def workload(tmp_path: Path, proxy_port: socket.socket) -> Iterator[SparkStream]:
    port = proxy_port.getsockname()[1]
    ctx = CellContext(bootstrap=f"127.0.0.1:{port}", direct="127.0.0.1:9", topic="t", partitions=2, group="g",
                      tmp=tmp_path, seed=1)
    w = SparkStream()
    w.ctx = ctx
    w.serial = 1
    w.driver = "driver-1"
    w.procs["driver-1"] = subprocess.Popen([sys.executable, "-c", _DRIVER, _DAEMON, str(port)])
    try:
        yield w
    finally:
        w.close()


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_only_the_forks_of_the_task_daemon_are_task_workers():
    assert _task_daemon(["python", "-m", "pyspark.daemon", "pyspark.worker"])
    assert _task_daemon(["python", "-m", "pyspark.daemon"])  # the default worker module
    assert not _task_daemon(["python", "-m", "pyspark.daemon", "pyspark.sql.worker.lookup_data_sources"])
    assert not _task_daemon(["python", "-m", "pyspark.sql.streaming.python_streaming_source_runner"])


def test_members_appear_once_the_driver_is_ready(workload: SparkStream):
    assert workload.members() == []
    (workload.ctx.tmp / "driver-1.status").write_text("started 1.0\nbatch 0 0 2.0\nready 2.5\n")
    assert workload.members() == ["driver-1", "task"]


def test_a_task_kill_takes_the_worker_reading_from_the_proxy(workload: SparkStream, proxy_port: socket.socket):
    connection, _ = proxy_port.accept()
    with connection:
        assert wait_for(lambda: len(workload.python_workers()) == 2, 30, interval=0.05)
        workers = set(workload.python_workers())
        planner_forks = {p.pid for p in psutil.Process(workload.procs["driver-1"].pid).children(recursive=True)
                         } - workers
        workload.kill_member("task")
        (killed,) = workload.killed
        how, pid = killed.split("-")[1], int(killed.split("-")[2])
        assert how == "busy" and pid in workers and workload.kills[0].endswith("(reading from the proxy)")
        connection.settimeout(30)
        assert connection.recv(1) == b""  # the killed worker held the connection
        assert wait_for(lambda: _gone(pid), 10, interval=0.05)
        assert not any(_gone(other) for other in (workers | planner_forks) - {pid})


def test_a_task_kill_takes_a_worker_on_cpu(tmp_path: Path):
    w = SparkStream()
    w.ctx = CellContext(bootstrap="127.0.0.1:9", direct="127.0.0.1:9", topic="t", partitions=2, group="g",
                        tmp=tmp_path, seed=1)
    w.driver = "driver-1"
    w.procs["driver-1"] = subprocess.Popen([sys.executable, "-c", _DRIVER, _DAEMON, "cpu"])
    try:
        assert wait_for(lambda: len(w.python_workers()) == 2, 30, interval=0.05)
        w.kill_member("task")
        (killed,) = w.killed
        assert killed.startswith("task-busy-") and w.kills[0].endswith("(on CPU)")
        pid = int(killed.split("-")[2])
        assert wait_for(lambda: _gone(pid), 10, interval=0.05)
        assert len([p for p in w.python_workers() if not _gone(p)]) == 1  # the idle one lives
    finally:
        w.close()


def test_a_task_kill_takes_an_idle_worker_when_none_is_busy(workload: SparkStream, proxy_port: socket.socket,
                                                           monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr("chaos.spark_workload.BUSY_SEARCH", 0.2)
    proxy_port.accept()[0].close()
    assert wait_for(lambda: len(workload.python_workers()) == 2, 30, interval=0.05)
    monkeypatch.setattr(workload, "_busy", lambda pids, cpu: None)
    workload.kill_member("task")
    (killed,) = workload.killed
    assert killed.startswith("task-idle-")


def test_a_driver_kill_takes_the_whole_tree_and_starts_a_replacement(workload: SparkStream,
                                                                    proxy_port: socket.socket,
                                                                    monkeypatch: pytest.MonkeyPatch):
    proxy_port.accept()[0].close()
    root = psutil.Process(workload.procs["driver-1"].pid)
    assert wait_for(lambda: len(root.children(recursive=True)) == 5, 30, interval=0.05)
    tree = [root, *root.children(recursive=True)]
    launched: list[bool] = []

    def launch(warm_up: bool) -> str:
        launched.append(warm_up)
        return "driver-2"

    monkeypatch.setattr(workload, "_launch", launch)
    workload.kill_member("driver-1")
    assert launched == [False] and set(workload.killed) == {"driver-1"}
    assert all(_gone(p.pid) for p in tree)


def test_finish_reads_every_drivers_events(tmp_path: Path):
    w = SparkStream()
    w.ctx = CellContext(bootstrap="127.0.0.1:9", direct="127.0.0.1:9", topic="t", partitions=2, group="g",
                        tmp=tmp_path, seed=1)
    for name in ("driver-1", "driver-2"):
        w.procs[name] = subprocess.Popen([sys.executable, "-c", ""])
        w.procs[name].wait(30)
    w.killed["driver-1"] = 5.0
    (tmp_path / "driver-1.events").write_text("H driver-1 0 0 6b31 1.0\nH driver-1 0 1 - 1.0\n"
                                              "F driver-1 0 0 6b31 1.1\nF driver-1 0 1 - 1.2\n")
    (tmp_path / "driver-2.events").write_text("H driver-2 0 1 - 9.0\nF driver-2 0 1 - 9.5\n")
    outcome = w.finish(1)
    assert sorted((h.member, h.offset, h.key, h.time, h.finished) for h in outcome.handed) == [
        ("driver-1", 0, b"k1", 1.0, 1.1), ("driver-1", 1, None, 1.0, 1.2), ("driver-2", 1, None, 9.0, 9.5)]
    assert outcome.killed == {"driver-1": 5.0} and not outcome.notes


def test_the_workload_registers_where_spark_is_installed():
    pytest.importorskip("pyspark")
    from chaos.workloads import WORKLOADS

    assert WORKLOADS["spark-stream"] is SparkStream


def test_close_kills_what_still_runs(tmp_path: Path):
    w = SparkStream()
    w.procs["driver-1"] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    w.close()
    assert w.procs["driver-1"].returncode == -signal.SIGKILL
