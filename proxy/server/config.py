"""Proxy configuration: a Kafka-style properties file plus ``--override key=value``.

Every key is declared once in ``SETTINGS`` with its type, default and a check, so an
unknown key or a bad value fails at start with a message that names the key and the
problem, never later and never silently. Per-topic settings are written
``topic.<topic name>.<setting>`` (topic names may themselves contain dots; the setting is
matched as a suffix).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.commits.state import MAX_SHARES


class ConfigError(ValueError):
    """A configuration mistake, phrased for the person who made it."""


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "yes", "1", "on"):
        return True
    if lowered in ("false", "no", "0", "off"):
        return False
    raise ValueError("expected true or false")


def _parse_int(text: str) -> int:
    return int(text.strip().replace("_", ""), 0)


def _parse_str(text: str) -> str:
    return text.strip()


def _parse_host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host:
        raise ValueError("expected host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    port_number = int(port)
    if not 0 < port_number < 65536:
        raise ValueError(f"port {port_number} is outside 1..65535")
    return host, port_number


def _parse_servers(text: str) -> list[tuple[str, int]]:
    servers = [_parse_host_port(part) for part in text.split(",") if part.strip()]
    if not servers:
        raise ValueError("expected at least one host:port")
    return servers


def _parse_node_addresses(text: str) -> dict[int, tuple[str, int]]:
    """``1@host:port,2@host:port``: the advertised proxy address of each broker node."""
    mapping: dict[int, tuple[str, int]] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        node, sep, address = part.partition("@")
        if not sep:
            raise ValueError(f"entry {part!r} is not node_id@host:port")
        mapping[int(node)] = _parse_host_port(address)
    return mapping


@dataclass(frozen=True)
class Setting:
    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str
    check: Callable[[Any], str | None] = lambda value: None


def _at_least(minimum: int) -> Callable[[int], str | None]:
    return lambda value: None if value >= minimum else f"must be at least {minimum}"


def _within(minimum: int, maximum: int) -> Callable[[int], str | None]:
    return lambda value: None if minimum <= value <= maximum else f"must be {minimum}..{maximum}"


def _one_of(*choices: str) -> Callable[[str], str | None]:
    return lambda value: None if value in choices else f"must be one of {', '.join(choices)}"


def _port(value: int) -> str | None:
    return None if 0 <= value < 65536 else "must be a port number in 0..65535 (0 picks a free port)"


PROXY_SETTINGS: tuple[Setting, ...] = (
    Setting("bootstrap.servers", _parse_servers, None, "The real Kafka cluster: host:port[,host:port...]."),
    Setting("topology", _parse_str, "port-per-broker", "port-per-broker or sidecar.",
            _one_of("port-per-broker", "sidecar")),
    Setting("listen.host", _parse_str, "127.0.0.1", "Address the proxy listens on."),
    Setting("listen.port", _parse_int, 9192, "Bootstrap port (port-per-broker) or the sidecar's port.", _port),
    Setting("advertised.host", _parse_str, "", "Host clients should use to reach the proxy; defaults to listen.host."),
    Setting("node.port.base", _parse_int, 0,
            "port-per-broker: node N listens on node.port.base + N; 0 means listen.port + 1.", _port),
    Setting("sidecar.node.addresses", _parse_node_addresses, {},
            "sidecar: the proxy address advertised for each broker node, as id@host:port,..."),
    Setting("sidecar.node.id", _parse_int, -1,
            "sidecar: the id of the broker this sidecar fronts; -1 finds it in the cluster metadata."),
    Setting("max.frame.bytes", _parse_int, 104857600, "Largest request or response frame accepted.", _at_least(1024)),
    Setting("max.frame.bytes.unauthenticated", _parse_int, 524288,
            "Largest request frame accepted from a client before it is past authentication (its first request, "
            "or the end of its SASL exchange), as a broker caps SASL frames; a larger size prefix closes the "
            "connection before a byte of the body is read.", _at_least(1024)),
    Setting("queued.max.request.bytes", _parse_int, 104857600,
            "Bytes of client request frames the whole proxy holds at once, being read or waiting to go upstream. "
            "When spent, the proxy stops reading from clients until frames leave (their sockets fill, TCP slows "
            "them). Frames are charged as their bytes arrive, never by their declared size; the oldest frame being "
            "read may always finish, so the proxy holds at most this plus one max.frame.bytes.",
            _at_least(1024 * 1024)),
    Setting("max.connections", _parse_int, 10000, "Client connections accepted at once.", _at_least(1)),
    Setting("max.inflight.requests.per.connection", _parse_int, 64,
            "Requests awaiting a response per connection before the proxy stops reading from the client.",
            _at_least(1)),
    Setting("socket.send.buffer.bytes", _parse_int, 1048576,
            "SO_SNDBUF of the proxy's sockets (to clients and to brokers); -1 keeps the operating system's "
            "default. Large enough for a whole Fetch response, the proxy hands it to the kernel in one write.",
            lambda value: None if value == -1 or value >= 4096
            else "must be -1 (the operating system's default) or at least 4096"),
    Setting("connections.max.idle.ms", _parse_int, 540000, "Close a connection idle this long.", _at_least(1000)),
    Setting("connections.setup.timeout.ms", _parse_int, 30000,
            "Close a client connection that has not, this long after it was accepted, delivered its first "
            "complete request and, if it began SASL authentication first, finished it.", _at_least(1000)),
    Setting("upstream.connect.timeout.ms", _parse_int, 10000, "Deadline to connect to a broker.", _at_least(1)),
    Setting("shutdown.drain.timeout.ms", _parse_int, 30000,
            "On SIGTERM, how long in-flight requests may take to finish.", _at_least(0)),
    Setting("memory.trim.interval.ms", _parse_int, 30000,
            "How often freed heap memory is given back to the operating system (glibc malloc_trim); 0 never. "
            "Between two trims large frames reuse the pages the last ones freed.", _at_least(0)),
    Setting("metrics.port", _parse_int, -1,
            "Prometheus metrics HTTP port on listen.host; -1 disables, 0 picks a free port.",
            lambda value: None if value == -1 else _port(value)),
    Setting("log.format", _parse_str, "logfmt", "logfmt or json.", _one_of("logfmt", "json")),
    Setting("log.level", _parse_str, "INFO", "Python logging level.",
            _one_of("DEBUG", "INFO", "WARNING", "ERROR")),
    Setting("ssl.listener.enabled", _parse_bool, False, "Terminate TLS from clients."),
    Setting("ssl.listener.certfile", _parse_str, "", "PEM certificate chain for the client-facing listener."),
    Setting("ssl.listener.keyfile", _parse_str, "", "PEM private key for the client-facing listener."),
    Setting("ssl.upstream.enabled", _parse_bool, False, "Speak TLS to the brokers."),
    Setting("ssl.upstream.cafile", _parse_str, "", "PEM CA bundle to verify brokers; empty uses the system store."),
    Setting("ssl.upstream.check.hostname", _parse_bool, True, "Verify the broker's host name."),
    Setting("max.bytes.key.range.results", _parse_int, 209715200,
            "Cap on the memory the key-range result cache holds. Each share is charged what it takes: its buffer "
            "(records, or 41 bytes an offset) plus about 1.3 KB of objects and cache entries (measured), so a full "
            "cache holds about this many bytes.", _at_least(0)),
    Setting("key.range.fetch.compression", _parse_str, "source",
            "Filtered batches keep their codec (source) or go out uncompressed (none).", _one_of("source", "none")),
    Setting("key.range.interest.ms", _parse_int, 30000,
            "A range set not requested for this long is no longer split out of broker reads.", _at_least(100)),
    Setting("key.range.readahead.enabled", _parse_bool, True,
            "Read the next position of a partition two or more range sets share from the broker as soon as a "
            "consumer reaches it, and cache every set's share before they ask (topics with "
            "reserve.message.value.range.fetch=true)."),
    Setting("key.range.split.threads", _parse_int, 0,
            "Worker threads that split large broker reads by key range off the event loop (needs the C "
            "kernels; 0: on the event loop, measured faster on 2 cores, docs/proxy.md).", _at_least(0)),
    Setting("key.range.split.thread.min.bytes", _parse_int, 65536,
            "Broker reads smaller than this are split on the event loop (a trip to a thread costs more).",
            _at_least(0)),
    Setting("native.relay.threads", _parse_int, 2,
            "Worker threads that relay runs of requests no feature reads (Produce, most group and admin "
            "requests) and their responses in native code, off the event loop; 0 keeps every frame on the "
            "event loop (docs/proxy.md).", _at_least(0)),
    Setting("native.relay.slice.ms", _parse_int, 200,
            "Longest native relay run before the connection's counters and idle clock are brought up to date.",
            _at_least(1)),
    Setting("fetch.readahead.enabled", _parse_bool, False,
            "Send a consumer's next Fetch to the broker while it still processes the last one, and answer "
            "the consumer from it when it asks (plain consumer fetches only; see docs/read-ahead.md)."),
    Setting("fetch.readahead.max.bytes", _parse_int, 8388608,
            "Largest response one read-ahead asks for (its max_bytes, if the client's is larger).",
            _at_least(1024)),
    Setting("fetch.readahead.max.partitions", _parse_int, 100,
            "Fetches naming more partitions than this keep their fetch session and are not read ahead for.",
            _at_least(1)),
    Setting("fetch.readahead.buffer.bytes", _parse_int, 268435456,
            "Bytes all read-aheads together may reserve or hold; beyond it the proxy stops reading ahead.",
            _at_least(0)),
    Setting("accept.individual.commit", _parse_bool, True, "Accept OffsetCommit requests carrying offset ranges."),
    Setting("individual.commit.log.segment.bytes", _parse_int, 10485760,
            "segment.bytes of __individual_commit_offsets.", _at_least(14)),
    # 1000: a consumer commits what one poll processed, at most max.poll.records (500 by
    # default) records, i.e. at most 500 disjoint ranges; 1000 leaves twice that while
    # capping one partition's ranges at 16 KB and its merge at O(1000) per request.
    Setting("max.individual.commit.ranges", _parse_int, 1000,
            "Most offset ranges one partition of one OffsetCommit may carry.", _at_least(1)),
    # 10000: the state of one (group, topic, partition) holds a range per gap a lagging
    # share leaves above S; real groups hold tens to hundreds (the soak's most: 166), and
    # 10000 means one share some 20 polls of max.poll.records (500) behind the others. One
    # range costs 17 bytes in memory (the packed form), 2 to 18 in the log value (varint
    # deltas: about 2 when offsets are near each other), which every commit of the
    # partition rewrites whole: at most 170 KB in memory and 180 KB in the record, well
    # within the broker's message.max.bytes (1 MB) even with several keys in one batch.
    Setting("max.individual.commit.ranges.held", _parse_int, 10000,
            "Most disjoint offset ranges above the stable offset the state of one (group, topic, partition) may "
            "hold after a commit. A range commit (OffsetCommit or TxnOffsetCommit) that would leave more, and "
            "more than the state holds now, is refused for that partition with INVALID_COMMIT_OFFSET_SIZE "
            "(28) and changes nothing; commits that close gaps always pass. One range costs 17 bytes of memory "
            "and 2-18 bytes of the log record every commit rewrites: 10000 is at most 170 KB and 180 KB.",
            _at_least(1)),
    Setting("cooperative.fetch.enabled", _parse_bool, True,
            "Hand out chunks of offsets to Fetch partitions tagged Cooperative (docs/cooperative-fetch.md)."),
    Setting("cooperative.fetch.lease.ms", _parse_int, 45000,
            "How long a member has to commit a chunk before its uncommitted offsets are handed out again "
            "(Kafka's default session.timeout.ms).", _at_least(100)),
    Setting("cooperative.fetch.max.leases.per.member", _parse_int, 1024,
            "Uncommitted chunks one member may hold of one partition; beyond it its fetches get no chunk "
            "until it commits.", _at_least(1)),
    Setting("virtual.topics.enabled", _parse_bool, False,
            "Serve virtual range topics <topic><suffix><K> to standard clients (off by default: it reads "
            "every Metadata, Fetch and OffsetCommit on its way, which costs the other features)."),
    Setting("virtual.topic.suffix", _parse_str, ".kr", "What separates a topic from its share count K.",
            lambda value: None if value else "must not be empty"),
    Setting("virtual.coop.suffix", _parse_str, ".coop",
            "What separates a topic from its stripe count K in a striped virtual topic (<topic>.coop<K>: "
            "stripes of whole batches, no per-key order; docs/cooperative-fetch.md).",
            lambda value: None if value else "must not be empty"),
    # Why the ceiling is fixed, and 64: proxy.commits.state.MAX_SHARES.
    Setting("virtual.topic.max.shares", _parse_int, 64,
            f"Largest K of a virtual range topic, at most {MAX_SHARES} (the watermarks of every share of a "
            "partition must fit the coordinator's offset metadata).", _within(2, MAX_SHARES)),
)

TOPIC_SETTINGS: tuple[Setting, ...] = (
    Setting("accept.range.fetch", _parse_bool, True, "Serve key-range fetches of this topic."),
    Setting("reserve.message.value.range.fetch", _parse_bool, False,
            "Cache filtered records themselves (true) or only the matching offsets (false)."),
)

_PROXY_BY_NAME = {setting.name: setting for setting in PROXY_SETTINGS}
_TOPIC_BY_NAME = {setting.name: setting for setting in TOPIC_SETTINGS}


@dataclass
class ProxyConfig:
    """Parsed, checked settings, read by their Kafka-style names with ``get``."""

    values: dict[str, Any]
    topics: dict[str, dict[str, Any]] = field(default_factory=dict)

    def get(self, key: str) -> Any:
        return self.values[key]

    def topic_setting(self, topic: str, key: str) -> Any:
        per_topic = self.topics.get(topic)
        if per_topic is not None and key in per_topic:
            return per_topic[key]
        return _TOPIC_BY_NAME[key].default

    @property
    def advertised_host(self) -> str:
        return self.values["advertised.host"] or self.values["listen.host"]


def parse_properties(text: str, source: str = "<properties>") -> dict[str, str]:
    """Java properties, the subset Kafka configs use: ``key=value`` or ``key: value``,
    ``#``/``!`` comments, blank lines, trailing-backslash continuations."""
    entries: dict[str, str] = {}
    pending = ""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = pending + raw.strip()
        pending = ""
        if not line or line[0] in "#!":
            continue
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        separator_index = next((i for i, char in enumerate(line) if char in "=:"), -1)
        if separator_index < 0:
            raise ConfigError(f"{source}:{number}: expected key=value, got {raw.strip()!r}")
        key = line[:separator_index].strip()
        if not key:
            raise ConfigError(f"{source}:{number}: empty key")
        entries[key] = line[separator_index + 1 :].strip()
    return entries


