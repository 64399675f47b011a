"""``workers``: several proxy processes on one host, sharing its listening ports.

One proxy process runs one event loop on one core. With ``workers`` = N the command
becomes a supervisor of N worker processes, each a whole proxy started with the same
settings plus ``listen.reuse.port=true``. Every worker binds the bootstrap port with
``SO_REUSEPORT``, so the kernel spreads new bootstrap connections over them; node N's port
(port per broker) is listened on by worker N mod N_workers alone (``NodePlacement``), and
every worker advertises it. A client's connection to a node carries every request for the
partitions that node leads, so all the consumers of one partition reach one worker: the
broker reads each key-range batch once and one cache serves them all, as with one process.
What spreads over the cores is the nodes: a cluster of B brokers keeps min(B, N) workers
busy with its data (docs/proxy.md, Workers). A sidecar fronts one node, so ``workers`` = 0
starts one worker there.

This is correct for the same reason several proxy instances are (docs/high-availability.md):
the state more than one process serves lives in Kafka, never in one process's memory.

The supervisor keeps no client connection. It reserves the bootstrap port, and when the
settings leave the ports to the system (``listen.port=0``) the node ports after it, so that
every worker binds the same ones; serves ``metrics.port`` for the proxy as a whole
(``proxy.server.worker_metrics``: the workers' metrics added up, readiness while every
worker is ready), worker i serving its own on ``metrics.port + 1 + i``; restarts a worker
that exits on its own, with a backoff (its node ports refuse connections until it is back,
as a restarting broker's would); forwards SIGTERM, SIGINT and SIGHUP to every worker; and,
once every worker listens, writes the ready file with the ports and the workers' process ids.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from proxy.server.worker_metrics import WorkerView, serve

log = logging.getLogger("proxy.workers")

AUTO_LIMIT = 16  # workers=0 starts one per core, at most this many
HELD_NODE_PORTS = 16  # node ids 0-15 get a port held for them when the system picks the bootstrap port
RESTART_BACKOFF = (1.0, 30.0)  # seconds: first restart delay, longest
STEADY_SECONDS = 60.0  # a worker that ran this long restarts at the first delay again


def cpu_limit(cpu_max: str | None, quota_us: str | None = None, period_us: str | None = None) -> int | None:
    """The cores a cgroup's CPU quota amounts to, rounded up: from cgroup v2's ``cpu.max``
    ("200000 100000"; "max ..." is none), or else v1's ``cpu.cfs_quota_us`` (-1 is none) and
    ``cpu.cfs_period_us``. None without a quota."""
    try:
        if cpu_max is not None:
            quota, _, period = cpu_max.strip().partition(" ")
            if quota == "max":
                return None
            return max(1, -(-int(quota) // int(period or "100000")))
        if quota_us is not None and period_us is not None and int(quota_us) > 0:
            return max(1, -(-int(quota_us) // int(period_us)))
    except ValueError:
        pass
    return None


def usable_cpus() -> int | None:
    """The cores this process may run on: the CPUs its affinity allows (a cpuset), capped by
    its cgroup's CPU quota (a container's CPU limit). os.cpu_count() sees neither, and
    a container limited to one core on a 64-core node would start 16 workers."""
    try:
        cpus: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count()
    limit = cpu_limit(_read("/sys/fs/cgroup/cpu.max"), _read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
                      _read("/sys/fs/cgroup/cpu/cpu.cfs_period_us"))
    if limit is not None and cpus is not None:
        return min(cpus, limit)
    return limit or cpus


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def worker_count(setting: int, cpus: int | None, topology: str = "port-per-broker") -> int:
    """How many workers ``workers`` = ``setting`` means on a host with ``cpus`` cores: 0 is
    one per core up to ``AUTO_LIMIT``, except for a sidecar, whose one node one worker serves."""
    if setting > 0:
        return setting
    if topology == "sidecar":
        return 1
    return max(1, min(cpus or 1, AUTO_LIMIT))


def worker_overrides(index: int, listen_port: int, metrics_port: int) -> list[str]:
    """The settings worker ``index`` runs with on top of the supervisor's: the shared
    bootstrap port, and a metrics port of its own (the supervisor serves ``metrics.port``)."""
    overrides = [f"listen.port={listen_port}", "listen.reuse.port=true", "workers=1"]
    if metrics_port > 0:
        overrides.append(f"metrics.port={metrics_port + 1 + index}")
    return overrides


def next_delay(previous: float | None, ran_for: float) -> float:
    """The backoff before restarting a worker that exited after ``ran_for`` seconds."""
    first, longest = RESTART_BACKOFF
    if previous is None or ran_for >= STEADY_SECONDS:
        return first
    return min(longest, previous * 2)


def merge_ready(infos: Sequence[dict], metrics_port: int | None) -> dict:
    """One ready file for the supervisor from its workers': the bootstrap port, every node
    port some worker listens on, the supervisor's metrics port, and each worker's own."""
    first = infos[0]
    node_ports: dict[str, int] = {}
    for info in infos:
        node_ports.update(info["node_ports"])
    return {
        "pid": os.getpid(),
        "host": first["host"],
        "port": first["port"],
        "node_ports": dict(sorted(node_ports.items(), key=lambda item: int(item[0]))),
        "metrics_port": metrics_port,
        "workers": [{"pid": info["pid"], "node_ports": info["node_ports"], "metrics_port": info["metrics_port"]}
                    for info in infos],
    }


def reserve_block(host: str, nodes: int, attempts: int = 200) -> tuple[list[socket.socket], int]:
    """A free port P and P + 1 .. P + ``nodes``, each held as ``reserve_port`` holds one:
    with ``listen.port=0`` a worker's node N listens on P + 1 + N (``node.port.base`` 0
    means ``listen.port`` + 1), and a port the supervisor did not hold may be taken by then
    (any connection's ephemeral port), which stops the worker. Node ids from 0 to
    ``nodes`` - 1 are covered. P is drawn below the kernel's ephemeral range, where no
    outgoing connection takes a port: inside it, a host holding thousands of connections
    has few free runs of ports. Raises OSError when no such block is found."""
    low, high = 10000, _ephemeral_low() - nodes - 1
    last: OSError | None = None
    for attempt in range(attempts):
        held: list[socket.socket] = []
        try:
            first, port = reserve_port(host, random.randint(low, high) if high > low and attempt < attempts - 10 else 0)
            held.append(first)
            if port + nodes >= 65536:
                raise OSError(f"port {port} leaves no room for {nodes} node ports")
            for offset in range(1, nodes + 1):
                held.append(reserve_port(host, port + offset)[0])
            return held, port
        except OSError as exc:
            last = exc
            for sock in held:
                sock.close()
    raise OSError(f"no block of {nodes + 1} free ports on {host} after {attempts} attempts: {last}")


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; 32768 when unknown)."""
    text = _read("/proc/sys/net/ipv4/ip_local_port_range")
    try:
        return int(text.split()[0]) if text else 32768
    except ValueError:
        return 32768


def reserve_port(host: str, port: int) -> tuple[socket.socket, int]:
    """A socket bound (not listening) to ``host:port`` that the workers can bind beside:
    port 0 picks one; holding it keeps another program from taking it between two worker
    restarts. It is bound before ``SO_REUSEPORT`` is set, so the bind fails on a port any
    socket holds, even another proxy's that shares it (same user, ``SO_REUSEPORT``): two
    proxies must never split one port's connections. A bound socket that never listens
    receives no connection."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    except OSError:
        sock.close()
        raise
    return sock, sock.getsockname()[1]


@dataclass
class Worker:
    index: int
    command: list[str]
    ready_file: Path
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    delay: float | None = None
    restart_at: float | None = None
    info: dict = field(default_factory=dict)

    def start(self) -> None:
        self.ready_file.unlink(missing_ok=True)
        self.process = subprocess.Popen(self.command, preexec_fn=_die_with_parent)
        self.started_at = time.monotonic()
        self.restart_at = None
        log.info("worker started worker=%d pid=%d", self.index, self.process.pid)

    def read_ready(self) -> bool:
        if not self.info and self.ready_file.exists():
            self.info = json.loads(self.ready_file.read_text())
        return bool(self.info)


def _die_with_parent() -> None:
    """Workers end with the supervisor, whatever ends it (PR_SET_PDEATHSIG, Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Supervisor:
    """Starts the workers, keeps them running, forwards signals; see the module docstring."""

    def __init__(self, count: int, command: Sequence[str], host: str, port: int, metrics_port: int,
                 ready_file: str | None, rundir: Path, *, node_port_base: int = 0) -> None:
        """``command``: the proxy's command line as the supervisor was started (a worker's
        own options are added to it); ``port`` and ``node_port_base`` as configured (0: the
        system picks the port, and node N listens on it + 1 + N)."""
        try:
            if port == 0 and node_port_base == 0:
                self.reserved, self.port = reserve_block(host, HELD_NODE_PORTS)
            else:
                sock, self.port = reserve_port(host, port)
                self.reserved = [sock]
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self.ready_file = ready_file
        self.stopping = False
        self.workers = [
            Worker(index, [*command, *_as_options(worker_overrides(index, self.port, metrics_port)),
                           "--worker-index", str(index), "--worker-count", str(count),
                           "--ready-file", str(rundir / f"worker-{index}.json")],
                   rundir / f"worker-{index}.json")
            for index in range(count)
        ]
        self.view = WorkerView(host, count)
        try:
            self.endpoint = serve(self.view, host, metrics_port) if metrics_port >= 0 else None
        except OSError as exc:
            for sock in self.reserved:
                sock.close()
            raise OSError(f"cannot serve metrics on {host}:{metrics_port}: {exc.strerror or exc}") from None

    def run(self) -> int:
        received: list[int] = []
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda number, _frame: received.append(number))
        for worker in self.workers:
            worker.start()
        log.info("supervisor running workers=%d port=%d", len(self.workers), self.port)
        announced = False
        while True:
            while received:
                self._forward(received.pop(0))
            for worker in self.workers:
                if worker.read_ready():
                    self.view.started(worker.index, worker.info["metrics_port"])
            if not announced and all(worker.info for worker in self.workers):
                announced = True
                self._announce()
            if self.stopping and all(w.process is None or w.process.poll() is not None for w in self.workers):
                break
            self._reap()
            time.sleep(0.05)
        for sock in self.reserved:
            sock.close()
        if self.endpoint is not None:
            self.endpoint.shutdown()
            self.endpoint.server_close()
        log.info("supervisor stopped")
        return 0

    def _forward(self, signum: int) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            self.stopping = True
            log.info("signal received signal=%s; stopping workers", signal.Signals(signum).name)
        for worker in self.workers:
            if worker.process is not None and worker.process.poll() is None:
                worker.process.send_signal(signum)

    def _reap(self) -> None:
        now = time.monotonic()
        for worker in self.workers:
            if self.stopping or worker.process is None:
                continue
            code = worker.process.poll()
            if code is not None and worker.restart_at is None:
                worker.delay = next_delay(worker.delay, now - worker.started_at)
                worker.restart_at = now + worker.delay
                log.warning("worker exited worker=%d pid=%d code=%d; restarting in %.0f s", worker.index,
                            worker.process.pid, code, worker.delay)
            if worker.restart_at is not None and now >= worker.restart_at:
                worker.info = {}
                self.view.started(worker.index, None)
                self.view.restarts += 1
                worker.start()

    def _announce(self) -> None:
        log.info("workers listening port=%d pids=%s", self.port,
                 ",".join(str(worker.info["pid"]) for worker in self.workers))
        if self.ready_file:
            temporary = f"{self.ready_file}.tmp"
            with open(temporary, "w", encoding="utf-8") as file:
                json.dump(merge_ready([worker.info for worker in self.workers],
                                      self.endpoint.server_address[1] if self.endpoint else None), file)
            os.replace(temporary, self.ready_file)


def _as_options(overrides: Sequence[str]) -> list[str]:
    options: list[str] = []
    for override in overrides:
        options += ["--override", override]
    return options
