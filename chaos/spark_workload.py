"""The ``spark-stream`` workload: the Spark ``keyrange`` source as a stream with a checkpoint.

One Spark driver (``harness.spark_member``, local mode, task retries allowed) reads
the cell's topic through the proxy as 3 key-range shares per partition, a micro-batch
every 300 ms, and commits what its micro-batches processed for the cell's group (the
source's ``commit.group.id``), so the runner's check of the committed offsets applies.
Its ``foreachBatch`` works a few ms on each row and writes the event lines the other
workloads write, under the name of the driver (``driver-1``, then ``driver-2`` after a
restart, ...).

Two members a ``member-kill`` may pick:

- ``driver-<n>``: kill -9 of the whole driver (the Python driver, its JVM and the JVM's
  Python workers, each by PID); a new driver starts at once on the same checkpoint, as an
  orchestrator would restart it. The micro-batch in progress is run again by the new
  driver: its records are handed out again, their earlier holder the killed driver.
- ``task``: kill -9 of one of the JVM's Python workers, one running a task of the stream
  at that moment (connected to the proxy, or using CPU) if one is found within 15 s (while
  ``foreachBatch`` works on a large batch no task runs), else an idle one (the next task
  handed to it fails). Spark tries the task again (``local[2,4]``); the stream goes on, and
  ``foreachBatch`` sees the batch once. The kill is recorded in ``killed`` as
  ``task-busy-<pid>`` or ``task-idle-<pid>`` (nothing holds records under that name).

Registered only where PySpark and psutil are installed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from chaos.verdict import Handed, pair_events
from chaos.workloads import CellContext, Outcome, Workload, register, wait_for
from harness.group_member import Event, read_events

log = logging.getLogger("chaos")

_REPO = Path(__file__).resolve().parents[1]
START_DEADLINE = 240.0  # a driver's session, its warm-up read and the query's first (empty) batch
BUSY_SEARCH = 15.0  # seconds to look for a Python worker running a task before taking an idle one
SPLITS = 3
# Up to 6 ms of work per row in foreachBatch (3 on average): the driver is inside a
# micro-batch a good part of the time, so a driver kill may find one in progress.
WORK_MAX_MS = 6
TASK = "task"


class SparkStream(Workload):
    name = "spark-stream"
    description = ("the Spark keyrange source as a stream (local[2,4], 3 splits per partition, checkpoint, "
                   "foreachBatch every 300 ms); member kills: the driver (restart from the checkpoint) "
                   "or a Python worker running a task")
    keyed_order = True
    commits = True
    partitions = 2

    def __init__(self) -> None:
        self.ctx: CellContext | None = None
        self.serial = 0
        self.driver: str | None = None  # the current driver's name
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.killed: dict[str, float] = {}
        self.kills: list[str] = []  # what each kill_member did, for the log and the tests

    # -- paths ---------------------------------------------------------------------------
    def _path(self, name: str, suffix: str) -> Path:
        assert self.ctx is not None
        return self.ctx.tmp / f"{name}.{suffix}"

    def status(self, name: str) -> list[list[str]]:
        try:
            return [line.split() for line in self._path(name, "status").read_text().splitlines()]
        except FileNotFoundError:
            return []

    def ready(self, name: str) -> bool:
        return any(cells[:1] == ["ready"] for cells in self.status(name))

    def log_tail(self, name: str) -> str:
        return self._path(name, "log").read_text(errors="replace")[-3000:]

    # -- the driver ----------------------------------------------------------------------
    def _launch(self, warm_up: bool) -> str:
        assert self.ctx is not None
        self.serial += 1
        name = f"driver-{self.serial}"
        command = [sys.executable, "-m", "harness.spark_member", "--bootstrap", self.ctx.bootstrap,
                   "--group", self.ctx.group, "--topic", self.ctx.topic, "--name", name,
                   "--events", str(self._path(name, "events")), "--stop", str(self._path(name, "stop")),
                   "--status", str(self._path(name, "status")), "--checkpoint", str(self.ctx.tmp / "checkpoint"),
                   "--splits", str(SPLITS), "--master", "local[2,4]", "--trigger-ms", "300",
                   "--delay-max-ms", str(WORK_MAX_MS), "--seed", str(self.ctx.seed * 1000 + self.serial)]
        with open(self._path(name, "log"), "wb") as out:
            self.procs[name] = subprocess.Popen([*command, *(["--warm-up"] if warm_up else [])], cwd=_REPO,
                                                stdout=out, stderr=subprocess.STDOUT)
        self.driver = name
        return name

    def start(self, ctx: CellContext) -> None:
        self.ctx = ctx
        name = self._launch(warm_up=True)
        # Spark's start-up takes longer than the runner's warm-up on 2 busy cores: the query
        # runs, with a first (empty) micro-batch done, before the producer starts
        if not wait_for(lambda: self.ready(name), START_DEADLINE, interval=0.5, also=[self.check_running]):
            raise RuntimeError(f"{name} did not run its first micro-batch within {START_DEADLINE:g} s:\n"
                               f"{self.log_tail(name)}")

    def members(self) -> list[str]:
        """The driver, once its query runs, and ``task`` (a Python worker of it)."""
        name = self.driver
        if name is None or self.procs[name].poll() is not None or not self.ready(name):
            return []
        return [name, TASK]

    def kill_member(self, name: str) -> None:
        if name == TASK:
            self._kill_task()
        else:
            self._kill_driver(name)

    def _kill_driver(self, name: str) -> None:
        """kill -9 of the driver and every process under it, then a new driver on the checkpoint."""
        import psutil

        proc = self.procs[name]
        try:
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        for p in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGKILL)
        proc.wait(10)
        _, alive = psutil.wait_procs(tree[1:], timeout=10)
        if alive:
            raise RuntimeError(f"{name}'s processes {[p.pid for p in alive]} outlived SIGKILL")
        self.killed[name] = time.monotonic()
        replacement = self._launch(warm_up=False)
        self.kills.append(f"{name}: {len(tree)} processes killed, {replacement} started on the checkpoint")
        log.info("spark-stream: %s", self.kills[-1])

    def python_workers(self) -> list[int]:
        """The PIDs of the Python workers of the current driver's JVM that run tasks (the
        forks of its ``pyspark.daemon pyspark.worker``)."""
        import psutil

        if self.driver is None:
            return []
        try:
            below = psutil.Process(self.procs[self.driver].pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        workers = []
        for p in below:
            with contextlib.suppress(psutil.Error):
                parent = p.parent()
                if parent is not None and _task_daemon(p.cmdline()) and _task_daemon(parent.cmdline()):
                    workers.append(p.pid)
        return workers

    def _busy(self, pids: list[int], cpu: dict[int, float]) -> tuple[int, str] | None:
        """A worker running a task, and why it looks busy: it is connected to the proxy
        (reading a share), or it is on CPU now and used CPU since the last look (``cpu``:
        PID -> CPU seconds then, brought up to date here); an idle worker waits on its
        socket to the JVM."""
        import psutil

        assert self.ctx is not None
        ports = {int(address.rsplit(":", 1)[1]) for address in self.ctx.bootstrap.split(",")}
        found: tuple[int, str] | None = None
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                process = psutil.Process(pid)
                if found is None and any(conn.raddr and conn.raddr.port in ports
                                         and conn.status == psutil.CONN_ESTABLISHED
                                         for conn in process.net_connections(kind="tcp")):
                    found = (pid, "reading from the proxy")
                times = process.cpu_times()
                used = times.user + times.system
                if found is None and pid in cpu and used > cpu[pid] and process.status() == psutil.STATUS_RUNNING:
                    found = (pid, "on CPU")
                cpu[pid] = used
        return found

    def _kill_task(self) -> None:
        """kill -9 of a Python worker of the driver's JVM, one running a task if possible."""
        busy: tuple[int, str] | None = None
        cpu: dict[int, float] = {}
        deadline = time.monotonic() + BUSY_SEARCH
        while busy is None and time.monotonic() < deadline:
            busy = self._busy(self.python_workers(), cpu)
            if busy is None:
                time.sleep(0.02)  # the polling interval of the search, bounded by its deadline
        if busy is not None:
            (victim, why), how = busy, "busy"
        else:
            workers = self.python_workers()
            if not workers:
                self.kills.append("task: no Python worker to kill")
                log.info("spark-stream: %s", self.kills[-1])
                return
            victim, how, why = workers[0], "idle", f"none busy within {BUSY_SEARCH:g} s"
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
        self.killed[f"task-{how}-{victim}"] = time.monotonic()
        self.kills.append(f"task: killed the {how} Python worker {victim} of {self.driver} ({why})")
        log.info("spark-stream: %s", self.kills[-1])

    # -- progress and the end ------------------------------------------------------------
    def events(self) -> list[Event]:
        return read_events([str(self._path(name, "events")) for name in self.procs])

    def handed_count(self) -> int:
        return len({(e.partition, e.offset) for e in self.events() if e.kind == "H"})

    def check_running(self) -> None:
        for name, proc in self.procs.items():
            if name not in self.killed and proc.poll() not in (None, 0):
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")

    def finish(self, timeout: float) -> Outcome:
        notes: list[str] = []
        name = self.driver
        if name is not None and self.procs[name].poll() is None:
            self._path(name, "stop").touch()
            try:
                code = self.procs[name].wait(timeout)
            except subprocess.TimeoutExpired:
                notes.append(f"{name} did not stop within {timeout:g} s")
            else:
                if code != 0:
                    notes.append(f"{name} exited with {code}: {self.log_tail(name)[-500:]}")
        for driver in self.procs:  # what the kills did, as Spark saw it
            try:
                lines = self._path(driver, "log").read_text(errors="replace").splitlines()
            except FileNotFoundError:
                continue
            lost = [line for line in lines if "WARN TaskSetManager" in line and "Lost task" in line]
            if lost:
                log.info("spark-stream: %s lost %d task(s) and tried them again: %s", driver, len(lost),
                         "; ".join(line[:160] for line in lost[:3]))
        handed: list[Handed] = pair_events(
            (e.kind, e.member, e.partition, e.offset, None if e.key == "-" else bytes.fromhex(e.key), e.time)
            for e in self.events())
        return Outcome(handed, killed=dict(self.killed), notes=notes)

    def close(self) -> None:
        import psutil

        for proc in self.procs.values():
            if proc.poll() is not None:
                continue
            tree: list[psutil.Process] = []
            with contextlib.suppress(psutil.NoSuchProcess):
                tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            for p in tree:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.send_signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)  # before psutil waits for the rest: Popen keeps its own exit status
            psutil.wait_procs(tree[1:], timeout=10)


def _task_daemon(cmdline: list[str]) -> bool:
    """Whether a command line is ``python -m pyspark.daemon [pyspark.worker]``: the daemon
    that forks the workers running tasks (and, as forks keep it, those workers). The
    daemons of other worker modules (``pyspark.sql.worker.plan_data_source_read``, ...) run
    the data source's planning, and the streaming source's own runner is no daemon."""
    if "pyspark.daemon" not in cmdline:
        return False
    after = cmdline[cmdline.index("pyspark.daemon") + 1:]
    return not after or after[0] == "pyspark.worker"


if importlib.util.find_spec("pyspark") is not None and importlib.util.find_spec("psutil") is not None:
    register(SparkStream, SparkStream.name)
