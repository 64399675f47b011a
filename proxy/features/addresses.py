"""Broker addresses out, proxy addresses in: the one stage that rewrites them.

A client must never learn a broker's real address through the proxy. Every response field
that carries one is rewritten to the proxy's address for that node (docs/wire-contract.md,
"Topology"): Metadata, DescribeCluster, FindCoordinator (single and batched), and the
leader hints (NodeEndpoints, KIP-951) of Produce v10+, Fetch v16+, ShareFetch and
ShareAcknowledge. As a feature, ``AddressRewrite`` is a response stage of each of those
APIs, so it runs once per response whichever feature claimed the request; and for a Fetch
nobody else claims, it relays the response while it arrives and rewrites only its tail.

The rewrite functions are pure: each takes a decoded response body, changes it in place
and says whether it changed anything, so the response is encoded again only when it must.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from proxy.net.streams import Relay
from proxy.pipeline.context import ConnectionContext
from proxy.pipeline.feature import Feature, NativePass, RequestStage, ResponseReads, ResponseStage, ResponseStageSpec
from proxy.pipeline.request import Request
from proxy.pipeline.route import DecodedResponse, Route
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import ErrorCode
from proxy.protocol.errors import ProtocolError
from proxy.protocol.message_types import (
    DescribeClusterResponse,
    FetchResponse,
    FindCoordinatorResponse,
    MetadataResponse,
    ProduceResponse,
    ShareAcknowledgeResponse,
    ShareFetchResponse,
)
from proxy.protocol.message_versions import FETCH_FIRST_NODE_ENDPOINTS, PRODUCE_FIRST_NODE_ENDPOINTS
from proxy.protocol.peek import NODE_ENDPOINTS_TAG, read_uvarint, walk_fetch_response
from proxy.protocol.primitives import check_tag_count, uvarint_bytes

log = logging.getLogger("proxy.addresses")


class Advertiser(Protocol):
    def learn(self, node_id: int, host: str, port: int) -> None: ...

    def advertised(self, node_id: int) -> tuple[str, int]: ...


class Endpoint(Protocol):
    """An entry of a response that names a broker: its id (``node_id`` or ``broker_id``)
    and address."""

    host: str
    port: int


def _rewrite_entries(entries: Iterable[Endpoint], book: Advertiser, id_field: str = "node_id") -> bool:
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


def rewrite_metadata(body: MetadataResponse, book: Advertiser) -> bool:
    return _rewrite_entries(body.brokers, book)


def rewrite_describe_cluster(body: DescribeClusterResponse, book: Advertiser) -> bool:
    return _rewrite_entries(body.brokers, book, id_field="broker_id")


def rewrite_find_coordinator(body: FindCoordinatorResponse, book: Advertiser) -> bool:
    coordinators = body.coordinators
    if coordinators:  # v4+: batched form
        changed = False
        for entry in coordinators:
            if entry.error_code == ErrorCode.NONE:
                changed |= _rewrite_entries([entry], book)
        return changed
    if body.error_code == ErrorCode.NONE and body.node_id >= 0:  # v0-v3: one coordinator
        return _rewrite_entries([body], book)
    return False


LeaderHints = ProduceResponse | FetchResponse | ShareFetchResponse | ShareAcknowledgeResponse


def rewrite_node_endpoints(body: LeaderHints, book: Advertiser) -> bool:
    """Produce v10+, Fetch v16+, ShareFetch and ShareAcknowledge (KIP-951 leader hints)."""
    return _rewrite_entries(body.node_endpoints or (), book)


# API key -> the rewrite of its response body (of that API's response class)
ADDRESS_REWRITERS: dict[int, Callable[..., bool]] = {
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
FIRST_VERSION_WITH_ADDRESSES: dict[int, int] = {
    ApiKey.PRODUCE: PRODUCE_FIRST_NODE_ENDPOINTS,
    ApiKey.FETCH: FETCH_FIRST_NODE_ENDPOINTS,
}

# A tagged field no Kafka version defines, inside the proxy's own tag range (docs/wire-contract.md#31-tag-10000-and-feature-advertisement):
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
    check_tag_count(count, 0)
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


class AddressRewrite(Feature):
    name = "addresses"

    def __init__(self, book: Advertiser) -> None:
        self.book = book
        self._fetch_relays: dict[int, Relay] = {}

    def request_stages(self) -> Mapping[int, RequestStage]:
        return {ApiKey.FETCH: self.relay_fetch}

    def native_passes(self) -> Mapping[int, NativePass]:
        # It reads nothing of a Fetch: the native relay walks the response as fetch_relay's
        # walk does, and hands back a tail with tagged fields for its finish.
        return {ApiKey.FETCH: NativePass(relay=self.fetch_relay)}

    def response_stages(self) -> Mapping[int, ResponseStageSpec]:
        # The leader hints are top-level tagged fields: a response without any needs no
        # stage, which lets the native relay pass such Produce responses on untouched.
        return {api_key: ResponseStageSpec(FIRST_VERSION_WITH_ADDRESSES.get(api_key, 0), self._stage(rewriter),
                                           ResponseReads.TOP_LEVEL_TAGS if rewriter is rewrite_node_endpoints
                                           else ResponseReads.WHOLE)
                for api_key, rewriter in ADDRESS_REWRITERS.items()}

    def _stage(self, rewriter: Callable[..., bool]) -> ResponseStage:
        book = self.book

        def stage(ctx: ConnectionContext, response: DecodedResponse) -> None:
            if rewriter(response.body, book):
                response.changed = True

        return stage

    async def relay_fetch(self, ctx: ConnectionContext, request: Request) -> Route | None:
        """A Fetch no other feature claimed streams through; only its top-level tagged
        fields, where the leader hints live, are held back and rewritten in place."""
        relay = self.fetch_relay(request.version)
        if relay is None:
            return None  # no addresses in the response: the default (opaque) relay
        return Route(request.frame, relay=relay)

    def fetch_relay(self, version: int) -> Relay | None:
        """How a Fetch response of ``version`` is relayed: walked to its top-level tagged
        fields, which are rewritten in as many bytes; None before they can hold leader hints."""
        if version < FETCH_FIRST_NODE_ENDPOINTS:
            return None
        relay = self._fetch_relays.get(version)
        if relay is None:
            book = self.book

            def walk(frame, size, filled):
                return walk_fetch_response(frame, size, version, filled)

            def finish(frame, tail):
                return rewrite_fetch_tail(frame, tail, version, book)

            relay = self._fetch_relays[version] = Relay(walk, finish)
        return relay
