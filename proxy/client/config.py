"""Consumer settings, validated up front with messages that name the setting and the value."""

from __future__ import annotations

from dataclasses import dataclass, fields

from proxy.client.errors import ConfigError

AUTO_OFFSET_RESET = ("earliest", "latest", "none")
ISOLATION_LEVELS = {"read_uncommitted": 0, "read_committed": 1}
PARTITION_SHARING = ("keyrange", "cooperative")


@dataclass(frozen=True)
class ConsumerConfig:
    bootstrap_servers: str | list[str]
    client_id: str = "keyrange-consumer"
    group_id: str | None = None
    auto_offset_reset: str = "latest"
    isolation_level: str = "read_uncommitted"
    max_poll_records: int = 500
    fetch_max_bytes: int = 52_428_800
    max_partition_fetch_bytes: int = 1_048_576
    fetch_max_wait_ms: int = 500
    request_timeout_ms: int = 30_000
    retry_backoff_ms: int = 100
    # Individual commit (docs/wire-contract.md#6-configuration): commit() sends the offsets marked processed,
    # gaps and all, as OffsetRanges; needs group_id.
    allow_individual_commit: bool = False
    # Ranges per partition in one OffsetCommit; more go in further requests. The proxy
    # refuses more than its max.individual.commit.ranges (default 1000).
    individual_commit_max_ranges: int = 1000
    # Group membership (subscribe; docs/wire-contract.md section 8, KIP-62, KIP-345)
    group_instance_id: str | None = None
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 3_000
    max_poll_interval_ms: int = 300_000
    # How this group member shares a partition once members outnumber partitions:
    # "keyrange" (by key range, per-key order kept) or "cooperative" (whole partitions
    # handed out in offset chunks, docs/wire-contract.md#37-cooperative-fetch: no per-key
    # order). Cooperative sharing needs individual commit: each member commits its chunks.
    partition_sharing: str = "keyrange"

    def __post_init__(self) -> None:
        validate(self)

    @property
    def bootstrap_addresses(self) -> list[tuple[str, int]]:
        return parse_bootstrap(self.bootstrap_servers)

    @property
    def isolation_code(self) -> int:
        return ISOLATION_LEVELS[self.isolation_level]


def parse_bootstrap(servers: str | list[str]) -> list[tuple[str, int]]:
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"bootstrap_servers: entries must be 'host:port' strings, got {item!r}")
        text = item.strip()
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"bootstrap_servers: {text!r} is not 'host:port' with a port in 1..65535")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ConfigError("bootstrap_servers: at least one 'host:port' is required")
    return out


_INT_MINIMUMS = {
    "max_poll_records": 1,
    "fetch_max_bytes": 1,
    "max_partition_fetch_bytes": 1,
    "fetch_max_wait_ms": 0,
    "request_timeout_ms": 1,
    "retry_backoff_ms": 0,
    "individual_commit_max_ranges": 1,
    "session_timeout_ms": 1,
    "heartbeat_interval_ms": 1,
    "max_poll_interval_ms": 1,
}
_INT_MAXIMUM = (1 << 31) - 1


def validate(config: ConsumerConfig) -> None:
    """Raise ``ConfigError`` naming the first bad setting."""
    if not isinstance(config.bootstrap_servers, (str, list, tuple)):
        raise ConfigError(f"bootstrap_servers must be a string or a list of strings, got "
                          f"{type(config.bootstrap_servers).__name__}")
    parse_bootstrap(config.bootstrap_servers)
    if not isinstance(config.client_id, str):
        raise ConfigError(f"client_id must be a string, got {type(config.client_id).__name__}")
    if config.group_id is not None and (not isinstance(config.group_id, str) or not config.group_id):
        raise ConfigError(f"group_id must be a non-empty string or None, got {config.group_id!r}")
    if config.auto_offset_reset not in AUTO_OFFSET_RESET:
        raise ConfigError(f"auto_offset_reset must be one of {', '.join(AUTO_OFFSET_RESET)}; "
                          f"got {config.auto_offset_reset!r}")
    if config.isolation_level not in ISOLATION_LEVELS:
        raise ConfigError(f"isolation_level must be one of {', '.join(ISOLATION_LEVELS)}; "
                          f"got {config.isolation_level!r}")
    if not isinstance(config.allow_individual_commit, bool):
        raise ConfigError(f"allow_individual_commit must be a bool, got "
                          f"{type(config.allow_individual_commit).__name__} {config.allow_individual_commit!r}")
    if config.allow_individual_commit and config.group_id is None:
        raise ConfigError("allow_individual_commit=True needs a group_id: committed offsets belong to a group")
    if config.group_instance_id is not None and (not isinstance(config.group_instance_id, str)
                                                 or not config.group_instance_id):
        raise ConfigError(f"group_instance_id must be a non-empty string or None, got {config.group_instance_id!r}")
    if config.group_instance_id is not None and config.group_id is None:
        raise ConfigError("group_instance_id needs a group_id")
    if config.partition_sharing not in PARTITION_SHARING:
        raise ConfigError(f"partition_sharing must be one of {', '.join(PARTITION_SHARING)}; "
                          f"got {config.partition_sharing!r}")
    if config.partition_sharing == "cooperative" and not config.allow_individual_commit:
        raise ConfigError("partition_sharing='cooperative' needs allow_individual_commit=True (and a group_id): "
                          "each member commits the offsets of the chunks it was handed as ranges")
    for field in fields(config):
        minimum = _INT_MINIMUMS.get(field.name)
        if minimum is None:
            continue
        value = getattr(config, field.name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{field.name} must be an int, got {type(value).__name__} {value!r}")
        if not minimum <= value <= _INT_MAXIMUM:
            raise ConfigError(f"{field.name} must be between {minimum} and {_INT_MAXIMUM}, got {value}")
    if config.heartbeat_interval_ms >= config.session_timeout_ms:
        raise ConfigError(f"heartbeat_interval_ms ({config.heartbeat_interval_ms}) must be below "
                          f"session_timeout_ms ({config.session_timeout_ms})")
