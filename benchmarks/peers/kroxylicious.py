"""Kroxylicious as a passthrough proxy (no filters), port per broker.

Maven Central does not carry ``io.kroxylicious:kroxylicious-app`` (the runnable
application); it does carry ``kroxylicious-runtime`` up to 0.12.0 (May 2025), which holds
the proxy itself. ``benchmarks/java/kroxylicious`` starts it with the runtime's own
configuration parser, so the figures measured here are Kroxylicious 0.12.0. The issue also
quotes figures for 0.21.0 built from its sources (:data:`QUOTED`), which the results table
shows beside, labelled as quoted.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil

from benchmarks.peers import java_harness
from harness.processes import spawn
from harness.wait import wait_until
from proxy.local_kafka import free_port

MAIN = "io.keyrange.bench.KroxyliciousMain"
VERSION = "0.12.0"

# Measured beside our proxy in one run on a 2-core machine (Kroxylicious 0.21.0 built from its
# sources, port-per-broker passthrough, Kafka 4.1.1, 1 KB records); ratios to direct.
QUOTED = {
    "source": "issue 17 (Kroxylicious 0.21.0 built from source, Kafka 4.1.1, 1 KB records, 2-core machine)",
    "consume": {"kroxylicious": [0.57, 0.60, 0.71], "proxy": [0.88, 0.79, 0.84]},
    "produce": {"kroxylicious": [0.94, 1.00], "proxy": [0.90, 0.96]},
}


def config_yaml(target: str, bootstrap_port: int, node_start_port: int) -> str:
    """A virtual cluster in front of ``target``: bootstrap on ``bootstrap_port``, node ``i``
    on ``node_start_port + i`` (node ids 0..3 reserved; our harness's node is 1)."""
    return (
        "virtualClusters:\n"
        "  - name: bench\n"
        "    targetCluster:\n"
        f"      bootstrapServers: {target}\n"
        "    gateways:\n"
        "      - name: default\n"
        "        portIdentifiesNode:\n"
        f"          bootstrapAddress: 127.0.0.1:{bootstrap_port}\n"
        f"          nodeStartPort: {node_start_port}\n"
        "          nodeIdRanges:\n"
        "            - name: nodes\n"
        "              start: 0\n"
        "              end: 3\n"
    )


@contextlib.contextmanager
def running(target: str, *, timeout: float = 90.0) -> Iterator[tuple[str, psutil.Process]]:
    """Kroxylicious in front of ``target``; yields (its bootstrap address, its process)."""
    bootstrap_port = free_port()
    node_start_port = free_port()
    for _ in range(200):  # four consecutive free ports for the nodes
        if all(_port_free(node_start_port + i) for i in range(4)):
            break
        node_start_port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="kroxylicious-"))
    config = workdir / "config.yaml"
    config.write_text(config_yaml(target, bootstrap_port, node_start_port))
    log = open(workdir / "kroxylicious.log", "w")
    proxy = spawn(java_harness.command("bench-kroxylicious", MAIN, [config],
                                       jvm_options=("-Xms128m", "-Xmx512m", "-XX:+UseSerialGC")),
                  stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        def ready() -> bool:
            if proxy.poll() is not None:
                raise RuntimeError(f"Kroxylicious exited with {proxy.returncode}:\n"
                                   + (workdir / "kroxylicious.log").read_text(errors="replace")[-3000:])
            return "READY" in (workdir / "kroxylicious.log").read_text(errors="replace")

        wait_until(ready, timeout=timeout, interval=0.2, what="Kroxylicious listening")
        yield f"127.0.0.1:{bootstrap_port}", psutil.Process(proxy.pid)
    finally:
        proxy.kill()
        proxy.wait()


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
