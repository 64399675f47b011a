"""The group coordinator: found with FindCoordinator, found again when it moves.

Every group request (OffsetCommit and OffsetFetch now; JoinGroup, SyncGroup, Heartbeat
and LeaveGroup with group membership) goes through ``Coordinator.request``, which retries
within the request timeout while the cluster answers that the coordinator is loading,
moving or not available, or the connection fails.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import trio

from proxy.client.connection import NETWORK_ERRORS, Connections, NodeConnection, close_connection
from proxy.client.errors import COORDINATOR_RETRY_CODES, KafkaError, RequestTimedOutError, UnsupportedVersionError
from proxy.net.broker_connection import BrokerConnectionError
from proxy.protocol.constants import ErrorCode
from proxy.protocol.message_types import FindCoordinatorRequest, FindCoordinatorResponse
from proxy.protocol.messages import ApiKey

log = logging.getLogger(__name__)

GROUP_KEY_TYPE = 0  # FindCoordinator: a group (1 would be a transactional id)


def find_coordinator_request(version: int, group: str) -> FindCoordinatorRequest:
    return FindCoordinatorRequest(key_type=GROUP_KEY_TYPE, coordinator_keys=[group])


def coordinator_address(response: FindCoordinatorResponse, group: str) -> tuple[str, int]:
    """The coordinator's address from a FindCoordinator v4 response. A coordinator not
    available yet raises ``BrokerConnectionError`` (retried like a failed connection)."""
    (entry,) = response.coordinators
    if entry.error_code != ErrorCode.NONE:
        if entry.error_code in COORDINATOR_RETRY_CODES:
            raise BrokerConnectionError(f"coordinator of {group!r} not available yet (error "
                                        f"{ErrorCode.name_of(entry.error_code)})")
        raise KafkaError.for_code(entry.error_code, f"FindCoordinator for group {group!r}")
    return entry.host, entry.port


def must_find_again(response: object) -> bool:
    """Whether a group response's partition or group errors say the coordinator moved,
    is loading, or a pending transactional commit should settle first."""
    codes = {p.error_code for t in getattr(response, "topics", ()) for p in t.partitions}
    codes |= {g.error_code for g in getattr(response, "groups", ())}
    codes.add(getattr(response, "error_code", 0))  # JoinGroup, SyncGroup, Heartbeat, LeaveGroup
    return bool(codes & COORDINATOR_RETRY_CODES)


class Coordinator:
    """The connection to one group's coordinator, and requests to it with retries."""

    def __init__(self, group: str, connections: Connections, *, retry_backoff: float, metrics: Counter[str]) -> None:
        self.group = group
        self._connections = connections
        self._retry_backoff = retry_backoff
        self._metrics = metrics
        self._connection: NodeConnection | None = None

    async def request(self, api_key: int, build: Callable[[int], object], *, timeout: float | None = None) -> Any:
        """Send ``build(version)`` (a request body of ``api_key``) to the coordinator and
        return the response body (typed by the caller, who knows its API), finding it (again) while needed, for
        at most ``timeout`` (default: the request timeout); ``RequestTimedOutError`` after
        that. A JoinGroup needs longer: the coordinator holds it for the rebalance."""
        timeout = self._connections.timeout if timeout is None else timeout
        try:
            with trio.fail_after(timeout):
                return await self._request_until_answered(api_key, build, timeout)
        except trio.TooSlowError:
            raise RequestTimedOutError(f"{ApiKey(api_key).name} for group {self.group!r} got no answer within "
                                       f"request_timeout_ms={int(timeout * 1000)}") from None

    async def _request_until_answered(self, api_key: int, build: Callable[[int], object], timeout: float) -> Any:
        while True:
            try:
                connection = await self._find()
                version = connection.versions.get(api_key)
                if version is None:
                    raise UnsupportedVersionError(f"the coordinator serves no {ApiKey(api_key).name} in a version this "
                                                 f"consumer speaks")
                response = await self._connections.request(connection, api_key, version, build(version),
                                                           timeout=timeout)
            except NETWORK_ERRORS as exc:
                log.info("consumer: coordinator request failed (%r); finding it again", exc)
                await self.aclose()
                await trio.sleep(self._retry_backoff)
                continue
            if must_find_again(response):
                self._metrics["retriable_errors"] += 1
                await self.aclose()
                await trio.sleep(self._retry_backoff)
                continue
            return response

    async def _find(self) -> NodeConnection:
        if self._connection is not None and not self._connection.closed:
            return self._connection
        connection = await self._connections.any()
        version = connection.versions.get(ApiKey.FIND_COORDINATOR)
        if version is None:
            raise UnsupportedVersionError("the cluster serves no FindCoordinator v4")
        response = await self._connections.request(connection, ApiKey.FIND_COORDINATOR, version,
                                                   find_coordinator_request(version, self.group))
        self._connection = await self._connections.open(*coordinator_address(response, self.group))
        return self._connection

    async def aclose(self) -> None:
        """Close the coordinator connection; the next request finds the coordinator again."""
        connection, self._connection = self._connection, None
        if connection is not None:
            await close_connection(connection)
