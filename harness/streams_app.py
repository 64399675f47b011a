"""Launch the Java programs of ``benchmarks/java/streams``: the Kafka Streams exactly-once
application (``KeyCountApp``) and a plain Java producer and consumer, for the chaos matrix
and the exactly-once benchmark.

- :func:`build` runs Maven for that module only when a source or pom changed (a digest is
  kept next to the jars, ``build/bench-java/bench-streams/``), with the harness's local
  repository in the cache, so later runs work offline.
- :class:`StreamsInstance` is one ``KeyCountApp`` JVM: ``start()``, ``wait_running()``,
  ``kill()`` (SIGKILL by PID), ``stop()`` (SIGTERM: it commits, leaves the group and exits),
  ``start()`` again on the same state directory. :class:`StreamsFleet` runs N of them as one
  application.
- :func:`read_counts` reads the application's output with ``isolation.level=read_committed``
  to the last stable offset of every partition and keeps the last count of each key: once
  every transaction has ended it must equal the number of input records of that key.
- :class:`PlainProducerProcess` and :class:`PlainConsumerProcess` run ``PlainProducer`` and
  ``PlainConsumer`` and parse their lines into acknowledgements and deliveries, which
  :meth:`~PlainProducerProcess.feed` and :meth:`~PlainConsumerProcess.feed` add to a
  :class:`harness.history.History`.
- :class:`TxnRelayProcess` runs ``TxnRelay`` (a transactional consume-transform-produce
  loop that aborts every N-th transaction on purpose) and parses its ``commit`` and
  ``abort`` lines into :class:`TxnEvent`; :class:`TxnFleet` runs several as one group.
  ``harness.txn_output`` checks their output.

Every program writes tab-separated lines to stdout (the formats are in the class comment of
each Java program and in the parsers below); stdout goes to ``<name>-<launch>.out`` and
stderr (slf4j-simple at WARN) to ``<name>-<launch>.err`` in the work directory. Each JVM runs
in its own session and is SIGKILLed if this process dies.

Command line::

    python -m harness.streams_app build
    python -m harness.streams_app keycount --bootstrap 127.0.0.1:9192 --input orders \\
        --output order-counts --instances 2
    python -m harness.streams_app counts --bootstrap 127.0.0.1:9092 --topic order-counts
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from harness import ROOT, maven
from harness.processes import spawn
from proxy.local_kafka import LocalKafkaError, find_java, terminate

SOURCES = ROOT / "benchmarks" / "java"
MODULE_SOURCES = SOURCES / "streams"
OUTPUT = ROOT / "build" / "bench-java"
MODULE = "bench-streams"

PACKAGE = "io.keyrange.bench.streams"
KEY_COUNT_APP = f"{PACKAGE}.KeyCountApp"
PLAIN_PRODUCER = f"{PACKAGE}.PlainProducer"
PLAIN_CONSUMER = f"{PACKAGE}.PlainConsumer"
TXN_RELAY = f"{PACKAGE}.TxnRelay"

JVM_OPTIONS = ("-Xms64m", "-Xmx384m", "-XX:+UseSerialGC", "-XX:+ExitOnOutOfMemoryError",
               "-Djava.awt.headless=true")

# A member that dies is noticed after this session timeout (the broker's minimum by default)
# instead of 45 s: for tests and the chaos matrix that kill instances.
FAST_FAILOVER = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "1500"}


class StreamsAppError(LocalKafkaError):
    """A program of the streams module failed or did not get where it was asked to in time;
    the message ends with the tail of its stderr."""


# --------------------------------------------------------------------------------------
# Build


def _digest() -> str:
    sha = hashlib.sha256()
    for path in [SOURCES / "pom.xml", *sorted(MODULE_SOURCES.rglob("*"))]:
        if path.is_file() and path.suffix in (".java", ".xml"):
            sha.update(str(path.relative_to(SOURCES)).encode())
            sha.update(path.read_bytes())
    return sha.hexdigest()


def module_dir() -> Path:
    """Where the module's jar and ``lib/`` are (built or not)."""
    return OUTPUT / MODULE


def build(*, timeout: float = 900.0) -> Path:
    """Build the streams module unless it is up to date; return its output directory.

    ``mvn -pl streams -am package`` on ``benchmarks/java/pom.xml``, under the same lock as
    the benchmark harness's build (``benchmarks/peers/java_harness.py``), so two test runs or
    a test run and a benchmark never run Maven on one output at once.
    """
    out = module_dir()
    stamp = out / ".stamp.json"
    digest = _digest()

    def current() -> bool:
        try:
            return (json.loads(stamp.read_text())["digest"] == digest and (out / f"{MODULE}.jar").is_file()
                    and any((out / "lib").glob("kafka-streams-*.jar")))
        except (OSError, ValueError, KeyError):
            return False

    if current():
        return out
    OUTPUT.mkdir(parents=True, exist_ok=True)
    with open(OUTPUT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if current():
            return out
        try:
            maven.package(SOURCES / "pom.xml", what="benchmarks/java/streams", projects=["streams"], timeout=timeout)
        except maven.MavenError as exc:
            raise StreamsAppError(str(exc)) from None
        stamp.write_text(json.dumps({"digest": digest}))
    return out


def java_command(main_class: str, args: Sequence[object] = (), *,
                 jvm_options: Sequence[str] = JVM_OPTIONS) -> list[str]:
    """``java ... -cp <the module's classpath> main_class args``, building first if needed."""
    out = build()
    return [find_java(), *jvm_options, "-cp", f"{out / (MODULE + '.jar')}:{out / 'lib'}/*", main_class,
            *map(str, args)]


def config_args(configs: Mapping[str, object] | None) -> list[str]:
    """``--config key=value`` for each setting."""
    out: list[str] = []
    for key, value in (configs or {}).items():
        out += ["--config", f"{key}={value}"]
    return out


# --------------------------------------------------------------------------------------
# Lines


_UNESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}


