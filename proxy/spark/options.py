"""The ``keyrange`` source's options, checked on the driver before any task starts.

Spark hands a data source its options as a case-insensitive map of strings. Everything
is parsed here, once, into a plain picklable value, so a bad option fails the query at
planning time with a message that names the option and the value, instead of failing
every task on an executor. Names follow Spark's Kafka source where they mean the same
(docs/wire-contract.md#10-the-spark-source).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Each share is one Spark task holding one connection to the proxy for its whole read,
# and one more copy of the partition's data crossing the proxy's split: past this the
# tasks cost more than they add.
MAX_SPLITS_PER_PARTITION = 1024

ISOLATION_LEVELS = {"read_uncommitted": 0, "read_committed": 1}
OFFSET_SPECS = ("earliest", "latest")

# Spark adds these itself (e.g. ``load(path)``); they mean nothing to this source.
_IGNORED = {"path"}
_KNOWN = {
    "kafka.bootstrap.servers", "subscribe", "startingoffsets", "endingoffsets", "maxoffsetspertrigger",
    "kafka.isolation.level", "splits.per.partition", "commit.group.id", "includeheaders",
    "kafka.request.timeout.ms",
}


class KeyRangeSourceError(ValueError):
    """An option of the ``keyrange`` source is wrong, or what it names cannot be read."""


@dataclass(frozen=True)
class SourceOptions:
    bootstrap_servers: str
    topics: tuple[str, ...]
    starting_offsets: str
    ending_offsets: str
    splits: int
    isolation_level: int
    include_headers: bool
    max_offsets_per_trigger: int | None
    commit_group_id: str | None
    request_timeout_ms: int

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == 1


def parse_options(raw: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """The options as a ``SourceOptions``; raise ``KeyRangeSourceError`` on the first bad one.

    ``streaming`` picks Spark's defaults (``startingOffsets`` is ``earliest`` for a batch
    read and ``latest`` for a stream) and which options make sense at all.
    """
    options = {str(key).lower(): value for key, value in raw.items()}
    unknown = sorted(set(options) - {k.lower() for k in _KNOWN} - _IGNORED)
    if unknown:
        raise KeyRangeSourceError(
            f"keyrange source: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(_KNOWN))}")

    bootstrap = _text(options, "kafka.bootstrap.servers", required=True)
    parse_bootstrap(bootstrap)

    subscribe = _text(options, "subscribe", required=True)
    topics = tuple(t.strip() for t in subscribe.split(","))
    if not all(topics):
        raise KeyRangeSourceError(f"subscribe: {subscribe!r} holds an empty topic name; give 'a,b,c'")
    if len(set(topics)) != len(topics):
        raise KeyRangeSourceError(f"subscribe: {subscribe!r} names a topic twice")

    starting = _choice(options, "startingOffsets", OFFSET_SPECS, "latest" if streaming else "earliest")
    ending = _choice(options, "endingOffsets", OFFSET_SPECS, "latest")
    if streaming and "endingoffsets" in options:
        raise KeyRangeSourceError("endingOffsets: only for batch reads; a stream reads on as data arrives")

    splits = _int(options, "splits.per.partition", 1)
    if not 1 <= splits <= MAX_SPLITS_PER_PARTITION:
        raise KeyRangeSourceError(
            f"splits.per.partition must be between 1 and {MAX_SPLITS_PER_PARTITION}, got {splits}")

    isolation = _choice(options, "kafka.isolation.level", tuple(ISOLATION_LEVELS), "read_uncommitted")

    max_per_trigger = None
    if "maxoffsetspertrigger" in options:
        if not streaming:
            raise KeyRangeSourceError("maxOffsetsPerTrigger: only for streaming reads")
        max_per_trigger = _int(options, "maxOffsetsPerTrigger", 0)
        if max_per_trigger < 1:
            raise KeyRangeSourceError(f"maxOffsetsPerTrigger must be positive, got {max_per_trigger}")

    group = None
    if "commit.group.id" in options:
        if not streaming:
            raise KeyRangeSourceError("commit.group.id: only for streaming reads (commits follow micro-batches)")
        group = _text(options, "commit.group.id", required=True)

    headers = _choice(options, "includeHeaders", ("true", "false"), "false") == "true"
    timeout = _int(options, "kafka.request.timeout.ms", 30_000)
    if not 1 <= timeout <= 3_600_000:
        raise KeyRangeSourceError(f"kafka.request.timeout.ms must be between 1 and 3600000, got {timeout}")

    return SourceOptions(
        bootstrap_servers=bootstrap, topics=topics, starting_offsets=starting, ending_offsets=ending,
        splits=splits, isolation_level=ISOLATION_LEVELS[isolation], include_headers=headers,
        max_offsets_per_trigger=max_per_trigger, commit_group_id=group, request_timeout_ms=timeout,
    )


def parse_bootstrap(servers: str) -> list[tuple[str, int]]:
    """``"host:port,host:port"`` as (host, port) pairs."""
    out = []
    for item in servers.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise KeyRangeSourceError(
                f"kafka.bootstrap.servers: {item.strip()!r} is not 'host:port' with a port in 1..65535")
        out.append((host.strip("[]"), int(port)))
    return out


def _text(options: Mapping[str, str], name: str, *, required: bool = False, default: str | None = None) -> Any:
    value = options.get(name.lower())
    if value is None:
        if required:
            raise KeyRangeSourceError(f"option {name} is required")
        return default
    value = str(value).strip()
    if not value:
        raise KeyRangeSourceError(f"option {name} is empty")
    return value


def _choice(options: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    value = _text(options, name, default=default).lower()
    if value not in choices:
        raise KeyRangeSourceError(f"{name} must be one of {', '.join(choices)}; got {options[name.lower()]!r}")
    return value


def _int(options: Mapping[str, str], name: str, default: int) -> int:
    value = _text(options, name, default=str(default))
    try:
        return int(value)
    except ValueError:
        raise KeyRangeSourceError(f"{name} must be an integer, got {value!r}") from None
