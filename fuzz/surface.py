"""Which API keys and versions the proxy decodes, asked of the proxy itself.

The answer depends on configuration (virtual topics and fetch prediction add request stages),
so the proxy is built with every optional feature on, and the feature chain it assembles
says which keys some feature reads. The versions are every version our schemas decode,
not the chain's clamped ones: a feature's ``version_limits`` (virtual topics cap
OffsetCommit and OffsetFetch) apply only when that feature is on, and without it the
newer versions are decoded too.
"""

from __future__ import annotations

import functools

from proxy.pipeline.chain import FeatureChain
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.server.app import ProxyServer
from proxy.server.config import build_config

# Requests the proxy sends on its own behalf and whose responses it decodes, beyond the
# keys its features read: the individual-commit log's idempotent producer.
OWN_REQUEST_KEYS = (ApiKey.INIT_PRODUCER_ID,)


@functools.cache
def production_chain() -> FeatureChain:
    """The feature chain of a proxy with every optional feature enabled."""
    config = build_config({
        "bootstrap.servers": "127.0.0.1:9",
        "listen.port": "0",
        "virtual.topics.enabled": "true",
        "fetch.prediction.enabled": "true",
    })
    server = ProxyServer(config)
    server._main_socket.close()  # only its chain is wanted; nothing listens
    return server.chain


@functools.cache
def decoded_versions() -> dict[int, tuple[int, int]]:
    """API key -> (oldest, newest) version the proxy may decode, requests and responses."""
    keys = {*production_chain().known_versions(), *OWN_REQUEST_KEYS}
    versions = {}
    for key in sorted(keys):
        supported = messages.supported_versions(key)
        if supported is not None:
            versions[int(key)] = supported
    return versions


def is_decoded(api_key: int, version: int) -> bool:
    span = decoded_versions().get(api_key)
    return span is not None and span[0] <= version <= span[1]