def unescape(field: str) -> str | None:
    """The text of a field the Java side escaped (``\\N`` is null)."""
    if field == "\\N":
        return None
    if "\\" not in field:
        return field
    return _UNESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), m.group(1)), field)


def escape(text: str | None) -> str:
    """A field as the Java side writes it (``Lines.escape``): null is ``\\N``; backslash, tab,
    newline and carriage return are escaped (for Python programs that speak the same lines)."""
    if text is None:
        return "\\N"
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


class _LineFile:
    """The complete lines appended to a file since the last read, split at tabs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read_new(self) -> list[list[str]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._partial + data
        complete, newline, self._partial = data.rpartition(b"\n")
        if not newline:
            return []
        return [line.split("\t") for line in complete.decode("utf-8", "replace").split("\n")]


# --------------------------------------------------------------------------------------
# Processes


def _wait(condition: Callable[[], bool], timeout: float, what: Callable[[], str],
          check: Callable[[], None] = lambda: None, interval: float = 0.1) -> None:
    """Poll ``condition`` until it holds; ``check`` raises at once when waiting is pointless
    (the process died). Bounded by ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return
        check()
        if time.monotonic() >= deadline:
            raise StreamsAppError(f"{what()} did not happen within {timeout:g} s")
        time.sleep(interval)


class JavaProcess:
    """One program of the module, started any number of times (one launch after another,
    never two at once); its stdout lines are parsed by :meth:`_on_line` as they come."""

    main_class = ""

    def __init__(self, name: str, args: Sequence[object], workdir: Path, *,
                 jvm_options: Sequence[str] = JVM_OPTIONS) -> None:
        self.name = name
        self.args = [str(a) for a in args]
        self.workdir = Path(workdir)
        self.jvm_options = tuple(jvm_options)
        self.process: subprocess.Popen[bytes] | None = None
        self.launches = 0
        self.killed = 0
        self._readers: list[_LineFile] = []
        self._files: list[IO[bytes]] = []

    # -- life cycle ------------------------------------------------------------------

    def start(self) -> JavaProcess:
        """Start a new launch (the previous one must have ended)."""
        if self.alive:
            raise StreamsAppError(f"{self.name} is already running (pid {self.pid})")
        command = self.command()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.refresh()  # the earlier launches' last lines, while they are still the current one's
        self._launch_started()
        self.launches += 1
        out = open(self.stdout_path, "wb")
        err = open(self.stderr_path, "wb")
        self._files += [out, err]
        self._readers.append(_LineFile(self.stdout_path))
        self.process = spawn(command, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=self.workdir,
                             env=self.environment())
        return self

    def command(self) -> list[str]:
        """The command line of a launch (a subclass may run another program than a JVM)."""
        return java_command(self.main_class, self.args, jvm_options=self.jvm_options)

    def environment(self) -> dict[str, str] | None:
        """The environment of a launch (None: this process's)."""
        return None

    def _launch_started(self) -> None:
        """A new launch is about to begin (for subclasses to reset per-launch state)."""

    @property
    def stdout_path(self) -> Path:
        return self.workdir / f"{self.name}-{self.launches}.out"

    @property
    def stderr_path(self) -> Path:
        return self.workdir / f"{self.name}-{self.launches}.err"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def kill(self) -> None:
        """SIGKILL this launch by its PID, as a crash would, and reap it."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
            self.killed += 1
        self.refresh()

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (the program closes its clients and exits), SIGKILL past ``timeout``;
        the exit code (None if it was never started)."""
        if self.process is None:
            return None
        code = terminate(self.process, timeout)
        self.refresh()
        return code

    def close(self, timeout: float = 10.0) -> None:
        """Stop the current launch if it runs, and close the output files."""
        self.stop(timeout)
        for f in self._files:
            f.close()
        self._files.clear()

    def __enter__(self) -> JavaProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- output ----------------------------------------------------------------------

    def refresh(self) -> None:
        """Parse the lines every launch has written since the last call."""
        for launch, reader in enumerate(self._readers, start=1):
            for fields in reader.read_new():
                if fields and fields[0]:
                    self._on_line(fields, launch)

    def _on_line(self, fields: list[str], launch: int) -> None:
        raise NotImplementedError

    def stderr_tail(self, lines: int = 30) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace")
        except OSError:
            return "(no stderr)"
        return "\n".join(text.strip().splitlines()[-lines:]) or "(stderr empty)"

    def check_alive(self) -> None:
        """Raise StreamsAppError if the current launch has exited."""
        if self.process is not None and self.process.poll() is not None:
            self.refresh()
            raise StreamsAppError(f"{self.name} (pid {self.pid}) exited with code {self.process.returncode}; "
                                  f"stderr {self.stderr_path}:\n{self.stderr_tail()}")


# -- KeyCountApp ----------------------------------------------------------------------


