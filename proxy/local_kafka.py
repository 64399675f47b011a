"""A local Apache Kafka with the proxy in front of it, for trying the product.

``make demo`` (``proxy/demo.py``) and the Spark pipeline example (``proxy/spark/pipeline.py``)
start a one-node Kafka on this machine and ``keyrange-proxy`` in front of it with this
module, and ``proxy/spark/session.py`` finds Spark's Kafka connector here. It is for trying
the product, not for production: a deployment runs the proxy in front of its own cluster
(``keyrange-proxy --bootstrap-server``, README.md).

- **Jars.** Kafka comes from Maven Central through ``kafka-dist/pom.xml`` (Spark's Kafka
  connector through ``kafka-dist/spark-connector.pom.xml``) into a cache outside the
  repository, ``${KEYRANGE_CACHE:-~/.cache/keyrange-proxy}/kafka-<version>/libs``; once a
  stamp file there says they are complete, Maven is not run again, so later runs work
  offline. ``kafka-dist/`` belongs to a checkout, not to the installed package: run from a
  checkout (``pip install -e``) or set ``KEYRANGE_KAFKA_DIST``.
- **The broker** (``LocalKafka``). One JVM, ``java -cp '<libs>/*' kafka.Kafka
  server.properties``, in the combined broker+controller (KRaft) role, listening on free
  loopback ports, in its own directory with its log in ``node-1/server.log``.
- **The proxy** (``ProxyProcess``). ``keyrange-proxy`` as a process of its own, as in
  production, so clients that block and the proxy never share an event loop or a GIL.

Every child is killed with its parent (PR_SET_PDEATHSIG), the broker also on interpreter
exit (atexit), and ``close()``/``stop()`` stop them by PID, so nothing outlives its run.

    with LocalKafka.start() as kafka, ProxyProcess.start(kafka.bootstrap_servers) as proxy:
        print(proxy.bootstrap_servers)

Command line: ``python -m proxy.local_kafka fetch-jars`` fills the cache (``make jars``).

Standard library only; nothing else of ``proxy`` is imported.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import queue
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Self

__all__ = [
    "KafkaNode",
    "KafkaNodeError",
    "KafkaNodes",
    "LocalKafka",
    "LocalKafkaError",
    "ProxyProcess",
    "ProxyStartError",
    "cache_root",
    "fetch_jars",
    "fetch_spark_jars",
    "find_java",
    "free_port",
    "java_base_command",
    "kafka_dist_dir",
    "kafka_version",
    "libs_dir",
    "metadata_brokers",
    "scratch_dir",
    "spark_libs_dir",
    "spark_version",
    "spawn",
    "terminate",
]

HOST = "127.0.0.1"
CLIENT_LISTENER = "PLAINTEXT"
CONTROLLER_LISTENER = "CONTROLLER"
STAMP_NAME = ".complete"
DEFAULT_JVM_OPTIONS = (
    "-Xms256m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
# Ports are picked below the kernel's ephemeral range (32768-60999 by default) so that an
# outgoing connection cannot take a stopped node's port before that node is restarted.
_PORT_RANGE = (20000, 32000)


class LocalKafkaError(RuntimeError):
    """The local Kafka cannot do what was asked; ``str()`` is one sentence to show as is."""


class KafkaNodeError(LocalKafkaError):
    """A Kafka node failed; the message ends with the tail of that node's log."""


# --------------------------------------------------------------------------------------
# Jars


def kafka_dist_dir() -> Path:
    """The directory holding pom.xml and the log4j2 configuration files."""
    env = os.environ.get("KEYRANGE_KAFKA_DIST")
    path = Path(env) if env else Path(__file__).resolve().parents[1] / "kafka-dist"
    if not (path / "pom.xml").is_file():
        raise LocalKafkaError(
            f"The Kafka distribution description {path / 'pom.xml'} is missing; run from a "
            "checkout of keyrange-proxy (pip install -e) or set KEYRANGE_KAFKA_DIST."
        )
    return path


def _pom_path() -> Path:
    return kafka_dist_dir() / "pom.xml"