def _apply(setting: Setting, raw: str, label: str) -> Any:
    try:
        value = setting.parse(raw)
    except ValueError as exc:
        raise ConfigError(f"{label}: invalid value {raw!r}: {exc}") from None
    problem = setting.check(value)
    if problem:
        raise ConfigError(f"{label}: {problem} (got {raw!r})")
    return value


def build_config(entries: dict[str, str]) -> ProxyConfig:
    """Check every entry; unknown keys are errors, so a typo never goes unnoticed."""
    values = {setting.name: setting.default for setting in PROXY_SETTINGS}
    topics: dict[str, dict[str, Any]] = {}
    for key, raw in entries.items():
        if key in _PROXY_BY_NAME:
            values[key] = _apply(_PROXY_BY_NAME[key], raw, key)
            continue
        if key.startswith("topic."):
            rest = key[len("topic."):]
            for name, setting in _TOPIC_BY_NAME.items():
                suffix = "." + name
                if rest.endswith(suffix) and len(rest) > len(suffix):
                    topic = rest[: -len(suffix)]
                    topics.setdefault(topic, {})[name] = _apply(setting, raw, key)
                    break
            else:
                known = ", ".join(_TOPIC_BY_NAME)
                raise ConfigError(f"{key}: unknown per-topic setting; write topic.<name>.<setting> with one of {known}")
            continue
        raise ConfigError(f"{key}: unknown setting (see `keyrange-proxy --help-config`)")
    if values["bootstrap.servers"] is None:
        raise ConfigError("bootstrap.servers: required; give --bootstrap-server host:port or set it in the properties file")
    if values["topology"] == "sidecar" and len(values["bootstrap.servers"]) != 1:
        raise ConfigError("bootstrap.servers: the sidecar topology fronts exactly one broker; give one host:port")
    if values["ssl.listener.enabled"] and not (values["ssl.listener.certfile"] and values["ssl.listener.keyfile"]):
        raise ConfigError("ssl.listener.enabled: needs ssl.listener.certfile and ssl.listener.keyfile")
    for key in ("ssl.listener.certfile", "ssl.listener.keyfile", "ssl.upstream.cafile"):
        if values[key] and not Path(values[key]).is_file():
            raise ConfigError(f"{key}: no such file {values[key]!r}")
    if values["virtual.coop.suffix"] == values["virtual.topic.suffix"]:
        raise ConfigError(f"virtual.coop.suffix: must differ from virtual.topic.suffix "
                          f"(both {values['virtual.topic.suffix']!r})")
    if values["node.port.base"] == 0 and values["listen.port"] != 0:
        values["node.port.base"] = values["listen.port"] + 1
    return ProxyConfig(values=values, topics=topics)


