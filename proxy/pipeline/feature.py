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
- which entries it adds to ApiVersions' SupportedFeatures (``advertised``);
- which of its request stages act only on requests naming a virtual topic
  (``native_guards``), so the native relay may carry the others after checking their
  names itself; and, more generally, which requests a request stage passes on untouched
  (``native_passes``: a Fetch with no tagged field in its body, off a connection holding
  fetch sessions, ...), so the native relay may carry those.

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

from proxy.net.native_relay import NativeAnswers
from proxy.net.streams import Relay
from proxy.pipeline.context import ConnectionContext
from proxy.pipeline.request import Request
from proxy.pipeline.route import DecodedResponse, Route

RequestStage = Callable[[ConnectionContext, Request], Awaitable["Route | None"]]
ResponseStage = Callable[[ConnectionContext, DecodedResponse], None]
# The native relay's guard as it stands now (``proxy.net.native_table.guard_blob``): asked
# again at the start of every run, so ids handed out meanwhile are in the next one's.
NativeGuard = Callable[[], bytes]


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


@dataclass(frozen=True, slots=True)
class NativePass:
    """Which requests of one API key a feature's request stage passes on untouched (the
    stage returns None for them), so that the native relay (``proxy/net/_cpump.c``) may
    carry them instead of the event loop. The loop checks each request against what is
    declared here, and what it cannot check (``held``) is asked of the connection when a
    run starts. The chain carries a request only when every stage of its key declares one,
    and only what the loop can check for that key (``FeatureChain.native_classes``)."""

    # the request's body holds no tagged field (the proxy's extensions are tagged fields):
    # the loop reads every Fetch to its end for this, and no other request
    untagged: bool = False
    # it names no topic that may be virtual by this guard (Produce, Fetch)
    guard: NativeGuard | None = None
    # by topic id, it names only topics of these ids (``native_table.known_blob``; Fetch)
    known: NativeGuard | None = None
    # none while this says True of the connection: its state (fetch sessions) makes every
    # request of the key the stage's
    held: Callable[[ConnectionContext], bool] | None = None
    # the stage reads nothing of the request: version -> the relay of its response, or None
    # (``Route.relay``, whose ``finish`` rewrites the response's top-level tagged fields);
    # the loop walks the response as that relay would, and hands back the tail when it has
    # tagged fields (Fetch, whose walk the loop knows)
    relay: Callable[[int], Relay | None] | None = None
    # Fetch: it also passes on a request whose only tagged fields are KeyRanges (at the top
    # level and on partitions), so the native relay may answer such a request itself from
    # the answers a feature publishes (``Feature.native_answers``)
    key_ranges: bool = False


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

    def native_guards(self) -> Mapping[int, NativeGuard]:
        """API key -> the guard under which this feature's request stage of that key does
        nothing: a request whose topic names the guard clears (none holds a virtual-topic
        suffix followed by a digit 1-9, no topic id is one it lists) would pass the stage
        untouched. The native relay then carries such requests, checking their names in C
        (Produce only: ``proxy/net/_cpump.c``), instead of leaving every one of them to the
        event loop. The same as ``native_passes`` declaring ``NativePass(guard=...)``."""
        return {}

    def native_passes(self) -> Mapping[int, NativePass]:
        """API key -> which requests this feature's request stage of that key passes on
        untouched (``NativePass``), so the native relay may carry them; a key it leaves
        out has every request through the stage on the event loop."""
        return {}

    def native_answers(self) -> NativeAnswers | None:
        """The answers of Fetch requests the native relay may send itself
        (``proxy.net.native_relay.NativeAnswers``: the key-range cache's shares), or None.
        The chain hands them to the relay only when every other Fetch stage passes such a
        request on (``NativePass.key_ranges``, or a relay that reads nothing of it)."""
        return None

    def version_limits(self) -> Mapping[int, int]:
        """API key -> the newest version this feature can serve; ApiVersions advertises no
        newer one, so clients pick a version whose layout the feature handles (a newer
        layout may, for example, name topics by id only)."""
        return {}
