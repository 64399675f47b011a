"""Requests that must never reach a virtual topic are refused: writes and topic
administration naming one (Produce, DeleteRecords, CreateTopics, ...), and a KIP-848
consumer group (ConsumerGroupHeartbeat) subscribing to one. The proxy answers them itself;
the rules are ``proxy.virtual.refusals``' (no I/O).

Produce is the one of them that comes in volume, and the native relay carries it when this
feature is off. So the Produce stage declares its guard (``native_guards``): the native
relay checks each Produce's topic names against it in C and carries those naming no
virtual topic, and only the others reach this stage."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from proxy.pipeline import ConnectionContext, Feature, Request, RequestStage, Route
from proxy.pipeline.feature import NativeGuard
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.message_types import ConsumerGroupHeartbeatRequest
from proxy.virtual import refusals
from proxy.virtual.metrics import VirtualTopicsMetrics
from proxy.virtual.resolver import VirtualResolver

log = logging.getLogger("proxy.virtual")

_REGEX_VERDICTS = 256  # heartbeat regular expressions whose verdict is remembered


class VirtualRefusalFeature(Feature):
    name = "virtual-refusals"

    def __init__(self, resolver: VirtualResolver, metrics: VirtualTopicsMetrics | None = None) -> None:
        self.resolver = resolver
        self._regex_verdicts: dict[tuple[str | None, tuple[str, ...], int], str | None] = {}
        self._refused = (metrics or VirtualTopicsMetrics()).refused

    def native_guards(self) -> Mapping[int, NativeGuard]:
        return {ApiKey.PRODUCE: self.resolver.precheck.native_guard}

    def request_stages(self) -> Mapping[int, RequestStage]:
        # A request whose bytes cannot name a virtual topic goes on undecoded; a heartbeat's
        # regular expression may hold the suffix with no digit after it.
        stages: dict[int, RequestStage] = {api_key: self.resolver.guarded(self.on_refused)
                                           for api_key in refusals.REFUSED_APIS}
        stages[ApiKey.CONSUMER_GROUP_HEARTBEAT] = self.resolver.guarded(self.on_group_heartbeat, pattern=True)
        return stages

    async def on_refused(self, ctx: ConnectionContext, request: Request) -> Route | None:
        _, body = request.decoded()
        response = refusals.refuse(request.api_key, request.version, body, self.resolver.virtual, self.resolver.by_id)
        if response is None:
            return None
        self._refused.labels(messages.api_name(request.api_key)).inc()
        if request.api_key == ApiKey.PRODUCE and body.acks == 0:
            return Route(None, expect_response=False)
        return Route.answer(messages.encode_response(request.api_key, request.version,
                                                     messages.new_response_header(request.correlation_id), response))

    async def on_group_heartbeat(self, ctx: ConnectionContext,
                                 request: Request[ConsumerGroupHeartbeatRequest]) -> Route | None:
        _, body = request.decoded()
        resolver = self.resolver
        await resolver.know(body.subscribed_topic_names or ())
        if refusals.regex_mentions_suffix(body, resolver.names.suffixes) is None:
            message = refusals.heartbeat_refusal(body, resolver.virtual, resolver.names)
        else:
            await resolver.refresh_all()  # the expression is tried against every real topic
            message = self._regex_verdict(body)
        if message is None:
            return None
        self._refused.labels(messages.api_name(request.api_key)).inc()
        log.warning("refused a consumer-protocol group group=%s reason=%s", body.group_id, message)
        return Route.answer(messages.encode_response(request.api_key, request.version,
                                                     messages.new_response_header(request.correlation_id),
                                                     refusals.refuse_heartbeat(request.version, message)))

    def _regex_verdict(self, body: ConsumerGroupHeartbeatRequest) -> str | None:
        """``heartbeat_refusal`` of a heartbeat carrying a regular expression, remembered until
        the topics the proxy knows change: a member may repeat its expression in every heartbeat."""
        resolver = self.resolver
        key = (body.subscribed_topic_regex, tuple(body.subscribed_topic_names or ()), len(resolver.cluster.topics))
        if key not in self._regex_verdicts:
            if len(self._regex_verdicts) >= _REGEX_VERDICTS:
                self._regex_verdicts.clear()
            self._regex_verdicts[key] = refusals.heartbeat_refusal(body, resolver.virtual, resolver.names,
                                                                   resolver.cluster.topics)
        return self._regex_verdicts[key]