class StreamsInstance(JavaProcess):
    """One ``KeyCountApp`` JVM; started again (after a kill or a stop) on the same state
    directory, it keeps its Streams process id and so its transactional ids.

    ``cache_max_bytes=0`` turns the record cache off: every record then writes its count to
    the store, the changelog and the output inside the open transaction, so a kill leaves
    the most to abort (with the cache, counts reach them only at a commit, which makes even
    at_least_once nearly exact after a kill).

    Parsed lines: ``state`` sets :attr:`state` (of the current launch) and appends to
    :attr:`states`; ``progress`` sets :attr:`processed`; ``error`` appends to :attr:`errors`;
    ``stopped`` sets :attr:`stopped_clean`.
    """

    main_class = KEY_COUNT_APP

    def __init__(self, name: str, *, bootstrap: str, input_topic: str, output_topic: str, application_id: str,
                 state_dir: Path, workdir: Path, threads: int = 1, commit_interval_ms: int = 100,
                 delay_us: int = 0, replication_factor: int = 1, min_insync_replicas: int | None = None,
                 output_partitions: int | None = None, store: str = "rocksdb",
                 guarantee: str = "exactly_once_v2", instance_id: str | None = None, progress_ms: int = 1000,
                 close_timeout_ms: int = 30_000, cache_max_bytes: int | None = None,
                 configs: Mapping[str, object] | None = None, extra_args: Sequence[str] = (),
                 jvm_options: Sequence[str] = JVM_OPTIONS) -> None:
        args: list[object] = [
            "--bootstrap", bootstrap, "--input", input_topic, "--output", output_topic,
            "--application-id", application_id, "--state-dir", state_dir, "--threads", threads,
            "--commit-interval-ms", commit_interval_ms, "--delay-us", delay_us,
            "--replication-factor", replication_factor, "--store", store, "--guarantee", guarantee,
            "--progress-ms", progress_ms, "--close-timeout-ms", close_timeout_ms,
        ]
        if min_insync_replicas is not None:
            args += ["--min-insync-replicas", min_insync_replicas]
        if output_partitions is not None:
            args += ["--output-partitions", output_partitions]
        if instance_id is not None:
            args += ["--instance-id", instance_id]
        if cache_max_bytes is not None:  # 0: every count goes to the store, changelog and output at once
            configs = {"statestore.cache.max.bytes": cache_max_bytes, **(configs or {})}
        super().__init__(name, [*args, *config_args(configs), *extra_args], workdir, jvm_options=jvm_options)
        self.bootstrap = bootstrap
        self.output_topic = output_topic
        self.application_id = application_id
        self.state_dir = Path(state_dir)
        self.close_timeout = close_timeout_ms / 1000
        self.state: str | None = None
        self.states: list[tuple[int, str]] = []  # (launch, state) in order
        self.processed = 0  # by the current launch, as of its last progress line
        self.processed_before = 0  # by the earlier launches
        self.errors: list[tuple[int, str]] = []  # (launch, "thread: Class: message")
        self.stopped_clean: bool | None = None

    def _launch_started(self) -> None:
        self.processed_before += self.processed
        self.processed = 0
        self.state = None
        self.stopped_clean = None

    def _on_line(self, fields: list[str], launch: int) -> None:
        kind = fields[0]
        current = launch == self.launches
        if kind == "state" and len(fields) >= 3:
            self.states.append((launch, fields[2]))
            if current:
                self.state = fields[2]
        elif kind == "progress" and len(fields) >= 3 and current:
            self.processed = int(fields[2])
        elif kind == "error" and len(fields) >= 4:
            self.errors.append((launch, f"{unescape(fields[2])}: {unescape(fields[3])}"))
        elif kind == "stopped" and len(fields) >= 4 and current:
            self.processed = int(fields[2])
            self.stopped_clean = fields[3] == "true"

    @property
    def processed_total(self) -> int:
        """Records handed to the counting step by every launch (re-processing included)."""
        return self.processed_before + self.processed

    def running(self) -> bool:
        self.refresh()
        return self.alive and self.state == "RUNNING"

    def wait_running(self, timeout: float = 60.0) -> None:
        """Wait until this launch's latest state is RUNNING; fail at once if it exits."""
        _wait(self.running, timeout, lambda: f"{self.name} reaching RUNNING (state {self.state})", self.check_alive)

    def wait_processed(self, records: int, timeout: float = 60.0) -> None:
        """Wait until this launch reported at least ``records`` processed."""
        def enough() -> bool:
            self.refresh()
            return self.processed >= records
        _wait(enough, timeout, lambda: f"{self.name} processing {records} records (at {self.processed})",
              self.check_alive)

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM: the instance commits, leaves the group and exits (0 when its close ended
        in time); SIGKILL past ``timeout`` (default its close timeout plus 10 s)."""
        return super().stop(self.close_timeout + 10 if timeout is None else timeout)


class StreamsFleet:
    """N ``KeyCountApp`` instances of one application, each with its own state directory
    (``<workdir>/<name>-state``), named ``<application_id>-<i>``."""

    def __init__(self, size: int, *, bootstrap: str, input_topic: str, output_topic: str, workdir: Path,
                 application_id: str | None = None, **options: Any) -> None:
        self.application_id = application_id or f"keycount-{uuid.uuid4().hex[:8]}"
        self.bootstrap = bootstrap
        self.input_topic = input_topic
        self.output_topic = output_topic
        self.workdir = Path(workdir)
        self.instances = [
            StreamsInstance(f"{self.application_id}-{i}", bootstrap=bootstrap, input_topic=input_topic,
                            output_topic=output_topic, application_id=self.application_id,
                            state_dir=self.workdir / f"{self.application_id}-{i}-state", workdir=self.workdir,
                            **options)
            for i in range(size)
        ]

    def __getitem__(self, index: int) -> StreamsInstance:
        return self.instances[index]

    def __len__(self) -> int:
        return len(self.instances)

    def __iter__(self) -> Iterator[StreamsInstance]:
        return iter(self.instances)

    def start(self) -> StreamsFleet:
        for instance in self.instances:
            instance.start()
        return self

    def wait_running(self, timeout: float = 90.0) -> None:
        """Wait until every running instance's latest state is RUNNING at once; fail at once
        if one exits."""
        def all_running() -> bool:
            return all(i.running() for i in self.instances if i.process is not None)

        _wait(all_running, timeout,
              lambda: "all instances RUNNING (" + ", ".join(f"{i.name} {i.state}" for i in self.instances) + ")",
              self.check_alive)

    def check_alive(self) -> None:
        """Raise StreamsAppError if an instance exited that was not killed or stopped."""
        for instance in self.instances:
            instance.check_alive()

    def processed(self) -> int:
        for instance in self.instances:
            instance.refresh()
        return sum(i.processed_total for i in self.instances)

    def errors(self) -> list[str]:
        for instance in self.instances:
            instance.refresh()
        return [f"{i.name}#{launch} {text}" for i in self.instances for launch, text in i.errors]

    def stop(self, timeout: float | None = None) -> list[int | None]:
        """SIGTERM every instance at once, then wait for each; their exit codes."""
        for instance in self.instances:
            if instance.alive and instance.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    instance.process.send_signal(signal.SIGTERM)
        return [instance.stop(timeout) for instance in self.instances]

    def close(self) -> None:
        self.stop()
        for instance in self.instances:
            instance.close()

    def __enter__(self) -> StreamsFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the output ------------------------------------------------------------------------


def read_to_end(bootstrap: str, topic: str, *, isolation: str = "read_committed",
                timeout: float = 30.0) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """(partition, offset, key, value) of every record of ``topic`` from the start to the
    end each partition had when the read began: the last stable offset with
    ``read_committed`` (librdkafka's watermark query honours the isolation level; an open
    transaction holds it back), the high watermark with ``read_uncommitted``. Raises
    TimeoutError past ``timeout``, KafkaException for a topic that cannot be read."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-to-end-{uuid.uuid4().hex}",
                         "isolation.level": isolation, "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    deadline = time.monotonic() + timeout
    try:
        described = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if described is None or described.error is not None:
            raise KafkaException(described.error if described is not None
                                 else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
        ends: dict[int, int] = {}
        for partition in sorted(described.partitions):
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                     timeout=max(0.1, deadline - time.monotonic()), cached=False)
            ends[partition] = high
        todo = {p for p, end in ends.items() if end > 0}
        out: list[tuple[int, int, bytes | None, bytes | None]] = []
        if not todo:
            return out
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(todo)])
        while todo:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"reading {topic} ({isolation}) to {ends} took longer than {timeout:g} s; "
                                   f"partitions {sorted(todo)} not read to the end")
            for message in consumer.consume(num_messages=1000, timeout=min(left, 1.0)):
                error = message.error()
                partition = message.partition() or 0
                offset = message.offset() or 0
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        if offset >= ends.get(partition, 0):
                            todo.discard(partition)
                        continue
                    raise KafkaException(error)
                if partition in todo and offset < ends[partition]:
                    out.append((partition, offset, message.key(), message.value()))
                if offset + 1 >= ends.get(partition, 0):
                    todo.discard(partition)
        return out
    finally:
        consumer.close()


