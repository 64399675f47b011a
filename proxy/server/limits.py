"""Rules that bound what one client connection, or a crowd of them, can cost the proxy;
pure, with the clock passed in.

``ConnectionSetup`` decides when a new connection has finished setting up, which is what
``connections.setup.timeout.ms`` bounds (``ClientConnection`` enforces it):

- every connection must deliver its first complete request;
- a connection that begins SASL authentication (a SaslHandshake or SaslAuthenticate
  request) before any request outside authentication must also finish it. The proxy
  relays SASL opaquely and reads no SASL bytes: a SaslAuthenticate response with error
  code 0 does not mean the exchange is over (SCRAM and GSSAPI answer their intermediate
  rounds with 0 too), so authentication counts as finished at the first request that is
  neither ApiVersions, SaslHandshake nor SaslAuthenticate. A broker serves no other request
  on a connection that has not authenticated (it closes it, and the proxy closes the
  client's with it), so that request is the proof, whatever the mechanism, and costs
  nothing to see: the proxy peeks every request's API key anyway.

Once a connection has sent a request outside authentication, a later SaslHandshake is a
re-authentication (KIP-368) and bounds nothing.

``LogThrottle`` keeps a storm of one event (thousands of connections refused a second
by a client in a reconnect loop against a full proxy) from flooding the log: one line at
once, then at most one per interval, each saying how many it stands for.
"""

from __future__ import annotations

import math

from proxy.protocol.api_keys import ApiKey

AUTHENTICATION_APIS = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})
_SASL_APIS = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})


class ConnectionSetup:
    """Whether one client connection has finished setting up, from the API keys of its
    complete requests, in the order they arrived."""

    __slots__ = ("requests", "authenticating", "past_authentication")

    def __init__(self) -> None:
        self.requests = 0  # complete requests seen
        self.authenticating = False  # SASL begun and not known to be over
        self.past_authentication = False  # a request outside authentication has arrived

    @property
    def complete(self) -> bool:
        return self.requests > 0 and not self.authenticating

    def on_request(self, api_key: int) -> None:
        """One more complete request (``api_key`` from its header)."""
        self.requests += 1
        if api_key not in AUTHENTICATION_APIS:
            self.past_authentication = True
            self.authenticating = False
        elif api_key in _SASL_APIS and not self.past_authentication:
            self.authenticating = True

    def describe(self) -> str:
        """What the connection had not done, for the log line that closes it."""
        if self.requests == 0:
            return "no complete request"
        return f"SASL authentication not finished after {self.requests} requests"


class LogThrottle:
    """At most one log line per ``interval`` seconds for one kind of event."""

    __slots__ = ("interval", "_next", "_held")

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._next = -math.inf
        self._held = 0  # events since the last line that had none of their own

    def allow(self, now: float) -> int | None:
        """None: do not log this event (it is counted). Otherwise log it, and say how many
        events before it went unlogged since the previous line."""
        if now < self._next:
            self._held += 1
            return None
        held, self._held = self._held, 0
        self._next = now + self.interval
        return held


__all__ = ["AUTHENTICATION_APIS", "ConnectionSetup", "LogThrottle"]
