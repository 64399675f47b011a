"""Start real Apache Kafka (KRaft) nodes for tests, the demo and benchmarks.

The jars come from Maven Central through ``kafka-dist/pom.xml`` into a cache outside the
repository, ``${KEYRANGE_CACHE:-~/.cache/keyrange-proxy}/kafka-<version>/libs``; once a stamp
file there says they are complete, Maven is not run again, so later runs work offline.

Each node is one JVM, ``java -cp '<libs>/*' kafka.Kafka server.properties``, in the combined
broker+controller role, listening on free loopback ports, with its own directory under the
cluster's work directory and its log captured in ``node-<id>/server.log``.  Three nodes form a
static quorum (``controller.quorum.voters``).

Every JVM is killed with its parent (PR_SET_PDEATHSIG) and on interpreter exit (atexit), and
``close()`` stops everything by PID, so no broker outlives the test run that started it.

    with KafkaCluster.start(nodes=1) as cluster:
        print(cluster.bootstrap_servers)

Command line: ``python -m proxy.testing.kafka_cluster fetch-jars`` and
``python -m proxy.testing.kafka_cluster run --nodes 1``.

The module uses only the standard library, so it runs before anything else is installed.
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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

__all__ = [
    "KafkaCluster",
    "KafkaHarnessError",
    "KafkaNode",
    "KafkaNodeError",
    "cache_root",
    "fetch_jars",
    "fetch_spark_jars",
    "find_java",
    "java_base_command",
    "kafka_dist_dir",
    "kafka_version",
    "libs_dir",
    "spark_libs_dir",
    "spark_version",
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


class KafkaHarnessError(RuntimeError):
    """The Kafka test harness cannot do what was asked; ``str()`` is one sentence to show as is."""


class KafkaNodeError(KafkaHarnessError):
    """A Kafka node failed; the message ends with the tail of that node's log."""


# --------------------------------------------------------------------------------------
# Jars


