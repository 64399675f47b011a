"""Pure rewrites of decoded responses: broker addresses and ApiVersions.

Each function takes a decoded response body, changes it in place and says whether it
changed anything, so the caller re-encodes only when it must and otherwise forwards the
broker's original bytes.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Protocol

from proxy.protocol import messages
from proxy.protocol.errors import ProtocolError
from proxy.protocol.messages import ApiKey
from proxy.protocol.peek import NODE_ENDPOINTS_TAG, read_uvarint
from proxy.protocol.primitives import uvarint_bytes

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

# The first version of each API whose response can carry a broker address; older versions
# pass through untouched.
FIRST_VERSION_WITH_ADDRESSES = {
    ApiKey.PRODUCE: 10,
    ApiKey.FETCH: 16,
}

# A tagged field no Kafka version defines, inside the proxy's own tag range (DESIGN.md):
# clients skip unknown tags, so it can fill out a rewritten tail to its original length.
PADDING_TAG = 10999


def rewrite_fetch_tail(frame, tail: int, version: int, book: Advertiser) -> bytes:
    """The top-level tagged fields of a Fetch response (``frame[tail:]``), with the leader
    hints (NodeEndpoints) pointing at the proxy, in exactly as many bytes as before.

    The response's size has already gone to the client when the tail is reached, so its
    length must not change: a shorter rewrite is padded with an unknown tagged field, and
    a rewrite that does not fit drops the hints (clients then look the leader up in the
    metadata, as they do for a broker that sends none). A broker's address is never passed on.
    """
    end = bytes(frame[tail:])
    fields = _tagged_fields(end)
    if NODE_ENDPOINTS_TAG not in fields:
        return end
    # Decode the hints as the tail of an otherwise empty response: correlation id, empty
    # header tags, throttle time, error code, session id, no topics.
    stub_head = bytes(frame[:4]) + b"\x00" + bytes(10) + b"\x01"
    header, body = messages.decode_response(ApiKey.FETCH, version, stub_head + end)
    rewrite_node_endpoints(body, book)
    encoded = messages.encode_response(ApiKey.FETCH, version, header, body)
    fields[NODE_ENDPOINTS_TAG] = _tagged_fields(encoded[len(stub_head):])[NODE_ENDPOINTS_TAG]
    fitted = _fit_tagged_fields(fields, len(end))
    if fitted is None:
        log.warning("leader hints dropped from a Fetch response: their proxy addresses do not fit")
        del fields[NODE_ENDPOINTS_TAG]
        fitted = _fit_tagged_fields(fields, len(end))
    assert fitted is not None and len(fitted) == len(end)
    return fitted


def _tagged_fields(data) -> dict[int, bytes]:
    """Tagged fields that make up all of ``data``: tag -> payload."""
    count, pos = read_uvarint(data, 0)
    fields = {}
    for _ in range(count):
        tag, pos = read_uvarint(data, pos)
        length, pos = read_uvarint(data, pos)
        if pos + length > len(data):
            raise ProtocolError("tagged field runs past the end of the frame", offset=pos)
        fields[tag] = bytes(data[pos : pos + length])
        pos += length
    if pos != len(data):
        raise ProtocolError(f"{len(data) - pos} bytes after the last tagged field", offset=pos)
    return fields


def _encode_tagged_fields(fields: dict[int, bytes]) -> bytes:
    out = bytearray(uvarint_bytes(len(fields)))
    for tag in sorted(fields):
        out += uvarint_bytes(tag) + uvarint_bytes(len(fields[tag])) + fields[tag]
    return bytes(out)


def _fit_tagged_fields(fields: dict[int, bytes], length: int) -> bytes | None:
    """``fields`` encoded in exactly ``length`` bytes, padded with ``PADDING_TAG``; None
    if they do not fit."""
    encoded = _encode_tagged_fields(fields)
    if len(encoded) == length:
        return encoded
    for size_bytes in range(1, 4):
        padding = length - len(_encode_tagged_fields({**fields, PADDING_TAG: b""})) + 1 - size_bytes
        if padding >= 0 and len(uvarint_bytes(padding)) == size_bytes:
            fitted = _encode_tagged_fields({**fields, PADDING_TAG: bytes(padding)})
            if len(fitted) == length:
                return fitted
    return None


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
