"""A TCP load balancer on loopback in front of proxy replicas (docs/high-availability.md:
"R replicas of a port-per-broker proxy behind a TCP load balancer").

Every replica listens on a loopback address of its own (127.0.0.2, 127.0.0.3, ...) on the
same bootstrap port and node ports (``node.port.base + N``), and advertises the balancer's
address (``advertised.host``): every address a client learns leads back to the balancer.
The balancer listens on its own address on each of those ports and hands every new
connection to the next replica in turn (round robin) that is healthy: its ``/readyz``
answers 200 when a probe address is known for it (``probe(host)``: its metrics port),
else it accepts connections. A replica that refuses a connection is skipped for it. So the
connections of one client (bootstrap, broker, coordinator) land on different replicas, and
when a replica dies its connections close and the clients' reconnections land on the others.

    balancer = Balancer("127.0.0.1", [bootstrap_port, node_port_base + 1], ["127.0.0.2", "127.0.0.3"],
                        probe=lambda host: (host, metrics_port_of[host])).start()
    ...
    balancer.stop()

Threads: one per listening port, one health checker, two per connection (one per
direction); the tests push thousands of records, not millions.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence

_CHUNK = 65536
_CONNECT_TIMEOUT = 5.0
_PROBE_TIMEOUT = 1.0

Probe = Callable[[str], "tuple[str, int] | None"]


class Balancer:
    """Round robin over the healthy ``upstreams`` (hosts) for each of ``ports``, listening
    on ``host``."""

    def __init__(self, host: str, ports: Sequence[int], upstreams: Sequence[str], probe: Probe | None = None, *,
                 interval: float = 0.2) -> None:
        self.host = host
        self.ports = list(ports)
        self.upstreams = list(upstreams)
        self.probe = probe
        self.interval = interval
        # hosts in the rotation; without probes, every upstream until a health check says otherwise
        self.healthy: set[str] = set(self.upstreams) if probe is None else set()
        self.connections: Counter[str] = Counter()  # host -> connections handed to it
        self._turn = 0
        self._lock = threading.Lock()
        self._listeners: list[socket.socket] = []
        self._sockets: set[socket.socket] = set()
        self._stopped = threading.Event()

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.ports[0]}"

    def start(self) -> Balancer:
        for port in self.ports:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.host, port))
            listener.listen(128)
            self._listeners.append(listener)
            threading.Thread(target=self._accept, args=(listener, port), name=f"balancer-{port}",
                             daemon=True).start()
        if self.probe is not None:
            self._check()
            threading.Thread(target=self._health, name="balancer-health", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening and close every proxied connection."""
        self._stopped.set()
        for listener in self._listeners:
            listener.close()
        with self._lock:
            open_sockets = list(self._sockets)
        for sock in open_sockets:
            _shutdown(sock)

    def __enter__(self) -> Balancer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- health --------------------------------------------------------------------------------
    def _health(self) -> None:
        while not self._stopped.wait(self.interval):
            self._check()

    def _check(self) -> None:
        assert self.probe is not None
        healthy = {host for host in self.upstreams if _ready(self.probe(host))}
        with self._lock:
            self.healthy = healthy

    # -- forwarding ----------------------------------------------------------------------------
    def _accept(self, listener: socket.socket, port: int) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            threading.Thread(target=self._serve, args=(client, port), daemon=True).start()

    def _serve(self, client: socket.socket, port: int) -> None:
        upstream = self._connect(port)
        if upstream is None:
            client.close()  # no replica to take it: the client sees its connection closed
            return
        with self._lock:
            self._sockets.update((client, upstream))
        threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()
        self._pump(client, upstream)

    def _connect(self, port: int) -> socket.socket | None:
        with self._lock:
            rotation = [host for host in self.upstreams if host in self.healthy]
            first = self._turn
            self._turn += 1
        for step in range(len(rotation)):
            host = rotation[(first + step) % len(rotation)]
            try:
                upstream = socket.create_connection((host, port), timeout=_CONNECT_TIMEOUT)
            except OSError:
                continue  # refused: that replica is down, whatever its last health check said
            upstream.settimeout(None)
            with self._lock:
                self.connections[host] += 1
            return upstream
        return None

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        """Copy ``source`` to ``sink`` until either side closes; then close both, as a
        balancer does when one side of a proxied connection goes away."""
        try:
            while True:
                data = source.recv(_CHUNK)
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                _shutdown(sock)
                sock.close()
                with self._lock:
                    self._sockets.discard(sock)


def _ready(address: tuple[str, int] | None) -> bool:
    if address is None:
        return False
    try:
        with urllib.request.urlopen(f"http://{address[0]}:{address[1]}/readyz", timeout=_PROBE_TIMEOUT) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def free_port_block(hosts: Sequence[str], nodes: int) -> tuple[int, int]:
    """A bootstrap port and a ``node.port.base`` (the next port) such that the bootstrap port
    and the ports of nodes 1..``nodes`` are free on each of ``hosts`` (the balancer's
    address and every replica's), below the ephemeral range."""
    rng = random.Random()
    for _ in range(200):
        bootstrap = rng.randrange(20000, 32000 - nodes - 2)
        try:
            with contextlib.ExitStack() as held:
                for host in hosts:
                    for port in range(bootstrap, bootstrap + 2 + nodes):
                        probe = held.enter_context(socket.socket())
                        probe.bind((host, port))
        except OSError:
            continue
        return bootstrap, bootstrap + 1
    raise RuntimeError(f"no free block of {nodes + 2} ports on {list(hosts)}")
