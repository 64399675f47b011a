"""The bare splice relay (``benchmarks/bare_relay.py``) as a peer: the floor of any proxy.

The relay does no address rewriting, so the broker must advertise the relay's port on a
listener of its own: start the cluster with :func:`cluster_options` and point the relay at
that listener with :func:`target`.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

import psutil

from harness.kafka_cluster import KafkaCluster
from harness.processes import spawn
from harness.wait import wait_until

LISTENER = "RELAY"


def cluster_options(relay_port: int) -> dict:
    """Keyword arguments for ``KafkaCluster.start`` (one node) so that clients bootstrapping
    through the relay are told to fetch through it too."""
    return {"extra_listeners": {LISTENER: "PLAINTEXT"}, "advertised_ports": {LISTENER: {1: relay_port}}}


def target(cluster: KafkaCluster) -> str:
    node = cluster.nodes[0]
    return f"{node.host}:{node.listener_ports[LISTENER]}"


@contextlib.contextmanager
def running(port: int, target_address: str, *, timeout: float = 30.0, module: str = "benchmarks.bare_relay",
            args: tuple[str, ...] = ()) -> Iterator[psutil.Process]:
    """The relay listening on 127.0.0.1:``port``; yields its process (for CPU times).
    ``module``: another relay taking the same arguments (then ``args``), such as
    ``benchmarks.hashing_relay``."""
    relay = spawn([sys.executable, "-m", module, str(port), target_address, *args],
                  stdin=subprocess.DEVNULL)
    try:
        process = psutil.Process(relay.pid)

        def listening() -> bool:
            if relay.poll() is not None:
                raise RuntimeError(f"{module} exited with {relay.returncode}")
            return any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
                       for c in process.net_connections())

        wait_until(listening, timeout=timeout, what=f"{module} listening")
        yield process
    finally:
        relay.kill()
        relay.wait()