def read_counts(bootstrap: str, topic: str, *, timeout: float = 30.0) -> dict[str, int]:
    """The last count of each key in ``topic`` (KeyCountApp's output), read with
    ``isolation.level=read_committed`` from the start to the last stable offset each
    partition had when the read began (``read_to_end``). An open transaction holds that
    offset back: call it once every transaction has ended (the instances stopped, or killed
    ones restarted) for the final counts."""
    from confluent_kafka import KafkaException

    try:
        records = read_to_end(bootstrap, topic, isolation="read_committed", timeout=timeout)
    except (TimeoutError, KafkaException) as exc:
        raise StreamsAppError(f"cannot read {topic} to its last stable offsets: {exc}") from exc
    counts: dict[str, int] = {}
    for _partition, _offset, key, value in records:
        if key is not None and value is not None:
            counts[key.decode()] = int(value.decode())
    return counts


# -- the plain producer and consumer ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProducedAck:
    partition: int
    offset: int
    key: str
    seq: int


class PlainProducerProcess(JavaProcess):
    """``PlainProducer``: ``records`` records keyed ``k<i mod keys>``, value ``<i>``, at
    ``rate`` per second (0: unpaced), acks=all and idempotent.

    Lines parsed: ``ack partition offset key i`` into :attr:`acks`, ``fail key i error``
    into :attr:`failures`, ``done ms sent acked failed`` sets :attr:`done`.
    """

    main_class = PLAIN_PRODUCER

    def __init__(self, bootstrap: str, topic: str, *, records: int, workdir: Path, name: str = "producer",
                 keys: int = 100, rate: float = 0, first: int = 0, partition: int | None = None,
                 value_bytes: int = 0, configs: Mapping[str, object] | None = None,
                 jvm_options: Sequence[str] = JVM_OPTIONS) -> None:
        args: list[object] = ["--bootstrap", bootstrap, "--topic", topic, "--records", records, "--keys", keys,
                              "--rate", rate, "--first", first, "--value-bytes", value_bytes]
        if partition is not None:
            args += ["--partition", partition]
        super().__init__(name, [*args, *config_args(configs)], workdir, jvm_options=jvm_options)
        self.topic = topic
        self.acks: list[ProducedAck] = []
        self.failures: list[tuple[str, int, str]] = []  # (key, i, error)
        self.done: tuple[int, int, int] | None = None  # (sent, acked, failed)
        self._fed = 0

    def _on_line(self, fields: list[str], launch: int) -> None:
        kind = fields[0]
        if kind == "ack" and len(fields) >= 5:
            self.acks.append(ProducedAck(int(fields[1]), int(fields[2]), unescape(fields[3]) or "", int(fields[4])))
        elif kind == "fail" and len(fields) >= 4:
            self.failures.append((unescape(fields[1]) or "", int(fields[2]), unescape(fields[3]) or ""))
        elif kind == "done" and len(fields) >= 5:
            self.done = (int(fields[2]), int(fields[3]), int(fields[4]))

    def wait_done(self, timeout: float = 120.0) -> tuple[int, int, int]:
        """Wait for the ``done`` line; ``(sent, acked, failed)``."""
        def finished() -> bool:
            self.refresh()
            return self.done is not None

        _wait(finished, timeout, lambda: f"{self.name} finishing ({len(self.acks)} acknowledged)",
              self.check_alive)
        self.stop(10.0)
        assert self.done is not None
        return self.done

    def feed(self, history: Any) -> int:
        """Add the acknowledgements not added yet to ``history`` (a History), key and value
        as bytes (the value as sent, without padding); how many were added."""
        self.refresh()
        new = self.acks[self._fed:]
        for ack in new:
            history.ack(self.topic, ack.partition, ack.offset, ack.key.encode(), str(ack.seq).encode())
        self._fed += len(new)
        return len(new)


