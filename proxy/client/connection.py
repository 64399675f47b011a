"""Connections to the cluster: version negotiation, feature advertisement, one connection
per broker node.

Every connection starts with ApiVersions. ``negotiate`` (sans I/O) picks, per API, the
newest version both sides speak within this consumer's window, and reads the features the
proxy advertises (``keyrange.fetch``, ``individual.commit``, ``cooperative.fetch``): the consumer sends an
extension only over a connection that advertised it. ``Connections`` keeps the bootstrap
connection and one connection per node, reopening one that failed; a request that fails
or is cancelled midway closes its connection, so a late response can never be read as the
answer to the next request.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import trio

from proxy.client.errors import ConsumerConnectionError, KafkaError, RetriableError, UnsupportedVersionError
from proxy.net.broker_connection import BrokerConnection, BrokerConnectionError
from proxy.protocol import messages
from proxy.protocol.constants import (
    COOPERATIVE_FETCH_FEATURE,
    INDIVIDUAL_COMMIT_FEATURE,
    KEY_RANGE_FETCH_FEATURE,
    ErrorCode,
)
from proxy.protocol.errors import ProtocolError
from proxy.protocol.message_types import ApiVersionsRequest, ApiVersionsResponse
from proxy.protocol.message_versions import API_VERSIONS_FIRST_SUPPORTED_FEATURES, FETCH_FIRST_FLEXIBLE
from proxy.protocol.messages import ApiKey

RANGE_FETCH_FEATURE = KEY_RANGE_FETCH_FEATURE
RANGE_FETCH_MIN_VERSION = FETCH_FIRST_FLEXIBLE  # tag 10000 fields need tagged fields
API_VERSIONS_VERSION = API_VERSIONS_FIRST_SUPPORTED_FEATURES

# The oldest versions this client speaks, and the newest it asks for.
VERSION_FLOOR: Mapping[int, int] = {ApiKey.FETCH: 4, ApiKey.LIST_OFFSETS: 2, ApiKey.METADATA: 4}
VERSION_CEILING: Mapping[int, int] = {ApiKey.FETCH: 17, ApiKey.LIST_OFFSETS: 9, ApiKey.METADATA: 12}
# Group requests, needed only with a group_id: negotiated where the node serves them.
GROUP_VERSIONS: Mapping[int, tuple[int, int]] = {
    ApiKey.FIND_COORDINATOR: (4, 4), ApiKey.OFFSET_COMMIT: (8, 9), ApiKey.OFFSET_FETCH: (8, 9),
    # group membership (docs/wire-contract.md section 8)
    ApiKey.JOIN_GROUP: (9, 9), ApiKey.SYNC_GROUP: (5, 5), ApiKey.HEARTBEAT: (4, 4), ApiKey.LEAVE_GROUP: (5, 5),
}

# Failures after which a request may be retried over a new connection.
NETWORK_ERRORS: tuple[type[BaseException], ...] = (BrokerConnectionError, OSError, trio.TooSlowError, ProtocolError)
# ... and the same with the cluster's retriable answers: back off, refresh, retry.
RETRIABLE_FAILURES: tuple[type[BaseException], ...] = NETWORK_ERRORS + (RetriableError,)


@dataclass(frozen=True)
class Negotiated:
    """What one ApiVersions exchange settled: a version per API, and the features."""

    versions: Mapping[int, int]
    features: frozenset[str]


def api_versions_request() -> ApiVersionsRequest:
    return ApiVersionsRequest(client_software_name="keyrange-consumer", client_software_version="1")


def negotiate(response: ApiVersionsResponse, where: str) -> Negotiated:
    """Versions and features from an ApiVersions response. Raises ``UnsupportedVersionError``
    when a required API has no version in common, naming both windows."""
    if response.error_code != ErrorCode.NONE:
        raise KafkaError.for_code(response.error_code, f"ApiVersions from {where}")
    theirs = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    versions: dict[int, int] = {}
    for api_key, floor in VERSION_FLOOR.items():
        ours = messages.supported_versions(api_key) or (floor, -1)
        low, high = theirs.get(api_key, (0, -1))
        version = min(VERSION_CEILING[api_key], ours[1], high)
        if version < max(floor, low, ours[0]):
            raise UnsupportedVersionError(
                f"{where} serves {ApiKey(api_key).name} v{low}-{high}; this consumer needs "
                f"v{max(floor, ours[0])}-{min(VERSION_CEILING[api_key], ours[1])}")
        versions[api_key] = version
    for api_key, (floor, ceiling) in GROUP_VERSIONS.items():
        low, high = theirs.get(api_key, (0, -1))
        decodable = messages.supported_versions(api_key)
        version = min(ceiling, decodable[1] if decodable else -1, high)
        if version >= max(floor, low):
            versions[api_key] = version
    features = frozenset(f.name for f in response.supported_features or ())
    return Negotiated(versions, features)


@dataclass
class NodeConnection:
    """An open connection with what its ApiVersions exchange settled."""

    conn: BrokerConnection
    versions: Mapping[int, int]
    features: frozenset[str]

    @property
    def filters_ranges(self) -> bool:
        """Whether Fetch requests over this connection may carry key ranges."""
        return RANGE_FETCH_FEATURE in self.features and self.versions[ApiKey.FETCH] >= RANGE_FETCH_MIN_VERSION

    @property
    def fetches_cooperatively(self) -> bool:
        """Whether Fetch requests over this connection may fetch partitions cooperatively
        (docs/wire-contract.md#37-cooperative-fetch)."""
        return COOPERATIVE_FETCH_FEATURE in self.features and self.versions[ApiKey.FETCH] >= RANGE_FETCH_MIN_VERSION

    @property
    def commits_ranges(self) -> bool:
        """Whether OffsetCommit requests over this connection may carry offset ranges."""
        return INDIVIDUAL_COMMIT_FEATURE in self.features

    @property
    def closed(self) -> bool:
        return self.conn.closed


async def open_connection(host: str, port: int, *, client_id: str, timeout: float) -> NodeConnection:
    """Connect and negotiate; the connection is closed again if negotiation fails."""
    conn = await BrokerConnection.open(host, port, client_id=client_id, timeout=timeout)
    try:
        response = await conn.request(ApiKey.API_VERSIONS, API_VERSIONS_VERSION, api_versions_request(),
                                      timeout=timeout)
        negotiated = negotiate(response, f"{host}:{port}")
    except BaseException:
        with trio.CancelScope(shield=True):
            await conn.aclose()
        raise
    return NodeConnection(conn, negotiated.versions, negotiated.features)


async def close_connection(connection: NodeConnection) -> None:
    with trio.CancelScope(shield=True):
        await connection.conn.aclose()


class Connections:
    """The bootstrap connection and one connection per broker node, opened on demand.

    Counts ``reconnects`` in ``metrics``: a node (or the bootstrap list) connected again
    after its connection was lost.
    """

    def __init__(self, bootstrap_addresses: list[tuple[str, int]], *, client_id: str, timeout: float,
                 metrics: Counter[str]) -> None:
        self._bootstrap_addresses = bootstrap_addresses
        self._client_id = client_id
        self.timeout = timeout
        self._metrics = metrics
        self.bootstrap: NodeConnection | None = None
        self.by_node: dict[int, NodeConnection] = {}
        self._nodes_opened: set[int] = set()

    async def open(self, host: str, port: int) -> NodeConnection:
        return await open_connection(host, port, client_id=self._client_id, timeout=self.timeout)

    async def connect_bootstrap(self) -> NodeConnection:
        """The first bootstrap server that answers; ``ConsumerConnectionError`` naming each
        failure when none does."""
        errors = []
        for host, port in self._bootstrap_addresses:
            try:
                self.bootstrap = await self.open(host, port)
                return self.bootstrap
            except NETWORK_ERRORS + (KafkaError,) as exc:
                errors.append(f"{host}:{port}: {exc!r}")
        raise ConsumerConnectionError("no bootstrap server answered: " + "; ".join(errors))

    async def any(self) -> NodeConnection:
        """An open connection for a request any node can answer (Metadata,
        FindCoordinator): the bootstrap one, any node's, else the bootstrap list again."""
        if self.bootstrap is not None and not self.bootstrap.closed:
            return self.bootstrap
        for connection in self.by_node.values():
            if not connection.closed:
                return connection
        errors = []
        for host, port in self._bootstrap_addresses:
            try:
                self.bootstrap = await self.open(host, port)
                self._metrics["reconnects"] += 1
                return self.bootstrap
            except NETWORK_ERRORS as exc:
                errors.append(f"{host}:{port}: {exc!r}")
        raise BrokerConnectionError("no bootstrap server answered: " + "; ".join(errors))

    async def node(self, node_id: int, address: tuple[str, int]) -> NodeConnection:
        """The open connection to ``node_id`` at ``address``, opened (again) if needed."""
        connection = self.by_node.get(node_id)
        if connection is not None and not connection.closed:
            return connection
        connection = await self.open(*address)
        if node_id in self._nodes_opened:
            self._metrics["reconnects"] += 1
        self._nodes_opened.add(node_id)
        self.by_node[node_id] = connection
        return connection

    async def retain(self, node_ids: Iterable[int]) -> None:
        """Drop the connections of nodes the cluster no longer lists, and closed ones."""
        keep = set(node_ids)
        for node_id in list(self.by_node):
            if self.by_node[node_id].closed or node_id not in keep:
                await close_connection(self.by_node.pop(node_id))

    async def request(self, connection: NodeConnection, api_key: int, version: int, body: object, *,
                      timeout: float | None = None) -> Any:
        """One request; the connection is closed if it fails or is cancelled midway. The
        response body is that of ``api_key``: the caller, who knows which, types it."""
        try:
            return await connection.conn.request(api_key, version, body,
                                                 timeout=self.timeout if timeout is None else timeout)
        except BaseException:
            await close_connection(connection)
            raise

    async def aclose(self) -> None:
        connections = list(self.by_node.values())
        if self.bootstrap is not None:
            connections.append(self.bootstrap)
        self.by_node.clear()
        self.bootstrap = None
        for connection in connections:
            await close_connection(connection)