def kafka_version() -> str:
    """The Kafka version pinned by the ``kafka.version`` property of kafka-dist/pom.xml."""
    text = _pom_path().read_text(encoding="utf-8")
    match = re.search(r"<kafka\.version>\s*([^<\s]+)\s*</kafka\.version>", text)
    if not match:
        raise LocalKafkaError(f"{_pom_path()} has no <kafka.version> property.")
    return match.group(1)


def cache_root() -> Path:
    """``$KEYRANGE_CACHE``, or ``~/.cache/keyrange-proxy``."""
    env = os.environ.get("KEYRANGE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "keyrange-proxy"


def libs_dir(cache_dir: Path | None = None) -> Path:
    """Where the jars of the pinned Kafka version live (whether fetched yet or not)."""
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    return root / f"kafka-{kafka_version()}" / "libs"


def _pom_digest(pom: Path | None = None) -> str:
    return hashlib.sha256((pom or _pom_path()).read_bytes()).hexdigest()


def spark_pom_path() -> Path:
    """The pom naming the four jars of Spark's Kafka connector (``spark.version`` pins it)."""
    return kafka_dist_dir() / "spark-connector.pom.xml"


def spark_version() -> str:
    """The Spark version pinned by ``spark.version`` in kafka-dist/spark-connector.pom.xml."""
    text = spark_pom_path().read_text(encoding="utf-8")
    match = re.search(r"<spark\.version>\s*([^<\s]+)\s*</spark\.version>", text)
    if not match:
        raise LocalKafkaError(f"{spark_pom_path()} has no <spark.version> property.")
    return match.group(1)


def spark_libs_dir(cache_dir: Path | None = None) -> Path:
    """Where the Spark Kafka connector jars live (whether fetched yet or not)."""
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    return root / f"spark-{spark_version()}" / "libs"


def _jars_complete(libs: Path, pom: Path | None = None) -> bool:
    try:
        stamp = json.loads((libs / STAMP_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if stamp.get("pom_sha256") != _pom_digest(pom):
        return False
    jars = stamp.get("jars") or []
    return bool(jars) and all((libs / name).is_file() for name in jars)


# Named in full so that Maven resolves exactly this plugin (and, offline, says which
# download failed instead of "No plugin found for prefix 'dependency'").
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

_NETWORK_ERROR = re.compile(
    r"Connection refused|UnknownHost|Unknown host|Connect to \S+ failed|connect timed out|"
    r"Network is unreachable|No route to host|Could not transfer|transfer failed|"
    r"Temporary failure in name resolution|Name or service not known|SSLHandshake|"
    r"Remote host terminated|Connection reset|Read timed out|PKIX path",
    re.IGNORECASE,
)


def fetch_jars(
    cache_dir: Path | None = None,
    *,
    maven_settings: Path | None = None,
    verbose: bool = False,
    timeout: float = 1800.0,
) -> Path:
    """Make sure the jars of the pinned Kafka version are in the cache; return their directory.

    Maven runs only when the stamp file is missing or stale (kafka-dist/pom.xml changed).  It
    downloads into a private local repository inside the cache (``<cache>/m2``) and copies
    the jars into a fresh directory that replaces ``libs`` only once complete, so an
    interrupted download never looks complete.  ``maven_settings`` (or
    ``$KEYRANGE_MAVEN_SETTINGS``) is passed to Maven as ``-s``, e.g. for a mirror.
    """
    return _maven_fetch(_pom_path(), libs_dir(cache_dir), f"Kafka {kafka_version()}",
                        maven_settings=maven_settings, verbose=verbose, timeout=timeout)


def fetch_spark_jars(
    cache_dir: Path | None = None,
    *,
    maven_settings: Path | None = None,
    verbose: bool = False,
    timeout: float = 1800.0,
) -> Path:
    """Like ``fetch_jars``, for the Spark Kafka connector jars (handed to Spark with
    ``spark.jars``; never on the brokers' classpath, whose kafka-clients differs)."""
    return _maven_fetch(spark_pom_path(), spark_libs_dir(cache_dir), f"Spark {spark_version()} Kafka connector",
                        maven_settings=maven_settings, verbose=verbose, timeout=timeout)


def _maven_fetch(pom: Path, libs: Path, label: str, *, maven_settings: Path | None, verbose: bool,
                 timeout: float) -> Path:
    if _jars_complete(libs, pom):
        return libs
    version_dir = libs.parent
    try:
        version_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LocalKafkaError(
            f"Cannot create the Kafka jar cache {version_dir} ({exc.strerror}); "
            "set KEYRANGE_CACHE to a writable directory."
        ) from None
    with open(version_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be fetching the same jars
        if _jars_complete(libs, pom):
            return libs
        mvn = shutil.which("mvn")
        if mvn is None:
            raise LocalKafkaError(
                f"Maven (mvn) is not installed and the {label} jars are not "
                f"cached in {libs}: install maven (apt-get install maven)."
            )
        settings = maven_settings or os.environ.get("KEYRANGE_MAVEN_SETTINGS")
        staging = Path(tempfile.mkdtemp(prefix="libs.partial-", dir=version_dir))
        cmd = [mvn, "-B", "-Dstyle.color=never", "-f", str(pom)]
        if not verbose:
            cmd.append("-q")
        if settings:
            cmd += ["-s", str(settings)]
        cmd += [
            f"-Dmaven.repo.local={version_dir.parent / 'm2'}",
            f"{_DEPENDENCY_PLUGIN}:copy-dependencies",
            f"-DoutputDirectory={staging}",
        ]
        log_path = version_dir / "maven.log"
        if verbose:
            print(f"fetching {label} jars into {libs}", file=sys.stderr)
        try:
            proc = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            shutil.rmtree(staging, ignore_errors=True)
            raise LocalKafkaError(
                f"Maven did not finish fetching the {label} jars within {timeout:.0f} s, so "
                f"Maven Central is probably unreachable and {libs} stays empty."
            ) from None
        log_path.write_text(proc.stdout, encoding="utf-8")
        if verbose and proc.stdout:
            sys.stderr.write(proc.stdout)
        jars = sorted(p.name for p in staging.glob("*.jar"))
        if proc.returncode != 0 or not jars:
            shutil.rmtree(staging, ignore_errors=True)
            if _NETWORK_ERROR.search(proc.stdout):
                raise LocalKafkaError(
                    f"Cannot download the {label} jars because Maven Central "
                    f"is unreachable and the cache {libs} is empty (Maven's output is in "
                    f"{log_path})."
                )
            raise LocalKafkaError(
                f"Maven failed to fetch the {label} jars into {libs} "
                f"(exit code {proc.returncode}; its output is in {log_path})."
            )
        stamp = {"pom_sha256": _pom_digest(pom), "what": label, "jars": jars}
        (staging / STAMP_NAME).write_text(json.dumps(stamp, indent=1), encoding="utf-8")
        if libs.exists():
            shutil.rmtree(libs)
        staging.rename(libs)
        return libs


def find_java() -> str:
    """The ``java`` executable on PATH."""
    java = shutil.which("java")
    if java is None:
        raise LocalKafkaError(
            "Java is not installed (no java on PATH): install openjdk-17-jre-headless "
            "(apt-get install openjdk-17-jre-headless)."
        )
    return java


def java_base_command(
    *,
    log4j_config: str = "log4j2.properties",
    jvm_options: Sequence[str] = DEFAULT_JVM_OPTIONS,
    cache_dir: Path | None = None,
) -> list[str]:
    """``java <options> -cp '<libs>/*'``, ready for a main class and its arguments.

    Fetches the jars first if they are not cached.
    """
    java = find_java()
    libs = fetch_jars(cache_dir)
    return [
        java,
        *jvm_options,
        f"-Dlog4j2.configurationFile={kafka_dist_dir() / log4j_config}",
        f"-Dkeyrange.local.kafka.parent={os.getpid()}",
        "-cp",
        f"{libs}/*",
    ]


# --------------------------------------------------------------------------------------
# Child processes that die with us

_PR_SET_PDEATHSIG = 1
try:
    _libc: Any = ctypes.CDLL(None, use_errno=True)
    _prctl = _libc.prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def _die_with_parent(parent_pid: int) -> None:
    """preexec_fn: ask the kernel to SIGKILL the child when the spawning thread dies."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


class _Spawner:
    """Runs Popen on one long-lived daemon thread.

    PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the process.
    Spawning from a worker thread (trio.to_thread, a thread pool) would kill the broker when
    that worker retires, so every child is forked by this thread, which lives as long as
    the process does.
    """

    def __init__(self) -> None:
        self._requests: queue.Queue[tuple[tuple[Any, ...], dict[str, Any], queue.Queue[Any]]] = (
            queue.Queue()
        )
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, *args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="local-kafka-spawner", daemon=True
                )
                self._thread.start()
        reply: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._requests.put((args, kwargs, reply))
        ok, value = reply.get()
        if not ok:
            raise value
        return value

    def _run(self) -> None:
        while True:
            args, kwargs, reply = self._requests.get()
            try:
                reply.put((True, subprocess.Popen(*args, **kwargs)))
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                reply.put((False, exc))


_spawner = _Spawner()


def spawn(cmd: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """Start ``cmd`` in its own session, to be SIGKILLed if this process dies."""
    parent = os.getpid()
    return _spawner.popen(
        list(cmd),
        preexec_fn=lambda: _die_with_parent(parent),
        start_new_session=True,
        **kwargs,
    )


def terminate(process: subprocess.Popen[Any], timeout: float) -> int:
    """SIGTERM ``process`` (it may drain), SIGKILL it past ``timeout``; its exit code."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def scratch_dir(prefix: str) -> Path:
    """A new directory under the system's temporary directory, removed at exit.

    A run of Kafka writes its logs there (gigabytes, for a benchmark); left behind, a few
    runs fill a disk. ``KEYRANGE_KEEP_WORKDIR=1`` keeps it for inspection (its path is
    printed).
    """
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if os.environ.get("KEYRANGE_KEEP_WORKDIR"):
        print(f"working directory kept: {path}", file=sys.stderr, flush=True)
    else:
        atexit.register(shutil.rmtree, path, True)
    return path


# --------------------------------------------------------------------------------------
# Ports and the readiness probe

_ports_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, never handed out twice by this process."""
    for _ in range(200):
        port = random.randrange(*_PORT_RANGE)
        if port in _ports_handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
        _ports_handed_out.add(port)
        return port
    raise LocalKafkaError(f"No free TCP port found on {HOST} in {_PORT_RANGE}.")


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    return bytes(buf)


def metadata_brokers(host: str, port: int, timeout: float = 2.0) -> tuple[dict[int, tuple[str, int]], int]:
    """Ask one broker for Metadata v1 with no topics; return ({node_id: (host, port)}, controller_id).

    A raw request on a plain socket, so it needs no client library and sees exactly what the
    broker says.  Raises OSError (or ConnectionError) when the broker does not answer.
    """
    client_id = b"keyrange-local-kafka"
    correlation_id = 1
    body = (
        struct.pack(">hhih", 3, 1, correlation_id, len(client_id))
        + client_id
        + struct.pack(">i", 0)  # topics: empty array = none (null would mean all)
    )
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(struct.pack(">i", len(body)) + body)
        (size,) = struct.unpack(">i", _recv_exact(sock, 4))
        data = _recv_exact(sock, size)
    pos = 0

    def take(fmt: str) -> Any:
        nonlocal pos
        values = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return values[0]

    def take_string() -> str | None:
        nonlocal pos
        length = take(">h")
        if length < 0:
            return None
        value = data[pos : pos + length].decode()
        pos += length
        return value

    if take(">i") != correlation_id:
        raise ConnectionError("unexpected correlation id in Metadata response")
    brokers: dict[int, tuple[str, int]] = {}
    for _ in range(take(">i")):
        node_id = take(">i")
        broker_host = take_string() or ""
        broker_port = take(">i")
        take_string()  # rack
        brokers[node_id] = (broker_host, broker_port)
    controller_id = take(">i")
    return brokers, controller_id


# --------------------------------------------------------------------------------------
# Nodes


@dataclass(eq=False)
class KafkaNode:
    """One KRaft node (broker and controller in one JVM)."""

    node_id: int
    host: str
    port: int
    controller_port: int
    workdir: Path
    listener_ports: dict[str, int] = field(default_factory=dict)
    """Port of every client-facing listener by name: PLAINTEXT and any extra ones."""
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _log_file: IO[bytes] | None = field(default=None, repr=False)
    _expected_running: bool = field(default=False, repr=False)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def log_path(self) -> Path:
        return self.workdir / "server.log"

    @property
    def config_path(self) -> Path:
        return self.workdir / "server.properties"

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


_live: set[KafkaNodes] = set()
_live_lock = threading.Lock()


def _close_all_at_exit() -> None:
    with _live_lock:
        running = list(_live)
    for nodes in running:
        with contextlib.suppress(Exception):
            nodes.close(timeout=5.0)


atexit.register(_close_all_at_exit)


class KafkaNodes:
    """KRaft nodes started by this process: each one JVM in the combined role (``process.roles
    = broker,controller``), together a static quorum (``controller.quorum.voters``).

    ``LocalKafka`` is one of them; a subclass with more says how to start them in a
    classmethod that calls ``_start``.
    """

    jvm_options: Sequence[str] = DEFAULT_JVM_OPTIONS
    format_args: Sequence[str] = ()
    """Appended to ``StorageTool format`` (e.g. ``--add-scram``, ``--feature``)."""

    def __init__(
        self,
        nodes: int,
        workdir: Path | None = None,
        broker_properties: Mapping[str, str] | None = None,
        *,
        cache_dir: Path | None = None,
    ) -> None:
        if nodes < 1:
            raise LocalKafkaError("A Kafka cluster needs at least one node.")
        self._owns_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else Path(
            tempfile.mkdtemp(prefix="keyrange-kafka-")
        )
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.broker_properties = dict(broker_properties or {})
        self.cache_dir = cache_dir
        # As Kafka's Uuid.randomUuid: never an id starting with "-", which the storage
        # tool's argument parser would take for an option (1 start in 64 failed so).
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        self.cluster_id = "A" + cluster_id[1:] if cluster_id.startswith("-") else cluster_id
        self.nodes: list[KafkaNode] = []
        for node_id in range(1, nodes + 1):
            node = KafkaNode(node_id=node_id, host=HOST, port=free_port(), controller_port=free_port(),
                             workdir=self.workdir / f"node-{node_id}")
            node.listener_ports[CLIENT_LISTENER] = node.port
            self.nodes.append(node)
        self._closed = False
        self._java_cmd: list[str] | None = None
        self.start_seconds: float | None = None

    @classmethod
    def _start(cls, make: Callable[[], Self], timeout: float) -> Self:
        """``make()`` a cluster, format and start every node and wait until all are ready;
        on a port another process took meanwhile, start over on new ports (three tries). On
        any failure, whatever was started is stopped before the error propagates."""
        for attempt in range(1, 4):
            cluster = make()
            try:
                began = time.monotonic()
                cluster._format_all(timeout)
                for node in cluster.nodes:
                    cluster._launch(node)
                cluster.wait_ready(timeout)
                cluster.start_seconds = time.monotonic() - began
                return cluster
            except KafkaNodeError:
                # Another process may have taken a port between our probe and the JVM's
                # bind: start over on new ports (the node directories are ours to wipe).
                clash = cluster._port_clash()
                cluster.close(timeout=5.0)
                if attempt == 3 or not clash:
                    raise
                for node in cluster.nodes:
                    shutil.rmtree(node.workdir, ignore_errors=True)
            except BaseException:
                cluster.close(timeout=5.0)
                raise
        raise AssertionError("unreachable")

    def _port_clash(self) -> bool:
        for node in self.nodes:
            with contextlib.suppress(OSError):
                if "Address already in use" in node.log_path.read_text(errors="replace"):
                    return True
        return False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:p1,127.0.0.1:p2,...`` of the PLAINTEXT listeners of all nodes."""
        return ",".join(f"{n.host}:{n.port}" for n in self.nodes)

    @property
    def running_nodes(self) -> list[KafkaNode]:
        return [n for n in self.nodes if n.is_running]

    # -- configuration -----------------------------------------------------------------

    def _client_listeners(self, node: KafkaNode) -> list[tuple[str, str, int, int]]:
        """(name, security protocol, port, advertised port) of every client listener."""
        return [(CLIENT_LISTENER, "PLAINTEXT", node.port, node.port)]

    def _properties(self, node: KafkaNode) -> dict[str, str]:
        n = len(self.nodes)
        replication = str(min(3, n))
        min_isr = str(min(2, n))
        voters = ",".join(f"{m.node_id}@{m.host}:{m.controller_port}" for m in self.nodes)
        clients = self._client_listeners(node)
        listeners = [f"{name}://{node.host}:{port}" for name, _, port, _ in clients]
        listeners.append(f"{CONTROLLER_LISTENER}://{node.host}:{node.controller_port}")
        advertised = [f"{name}://{node.host}:{port}" for name, _, _, port in clients]
        protocols = [f"{name}:{protocol}" for name, protocol, _, _ in clients] + [f"{CONTROLLER_LISTENER}:PLAINTEXT"]
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "controller.listener.names": CONTROLLER_LISTENER,
            "listeners": ",".join(listeners),
            "advertised.listeners": ",".join(advertised),
            "inter.broker.listener.name": CLIENT_LISTENER,
            "listener.security.protocol.map": ",".join(protocols),
            "log.dirs": str(node.data_dir),
            "metadata.log.dir": str(node.data_dir),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "auto.create.topics.enable": "true",
            "offsets.topic.replication.factor": replication,
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": replication,
            "transaction.state.log.min.isr": min_isr,
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": replication,
            "share.coordinator.state.topic.min.isr": min_isr,
            "share.coordinator.state.topic.num.partitions": "4",
            "group.initial.rebalance.delay.ms": "0",
            "num.network.threads": "2",
            "num.io.threads": "4",
            "num.recovery.threads.per.data.dir": "1",
            "background.threads": "4",
            "log.retention.check.interval.ms": "300000",
            "log.cleaner.threads": "1",
            "log.cleaner.dedupe.buffer.size": "16777216",
            "socket.request.max.bytes": "104857600",
            # Fail over quickly when a node is stopped or killed.
            "broker.session.timeout.ms": "6000",
            "broker.heartbeat.interval.ms": "1000",
            "controller.quorum.election.timeout.ms": "1000",
            "controller.quorum.fetch.timeout.ms": "2000",
            "controlled.shutdown.enable": "true",
        }
        props.update(self.broker_properties)
        return props

    def _write_config(self, node: KafkaNode) -> None:
        node.workdir.mkdir(parents=True, exist_ok=True)
        lines = ["# written by proxy.local_kafka"]
        lines += [f"{k}={v}" for k, v in self._properties(node).items()]
        node.config_path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def _java(self) -> list[str]:
        if self._java_cmd is None:
            self._java_cmd = java_base_command(jvm_options=self.jvm_options, cache_dir=self.cache_dir)
        return self._java_cmd

    # -- starting and stopping ---------------------------------------------------------

    def _format_all(self, timeout: float) -> None:
        """Run ``StorageTool format`` for every node, in parallel (each is a JVM start)."""
        java = self._java()
        running: list[tuple[KafkaNode, subprocess.Popen[bytes], IO[bytes]]] = []
        try:
            for node in self.nodes:
                self._write_config(node)
                out: IO[bytes] = open(node.workdir / "format.log", "wb")
                cmd = [*java, "kafka.tools.StorageTool", "format", "-t", self.cluster_id,
                       "-c", str(node.config_path), "--ignore-formatted", *self.format_args]
                proc = spawn(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
                running.append((node, proc, out))
            deadline = time.monotonic() + timeout
            for node, proc, _ in running:
                try:
                    code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise KafkaNodeError(
                        f"Formatting the storage of Kafka node {node.node_id} took longer than "
                        f"{timeout:.0f} s.\n"
                    ) from None
                if code != 0:
                    log = (node.workdir / "format.log").read_text(errors="replace")
                    raise KafkaNodeError(
                        f"Formatting the storage of Kafka node {node.node_id} failed with exit "
                        f"code {code}.\n{log[-3000:]}"
                    )
        finally:
            for _, proc, out in running:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                out.close()

    def _launch(self, node: KafkaNode) -> None:
        if node.is_running:
            return
        if self._closed:
            raise LocalKafkaError("This Kafka cluster has been closed.")
        self._write_config(node)  # broker_properties may have been changed in between
        cmd = [*self._java(), f"-Dkafka.logs.dir={node.workdir}", "kafka.Kafka", str(node.config_path)]
        node._log_file = open(node.log_path, "ab")
        node.process = spawn(cmd, stdin=subprocess.DEVNULL, stdout=node._log_file, stderr=subprocess.STDOUT, cwd=node.workdir)
        node._expected_running = True
        with _live_lock:
            _live.add(self)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until every running node answers Metadata and lists every running node.

        Raises KafkaNodeError if a node that should be running has exited, and
        LocalKafkaError when the deadline passes.
        """
        deadline = time.monotonic() + timeout
        last_problem = "no node checked yet"
        while True:
            for node in self.nodes:
                if node._expected_running and not node.is_running:
                    code = node.process.returncode if node.process else None
                    node._expected_running = False
                    raise KafkaNodeError(
                        f"Kafka node {node.node_id} exited unexpectedly with code {code}; "
                        f"its log is {node.log_path}.\n{node.log_tail()}"
                    )
            running = self.running_nodes
            if not running:
                raise LocalKafkaError("No Kafka node of this cluster is running.")
            want = {n.node_id for n in running}
            problem = None
            for node in running:
                try:
                    brokers, controller = metadata_brokers(node.host, node.port)
                except (OSError, struct.error, UnicodeDecodeError) as exc:
                    problem = f"node {node.node_id} does not answer Metadata yet ({exc})"
                    break
                missing = want - set(brokers)
                if missing:
                    problem = f"node {node.node_id} does not list node(s) {sorted(missing)} yet"
                    break
                if controller < 0:
                    problem = f"node {node.node_id} knows no controller yet"
                    break
            if problem is None:
                return
            last_problem = problem
            if time.monotonic() >= deadline:
                raise LocalKafkaError(f"The Kafka cluster was not ready within {timeout:.0f} s: {last_problem}.")
            time.sleep(0.2)

    @staticmethod
    def _signal(node: KafkaNode, sig: int) -> None:
        if node.process is not None and node.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(node.process.pid, sig)

    def _terminate(self, nodes: Sequence[KafkaNode], timeout: float) -> None:
        """SIGTERM ``nodes`` (a controlled shutdown), SIGKILL those still alive past
        ``timeout``; a ``timeout`` of 0 SIGKILLs at once, as a crash would."""
        nodes = [n for n in nodes if n.process is not None]
        for node in nodes:
            self._signal(node, signal.SIGTERM if timeout > 0 else signal.SIGKILL)
        deadline = time.monotonic() + timeout
        for node in nodes:
            assert node.process is not None
            try:
                node.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._signal(node, signal.SIGKILL)
                node.process.wait()
            if node._log_file is not None:
                node._log_file.close()
                node._log_file = None

    def close(self, timeout: float = 15.0) -> None:
        """Stop every node this cluster started, by PID: SIGTERM all, SIGKILL after ``timeout``.

        Safe to call more than once.  Removes the work directory if the cluster made it.
        """
        for node in self.nodes:
            node._expected_running = False
        try:
            self._terminate(self.nodes, timeout)
        finally:
            self._closed = True
            with _live_lock:
                _live.discard(self)
            if self._owns_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self.running_nodes)}/{len(self.nodes)} running"
        return f"<{type(self).__name__} {self.bootstrap_servers} {state}>"


class LocalKafka(KafkaNodes):
    """One KRaft node on loopback, for trying the product; see the module docstring.

        with LocalKafka.start() as kafka:
            print(kafka.bootstrap_servers)
    """

    @classmethod
    def start(
        cls,
        workdir: Path | None = None,
        broker_properties: Mapping[str, str] | None = None,
        *,
        cache_dir: Path | None = None,
        timeout: float = 120.0,
    ) -> LocalKafka:
        """Fetch the jars if they are not cached, format and start the node, and wait until
        it answers. ``workdir``: where its data and log go (default: a temporary directory,
        removed on close); ``broker_properties`` override what server.properties says."""
        return cls._start(lambda: cls(1, workdir, broker_properties, cache_dir=cache_dir), timeout)


# --------------------------------------------------------------------------------------
# The proxy as a process of its own


class ProxyStartError(RuntimeError):
    """The proxy exited or did not listen in time; the message carries the tail of its log."""


class ProxyProcess:
    """``keyrange-proxy`` (``python -m proxy.server.cli``) as a child process, started with
    :meth:`start`; it reports its ports in a ready file, read into ``info``."""

    def __init__(self, process: subprocess.Popen[bytes], info: dict[str, Any], log_path: Path,
                 workdir: Path) -> None:
        self.process = process
        self.info = info
        self.log_path = log_path
        self.workdir = workdir

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def port(self) -> int:
        return self.info["port"]

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.info['host']}:{self.info['port']}"

    @property
    def node_ports(self) -> dict[int, int]:
        return {int(node): port for node, port in self.info["node_ports"].items()}

    @property
    def metrics_url(self) -> str | None:
        port = self.info.get("metrics_port")
        return f"http://{self.info['host']}:{port}/metrics" if port else None

    @classmethod
    def start(
        cls,
        bootstrap_servers: str,
        *,
        overrides: Mapping[str, str] | None = None,
        workdir: Path | None = None,
        listen_port: int = 0,
        timeout: float = 30.0,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ProxyProcess:
        """Start the proxy in front of ``bootstrap_servers`` on 127.0.0.1 (``listen_port``
        0: any free port), with ``--override key=value`` for each of ``overrides``, and wait
        until it listens. Its log and ready file go to ``workdir`` (default: a new temporary
        directory); ``cwd`` and ``env``, the process's working directory and environment,
        default to this process's."""
        workdir = Path(workdir or tempfile.mkdtemp(prefix="keyrange-proxy-"))
        workdir.mkdir(parents=True, exist_ok=True)
        ready = workdir / f"ready-{time.monotonic_ns()}.json"
        log_path = workdir / f"proxy-{time.monotonic_ns()}.log"
        command = [
            sys.executable, "-m", "proxy.server.cli",
            "--bootstrap-server", bootstrap_servers,
            "--listen", f"127.0.0.1:{listen_port}",
            "--ready-file", str(ready),
        ]
        for key, value in (overrides or {}).items():
            command += ["--override", f"{key}={value}"]
        parent = os.getpid()
        with open(log_path, "wb") as log_file:
            process = subprocess.Popen(
                command, stdout=log_file, stderr=subprocess.STDOUT, preexec_fn=lambda: _die_with_parent(parent),
                cwd=cwd, env=None if env is None else dict(env),
            )
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if process.poll() is not None:
                raise ProxyStartError(
                    f"proxy exited with {process.returncode} before listening:\n{log_path.read_text(errors='replace')[-3000:]}"
                )
            if time.monotonic() > deadline:
                process.kill()
                process.wait()
                raise ProxyStartError(f"proxy not listening after {timeout}s; log: {log_path}")
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        return cls(process, info, log_path, workdir)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (the proxy drains), then SIGKILL past ``timeout``. Returns the exit code."""
        return terminate(self.process, timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def __enter__(self) -> ProxyProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


# --------------------------------------------------------------------------------------
# Command line


def main(argv: Sequence[str] | None = None) -> int:
    """``fetch-jars``: the Kafka and Spark connector jars into the cache (``make jars``)."""
    parser = argparse.ArgumentParser(prog="python -m proxy.local_kafka",
                                     description="A local Apache Kafka for trying keyrange-proxy.")
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch-jars", help="download the Kafka and Spark connector jars into the cache (once)")
    fetch.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    try:
        print(fetch_jars(verbose=args.verbose))
        print(fetch_spark_jars(verbose=args.verbose))
    except LocalKafkaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