@dataclass(frozen=True, slots=True)
class ConsumedRecord:
    topic: str
    partition: int
    offset: int
    key: str | None
    value: str | None
    launch: int
    time: float | None = None  # when the poll returned it, on the time.monotonic() clock


_VIRTUAL = re.compile(r"^(.+)\.kr([1-9][0-9]*)$")


def real_partition(topic: str, partition: int, suffix: str = ".kr", coop_suffix: str = ".coop") -> tuple[str, int]:
    """The real (topic, partition) of a virtual topic's partition (``orders.kr4`` or
    ``orders.coop4`` partition v is share ``v % 4`` of ``orders`` partition ``v // 4``);
    others unchanged."""
    for mark in (suffix, coop_suffix):
        pattern = _VIRTUAL if mark == ".kr" else re.compile(rf"^(.+){re.escape(mark)}([1-9][0-9]*)$")
        match = pattern.match(topic)
        if match is not None:
            return match.group(1), partition // int(match.group(2))
    return topic, partition


class PlainConsumerProcess(JavaProcess):
    """``PlainConsumer``: a KafkaConsumer of ``group`` subscribed to ``topic``, committing
    with commitSync after each poll.

    Lines parsed: ``rec`` into :attr:`records` (every launch), ``commit`` into
    :attr:`committed` (the last offset per (topic, partition)), ``assigned``, ``revoked``
    and ``lost`` into :attr:`assignment` (of the current launch) and
    :attr:`rebalances`, ``commitfail`` and ``error`` into :attr:`errors`.
    """

    main_class = PLAIN_CONSUMER

    def __init__(self, bootstrap: str, topic: str, group: str, *, workdir: Path, name: str = "consumer",
                 max_poll_records: int = 500, isolation: str = "read_uncommitted", poll_ms: int = 200,
                 max_seconds: int = 3600, configs: Mapping[str, object] | None = None,
                 jvm_options: Sequence[str] = JVM_OPTIONS) -> None:
        args: list[object] = ["--bootstrap", bootstrap, "--topic", topic, "--group", group, "--client-id", name,
                              "--max-poll-records", max_poll_records, "--isolation", isolation,
                              "--poll-ms", poll_ms, "--max-seconds", max_seconds]
        super().__init__(name, [*args, *config_args(configs)], workdir, jvm_options=jvm_options)
        self.records: list[ConsumedRecord] = []
        self.committed: dict[tuple[str, int], int] = {}
        self.assignment: set[tuple[str, int]] = set()
        self.joined = False  # the current launch got its first assignment (maybe empty)
        self.rebalances = 0
        self.errors: list[str] = []
        self._fed = 0

    def _launch_started(self) -> None:
        self.assignment = set()
        self.joined = False

    @staticmethod
    def _partitions(field: str) -> set[tuple[str, int]]:
        out = set()
        for item in (unescape(field) or "").split(","):
            if item:
                topic, _, partition = item.rpartition(":")
                out.add((topic, int(partition)))
        return out

    def _on_line(self, fields: list[str], launch: int) -> None:
        kind = fields[0]
        current = launch == self.launches
        if kind == "rec" and len(fields) >= 6:
            self.records.append(ConsumedRecord(unescape(fields[1]) or "", int(fields[2]), int(fields[3]),
                                               unescape(fields[4]), unescape(fields[5]), launch,
                                               float(fields[6]) if len(fields) >= 7 else None))
        elif kind == "commit" and len(fields) >= 4:
            tp = (unescape(fields[1]) or "", int(fields[2]))
            self.committed[tp] = max(self.committed.get(tp, 0), int(fields[3]))
        elif kind in ("assigned", "revoked", "lost") and len(fields) >= 3:
            if current:
                partitions = self._partitions(fields[2])
                if kind == "assigned":
                    self.assignment |= partitions
                    self.joined = True
                    self.rebalances += 1
                else:
                    self.assignment -= partitions
        elif kind in ("commitfail", "error") and len(fields) >= 3:
            self.errors.append(f"{kind}: {unescape(fields[2])}")

    def wait_joined(self, timeout: float = 60.0, *, nonempty: bool = False) -> None:
        """Wait until this launch got an assignment (with ``nonempty``, one with partitions)."""
        def joined() -> bool:
            self.refresh()
            return self.joined and (bool(self.assignment) or not nonempty)

        _wait(joined, timeout, lambda: f"{self.name} joining its group (assignment {sorted(self.assignment)})",
              self.check_alive)

    def feed(self, history: Any, *, virtual: bool = False) -> int:
        """Add the deliveries not added yet to ``history`` (a History) as handed out to this
        consumer (member ``<name>#<launch>``); with ``virtual``, partitions of ``T.krK``
        are named by their real topic and partition, as the producer's acks are. How many
        were added."""
        self.refresh()
        new = self.records[self._fed:]
        for record in new:
            topic, partition = (real_partition(record.topic, record.partition) if virtual
                                else (record.topic, record.partition))
            history.deliver(f"{self.name}#{record.launch}", topic, partition, record.offset,
                            None if record.key is None else record.key.encode())
        self._fed += len(new)
        return len(new)


