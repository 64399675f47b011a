"""The contract every feature of the proxy implements.

A feature is one module with one class that says, by API key:

- which requests it reads (``request_stages``): each stage gets the connection's context
  and the request, and returns a ``Route`` to claim it or None to pass it on; a stage
  that rewrites the request (``Request.replace``) may ask for its response
  (``on_response=``), to turn it back into the answer to what the client asked;
- which responses it reads or rewrites (``response_stages``): each stage gets every
  decoded response of that API from the given version on, whoever claimed the request;
  a stage that reads only the response's top-level tagged fields says so
  (``ResponseStageSpec.reads``), which lets the native relay carry such requests and
  hand back only the responses that have any;
- which entries it adds to ApiVersions' SupportedFeatures (``advertised``).

Features are listed once, in order, where the server is built (``proxy.server.app``); a
request goes through the request stages of its API key in that order, and a decoded
response through the claiming feature's own ``Route.on_response`` first, then through the
response stages in that order, then through the response hooks of the stages that
rewrote the request, the last one's first. Nothing else about a feature is known to the
server.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from proxy.pipeline.context import ConnectionContext
from proxy.pipeline.request import Request
from proxy.pipeline.route import DecodedResponse, Route

RequestStage = Callable[[ConnectionContext, Request], Awaitable["Route | None"]]
ResponseStage = Callable[[ConnectionContext, DecodedResponse], None]


class ResponseReads(enum.Enum):
    """What of a response a response stage reads."""

    WHOLE = "whole"  # any field: every response must be decoded for it
    TOP_LEVEL_TAGS = "top-level tags"  # only top-level tagged fields: a response without any needs no stage


@dataclass(frozen=True, slots=True)
class ResponseStageSpec:
    """A response stage as a feature declares it: from which version of the API it
    applies, and what it reads (``response_stages`` may also give ``(first_version,
    stage)``, which reads the whole response)."""

    first_version: int
    stage: ResponseStage
    reads: ResponseReads = ResponseReads.WHOLE


class Feature:
    """Base class of features: override what the feature needs, leave the rest empty."""

    name: str = "feature"

    def request_stages(self) -> Mapping[int, RequestStage]:
        """API key -> the stage that may claim its requests."""
        return {}

    def response_stages(self) -> Mapping[int, ResponseStageSpec | tuple[int, ResponseStage]]:
        """API key -> the stage over decoded responses (a spec, or (first version it
        applies to, stage))."""
        return {}

    def advertised(self) -> Mapping[str, tuple[int, int]]:
        """SupportedFeatures entries for ApiVersions v3+: name -> (min, max) version."""
        return {}

    def version_limits(self) -> Mapping[int, int]:
        """API key -> the newest version this feature can serve; ApiVersions advertises no
        newer one, so clients pick a version whose layout the feature handles (a newer
        layout may, for example, name topics by id only)."""
        return {}
