"""Which proxy address stands for which broker node.

Clients must only ever learn proxy addresses. The book learns each node's real address
from the responses that pass through (Metadata, DescribeCluster, FindCoordinator, ...)
and answers the address to advertise in its place:

- port per broker: one process, node N served on its own listening port. The port is
  bound synchronously the first time node N is seen, so by the time a client reads the
  rewritten response the port already accepts connections. With ``workers``, node N's
  port is listened on by one worker only (``NodePlacement``) and advertised by all.
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


@dataclass(frozen=True)
class NodePlacement:
    """Which of ``count`` worker processes listens on node N's port: worker N mod count.

    Every client connection to node N then lands on one worker, and with it every Fetch of
    the partitions N leads: the consumers of one partition share one key-range cache, and
    the broker reads each batch once, however many workers run. Every worker computes the
    same answer with no word to the others, so each advertises node ports it does not
    listen on itself."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"worker index {self.index} outside 0..{self.count - 1}")

    def serves(self, node_id: int) -> bool:
        return node_id % self.count == self.index


ONE_PROCESS = NodePlacement()  # a proxy that is not one of several workers serves every node


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
        placement: NodePlacement = ONE_PROCESS,
    ) -> None:
        self.topology = topology
        self.placement = placement
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
        if not self.placement.serves(node_id):
            if not port:
                raise UnmappedNodeError(f"node {node_id}: workers need a fixed node.port.base or listen.port")
            return (self.advertised_host, port)  # another worker listens on it
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