# -- TxnRelay ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TxnRange:
    """The records of one input partition in one transaction: offsets ``first``..``last``."""

    topic: str
    partition: int
    first: int
    last: int


@dataclass(frozen=True, slots=True)
class TxnEvent:
    """A transaction that ended, from a ``commit`` or ``abort`` line. ``writer`` is what the
    transaction's output records carry (``<transactional id>/<pid>/<txn>``); ``reason`` is
    ``planned`` for an abort on purpose, else the error that aborted it (None: committed)."""

    launch: int
    txn: int
    records: int
    ranges: tuple[TxnRange, ...]
    writer: str
    reason: str | None = None

    @property
    def committed(self) -> bool:
        return self.reason is None

    @property
    def planned(self) -> bool:
        return self.reason == "planned"


def parse_ranges(field: str) -> tuple[TxnRange, ...]:
    """``topic:partition:first:last`` items separated by commas (escaped as one field)."""
    out = []
    for item in (unescape(field) or "").split(","):
        if item:
            topic, partition, first, last = item.rsplit(":", 3)
            out.append(TxnRange(topic, int(partition), int(first), int(last)))
    return tuple(out)


class TxnRelayProcess(JavaProcess):
    """``TxnRelay``: a transactional consume-transform-produce member of ``group`` reading
    ``input_topic`` (read_committed) and writing one record per input record to
    ``output_topic``, every ``abort_every``-th transaction aborted on purpose and redone.

    The transactional id defaults to ``<group>-<name>``: unique per instance, the same for
    each of its launches, so a launch started after a kill fences the killed one and aborts
    its open transaction at once.

    Lines parsed: ``start`` (the launch's pid, :attr:`pids`), ``ready``, ``assigned``,
    ``revoked`` and ``lost`` into :attr:`assignment` (of the current launch), ``begin``
    (:meth:`in_transaction`), ``commit`` and ``abort`` into :attr:`transactions`, ``error`` and ``fatal`` into :attr:`errors` and
    :attr:`fatal`, ``stopped`` into :attr:`stopped`.
    """

    main_class = TXN_RELAY

    def __init__(self, bootstrap: str, input_topic: str, output_topic: str, group: str, *, workdir: Path,
                 name: str = "relay", transactional_id: str | None = None, abort_every: int = 5,
                 delay_ms: int = 0, max_poll_records: int = 100, poll_ms: int = 200, max_seconds: int = 3600,
                 close_timeout_ms: int = 10_000, configs: Mapping[str, object] | None = None,
                 jvm_options: Sequence[str] = JVM_OPTIONS) -> None:
        self.transactional_id = transactional_id or f"{group}-{name}"
        args: list[object] = ["--bootstrap", bootstrap, "--input", input_topic, "--output", output_topic,
                              "--group", group, "--transactional-id", self.transactional_id, "--client-id", name,
                              "--abort-every", abort_every, "--delay-ms", delay_ms,
                              "--max-poll-records", max_poll_records, "--poll-ms", poll_ms,
                              "--max-seconds", max_seconds, "--close-timeout-ms", close_timeout_ms]
        super().__init__(name, [*args, *config_args(configs)], workdir, jvm_options=jvm_options)
        self.bootstrap = bootstrap
        self.input_topic = input_topic
        self.output_topic = output_topic
        self.group = group
        self.close_timeout = close_timeout_ms / 1000
        self.pids: dict[int, int] = {}  # launch -> pid, from its start line
        self.ready = False  # the current launch's producer is initialised
        self.assignment: set[tuple[str, int]] = set()
        self.joined = False  # the current launch got its first assignment (maybe empty)
        self.rebalances = 0
        self.transactions: list[TxnEvent] = []  # every launch's, in order
        self.begun = 0  # the current launch's last transaction begun
        self.ended = 0  # the current launch's last transaction committed or aborted
        self.errors: list[tuple[int, str]] = []  # (launch, "Class: message")
        self.fatal: list[tuple[int, str]] = []
        self.stopped: tuple[int, int, int, int] | None = None  # committed, records, aborted, records

    def _launch_started(self) -> None:
        self.ready = False
        self.begun = self.ended = 0
        self.assignment = set()
        self.joined = False
        self.stopped = None

    def _writer(self, launch: int, txn: int) -> str:
        return f"{self.transactional_id}/{self.pids.get(launch, 0)}/{txn}"

    def _on_line(self, fields: list[str], launch: int) -> None:
        kind = fields[0]
        current = launch == self.launches
        if kind == "start" and len(fields) >= 4:
            self.pids[launch] = int(fields[3])
        elif kind == "ready" and current:
            self.ready = True
        elif kind in ("assigned", "revoked", "lost") and len(fields) >= 3:
            if current:
                partitions = PlainConsumerProcess._partitions(fields[2])
                if kind == "assigned":
                    self.assignment |= partitions
                    self.joined = True
                    self.rebalances += 1
                else:
                    self.assignment -= partitions
        elif kind == "begin" and len(fields) >= 3 and current:
            self.begun = int(fields[2])
        elif kind == "commit" and len(fields) >= 5:
            txn = int(fields[2])
            if current:
                self.ended = txn
            self.transactions.append(TxnEvent(launch, txn, int(fields[3]), parse_ranges(fields[4]),
                                              self._writer(launch, txn)))
        elif kind == "abort" and len(fields) >= 6:
            txn = int(fields[2])
            if current:
                self.ended = txn
            self.transactions.append(TxnEvent(launch, txn, int(fields[3]), parse_ranges(fields[4]),
                                              self._writer(launch, txn), unescape(fields[5]) or "?"))
        elif kind == "error" and len(fields) >= 3:
            self.errors.append((launch, unescape(fields[2]) or ""))
        elif kind == "fatal" and len(fields) >= 3:
            self.fatal.append((launch, unescape(fields[2]) or ""))
        elif kind == "stopped" and len(fields) >= 6 and current:
            self.stopped = (int(fields[2]), int(fields[3]), int(fields[4]), int(fields[5]))

    # -- what it did -------------------------------------------------------------------

    def in_transaction(self) -> bool:
        """The current launch has begun a transaction that has not ended (by its lines)."""
        self.refresh()
        return self.begun > self.ended

    def open_writer(self) -> str | None:
        """The writer of the current launch's open transaction (see :meth:`in_transaction`),
        as its output records name it; None when none is open."""
        return self._writer(self.launches, self.begun) if self.in_transaction() else None

    def committed(self) -> list[TxnEvent]:
        self.refresh()
        return [t for t in self.transactions if t.committed]

    def aborted(self, *, planned: bool | None = None) -> list[TxnEvent]:
        """The aborted transactions (only those aborted on purpose with ``planned=True``,
        only the others with ``planned=False``)."""
        self.refresh()
        return [t for t in self.transactions if not t.committed and (planned is None or t.planned == planned)]

    def problems(self, limit: int = 3) -> str:
        """The last fatal and error lines, for an assertion message."""
        self.refresh()
        parts = [f"fatal#{launch}: {text}" for launch, text in self.fatal[-limit:]]
        parts += [f"error#{launch}: {text}" for launch, text in self.errors[-limit:]]
        parts += [f"aborted#{t.launch} txn {t.txn}: {t.reason}" for t in self.aborted(planned=False)[-limit:]]
        return "; ".join(parts) or "no error reported"

    def summary(self) -> str:
        committed = self.committed()
        aborted = self.aborted()
        return (f"{self.name}: {len(committed)} transactions committed ({sum(t.records for t in committed)} "
                f"records), {len(aborted)} aborted ({sum(t.planned for t in aborted)} on purpose), "
                f"assignment {sorted(self.assignment)}")

    # -- waiting -----------------------------------------------------------------------

    def check_alive(self) -> None:
        """Raise StreamsAppError if the current launch has exited, with its fatal lines."""
        try:
            super().check_alive()
        except StreamsAppError as exc:
            raise StreamsAppError(f"{self.name}: {self.problems()}\n{exc}") from None

    def wait_joined(self, timeout: float = 60.0, *, nonempty: bool = False) -> None:
        """Wait until this launch got an assignment (with ``nonempty``, one with partitions)."""
        def joined() -> bool:
            self.refresh()
            return self.joined and (bool(self.assignment) or not nonempty)

        _wait(joined, timeout, lambda: f"{self.name} joining its group (assignment {sorted(self.assignment)})",
              self.check_alive)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until this launch's producer is initialised (``initTransactions`` returned:
        a previous launch with the same transactional id is fenced, its transaction aborted)."""
        def ready() -> bool:
            self.refresh()
            return self.ready

        _wait(ready, timeout, lambda: f"{self.name} initialising its transactions ({self.problems()})",
              self.check_alive)

    def wait_committed(self, transactions: int = 1, timeout: float = 60.0) -> None:
        """Wait until ``transactions`` transactions were committed (by every launch)."""
        _wait(lambda: len(self.committed()) >= transactions, timeout,
              lambda: f"{self.name} committing {transactions} transaction(s) ({self.summary()}; {self.problems()})",
              self.check_alive)

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM: the current transaction ends, consumer and producer close (0); SIGKILL
        past ``timeout`` (default twice the close timeout plus 10 s)."""
        return super().stop(2 * self.close_timeout + 10 if timeout is None else timeout)


