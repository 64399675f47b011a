"""The settings of the proxy process itself: the cluster and how it is fronted, TLS,
connection limits, the native relay, and operations (metrics, logs, memory, shutdown).
The features declare theirs in their own packages; ``proxy.server.config`` composes all."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from proxy.settings import (
    ConfigError,
    Settings,
    at_least,
    choice,
    flag,
    integer,
    one_of,
    port,
    setting,
    text,
)


def parse_host_port(text: str) -> tuple[str, int]:
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host:
        raise ValueError("expected host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    port_number = int(port_text)
    if not 0 < port_number < 65536:
        raise ValueError(f"port {port_number} is outside 1..65535")
    return host, port_number


def parse_servers(text: str) -> list[tuple[str, int]]:
    servers = [parse_host_port(part) for part in text.split(",") if part.strip()]
    if not servers:
        raise ValueError("expected at least one host:port")
    return servers


def parse_node_addresses(text: str) -> dict[int, tuple[str, int]]:
    """``1@host:port,2@host:port``: the advertised proxy address of each broker node."""
    mapping: dict[int, tuple[str, int]] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        node, sep, address = part.partition("@")
        if not sep:
            raise ValueError(f"entry {part!r} is not node_id@host:port")
        mapping[int(node)] = parse_host_port(address)
    return mapping


def _send_buffer(value: int) -> str | None:
    return None if value == -1 or value >= 4096 else "must be -1 (the operating system's default) or at least 4096"


def _upper(text: str) -> str:
    return text.strip().upper()


def _metrics_port(value: int) -> str | None:
    return None if value == -1 else port(value)


@dataclass(frozen=True)
class ClusterSettings(Settings):
    bootstrap_servers: list[tuple[str, int]] = setting(
        "bootstrap.servers", [], "The real Kafka cluster: host:port[,host:port...].", parse_servers,
        required="give --bootstrap-server host:port or set it in the properties file")
    topology: str = choice("topology", "port-per-broker", ("port-per-broker", "sidecar"), "port-per-broker or sidecar.")
    listen_host: str = text("listen.host", "127.0.0.1", "Address the proxy listens on.")
    listen_port: int = integer("listen.port", 9192, "Bootstrap port (port-per-broker) or the sidecar's port.", port)
    listen_reuse_port: bool = flag(
        "listen.reuse.port", False,
        "Bind the listening ports with SO_REUSEPORT, so that several proxy processes on one host share them and the "
        "kernel spreads connections over them; every worker of `workers` sets it.")
    advertised_host: str = text("advertised.host", "",
                                "Host clients should use to reach the proxy; defaults to listen.host.")
    node_port_base: int = integer("node.port.base", 0,
                                  "port-per-broker: node N listens on node.port.base + N; 0 means listen.port + 1.",
                                  port)
    sidecar_node_addresses: dict[int, tuple[str, int]] = setting(
        "sidecar.node.addresses", {}, "sidecar: the proxy address advertised for each broker node, as id@host:port,...",
        parse_node_addresses)
    sidecar_node_id: int = integer("sidecar.node.id", -1,
                                   "sidecar: the id of the broker this sidecar fronts; -1 finds it in the cluster "
                                   "metadata.")
    upstream_connect_timeout_ms: int = integer("upstream.connect.timeout.ms", 10000, "Deadline to connect to a broker.",
                                               at_least(1), reloadable=True)

    @property
    def sidecar(self) -> bool:
        return self.topology == "sidecar"

    def checked(self) -> Self:
        if self.sidecar and len(self.bootstrap_servers) != 1:
            raise ConfigError("bootstrap.servers: the sidecar topology fronts exactly one broker; give one host:port")
        return dataclasses.replace(
            self,
            advertised_host=self.advertised_host or self.listen_host,
            node_port_base=self.listen_port + 1 if self.node_port_base == 0 and self.listen_port != 0
            else self.node_port_base,
        )


@dataclass(frozen=True)
class TlsSettings(Settings):
    listener_enabled: bool = flag("ssl.listener.enabled", False, "Terminate TLS from clients.")
    listener_certfile: str = text("ssl.listener.certfile", "", "PEM certificate chain for the client-facing listener.",
                                  reloadable=True)
    listener_keyfile: str = text("ssl.listener.keyfile", "", "PEM private key (unencrypted) for the client-facing "
                                 "listener.", reloadable=True)
    upstream_enabled: bool = flag("ssl.upstream.enabled", False, "Speak TLS to the brokers.")
    upstream_cafile: str = text("ssl.upstream.cafile", "",
                                "PEM CA bundle to verify brokers; empty uses the system store.", reloadable=True)
    upstream_check_hostname: bool = flag("ssl.upstream.check.hostname", True, "Verify the broker's host name.",
                                         reloadable=True)

    def checked(self) -> Self:
        if self.listener_enabled and not (self.listener_certfile and self.listener_keyfile):
            raise ConfigError("ssl.listener.enabled: needs ssl.listener.certfile and ssl.listener.keyfile")
        for key, path in (("ssl.listener.certfile", self.listener_certfile),
                          ("ssl.listener.keyfile", self.listener_keyfile),
                          ("ssl.upstream.cafile", self.upstream_cafile)):
            if path and not Path(path).is_file():
                raise ConfigError(f"{key}: no such file {path!r}")
        return self


@dataclass(frozen=True)
class ConnectionLimits(Settings):
    max_frame_bytes: int = integer("max.frame.bytes", 104857600, "Largest request or response frame accepted.",
                                   at_least(1024), reloadable=True)
    max_frame_bytes_unauthenticated: int = integer(
        "max.frame.bytes.unauthenticated", 524288,
        "Largest request frame accepted from a client before it is past authentication (its first request, or the "
        "end of its SASL exchange), as a broker caps SASL frames; a larger size prefix closes the connection before "
        "a byte of the body is read.", at_least(1024), reloadable=True)
    queued_max_request_bytes: int = integer(
        "queued.max.request.bytes", 104857600,
        "Bytes of client request frames each worker holds at once, being read or waiting to go upstream. When "
        "spent, the proxy stops reading from clients until frames leave (their sockets fill, TCP slows them). "
        "Frames are charged as their bytes arrive, never by their declared size; the oldest frame being read may "
        "always finish, so the proxy holds at most this plus one max.frame.bytes.", at_least(1024 * 1024),
        reloadable=True)
    max_connections: int = integer("max.connections", 10000, "Client connections accepted at once, by each worker (workers).", at_least(1),
                                   reloadable=True,
                                   cost="proxy memory: about 23 KiB for each connection that has sent a request "
                                        "(and has a broker connection), 9 KiB for each silent one "
                                        "(docs/reliability.md).")
    max_inflight_requests: int = integer(
        "max.inflight.requests.per.connection", 64,
        "Requests awaiting a response per connection before the proxy stops reading from the client.", at_least(1),
        reloadable=True)
    socket_send_buffer_bytes: int = integer(
        "socket.send.buffer.bytes", 1048576,
        "SO_SNDBUF of the proxy's sockets (to clients and to brokers); -1 keeps the operating system's default. "
        "Large enough for a whole Fetch response, the proxy hands it to the kernel in one write.", _send_buffer,
        reloadable=True, cost="kernel memory, up to this much a socket while its data waits: two sockets a client "
                              "connection (the client's and its broker connection).")
    idle_ms: int = integer("connections.max.idle.ms", 540000, "Close a connection idle this long.", at_least(1000),
                           reloadable=True)
    setup_timeout_ms: int = integer(
        "connections.setup.timeout.ms", 30000,
        "Close a client connection that has not, this long after it was accepted, delivered its first complete "
        "request and, if it began SASL authentication first, finished it.", at_least(1000), reloadable=True)


@dataclass(frozen=True)
class NativeRelaySettings(Settings):
    threads: int = integer(
        "native.relay.threads", 2,
        "Worker threads that relay runs of requests no feature reads (Produce, most group and admin requests) and "
        "their responses in native code, off the event loop; 0 keeps every frame on the event loop "
        "(docs/proxy.md).", at_least(0),
        cost="a thread each, and a pipe and an eventfd a producing connection; 0: every Produce costs the event "
             "loop about 180 us of CPU (a 256 KiB request), most of what the proxy costs beyond a bare relay.")
    slice_ms: int = integer("native.relay.slice.ms", 200,
                            "Longest native relay run before the connection's counters and idle clock are brought "
                            "up to date.", at_least(1))


@dataclass(frozen=True)
class OperationsSettings(Settings):
    metrics_port: int = integer("metrics.port", -1,
                                "Prometheus metrics HTTP port on listen.host; -1 disables, 0 picks a free port.",
                                _metrics_port)
    log_format: str = choice("log.format", "logfmt", ("logfmt", "json"), "logfmt or json.")
    log_level: str = setting("log.level", "INFO", "Python logging level: DEBUG, INFO, WARNING or ERROR (any case).",
                             _upper, one_of("DEBUG", "INFO", "WARNING", "ERROR"), reloadable=True)
    memory_trim_interval_ms: int = integer(
        "memory.trim.interval.ms", 30000,
        "How often freed heap memory is given back to the operating system (glibc malloc_trim); 0 never. Between "
        "two trims large frames reuse the pages the last ones freed.", at_least(0),
        cost="0: resident memory stays at its peak. A short interval gives pages back sooner, and large frames "
             "then come from fresh ones: serving each from a fresh mmap costs 4x the CPU (docs/proxy.md).")
    gc_freeze_interval_ms: int = integer(
        "memory.gc.freeze.interval.ms", 10000,
        "How often objects that survived are moved out of the garbage collector's walks (gc.freeze), so its "
        "pauses do not grow with the connections held; cycles among them are collected once they grew by a "
        "quarter. 0 leaves the collector as CPython sets it.", at_least(0))
    workers: int = integer(
        "workers", 0,
        "Proxy processes on this host, each its own event loop on its own core; 0 starts one per core, at most 16 "
        "(a sidecar: one). They share the bootstrap port (SO_REUSEPORT); node N's port is served by worker N mod "
        "workers, so all the consumers of a partition reach one worker and its key-range cache. metrics.port serves "
        "the workers' metrics added up; worker i serves its own on metrics.port + 1 + i (docs/proxy.md, Workers).",
        at_least(0))
    shutdown_drain_timeout_ms: int = integer("shutdown.drain.timeout.ms", 30000,
                                             "On SIGTERM, how long in-flight requests may take to finish.",
                                             at_least(0), reloadable=True)
    config_watch_interval_ms: int = integer(
        "config.watch.interval.ms", 0,
        "How often the properties file, and the TLS certificate, key and CA files the settings name, are checked "
        "for changes; a change is reloaded as SIGHUP reloads (docs/proxy.md#reloading-settings). 0 never: SIGHUP "
        "only.", at_least(0))


__all__ = ["ClusterSettings", "ConnectionLimits", "NativeRelaySettings", "OperationsSettings", "TlsSettings"]
