"""Virtual topic names in the requests that name topics, and their responses: Metadata,
ListOffsets, OffsetsForLeaderEpoch, DescribeConfigs and DescribeTopicPartitions naming a
virtual topic are rewritten onto its real topic before any later feature or the broker
sees them, and each one's response is turned back into the answer to what the client asked
(the rewrite's response hook, ``Request.replace(..., on_response=...)``). The rules are
``proxy.virtual.rewrite``'s (no I/O).

It runs right after the cluster feed, so the shared cluster view learns only real topics.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from proxy.pipeline import ConnectionContext, DecodedResponse, Feature, Request, RequestStage, Route
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.message_types import (
    DescribeConfigsRequest,
    DescribeTopicPartitionsRequest,
    DescribeTopicPartitionsResponse,
    ListOffsetsRequest,
    MetadataRequest,
    MetadataResponse,
    OffsetForLeaderEpochRequest,
    RequestHeader,
)
from proxy.virtual import rewrite
from proxy.virtual.resolver import VirtualResolver


class VirtualNamingFeature(Feature):
    name = "virtual-naming"

    def __init__(self, resolver: VirtualResolver) -> None:
        self.resolver = resolver

    def request_stages(self) -> Mapping[int, RequestStage]:
        stages: dict[int, RequestStage] = {
            ApiKey.METADATA: self.on_metadata,
            ApiKey.LIST_OFFSETS: self.on_list_offsets,
            ApiKey.OFFSET_FOR_LEADER_EPOCH: self.on_leader_epoch,
            ApiKey.DESCRIBE_CONFIGS: self.on_describe_configs,
            ApiKey.DESCRIBE_TOPIC_PARTITIONS: self.on_describe_topic_partitions,
        }
        # A request whose bytes cannot name a virtual topic goes on undecoded.
        return {api_key: self.resolver.guarded(stage) for api_key, stage in stages.items()}

    @staticmethod
    def _rewritten(request: Request, body: object, back: Callable[[Any, int], None]) -> None:
        """The request goes on as ``body`` (rewritten in place); ``back(response body,
        version)`` turns its response (of the request's API) into the answer to what the
        client asked."""
        header, _ = request.decoded()

        def hook(response: DecodedResponse) -> None:
            back(response.body, response.version)
            response.changed = True

        request.replace(messages.encode_request(header, body), (header, body), on_response=hook)

    async def on_metadata(self, ctx: ConnectionContext, request: Request[MetadataRequest]) -> Route | None:
        _, body = request.decoded()
        if not body.topics:
            return None
        resolver = self.resolver
        await resolver.know(t.name for t in body.topics)
        plan = rewrite.metadata_request(body, request.version, resolver)
        if plan is not None:
            def back(response: MetadataResponse, version: int) -> None:
                rewrite.metadata_response(response, version, plan, resolver)
                resolver.handed_out(response.topics)

            self._rewritten(request, body, back)
        return None

    async def on_list_offsets(self, ctx: ConnectionContext, request: Request[ListOffsetsRequest]) -> Route | None:
        header, body = request.decoded()
        await self.resolver.know(t.name for t in body.topics)
        plan = rewrite.list_offsets_request(body, self.resolver)
        if plan is None:
            return None
        self._rewritten(request, body, lambda response, version: rewrite.list_offsets_response(response, plan))
        return self._asked_apart(request, header, plan)

    async def on_leader_epoch(self, ctx: ConnectionContext,
                              request: Request[OffsetForLeaderEpochRequest]) -> Route | None:
        header, body = request.decoded()
        await self.resolver.know(t.topic for t in body.topics)
        plan = rewrite.offsets_for_leader_epoch_request(body, self.resolver)
        if plan is None:
            return None
        self._rewritten(request, body,
                        lambda response, version: rewrite.offsets_for_leader_epoch_response(response, plan))
        return self._asked_apart(request, header, plan)

    @staticmethod
    def _asked_apart(request: Request, header: RequestHeader, plan: rewrite.PartitionPlan) -> Route | None:
        """Shares of one real partition that asked different questions: the further ones go
        upstream, on the client's connection, just before its request, and its response is
        rewritten with every answer. None (the request goes on) when one request asks all."""
        if not plan.extra:
            return None
        return Route(request.frame, before=rewrite.extra_requests(header, request.api_key, plan))

    async def on_describe_configs(self, ctx: ConnectionContext, request: Request[DescribeConfigsRequest]) -> Route | None:
        _, body = request.decoded()
        renamed = rewrite.describe_configs_request(body, self.resolver)
        if renamed is not None:
            self._rewritten(request, body,
                            lambda response, version: rewrite.describe_configs_response(response, renamed))
        return None

    async def on_describe_topic_partitions(self, ctx: ConnectionContext,
                                           request: Request[DescribeTopicPartitionsRequest]) -> Route | None:
        _, body = request.decoded()
        resolver = self.resolver
        await resolver.know(t.name for t in body.topics or ())
        asked = rewrite.describe_topic_partitions_request(body, resolver)
        if asked is not None:
            def back(response: DescribeTopicPartitionsResponse, version: int) -> None:
                rewrite.describe_topic_partitions_response(response, asked, resolver)
                resolver.handed_out(response.topics)

            self._rewritten(request, body, back)
        return None