def kafka_dist_dir() -> Path:
    """The directory holding pom.xml and the log4j2 configuration files."""
    env = os.environ.get("KEYRANGE_KAFKA_DIST")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "kafka-dist"
    if not (path / "pom.xml").is_file():
        raise KafkaHarnessError(
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
        raise KafkaHarnessError(f"{_pom_path()} has no <kafka.version> property.")
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
        raise KafkaHarnessError(f"{spark_pom_path()} has no <spark.version> property.")
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
        raise KafkaHarnessError(
            f"Cannot create the Kafka jar cache {version_dir} ({exc.strerror}); "
            "set KEYRANGE_CACHE to a writable directory."
        ) from None
    with open(version_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be fetching the same jars
        if _jars_complete(libs, pom):
            return libs
        mvn = shutil.which("mvn")
        if mvn is None:
            raise KafkaHarnessError(
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
            raise KafkaHarnessError(
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
                raise KafkaHarnessError(
                    f"Cannot download the {label} jars because Maven Central "
                    f"is unreachable and the cache {libs} is empty (Maven's output is in "
                    f"{log_path})."
                )
            raise KafkaHarnessError(
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
        raise KafkaHarnessError(
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
        f"-Dkeyrange.harness.parent={os.getpid()}",
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
                    target=self._run, name="kafka-harness-spawner", daemon=True
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


# --------------------------------------------------------------------------------------
# Ports and the readiness probe

_ports_handed_out: set[int] = set()


def _free_port() -> int:
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
    raise KafkaHarnessError(f"No free TCP port found on {HOST} in {_PORT_RANGE}.")


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
    client_id = b"keyrange-harness"
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
# Nodes and clusters


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


_live_clusters: set[KafkaCluster] = set()
_live_lock = threading.Lock()


def _close_all_at_exit() -> None:
    with _live_lock:
        clusters = list(_live_clusters)
    for cluster in clusters:
        with contextlib.suppress(Exception):
            cluster.close(timeout=5.0)


atexit.register(_close_all_at_exit)


def _normalise_listeners(extra: Mapping[str, str] | Iterable[str] | None) -> dict[str, str]:
    if not extra:
        return {}
    if isinstance(extra, Mapping):
        listeners = {str(k).upper(): str(v).upper() for k, v in extra.items()}
    else:
        listeners = {str(name).upper(): str(name).upper() for name in extra}
    for name in listeners:
        if name in (CLIENT_LISTENER, CONTROLLER_LISTENER) or not re.fullmatch(r"[A-Z0-9_]+", name):
            raise KafkaHarnessError(f"Extra listener name {name!r} is reserved or not valid.")
    return listeners


class KafkaCluster:
    """A set of KRaft nodes started by this process; see the module docstring.

    Build one with :meth:`start`.  Every node runs in combined mode (``process.roles =
    broker,controller``) and is a voter of a static quorum.
    """

    def __init__(
        self,
        nodes: int = 1,
        workdir: Path | None = None,
        broker_properties: Mapping[str, str] | None = None,
        extra_listeners: Mapping[str, str] | Iterable[str] | None = None,
        *,
        format_args: Sequence[str] = (),
        jvm_options: Sequence[str] = DEFAULT_JVM_OPTIONS,
        cache_dir: Path | None = None,
        advertised_ports: Mapping[str, Mapping[int, int]] | None = None,
    ) -> None:
        if nodes < 1:
            raise KafkaHarnessError("A Kafka cluster needs at least one node.")
        self._owns_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else Path(
            tempfile.mkdtemp(prefix="keyrange-kafka-")
        )
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.broker_properties = dict(broker_properties or {})
        self.extra_listeners = _normalise_listeners(extra_listeners)
        self.advertised_ports = {name.upper(): dict(ports) for name, ports in (advertised_ports or {}).items()}
        unknown = set(self.advertised_ports) - set(self.extra_listeners)
        if unknown:
            raise KafkaHarnessError(f"advertised_ports names listeners that are not extra listeners: {sorted(unknown)}")
        self.format_args = list(format_args)
        self.jvm_options = list(jvm_options)
        self.cache_dir = cache_dir
        # As Kafka's Uuid.randomUuid: never an id starting with "-", which the storage
        # tool's argument parser would take for an option (1 start in 64 failed so).
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        self.cluster_id = "A" + cluster_id[1:] if cluster_id.startswith("-") else cluster_id
        self.nodes: list[KafkaNode] = []
        for node_id in range(1, nodes + 1):
            node_dir = self.workdir / f"node-{node_id}"
            node = KafkaNode(
                node_id=node_id,
                host=HOST,
                port=_free_port(),
                controller_port=_free_port(),
                workdir=node_dir,
            )
            node.listener_ports[CLIENT_LISTENER] = node.port
            for name in self.extra_listeners:
                node.listener_ports[name] = _free_port()
            self.nodes.append(node)
        self._closed = False
        self._java_cmd: list[str] | None = None
        self.start_seconds: float | None = None

    # -- construction ------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        nodes: int = 1,
        workdir: Path | None = None,
        broker_properties: Mapping[str, str] | None = None,
        extra_listeners: Mapping[str, str] | Iterable[str] | None = None,
        *,
        format_args: Sequence[str] = (),
        jvm_options: Sequence[str] = DEFAULT_JVM_OPTIONS,
        cache_dir: Path | None = None,
        timeout: float = 120.0,
        advertised_ports: Mapping[str, Mapping[int, int]] | None = None,
    ) -> KafkaCluster:
        """Format and start ``nodes`` KRaft nodes and wait until all are ready.

        ``broker_properties`` override anything the harness writes into server.properties.
        ``extra_listeners`` adds client listeners besides PLAINTEXT, as {name: security
        protocol} (or names that are also their protocol, e.g. ["SASL_PLAINTEXT"]); each
        node gets a port for each, see ``KafkaNode.listener_ports`` and
        :meth:`bootstrap_servers_for`.  ``advertised_ports`` makes an extra listener
        advertise another port, as {listener: {node id: port}} (something else listening
        there, e.g. a relay, passes the traffic on).  ``format_args`` are appended to ``StorageTool
        format`` (e.g. ``--add-scram``, ``--feature``).  On any failure, whatever was
        started is stopped before the error propagates.
        """
        for attempt in range(1, 4):
            cluster = cls(
                nodes,
                workdir,
                broker_properties,
                extra_listeners,
                format_args=format_args,
                jvm_options=jvm_options,
                cache_dir=cache_dir,
                advertised_ports=advertised_ports,
            )
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

    def __enter__(self) -> KafkaCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- addresses ---------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:p1,127.0.0.1:p2,...`` of the PLAINTEXT listeners of all nodes."""
        return self.bootstrap_servers_for(CLIENT_LISTENER)

    def bootstrap_servers_for(self, listener: str) -> str:
        listener = listener.upper()
        return ",".join(f"{n.host}:{n.listener_ports[listener]}" for n in self.nodes)

    def node(self, node_id: int) -> KafkaNode:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no Kafka node {node_id} in this cluster")

    @property
    def running_nodes(self) -> list[KafkaNode]:
        return [n for n in self.nodes if n.is_running]

    # -- configuration -----------------------------------------------------------------

    def _properties(self, node: KafkaNode) -> dict[str, str]:
        n = len(self.nodes)
        replication = str(min(3, n))
        min_isr = str(min(2, n))
        voters = ",".join(f"{m.node_id}@{m.host}:{m.controller_port}" for m in self.nodes)
        listeners = [f"{CLIENT_LISTENER}://{node.host}:{node.port}"]
        advertised = [f"{CLIENT_LISTENER}://{node.host}:{node.port}"]
        protocols = [f"{CLIENT_LISTENER}:PLAINTEXT", f"{CONTROLLER_LISTENER}:PLAINTEXT"]
        for name, protocol in self.extra_listeners.items():
            listeners.append(f"{name}://{node.host}:{node.listener_ports[name]}")
            port = self.advertised_ports.get(name, {}).get(node.node_id, node.listener_ports[name])
            advertised.append(f"{name}://{node.host}:{port}")
            protocols.append(f"{name}:{protocol}")
        listeners.append(f"{CONTROLLER_LISTENER}://{node.host}:{node.controller_port}")
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
            # Fail over quickly when a test kills a node.
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
        lines = ["# written by proxy.testing.kafka_cluster"]
        lines += [f"{k}={v}" for k, v in self._properties(node).items()]
        node.config_path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def _java(self) -> list[str]:
        if self._java_cmd is None:
            self._java_cmd = java_base_command(jvm_options=self.jvm_options, cache_dir=self.cache_dir)
        return self._java_cmd

    def _format_all(self, timeout: float) -> None:
        """Run ``StorageTool format`` for every node, in parallel (each is a JVM start)."""
        java = self._java()
        running: list[tuple[KafkaNode, subprocess.Popen[bytes], IO[bytes]]] = []
        try:
            for node in self.nodes:
                self._write_config(node)
                out: IO[bytes] = open(node.workdir / "format.log", "wb")
                cmd = [
                    *java,
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    self.cluster_id,
                    "-c",
                    str(node.config_path),
                    "--ignore-formatted",
                    *self.format_args,
                ]
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
            raise KafkaHarnessError("This Kafka cluster has been closed.")
        self._write_config(node)  # broker_properties may have been changed in between
        cmd = [
            *self._java(),
            f"-Dkafka.logs.dir={node.workdir}",
            "kafka.Kafka",
            str(node.config_path),
        ]
        node._log_file = open(node.log_path, "ab")
        node.process = spawn(cmd, stdin=subprocess.DEVNULL, stdout=node._log_file, stderr=subprocess.STDOUT, cwd=node.workdir)
        node._expected_running = True
        with _live_lock:
            _live_clusters.add(self)

    # -- readiness ---------------------------------------------------------------------

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until every running node answers Metadata and lists every running node.

        Raises KafkaNodeError if a node that should be running has exited, and
        KafkaHarnessError when the deadline passes.
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
                raise KafkaHarnessError("No Kafka node of this cluster is running.")
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
                    problem = (
                        f"node {node.node_id} does not list node(s) {sorted(missing)} yet"
                    )
                    break
                if controller < 0:
                    problem = f"node {node.node_id} knows no controller yet"
                    break
            if problem is None:
                return
            last_problem = problem
            if time.monotonic() >= deadline:
                raise KafkaHarnessError(
                    f"The Kafka cluster was not ready within {timeout:.0f} s: {last_problem}."
                )
            time.sleep(0.2)

    # -- node life cycle ---------------------------------------------------------------

    def start_node(self, node_id: int, *, wait: bool = True, timeout: float = 60.0) -> KafkaNode:
        """Start a stopped node again with the same ports and data; wait until ready."""
        node = self.node(node_id)
        self._launch(node)
        if wait:
            self.wait_ready(timeout)
        return node

    def stop_node(self, node_id: int, timeout: float = 30.0) -> None:
        """SIGTERM the node (a controlled shutdown), SIGKILL it if still alive after ``timeout``."""
        node = self.node(node_id)
        node._expected_running = False
        self._terminate([node], timeout)

    def kill_node(self, node_id: int) -> None:
        """SIGKILL the node at once, as a crash would."""
        node = self.node(node_id)
        node._expected_running = False
        self._terminate([node], 0.0)

    @staticmethod
    def _signal(node: KafkaNode, sig: int) -> None:
        if node.process is not None and node.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(node.process.pid, sig)

    def _terminate(self, nodes: Sequence[KafkaNode], timeout: float) -> None:
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
                _live_clusters.discard(self)
            if self._owns_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self.running_nodes)}/{len(self.nodes)} running"
        return f"<KafkaCluster {self.bootstrap_servers} {state}>"


# --------------------------------------------------------------------------------------
# Command line


def _cmd_fetch_jars(args: argparse.Namespace) -> int:
    print(fetch_jars(verbose=args.verbose))
    print(fetch_spark_jars(verbose=args.verbose))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    props = dict(kv.split("=", 1) for kv in args.override)
    workdir = Path(args.workdir) if args.workdir else None
    with KafkaCluster.start(args.nodes, workdir=workdir, broker_properties=props) as cluster:
        print(f"Kafka {kafka_version()}: {len(cluster.nodes)} node(s) ready in {cluster.start_seconds:.1f} s")
        for node in cluster.nodes:
            print(f"  node {node.node_id}: {node.address} pid {node.pid} log {node.log_path}")
        print(f"bootstrap.servers={cluster.bootstrap_servers}", flush=True)
        while not stop.wait(0.5):
            dead = [n for n in cluster.nodes if n._expected_running and not n.is_running]
            if dead:
                print(f"Kafka node {dead[0].node_id} exited; see {dead[0].log_path}", file=sys.stderr)
                return 1
        print("stopping", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proxy.testing.kafka_cluster")
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch-jars", help="download the Kafka and Spark connector jars into the cache (once)")
    fetch.add_argument("-v", "--verbose", action="store_true")
    fetch.set_defaults(func=_cmd_fetch_jars)
    run = sub.add_parser("run", help="start a cluster and run it until Ctrl-C or SIGTERM")
    run.add_argument("--nodes", type=int, default=1)
    run.add_argument("--workdir", help="keep node data here (default: a temporary directory)")
    run.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                     help="broker property, may be repeated")
    run.set_defaults(func=_cmd_run)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KafkaHarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
