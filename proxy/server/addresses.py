"""Which proxy address stands for which broker node.

Clients must only ever learn proxy addresses. The book learns each node's real address
from the responses that pass through (Metadata, DescribeCluster, FindCoordinator, ...)
and answers the address to advertise in its place:

- port per broker: one process, node N served on its own listening port. The port is
  bound synchronously the first time node N is seen, so by the time a client reads the
  rewritten response the port already accepts connections.
- sidecar: one proxy per broker; the operator lists the other sidecars' addresses, and
  the node this sidecar fronts is advertised as the sidecar itself.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass

from proxy.pipeline.cluster import ClusterView

log = logging.getLogger("proxy.addresses")


class UnmappedNodeError(LookupError):
    """A node the proxy has no address for; its real address must not be passed on."""


@dataclass(frozen=True)
class NodeListener:
    node_id: int
    sock: socket.socket
    port: int


class AddressBook:
    """Real broker addresses by node id, and the proxy address advertised for each."""

    def __init__(
        self,
        cluster: ClusterView,
        *,
        topology: str,
        advertised_host: str,
        listen_host: str,
        node_port_base: int,
        own_port: int,
        sidecar_addresses: dict[int, tuple[str, int]] | None = None,
        on_new_listener: Callable[[NodeListener], None] | None = None,
        reuse_port: bool = False,
    ) -> None:
        self.topology = topology
        self.reuse_port = reuse_port
        self.advertised_host = advertised_host
        self.listen_host = listen_host
        self.node_port_base = node_port_base
        self.own_port = own_port
        self.sidecar_addresses = dict(sidecar_addresses or {})
        self.on_new_listener = on_new_listener
        self.cluster = cluster  # where the real addresses are kept
        self._advertised: dict[int, tuple[str, int]] = {}
        self.sidecar_node_id: int | None = None

    # -- learning -------------------------------------------------------------------
    def learn(self, node_id: int, host: str, port: int) -> None:
        """Record a node's real address as the cluster reports it."""
        self.cluster.learn_node(node_id, host, port)

    def real_address(self, node_id: int) -> tuple[str, int] | None:
        return self.cluster.nodes.get(node_id)

    # -- advertising ----------------------------------------------------------------
    def advertised(self, node_id: int) -> tuple[str, int]:
        """The proxy address that replaces node ``node_id``'s real address."""
        address = self._advertised.get(node_id)
        if address is not None:
            return address
        if self.topology == "sidecar":
            address = self._sidecar_address(node_id)
        else:
            address = self._open_node_listener(node_id)
        self._advertised[node_id] = address
        return address

    def _sidecar_address(self, node_id: int) -> tuple[str, int]:
        if node_id in self.sidecar_addresses:
            return self.sidecar_addresses[node_id]
        if self.sidecar_node_id is not None and node_id == self.sidecar_node_id:
            return (self.advertised_host, self.own_port)
        raise UnmappedNodeError(
            f"node {node_id} has no sidecar address; list it in sidecar.node.addresses"
        )

    def _open_node_listener(self, node_id: int) -> tuple[str, int]:
        port = self.node_port_base + node_id if self.node_port_base else 0
        if port >= 65536:
            raise UnmappedNodeError(f"node {node_id} maps to port {port}, beyond 65535; lower node.port.base")
        family = socket.AF_INET6 if ":" in self.listen_host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((self.listen_host, port))
            sock.listen(512)
        except OSError as exc:
            sock.close()
            raise UnmappedNodeError(f"cannot listen for node {node_id} on {self.listen_host}:{port}: {exc}") from exc
        bound_port = sock.getsockname()[1]
        log.info("node listener opened node_id=%s port=%s", node_id, bound_port)
        if self.on_new_listener is not None:
            self.on_new_listener(NodeListener(node_id, sock, bound_port))
        return (self.advertised_host, bound_port)
