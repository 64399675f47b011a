"""The feature contract of the proxy: how a feature sees requests, responses, connections
and the cluster, and how the server chains features in a declared order.

- ``Feature`` (feature.py): request stages, response stages and advertised extensions, by API key;
- ``Route`` (route.py): what a request stage decides: where a request goes, where its answer comes from;
- ``ConnectionContext`` (context.py): one client connection as features see it, with typed
  per-feature state (``StateKey``);
- ``ClusterView`` (cluster.py): the one view of brokers and topics every feature reads;
- ``FeatureChain`` (chain.py): runs the stages; ApiVersions is its own.

docs/architecture.md shows how a new feature plugs in.
"""

from proxy.pipeline.chain import FeatureChain
from proxy.pipeline.cluster import ClusterView
from proxy.pipeline.context import ConnectionContext, StateKey
from proxy.pipeline.feature import Feature, RequestStage, ResponseStage
from proxy.pipeline.request import Request, ResponseHook
from proxy.pipeline.route import DecodedResponse, LocalAnswer, OwnRequest, Route

__all__ = [
    "ClusterView",
    "ConnectionContext",
    "DecodedResponse",
    "Feature",
    "FeatureChain",
    "LocalAnswer",
    "OwnRequest",
    "Request",
    "ResponseHook",
    "RequestStage",
    "ResponseStage",
    "Route",
    "StateKey",
]
