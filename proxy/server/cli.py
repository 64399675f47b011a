"""``keyrange-proxy``: run the proxy from the command line."""

from __future__ import annotations

import argparse
import sys

import trio

from proxy.server.config import ConfigError, describe_settings, load_config
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
    return parser


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
    overrides = []
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
    try:
        config = load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"keyrange-proxy: configuration error: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.operations.log_level, config.operations.log_format)
    from proxy.server.memory import tune_malloc

    tune_malloc()

    from proxy.server.app import ProxyServer, StartupError

    try:
        server = ProxyServer(config)
        trio.run(_run, server, args.ready_file)
    except StartupError as exc:
        print(f"keyrange-proxy: cannot start: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
