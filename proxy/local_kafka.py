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

Every child is killed when the thread that started it ends (PR_SET_PDEATHSIG; the demo's
main thread, so with the process), the broker also on interpreter exit (atexit), and
``close()``/``stop()`` stop them by PID, so nothing outlives its run.

    with LocalKafka.start() as kafka, ProxyProcess.start(kafka.bootstrap_servers) as proxy:
        print(proxy.bootstrap_servers)

Command line: ``python -m proxy.local_kafka fetch-jars`` fills the cache (``make demo`` runs it).
Standard library only; nothing else of ``proxy`` is imported. The test harness's clusters
(``harness/kafka_cluster.py``, not installed: several nodes, more listeners, restarts) are
made of ``LocalKafka`` nodes.
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
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

__all__ = ["LocalKafka", "LocalKafkaError", "ProxyProcess", "ProxyStartError", "cache_root", "fetch_jars",
           "fetch_pom_jars", "fetch_spark_jars", "find_java", "free_port", "java_base_command", "kafka_dist_dir",
           "kafka_version", "metadata_brokers", "scratch_dir", "spawn", "terminate"]

HOST = "127.0.0.1"
CLIENT_LISTENER = "PLAINTEXT"
CONTROLLER_LISTENER = "CONTROLLER"
DEFAULT_JVM_OPTIONS = ("-Xms256m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:+ExitOnOutOfMemoryError",
                       "-Djava.awt.headless=true")
STAMP_NAME = ".complete"
# Below the kernel's ephemeral range (32768-60999 by default), so that no outgoing connection
# takes a port between the probe and the broker's bind.
_PORT_RANGE = (20000, 32000)
_MAVEN_TIMEOUT = 1800.0
# Named in full so that Maven resolves exactly this plugin (and, offline, says which
# download failed instead of "No plugin found for prefix 'dependency'").
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
_NETWORK_ERROR = re.compile(
    r"Connection refused|UnknownHost|Unknown host|Connect to \S+ failed|connect timed out|Network is unreachable|"
    r"No route to host|Could not transfer|transfer failed|Temporary failure in name resolution|Name or service not "
    r"known|SSLHandshake|Remote host terminated|Connection reset|Read timed out|PKIX path", re.IGNORECASE)


class LocalKafkaError(RuntimeError):
    """The local Kafka cannot do what was asked: ``str()`` is one sentence to show as is (when a
    broker failed, followed by the tail of its log)."""


# -- Jars ------------------------------------------------------------------------------


def kafka_dist_dir() -> Path:
    """The directory holding the poms and the log4j2 configuration files."""
    env = os.environ.get("KEYRANGE_KAFKA_DIST")
    path = Path(env) if env else Path(__file__).resolve().parents[1] / "kafka-dist"
    if not (path / "pom.xml").is_file():
        raise LocalKafkaError(f"The Kafka distribution description {path / 'pom.xml'} is missing; run from a "
                              "checkout of keyrange-proxy (pip install -e) or set KEYRANGE_KAFKA_DIST.")
    return path


def _pinned(pom_name: str, prop: str) -> tuple[Path, str]:
    """A pom of kafka-dist/ and the version its property ``prop`` pins."""
    pom, name = kafka_dist_dir() / pom_name, re.escape(prop)
    match = re.search(rf"<{name}>\s*([^<\s]+)\s*</{name}>", pom.read_text(encoding="utf-8"))
    if not match:
        raise LocalKafkaError(f"{pom} has no <{prop}> property.")
    return pom, match.group(1)


def kafka_version() -> str:
    """The Kafka version pinned by the ``kafka.version`` property of kafka-dist/pom.xml."""
    return _pinned("pom.xml", "kafka.version")[1]


