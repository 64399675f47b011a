"""``keyrange-proxy``: run the proxy from the command line.

Settings come from a properties file, then ``KEYRANGE_<SETTING>`` environment variables
(``proxy.server.environment``), then the options, each winning over the one before.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import trio

from proxy.server.config import ConfigError, describe_settings, load_config
from proxy.server.environment import environment_overrides
from proxy.server.logs import configure_logging


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keyrange-proxy",
        description="A Kafka proxy that lets many consumers share a partition by key-hash ranges.",
    )
    parser.add_argument("config", nargs="?", help="a Kafka-style properties file")
    parser.add_argument("--bootstrap-server", help="the real Kafka cluster, host:port[,host:port]")
    parser.add_argument("--listen", help="host:port to listen on (the bootstrap port, or the sidecar's port)")
    parser.add_argument("--topology", choices=["port-per-broker", "sidecar"])
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="set any setting; repeatable; wins over the file")
    parser.add_argument("--ready-file", metavar="PATH",
                        help="once listening, write the ports (JSON) here; for scripts that start the proxy")
    parser.add_argument("--help-config", action="store_true", help="list every setting with its default")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="run N proxy processes (the setting workers; 0, the default: one per core)")
    parser.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)  # set by the supervisor
    parser.add_argument("--worker-count", type=int, default=1, help=argparse.SUPPRESS)  # likewise
    parser.add_argument("--version", action="store_true",
                        help="print the version and which C accelerators this installation runs")
    return parser


def accelerators_taken() -> dict[str, bool]:
    """Whether this process runs each C accelerator: the record kernels (key-range split and
    match), the native relay and the range commits (``proxy.accelerators`` chose each when
    its module was imported). Reported by ``--version`` and at start, so an installation
    built without a C compiler or the xxHash header says so."""
    from proxy.commits import packed
    from proxy.net import native_relay
    from proxy.records import kernels

    return {"record kernels": kernels.ACCELERATED, "native relay": native_relay.AVAILABLE,
            "range commits": packed.ACCELERATED}


def version_text() -> str:
    """The version, the Python running it and each accelerator: ``C``, or what runs instead."""
    import platform
    from importlib import metadata

    try:
        version = metadata.version("keyrange-proxy")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        version = "unknown (not installed)"
    lines = [f"keyrange-proxy {version}", f"python {platform.python_version()}"]
    for name, taken in accelerators_taken().items():
        instead = "off" if name == "native relay" else "pure Python"
        lines.append(f"{name}: {'C' if taken else instead}")
    return "\n".join(lines)


async def _run(server, ready_file: str | None) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.run)
        await server.started.wait()
        if ready_file:
            _write_ready_file(server, ready_file)


def _write_ready_file(server, path: str) -> None:
    import json
    import os

    info = {
        "pid": os.getpid(),
        "host": server.config.advertised_host,
        "port": server.port,
        "node_ports": {str(node): port for node, port in sorted(server.node_ports.items())},
        "metrics_port": server.metrics_port,
    }
    temporary = f"{path}.tmp"
    with open(temporary, "w", encoding="utf-8") as file:
        json.dump(info, file)
    os.replace(temporary, path)  # readers never see a half-written file


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.help_config:
        print(describe_settings())
        return 0
    if args.version:
        print(version_text())
        return 0
    try:
        overrides = environment_overrides(os.environ)
    except ConfigError as exc:
        print(f"keyrange-proxy: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.bootstrap_server:
        overrides.append(f"bootstrap.servers={args.bootstrap_server}")
    if args.topology:
        overrides.append(f"topology={args.topology}")
    if args.listen:
        host, sep, port = args.listen.rpartition(":")
        if not sep:
            print(f"keyrange-proxy: --listen {args.listen!r}: expected host:port", file=sys.stderr)
            return 2
        overrides += [f"listen.host={host}", f"listen.port={port}"]
    overrides += args.override
    if args.workers is not None:
        if args.workers < 0:
            print(f"keyrange-proxy: --workers {args.workers}: expected 0 (one per core) or more", file=sys.stderr)
            return 2
        overrides.append(f"workers={args.workers}")
    try:
        config = load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"keyrange-proxy: configuration error: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.operations.log_level, config.operations.log_format, worker=args.worker_index)
    if args.worker_index is None:
        from proxy.server.workers import usable_cpus, worker_count

        count = worker_count(config.operations.workers, usable_cpus(), config.cluster.topology)
        if count > 1:
            return _supervise(count, config, argv if argv is not None else sys.argv[1:], args.ready_file)
    logging.getLogger("proxy.server").info(
        "accelerators %s", " ".join(f"{name.replace(' ', '_')}={'C' if taken else 'off'}"
                                    for name, taken in accelerators_taken().items()))
    from proxy.server.memory import tune_malloc

    tune_malloc()

    from proxy.server.addresses import NodePlacement
    from proxy.server.app import ProxyServer, StartupError
    from proxy.server.reloader import ConfigSource

    try:
        placement = NodePlacement(args.worker_index or 0, args.worker_count)
        # a reload (SIGHUP) reads the file again; the overrides keep winning over it
        server = ProxyServer(config, source=ConfigSource(args.config, tuple(overrides)), placement=placement)
        trio.run(_run, server, args.ready_file)
    except StartupError as exc:
        print(f"keyrange-proxy: cannot start: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _supervise(count: int, config, argv: list[str], ready_file: str | None) -> int:
    import tempfile
    from pathlib import Path

    from proxy.server.workers import Supervisor

    cluster = config.cluster
    try:
        with tempfile.TemporaryDirectory(prefix="keyrange-proxy-workers-") as rundir:
            command = [sys.executable, "-m", "proxy.server.cli", *argv]
            return Supervisor(count, command, cluster.listen_host, cluster.listen_port,
                              config.operations.metrics_port, ready_file, Path(rundir),
                              node_port_base=cluster.node_port_base).run()
    except OSError as exc:
        print(f"keyrange-proxy: cannot start: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
