"""The contract every feature of the proxy implements.

A feature is one module with one class that says, by API key:

- which requests it reads (``request_stages``): each stage gets the connection's context
  and the request, and returns a ``Route`` to claim it or None to pass it on;
- which responses it reads or rewrites (``response_stages``): each stage gets every
  decoded response of that API from the given version on, whoever claimed the request;
- which entries it adds to ApiVersions' SupportedFeatures (``advertised``).

Features are listed once, in order, where the server is built (``proxy.server.app``); a
request goes through the request stages of its API key in that order, and a decoded
response through the claiming feature's own ``Route.on_response`` first, then through the
response stages in that order. Nothing else about a feature is known to the server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from proxy.pipeline.context import ConnectionContext
from proxy.pipeline.request import Request
from proxy.pipeline.route import DecodedResponse, Route

RequestStage = Callable[[ConnectionContext, Request], Awaitable["Route | None"]]
ResponseStage = Callable[[ConnectionContext, DecodedResponse], None]


class Feature:
    """Base class of features: override what the feature needs, leave the rest empty."""

    name: str = "feature"

    def request_stages(self) -> Mapping[int, RequestStage]:
        """API key -> the stage that may claim its requests."""
        return {}

    def response_stages(self) -> Mapping[int, tuple[int, ResponseStage]]:
        """API key -> (first version it applies to, the stage over decoded responses)."""
        return {}

    def advertised(self) -> Mapping[str, tuple[int, int]]:
        """SupportedFeatures entries for ApiVersions v3+: name -> (min, max) version."""
        return {}

    def version_limits(self) -> Mapping[int, int]:
        """API key -> the newest version this feature can serve; ApiVersions advertises no
        newer one, so clients pick a version whose layout the feature handles (a newer
        layout may, for example, name topics by id only)."""
        return {}