class TxnFleet:
    """Transactional relay members of one group (``TxnRelayProcess`` or any subclass that
    writes the same lines, such as the librdkafka member of
    ``harness.rdkafka_txn_member``)."""

    def __init__(self, members: Sequence[TxnRelayProcess]) -> None:
        self.members = list(members)

    @classmethod
    def relays(cls, size: int, bootstrap: str, input_topic: str, output_topic: str, group: str, *,
               workdir: Path, **options: Any) -> TxnFleet:
        """``size`` ``TxnRelay`` JVMs named ``relay-<i>``."""
        return cls([TxnRelayProcess(bootstrap, input_topic, output_topic, group, workdir=workdir, name=f"relay-{i}",
                                    **options) for i in range(size)])

    def __getitem__(self, index: int) -> TxnRelayProcess:
        return self.members[index]

    def __len__(self) -> int:
        return len(self.members)

    def __iter__(self) -> Iterator[TxnRelayProcess]:
        return iter(self.members)

    def start(self) -> TxnFleet:
        for member in self.members:
            member.start()
        return self

    def check_alive(self) -> None:
        for member in self.members:
            member.check_alive()

    def wait_assigned(self, partitions: set[tuple[str, int]], timeout: float = 60.0) -> None:
        """Wait until the running members own ``partitions`` between them, each at least one
        when there are enough; fail at once if one exits."""
        running = [m for m in self.members if m.process is not None]

        def balanced() -> bool:
            for member in running:
                member.refresh()
            owned = [m.assignment for m in running]
            enough = len(partitions) >= len(running)
            return (set().union(*owned) == partitions if owned else not partitions) and (
                all(owned) or not enough)

        _wait(balanced, timeout, lambda: "the members sharing " + ", ".join(f"{t}:{p}" for t, p in sorted(partitions))
              + " (" + "; ".join(f"{m.name} {sorted(m.assignment)}" for m in running) + ")", self.check_alive)

    def transactions(self) -> list[TxnEvent]:
        for member in self.members:
            member.refresh()
        return [t for m in self.members for t in m.transactions]

    def aborted_writers(self) -> set[str]:
        """The writers of every aborted transaction: none of their output may be committed."""
        return {t.writer for t in self.transactions() if not t.committed}

    def aborted_ranges(self) -> list[tuple[str, int, int, int]]:
        """``(topic, partition, first, last)`` of the input read by every aborted transaction."""
        return [(r.topic, r.partition, r.first, r.last) for t in self.transactions() if not t.committed
                for r in t.ranges]

    def summary(self) -> str:
        return "; ".join(m.summary() for m in self.members)

    def problems(self) -> str:
        return " | ".join(f"{m.name}: {m.problems()}" for m in self.members)

    def stop(self, timeout: float | None = None) -> list[int | None]:
        """SIGTERM every member at once, then wait for each; their exit codes."""
        for member in self.members:
            if member.alive and member.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    member.process.send_signal(signal.SIGTERM)
        return [member.stop(timeout) for member in self.members]

    def close(self) -> None:
        for member in self.members:
            member.close()

    def __enter__(self) -> TxnFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------
