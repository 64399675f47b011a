"""Connections of the proxy's own to the brokers, pooled per address.

The proxy asks the cluster things itself (metadata at start-up and for topic ids it has
not seen, the individual-commit log, committed offsets). Those requests never share a
client's upstream connection; they go over ``BrokerConnection``s kept here, a few idle
ones per broker, each carrying one request at a time.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Iterable
from typing import Any

import trio

from proxy.net.broker_connection import BrokerConnection, BrokerConnectionError
from proxy.protocol.errors import ProtocolError

Address = tuple[str, int]

_IDLE_PER_ADDRESS = 16


class NoBrokerAnswered(Exception):
    """Every address tried failed; the message lists each with its reason, ``causes`` holds
    the exceptions."""

    def __init__(self, message: str, causes: list[BaseException]) -> None:
        super().__init__(message)
        self.causes = causes


class BrokerPool:
    def __init__(
        self,
        bootstrap: Iterable[Address],
        *,
        known_addresses: Callable[[], Iterable[Address]] = lambda: (),
        ssl_context: ssl.SSLContext | None = None,
        timeout: float = 10.0,
        client_id: str = "keyrange-proxy",
    ) -> None:
        self.bootstrap = list(bootstrap)
        self._known_addresses = known_addresses  # the nodes the cluster reported, tried first
        self.ssl_context = ssl_context
        self.timeout = timeout
        self.client_id = client_id
        self._idle: dict[Address, list[BrokerConnection]] = {}

    def addresses(self) -> list[Address]:
        """Every address worth trying, the cluster's own nodes first, then the bootstrap list."""
        known = list(dict.fromkeys(self._known_addresses()))
        return [*known, *(address for address in self.bootstrap if address not in known)]

    async def request(self, address: Address, api_key: int, version: int, body: Any, *,
                      timeout: float | None = None) -> Any:
        """One request to the broker at ``address``; its decoded response body."""
        idle = self._idle.setdefault(address, [])
        connection = idle.pop() if idle else None
        if connection is None or connection.closed:
            connection = await BrokerConnection.open(address[0], address[1], client_id=self.client_id,
                                                     timeout=self.timeout, ssl_context=self.ssl_context)
        try:
            response = await connection.request(api_key, version, body, timeout=timeout or self.timeout)
        except BaseException:
            with trio.CancelScope(shield=True):
                await connection.aclose()
            raise
        if len(idle) < _IDLE_PER_ADDRESS:
            idle.append(connection)
        else:
            await connection.aclose()
        return response

    async def request_any(self, api_key: int, version: int, body: Any, *, timeout: float | None = None,
                          addresses: Iterable[Address] | None = None) -> Any:
        """The same request to each address in turn until one answers."""
        failures = []
        causes: list[BaseException] = []
        for address in self.addresses() if addresses is None else addresses:
            try:
                return await self.request(address, api_key, version, body, timeout=timeout)
            except (BrokerConnectionError, OSError, trio.TooSlowError, ProtocolError, ssl.SSLError) as exc:
                failures.append(f"{address[0]}:{address[1]} ({exc or type(exc).__name__})")
                causes.append(exc)
        raise NoBrokerAnswered("no broker answered: " + ("; ".join(failures) or "no address known"), causes)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                await connection.aclose()
