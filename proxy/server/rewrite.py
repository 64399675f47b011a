"""Pure rewrites of decoded responses: broker addresses and ApiVersions.

Each function takes a decoded response body, changes it in place and says whether it
changed anything, so the caller re-encodes only when it must and otherwise forwards the
broker's original bytes.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Protocol

from proxy.protocol.messages import ApiKey

log = logging.getLogger("proxy.rewrite")


class Advertiser(Protocol):
    def learn(self, node_id: int, host: str, port: int) -> None: ...

    def advertised(self, node_id: int) -> tuple[str, int]: ...


def _rewrite_entries(entries: Iterable, book: Advertiser, id_field: str = "node_id") -> bool:
    changed = False
    for entry in entries or ():
        node_id = getattr(entry, id_field)
        if node_id is None or node_id < 0:
            continue
        book.learn(node_id, entry.host, entry.port)
        host, port = book.advertised(node_id)
        if entry.host != host or entry.port != port:
            entry.host = host
            entry.port = port
            changed = True
    return changed


def rewrite_metadata(body, book: Advertiser) -> bool:
    return _rewrite_entries(body.brokers, book)


def rewrite_describe_cluster(body, book: Advertiser) -> bool:
    return _rewrite_entries(body.brokers, book, id_field="broker_id")


def rewrite_find_coordinator(body, book: Advertiser) -> bool:
    coordinators = getattr(body, "coordinators", None)
    if coordinators:  # v4+: batched form
        changed = False
        for entry in coordinators:
            if entry.error_code == 0:
                changed |= _rewrite_entries([entry], book)
        return changed
    if getattr(body, "error_code", 0) == 0 and getattr(body, "node_id", -1) >= 0 and hasattr(body, "host"):
        return _rewrite_entries([body], book)
    return False


def rewrite_node_endpoints(body, book: Advertiser) -> bool:
    """Produce v10+, Fetch v16+, ShareFetch and ShareAcknowledge (KIP-951 leader hints)."""
    return _rewrite_entries(getattr(body, "node_endpoints", None), book)


ADDRESS_REWRITERS = {
    ApiKey.METADATA: rewrite_metadata,
    ApiKey.DESCRIBE_CLUSTER: rewrite_describe_cluster,
    ApiKey.FIND_COORDINATOR: rewrite_find_coordinator,
    ApiKey.PRODUCE: rewrite_node_endpoints,
    ApiKey.FETCH: rewrite_node_endpoints,
    ApiKey.SHARE_FETCH: rewrite_node_endpoints,
    ApiKey.SHARE_ACKNOWLEDGE: rewrite_node_endpoints,
}


def clamp_api_versions(
    body,
    known: dict[int, tuple[int, int]],
    features: dict[str, tuple[int, int]],
    new_feature: Callable[..., Any] | None = None,
) -> bool:
    """Clamp the advertised versions of every key we decode to what our schemas know; add
    our features.

    ``known`` maps each api key the proxy decodes to the (min, max) its schemas know. A
    broker newer than our schemas could otherwise announce a version we cannot decode, and
    an older one a version below our schemas' floor. Keys not in ``known`` are passed on
    exactly as the broker advertises them.
    """
    changed = False
    for entry in body.api_keys or ():
        ours = known.get(entry.api_key)
        if ours is None:
            continue
        low, high = ours
        if entry.max_version > high:
            entry.max_version = max(high, entry.min_version)
            changed = True
        if entry.min_version < low <= entry.max_version:
            entry.min_version = low
            changed = True
    if features and hasattr(body, "supported_features"):
        present = {feature.name for feature in body.supported_features or ()}
        for name, (min_version, max_version) in features.items():
            if name in present or new_feature is None:
                continue
            if body.supported_features is None:
                body.supported_features = []
            body.supported_features.append(new_feature(name=name, min_version=min_version, max_version=max_version))
            changed = True
    return changed