def cache_root() -> Path:
    """``$KEYRANGE_CACHE``, or ``~/.cache/keyrange-proxy``."""
    env = os.environ.get("KEYRANGE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "keyrange-proxy"


def fetch_jars(cache_dir: Path | None = None) -> Path:
    """Make sure the broker's jars, of the pinned Kafka version, are in the cache; return their
    directory (see ``fetch_pom_jars``)."""
    version = kafka_version()
    return fetch_pom_jars("pom.xml", f"kafka-{version}", f"Kafka {version}", cache_dir)


def fetch_spark_jars(cache_dir: Path | None = None) -> Path:
    """Like ``fetch_jars``, for the four jars of Spark's Kafka connector (handed to Spark with
    ``spark.jars``; never on the broker's classpath, whose kafka-clients differs)."""
    version = _pinned("spark-connector.pom.xml", "spark.version")[1]
    return fetch_pom_jars("spark-connector.pom.xml", f"spark-{version}", f"Spark {version} Kafka connector",
                          cache_dir)


def fetch_pom_jars(pom_name: str, name: str, what: str, cache_dir: Path | None = None) -> Path:
    """The jars ``kafka-dist/<pom_name>`` names, in ``<cache>/<name>/libs``; ``what`` names
    them in errors.

    Maven runs only when the stamp file there is missing or stale (the pom, or its parent,
    changed). It downloads into a private local repository inside the cache (``<cache>/m2``)
    and copies the jars into a fresh directory that replaces ``libs`` only once complete, so
    an interrupted download never looks complete. ``$KEYRANGE_MAVEN_SETTINGS`` is passed to
    Maven as ``-s`` (e.g. for a mirror).
    """
    pom, libs = kafka_dist_dir() / pom_name, Path(cache_dir or cache_root()) / name / "libs"
    text = pom.read_bytes()
    if parent := re.search(rb"<relativePath>\s*([^<\s]+)\s*</relativePath>", text):
        text += (pom.parent / parent.group(1).decode()).read_bytes()
    digest = hashlib.sha256(text).hexdigest()
    if _complete(libs, digest):
        return libs
    try:
        libs.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LocalKafkaError(f"Cannot create the jar cache {libs.parent} ({exc.strerror}); set KEYRANGE_CACHE "
                              "to a writable directory.") from None
    with open(libs.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be fetching the same jars
        if not _complete(libs, digest):
            staging = Path(tempfile.mkdtemp(prefix="libs.partial-", dir=libs.parent))
            try:
                jars = _maven_copy(pom, staging, libs, what)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            stamp = {"pom_sha256": digest, "what": what, "jars": jars}
            (staging / STAMP_NAME).write_text(json.dumps(stamp, indent=1), encoding="utf-8")
            shutil.rmtree(libs, ignore_errors=True)
            staging.rename(libs)
    return libs


def _complete(libs: Path, digest: str) -> bool:
    try:
        stamp = json.loads((libs / STAMP_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    jars = stamp.get("jars") or []
    return stamp.get("pom_sha256") == digest and bool(jars) and all((libs / name).is_file() for name in jars)


def _maven_copy(pom: Path, staging: Path, libs: Path, label: str) -> list[str]:
    """Maven's copy-dependencies of ``pom`` into ``staging``; the names of the jars it put there."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise LocalKafkaError(f"Maven (mvn) is not installed and the {label} jars are not cached in {libs}: "
                              "install maven (apt-get install maven).")
    settings = os.environ.get("KEYRANGE_MAVEN_SETTINGS")
    cmd = [mvn, "-B", "-q", "-Dstyle.color=never", "-f", str(pom), *(["-s", settings] if settings else []),
           f"-Dmaven.repo.local={libs.parent.parent / 'm2'}", f"{_DEPENDENCY_PLUGIN}:copy-dependencies",
           f"-DoutputDirectory={staging}"]
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=_MAVEN_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise LocalKafkaError(f"Maven did not finish fetching the {label} jars within {_MAVEN_TIMEOUT:.0f} s, so "
                              f"Maven Central is probably unreachable and {libs} stays empty.") from None
    log_path = libs.parent / "maven.log"
    log_path.write_text(proc.stdout, encoding="utf-8")
    jars = sorted(path.name for path in staging.glob("*.jar"))
    if proc.returncode == 0 and jars:
        return jars
    if _NETWORK_ERROR.search(proc.stdout):
        raise LocalKafkaError(f"Cannot download the {label} jars because Maven Central is unreachable and the "
                              f"cache {libs} is empty (Maven's output is in {log_path}).")
    raise LocalKafkaError(f"Maven failed to fetch the {label} jars into {libs} (exit code {proc.returncode}; "
                          f"its output is in {log_path}).")


def find_java() -> str:
    """The ``java`` executable on PATH."""
    java = shutil.which("java")
    if java is None:
        raise LocalKafkaError("Java is not installed (no java on PATH): install openjdk-17-jre-headless "
                              "(apt-get install openjdk-17-jre-headless).")
    return java


def java_base_command(*, log4j_config: str = "log4j2.properties", jvm_options: Sequence[str] = DEFAULT_JVM_OPTIONS,
                      libs: Path | None = None) -> list[str]:
    """``java <options> -cp '<libs>/*'``, ready for a main class of Kafka's and its arguments;
    ``libs`` defaults to the broker's jars, fetched first if they are not cached."""
    java, libs = find_java(), libs or fetch_jars()
    return [java, *jvm_options, f"-Dlog4j2.configurationFile={kafka_dist_dir() / log4j_config}",
            f"-Dkeyrange.local.kafka.parent={os.getpid()}", "-cp", f"{libs}/*"]


# -- Child processes that die with us, and scratch directories -------------------------

try:
    _prctl: Any = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def _die_with_parent(parent_pid: int) -> None:
    """preexec_fn: ask the kernel to SIGKILL the child when the thread that forked it ends."""
    if _prctl is not None:
        _prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def spawn(cmd: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """Start ``cmd`` in its own session, to be SIGKILLed when the thread calling this ends (for the
    demo, its main thread: when the process does)."""
    parent = os.getpid()
    return subprocess.Popen(list(cmd), preexec_fn=lambda: _die_with_parent(parent), start_new_session=True, **kwargs)


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead and not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def terminate(process: subprocess.Popen[Any], timeout: float) -> int:
    """SIGTERM ``process`` (it may drain), SIGKILL it past ``timeout``; its exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def scratch_dir(prefix: str) -> Path:
    """A new directory under the system's temporary directory, removed at exit.

    A run of Kafka writes its logs there (gigabytes, for a benchmark); left behind, a few runs
    fill a disk. ``KEYRANGE_KEEP_WORKDIR=1`` keeps it for inspection (its path is printed).
    """
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if os.environ.get("KEYRANGE_KEEP_WORKDIR"):
        print(f"working directory kept: {path}", file=sys.stderr, flush=True)
    else:
        atexit.register(shutil.rmtree, path, True)
    return path


# -- Ports and the readiness probe -----------------------------------------------------

_ports_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, never handed out twice by this process."""
    for _ in range(200):
        port = random.randrange(*_PORT_RANGE)
        if port in _ports_handed_out:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((HOST, port))
            except OSError:
                continue
        _ports_handed_out.add(port)
        return port
    raise LocalKafkaError(f"No free TCP port found on {HOST} in {_PORT_RANGE}.")


def metadata_brokers(host: str, port: int, timeout: float = 2.0) -> tuple[dict[int, tuple[str, int]], int]:
    """Ask one broker for Metadata v1 with no topics: ({node id: (host, port)}, controller id).

    A raw request on a plain socket, so it needs no client library and sees exactly what the
    broker says. OSError (ConnectionError, a timeout) when the broker does not answer.
    """
    client_id = b"keyrange-local-kafka"  # api key 3 (Metadata) v1, correlation id 1, no topics (not null: all)
    request = struct.pack(">hhih", 3, 1, 1, len(client_id)) + client_id + struct.pack(">i", 0)
    with socket.create_connection((host, port), timeout=timeout) as sock, sock.makefile("rb") as stream:
        sock.sendall(struct.pack(">i", len(request)) + request)
        size = struct.unpack(">i", stream.read(4))[0]
        data = stream.read(size)
    if len(data) != size or struct.unpack_from(">i", data)[0] != 1:
        raise ConnectionError("a short or unexpected Metadata response")
    (count,), pos = struct.unpack_from(">i", data, 4), 8
    brokers: dict[int, tuple[str, int]] = {}
    for _ in range(count):
        node_id, length = struct.unpack_from(">ih", data, pos)
        broker_port, rack_length = struct.unpack_from(">ih", data, pos + 6 + length)
        brokers[node_id] = (data[pos + 6 : pos + 6 + length].decode(), broker_port)
        pos += 12 + length + max(rack_length, 0)
    return brokers, struct.unpack_from(">i", data, pos)[0]


# -- The broker ------------------------------------------------------------------------


class LocalKafka:
    """One KRaft node on loopback (broker and controller in one JVM), for trying the product;
    see the module docstring.

        with LocalKafka.start() as kafka:
            print(kafka.bootstrap_servers)

    ``start`` formats its storage (``format``), launches the JVM (``launch``) and waits until
    it answers (``wait_ready``); the harness's clusters take these steps node by node, with
    their own ``node_id``, ``_properties`` and ``spawn``.
    """

    node_id = 1
    jvm_options: Sequence[str] = DEFAULT_JVM_OPTIONS
    format_args: Sequence[str] = ()
    """Appended to ``StorageTool format``."""
    spawn = staticmethod(spawn)
    """How its JVMs are started."""

    def __init__(self, workdir: Path | None = None, broker_properties: Mapping[str, str] | None = None) -> None:
        """Data and log go to ``<workdir>/node-<node_id>`` (default: a temporary directory,
        removed on close); ``broker_properties`` override what server.properties says."""
        self._owns_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="keyrange-kafka-"))
        self.broker_properties = dict(broker_properties or {})
        # As Kafka's Uuid.randomUuid: never an id starting with "-", which the storage tool
        # would take for an option.
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        self.cluster_id = "A" + cluster_id[1:] if cluster_id.startswith("-") else cluster_id
        self.host, self.port, self.controller_port = HOST, free_port(), free_port()
        self.process: subprocess.Popen[bytes] | None = None
        """The JVM once launched; None before, and once stopped."""
        self.start_seconds: float | None = None

    @classmethod
    def start(cls, workdir: Path | None = None, broker_properties: Mapping[str, str] | None = None, *,
              timeout: float = 120.0) -> LocalKafka:
        """A node, formatted, launched and answering (the jars fetched first if not cached).
        On a failure, whatever was started is stopped before the error propagates."""
        kafka, began = cls(workdir, broker_properties), time.monotonic()
        try:
            kafka.format(timeout)
            kafka.launch()
            kafka.wait_ready(timeout)
        except BaseException:
            kafka.close(timeout=5.0)
            raise
        kafka.start_seconds = time.monotonic() - began
        return kafka

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    bootstrap_servers = address

    @property
    def voter(self) -> str:
        """This node in ``controller.quorum.voters``."""
        return f"{self.node_id}@{self.host}:{self.controller_port}"

    @property
    def node_dir(self) -> Path:
        return self.workdir / f"node-{self.node_id}"

    @property
    def log_path(self) -> Path:
        return self.node_dir / "server.log"

    @property
    def data_dir(self) -> Path:
        return self.node_dir / "data"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _properties(self) -> dict[str, str]:
        """server.properties, before ``broker_properties`` override them."""
        data = str(self.data_dir)
        return {
            "process.roles": "broker,controller", "node.id": str(self.node_id),
            "controller.quorum.voters": self.voter,
            "controller.listener.names": CONTROLLER_LISTENER, "inter.broker.listener.name": CLIENT_LISTENER,
            "listeners": f"{CLIENT_LISTENER}://{self.address},{CONTROLLER_LISTENER}://{self.host}:{self.controller_port}",
            "advertised.listeners": f"{CLIENT_LISTENER}://{self.address}",
            "listener.security.protocol.map": f"{CLIENT_LISTENER}:PLAINTEXT,{CONTROLLER_LISTENER}:PLAINTEXT",
            "log.dirs": data, "metadata.log.dir": data,
            "num.partitions": "1", "default.replication.factor": "1", "auto.create.topics.enable": "true",
            "offsets.topic.replication.factor": "1", "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1", "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4", "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1", "share.coordinator.state.topic.num.partitions": "4",
            "group.initial.rebalance.delay.ms": "0",
            # A small broker: few threads, a log cleaner's buffer that fits the heap.
            "num.network.threads": "2", "num.io.threads": "4", "num.recovery.threads.per.data.dir": "1",
            "background.threads": "4", "log.retention.check.interval.ms": "300000", "log.cleaner.threads": "1",
            "log.cleaner.dedupe.buffer.size": "16777216", "socket.request.max.bytes": "104857600",
        }

    def _config(self) -> str:
        """Writes server.properties (anew: ``broker_properties`` may have changed); its path."""
        self.node_dir.mkdir(parents=True, exist_ok=True)
        path = self.node_dir / "server.properties"
        props = {**self._properties(), **self.broker_properties}
        path.write_text("".join(f"{key}={value}\n" for key, value in props.items()), encoding="utf-8")
        return str(path)

    def format(self, timeout: float = 120.0) -> None:
        """``StorageTool format`` the node's storage (kept if already formatted)."""
        cmd = [*java_base_command(jvm_options=self.jvm_options), "kafka.tools.StorageTool", "format", "-t",
               self.cluster_id, "-c", self._config(), "--ignore-formatted", *self.format_args]
        log_path, what = self.node_dir / "format.log", f"Formatting the storage of Kafka node {self.node_id}"
        with open(log_path, "wb") as log:
            process = self.spawn(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise LocalKafkaError(f"{what} took longer than {timeout:.0f} s.") from None
        finally:
            terminate(process, 0)
        if code != 0:
            raise LocalKafkaError(f"{what} failed with exit code {code}.\n{log_path.read_text(errors='replace')[-3000:]}")

    def launch(self) -> None:
        """Start the node's JVM; ``wait_ready`` waits until it answers."""
        cmd = [*java_base_command(jvm_options=self.jvm_options), f"-Dkafka.logs.dir={self.node_dir}", "kafka.Kafka",
               self._config()]
        with open(self.log_path, "ab") as log:
            self.process = self.spawn(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.node_dir)
        atexit.register(self.close, 5.0)

    def wait_ready(self, timeout: float = 60.0, peers: Iterable[int] = ()) -> None:
        """Wait until the node answers Metadata listing itself (and the nodes ``peers``) and a
        controller. LocalKafkaError if it exits meanwhile, or when ``timeout`` passes."""
        deadline, want, process = time.monotonic() + timeout, {self.node_id, *peers}, self.process
        if process is None:
            raise LocalKafkaError(f"Kafka node {self.node_id} has not been launched.")
        while True:
            if process.poll() is not None:
                raise LocalKafkaError(f"Kafka node {self.node_id} exited unexpectedly with code {process.returncode}; "
                                      f"its log is {self.log_path}.\n{self.log_tail()}")
            try:
                brokers, controller = metadata_brokers(self.host, self.port)
                missing = sorted(want - set(brokers))
                problem = (f"it does not list node(s) {missing} yet" if missing
                           else "it knows no controller yet" if controller < 0 else None)
            except (OSError, struct.error, UnicodeDecodeError) as exc:
                problem = f"it does not answer Metadata yet ({exc})"
            if problem is None:
                return
            if time.monotonic() >= deadline:
                raise LocalKafkaError(f"Kafka node {self.node_id} was not ready within {timeout:.0f} s: {problem}.")
            time.sleep(0.2)

    def close(self, timeout: float = 15.0) -> None:
        """Stop the node by PID: SIGTERM (a controlled shutdown), SIGKILL past ``timeout``.
        Removes the work directory if it made it; safe to repeat."""
        atexit.unregister(self.close)
        if self.process is not None:
            terminate(self.process, timeout)
            self.process = None
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


# -- The proxy as a process of its own -------------------------------------------------


class ProxyStartError(RuntimeError):
    """The proxy exited or did not listen in time; the message carries the tail of its log."""


@dataclass(eq=False)
class ProxyProcess:
    """``keyrange-proxy`` (``python -m proxy.server.cli``) as a child process, started with
    :meth:`start`; it reports its ports in a ready file, read into ``info``."""

    process: subprocess.Popen[bytes]
    info: dict[str, Any]
    log_path: Path
    workdir: Path

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

    def metric(self, name: str, **labels: str) -> float:
        """The sum of metric ``name`` over its series whose labels include ``labels``, as
        the proxy's metrics endpoint serves it now (0 when it has none)."""
        assert self.metrics_url is not None, "the proxy serves no metrics (metrics.port)"
        text = urllib.request.urlopen(self.metrics_url, timeout=10).read().decode()
        total = 0.0
        for match in re.finditer(rf"^{re.escape(name)}(?:{{([^}}]*)}})? (\S+)$", text, re.M):
            found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
            if all(found.get(key) == value for key, value in labels.items()):
                total += float(match.group(2))
        return total

    @classmethod
    def start(cls, bootstrap_servers: str, *, overrides: Mapping[str, str] | None = None, workdir: Path | None = None,
              listen_port: int = 0, timeout: float = 30.0, cwd: Path | None = None,
              env: Mapping[str, str] | None = None, config_file: Path | None = None,
              program: Sequence[str] | None = None) -> ProxyProcess:
        """Start the proxy in front of ``bootstrap_servers`` on 127.0.0.1 (``listen_port``
        0: any free port), with ``--override key=value`` for each of ``overrides`` (they win
        over ``config_file``, a properties file, as a reload reads it again), and wait until
        it listens. Its log and ready file go to ``workdir`` (default: a new temporary
        directory); ``cwd`` and ``env``, the process's working directory and environment,
        default to this process's; ``program``, the command that is the proxy, to this
        interpreter running ``proxy.server.cli`` (an installed ``keyrange-proxy`` instead)."""
        workdir = Path(workdir or tempfile.mkdtemp(prefix="keyrange-proxy-"))
        workdir.mkdir(parents=True, exist_ok=True)
        ready, log_path = workdir / f"ready-{time.monotonic_ns()}.json", workdir / f"proxy-{time.monotonic_ns()}.log"
        command = [*(program or (sys.executable, "-m", "proxy.server.cli")), "--bootstrap-server", bootstrap_servers,
                   "--listen", f"127.0.0.1:{listen_port}", "--ready-file", str(ready)]
        if config_file is not None:
            command.append(str(config_file))
        for key, value in (overrides or {}).items():
            command += ["--override", f"{key}={value}"]
        parent = os.getpid()
        with open(log_path, "wb") as log_file:
            process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, cwd=cwd,
                                       preexec_fn=lambda: _die_with_parent(parent),
                                       env=None if env is None else dict(env))
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if process.poll() is not None:
                raise ProxyStartError(f"proxy exited with {process.returncode} before listening:\n"
                                      f"{log_path.read_text(errors='replace')[-3000:]}")
            if time.monotonic() > deadline:
                process.kill()
                process.wait()
                raise ProxyStartError(f"proxy not listening after {timeout}s; log: {log_path}")
            time.sleep(0.05)
        return cls(process, json.loads(ready.read_text()), log_path, workdir)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (the proxy drains), then SIGKILL past ``timeout``. Returns the exit code."""
        return terminate(self.process, timeout)

    def kill(self) -> None:
        """kill -9 of the whole proxy: the command's process and, when it supervises
        workers, each of them at the same moment (they would also die with it, a little
        later), returning once none of them runs (their sockets closed)."""
        workers = [worker["pid"] for worker in self.info.get("workers", [])]
        if self.process.poll() is None:
            self.process.kill()
            for pid in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.process.wait()
        deadline = time.monotonic() + 10
        while any(running(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.01)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def __enter__(self) -> ProxyProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """``fetch-jars``: the Kafka and Spark connector jars into the cache (``make demo`` runs it)."""
    parser = argparse.ArgumentParser(prog="python -m proxy.local_kafka",
                                     description="A local Apache Kafka for trying keyrange-proxy.")
    parser.add_subparsers(dest="command", required=True).add_parser(
        "fetch-jars", help="download the Kafka and Spark connector jars into the cache (once)")
    parser.parse_args(argv)
    try:
        print(fetch_jars())
        print(fetch_spark_jars())
    except LocalKafkaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