def load_config(path: str | None, overrides: list[str]) -> ProxyConfig:
    entries: dict[str, str] = {}
    if path:
        entries.update(parse_properties(_read_properties(path), source=path))
    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--override {override!r}: expected key=value")
        entries[key.strip()] = value.strip()
    return build_config(entries)


def _read_properties(path: str) -> str:
    """The properties file's text. It must be UTF-8: a file that is not is ConfigError
    naming it and its first byte that is not.

    Kafka reads properties files as ISO-8859-1 (``Utils.loadProps`` calls
    ``Properties.load(InputStream)``) and writes anything beyond it as ``\\uXXXX``, an
    escape this reader does not take. The two encodings agree on ASCII, which every setting
    name and nearly every value is, so a file Kafka's tools read reads the same here unless
    it holds a non-ASCII byte. There they disagree, and taking ISO-8859-1 would misread
    silently: every byte is valid ISO-8859-1, so a UTF-8 file (what editors and shells write,
    and what ``--override`` arguments arrive as) with a non-ASCII host name or path would give
    other characters, advertised to clients or looked up as a file that is not there. UTF-8
    refuses an ISO-8859-1 byte instead, at start, where it is."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config file {path!r} does not exist")
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"config file {path!r} cannot be read: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError(
            f"config file {path!r} is not UTF-8: at byte offset {exc.start} (line {line}, column {column}) is "
            f"0x{data[exc.start]:02x}, {exc.reason}; the proxy reads its properties file as UTF-8 "
            f"(Kafka's tools read ISO-8859-1; the two agree on ASCII only)"
        ) from None


def describe_settings() -> str:
    lines = ["Proxy settings (properties file or --override key=value):"]
    for setting in PROXY_SETTINGS:
        lines.append(f"  {setting.name} (default {setting.default!r})\n      {setting.doc}")
    lines.append("Per-topic settings, written topic.<topic name>.<setting>:")
    for setting in TOPIC_SETTINGS:
        lines.append(f"  {setting.name} (default {setting.default!r})\n      {setting.doc}")
    return "\n".join(lines)
