"""Run Apache Kafka's own Java command-line tools from the harness jars.

Each call is ``java -cp '<libs>/*' <main class> <args>`` with the jars fetched by
:func:`harness.kafka_cluster.fetch_tools_jars`, warnings only on stderr (kafka-dist/tools-log4j2.properties),
and a timeout.  The helpers return :class:`subprocess.CompletedProcess` with text stdout and
stderr and raise :class:`JavaToolError` on a non-zero exit unless ``check=False``.

Main classes, checked against the kafka-tools and kafka_2.13 jars of the pinned version:
ProducerPerformance, ConsumerPerformance and TopicCommand in ``org.apache.kafka.tools``,
ConsoleConsumer in ``org.apache.kafka.tools.consumer``, ConsumerGroupCommand in
``org.apache.kafka.tools.consumer.group``, ConfigCommand in ``kafka.admin`` (still in core).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from harness.kafka_cluster import fetch_tools_jars
from harness.processes import spawn
from proxy.local_kafka import LocalKafkaError, java_base_command

PRODUCER_PERFORMANCE = "org.apache.kafka.tools.ProducerPerformance"
CONSUMER_PERFORMANCE = "org.apache.kafka.tools.ConsumerPerformance"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
CONSUMER_GROUP_COMMAND = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
TOPIC_COMMAND = "org.apache.kafka.tools.TopicCommand"
CONFIG_COMMAND = "kafka.admin.ConfigCommand"

TOOL_JVM_OPTIONS = (
    "-Xms64m",
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-Djava.awt.headless=true",
)


def java_command(jvm_options: Sequence[str] = TOOL_JVM_OPTIONS) -> list[str]:
    """``java <options> -cp '<libs>/*'`` with Kafka's tools and broker on the class path, ready
    for a main class and its arguments; the jars fetched first if they are not cached."""
    return java_base_command(log4j_config="tools-log4j2.properties", jvm_options=jvm_options, libs=fetch_tools_jars())


class JavaToolError(LocalKafkaError):
    """A Java tool exited with a non-zero code; the message carries its stderr."""

    def __init__(self, message: str, result: subprocess.CompletedProcess[str]) -> None:
        super().__init__(message)
        self.result = result


def run_java_tool(
    main_class: str,
    args: Sequence[str],
    timeout: float = 120.0,
    *,
    check: bool = True,
    input: str | None = None,
    jvm_options: Sequence[str] = TOOL_JVM_OPTIONS,
) -> subprocess.CompletedProcess[str]:
    """Run ``main_class`` with ``args``; return the finished process with stdout and stderr.

    The JVM dies with this process, and is killed when ``timeout`` passes (raising
    subprocess.TimeoutExpired with whatever it printed so far).
    """
    cmd = [*java_command(jvm_options), main_class, *map(str, args)]
    proc = spawn(
        cmd,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = proc.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        stdout, stderr = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, output=stdout, stderr=stderr) from None
    except BaseException:
        _kill_group(proc)
        proc.wait()
        raise
    result = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    if check and result.returncode != 0:
        short = main_class.rsplit(".", 1)[-1]
        tail = "\n".join((stderr or stdout).strip().splitlines()[-15:])
        raise JavaToolError(f"{short} exited with code {result.returncode}.\n{tail}", result)
    return result


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # spawn() gives each tool its own session
    except ProcessLookupError:
        pass


def _client_config_args(option: str, config: Mapping[str, str] | None) -> list[str]:
    """Write client properties to a temporary file and return ``[option, path]``."""
    if not config:
        return []
    fd, path = tempfile.mkstemp(prefix="kafka-client-", suffix=".properties")
    with os.fdopen(fd, "w") as f:
        f.writelines(f"{k}={v}\n" for k, v in config.items())
    return [option, path]


def _cleanup(args: list[str]) -> None:
    if args:
        Path(args[1]).unlink(missing_ok=True)


def producer_performance(
    bootstrap_servers: str,
    topic: str,
    num_records: int,
    *,
    record_size: int = 100,
    throughput: int = -1,
    producer_props: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    timeout: float = 120.0,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """ProducerPerformance: ``num_records`` records of ``record_size`` bytes (null keys)."""
    props = {"bootstrap.servers": bootstrap_servers, **(producer_props or {})}
    args = [
        "--topic", topic,
        "--num-records", str(num_records),
        "--record-size", str(record_size),
        "--throughput", str(throughput),
        "--command-property", *(f"{k}={v}" for k, v in props.items()),
        *extra_args,
    ]
    return run_java_tool(PRODUCER_PERFORMANCE, args, timeout, check=check)


def consumer_performance(
    bootstrap_servers: str,
    topic: str,
    num_records: int,
    *,
    group: str | None = None,
    consumer_config: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    timeout: float = 120.0,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """ConsumerPerformance: consume ``num_records`` records and print the throughput line."""
    config = _client_config_args("--command-config", consumer_config)
    args = [
        "--bootstrap-server", bootstrap_servers,
        "--topic", topic,
        "--num-records", str(num_records),
        *(["--group", group] if group else []),
        *config,
        *extra_args,
    ]
    try:
        return run_java_tool(CONSUMER_PERFORMANCE, args, timeout, check=check)
    finally:
        _cleanup(config)


def console_consumer(
    bootstrap_servers: str,
    topic: str,
    *,
    max_messages: int | None = None,
    group: str | None = None,
    from_beginning: bool = True,
    timeout_ms: int | None = 30000,
    print_key: bool = False,
    consumer_config: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    timeout: float = 120.0,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """ConsoleConsumer: print records (values, or ``key<TAB>value`` with print_key) to stdout.

    ``timeout_ms`` makes the tool exit once no record arrives for that long; it then exits
    with code 0 if it printed anything up to ``max_messages``.
    """
    config = _client_config_args("--command-config", consumer_config)
    args = ["--bootstrap-server", bootstrap_servers, "--topic", topic]
    if from_beginning:
        args.append("--from-beginning")
    if max_messages is not None:
        args += ["--max-messages", str(max_messages)]
    if group:
        args += ["--group", group]
    if timeout_ms is not None:
        args += ["--timeout-ms", str(timeout_ms)]
    if print_key:
        args += ["--formatter-property", "print.key=true"]
    args += [*config, *extra_args]
    try:
        return run_java_tool(CONSOLE_CONSUMER, args, timeout, check=check)
    finally:
        _cleanup(config)


def consumer_groups(
    bootstrap_servers: str,
    *args: str,
    command_config: Mapping[str, str] | None = None,
    timeout: float = 120.0,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """ConsumerGroupCommand with ``args``, e.g. ``"--describe", "--group", "g"`` or ``"--list"``."""
    config = _client_config_args("--command-config", command_config)
    try:
        return run_java_tool(
            CONSUMER_GROUP_COMMAND,
            ["--bootstrap-server", bootstrap_servers, *args, *config],
            timeout,
            check=check,
        )
    finally:
        _cleanup(config)


def describe_group(bootstrap_servers: str, group: str, **kwargs: object) -> list[dict[str, str]]:
    """``ConsumerGroupCommand --describe --group``, parsed: one dict per row, keyed by column."""
    result = consumer_groups(bootstrap_servers, "--describe", "--group", group, **kwargs)  # type: ignore[arg-type]
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in result.stdout.splitlines():
        cells = line.split()
        if not cells:
            continue
        if cells[0] == "GROUP":
            header = cells
            continue
        if header and len(cells) >= len(header):
            # CLIENT-ID and HOST never contain spaces in our tests; keep the first columns.
            rows.append(dict(zip(header, cells)))
    return rows


def create_topic(
    bootstrap_servers: str,
    topic: str,
    *,
    partitions: int = 1,
    replication_factor: int = 1,
    configs: Mapping[str, str] | None = None,
    command_config: Mapping[str, str] | None = None,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """TopicCommand --create (waits for the topic to be created)."""
    config = _client_config_args("--command-config", command_config)
    args = [
        "--bootstrap-server", bootstrap_servers,
        "--create",
        "--topic", topic,
        "--partitions", str(partitions),
        "--replication-factor", str(replication_factor),
    ]
    for key, value in (configs or {}).items():
        args += ["--config", f"{key}={value}"]
    try:
        return run_java_tool(TOPIC_COMMAND, [*args, *config], timeout)
    finally:
        _cleanup(config)


def topics(
    bootstrap_servers: str, *args: str, timeout: float = 120.0, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """TopicCommand with ``args``, e.g. ``"--describe", "--topic", "t"``."""
    return run_java_tool(
        TOPIC_COMMAND, ["--bootstrap-server", bootstrap_servers, *args], timeout, check=check
    )


def configs(
    bootstrap_servers: str, *args: str, timeout: float = 120.0, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """ConfigCommand with ``args``, e.g. ``"--alter", "--entity-type", "topics", ...``."""
    return run_java_tool(
        CONFIG_COMMAND, ["--bootstrap-server", bootstrap_servers, *args], timeout, check=check
    )