# Command line


def _cmd_build(args: argparse.Namespace) -> int:
    print(build())
    return 0


def _cmd_keycount(args: argparse.Namespace) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="keycount-"))
    configs = dict(kv.split("=", 1) for kv in args.config)
    with StreamsFleet(args.instances, bootstrap=args.bootstrap, input_topic=args.input, output_topic=args.output,
                      workdir=workdir, application_id=args.application_id, threads=args.threads,
                      delay_us=args.delay_us, replication_factor=args.replication_factor,
                      configs=configs) as fleet:
        fleet.start()
        print(f"{len(fleet)} instance(s) of {fleet.application_id}, output in {workdir}", flush=True)
        fleet.wait_running(args.timeout)
        print("RUNNING", flush=True)
        while not stop.wait(args.progress):
            fleet.check_alive()
            print(f"processed {fleet.processed()}", flush=True)
    return 0


def _cmd_counts(args: argparse.Namespace) -> int:
    counts = read_counts(args.bootstrap, args.topic, timeout=args.timeout)
    print(json.dumps({"keys": len(counts), "total": sum(counts.values()), "counts": counts}, sort_keys=True))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.streams_app")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build benchmarks/java/streams (only when it changed)").set_defaults(func=_cmd_build)
    run = sub.add_parser("keycount", help="run KeyCountApp instances until Ctrl-C or SIGTERM")
    run.add_argument("--bootstrap", required=True)
    run.add_argument("--input", required=True)
    run.add_argument("--output", required=True)
    run.add_argument("--application-id")
    run.add_argument("--instances", type=int, default=1)
    run.add_argument("--threads", type=int, default=1)
    run.add_argument("--delay-us", type=int, default=0)
    run.add_argument("--replication-factor", type=int, default=1)
    run.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    run.add_argument("--workdir", help="state directories and logs (default: a new temporary directory)")
    run.add_argument("--timeout", type=float, default=120.0, help="seconds to reach RUNNING")
    run.add_argument("--progress", type=float, default=5.0, help="seconds between progress lines")
    run.set_defaults(func=_cmd_keycount)
    counts = sub.add_parser("counts", help="print the committed last count of each key of an output topic")
    counts.add_argument("--bootstrap", required=True)
    counts.add_argument("--topic", required=True)
    counts.add_argument("--timeout", type=float, default=60.0)
    counts.set_defaults(func=_cmd_counts)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except LocalKafkaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
