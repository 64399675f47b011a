"""Feeds the shared cluster view from the Metadata responses that pass through to clients.

Listed before ``AddressRewrite``, so the view learns the brokers' real addresses before
they are replaced by the proxy's.
"""

from __future__ import annotations

from collections.abc import Mapping

from proxy.pipeline.cluster import ClusterView
from proxy.pipeline.context import ConnectionContext
from proxy.pipeline.feature import Feature, ResponseStage
from proxy.pipeline.route import DecodedResponse
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.message_types import MetadataResponse


class ClusterFeed(Feature):
    name = "cluster-feed"

    def __init__(self, view: ClusterView) -> None:
        self.view = view

    def response_stages(self) -> Mapping[int, tuple[int, ResponseStage]]:
        return {ApiKey.METADATA: (0, self._metadata)}

    def _metadata(self, ctx: ConnectionContext, response: DecodedResponse[MetadataResponse]) -> None:
        self.view.learn_metadata(response.body)
