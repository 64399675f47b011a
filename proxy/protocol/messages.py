"""Public message codec API: decode and encode Kafka requests, responses and data.

Values are generated slotted dataclasses (see ``values.py``) with snake_case attributes
named after Kafka's fields, e.g. ``body.topics[0].partitions[0].key_ranges``. One class
per struct covers every version; a field the version lacks holds its default. Records
are ``memoryview`` slices of the decoded frame (zero copy), strings are ``str``, bytes
are ``bytes``, uuids are ``uuid.UUID``, arrays are ``list`` and nullable values ``None``.

Every decode path raises only ``ProtocolError`` (with api key, version and byte offset);
``UnsupportedVersionError`` (a subclass) means our schemas lack the key or version.
Decoding is strict: it accepts only canonical encodings and rejects trailing bytes after
a body, so ``encode(decode(frame)) == frame`` for every frame it accepts, with one
deliberate exception: a tagged field whose default is null, sent explicitly as null, is
dropped on re-encode (Java clients never send that; see below).

Frames here are Kafka frames *without* the 4-byte size prefix (``framing`` strips it).
Behind the functions is ``REGISTRY``, a ``MessageRegistry``: it maps (api key, version,
kind) to a ``FrameCodec`` (header codec of the right header version plus body codec) on
first use, so decoding a frame is one dictionary lookup and two generated functions.
The classes are made from the schemas at run time; ``message_types`` names them
(``FetchRequest``, ``FetchRequest.FetchTopic``) and its stub, generated from the same
schemas, types them. Headers are typed here; a body is typed through its class: the
``*_as`` functions take the class and return the body as it (``decode_response_as(
FetchResponse, version, frame)``), and a pipeline stage's ``Request[FetchRequest]`` or
``DecodedResponse[FetchResponse]`` says what its body is. The functions that find the
API from the frame itself (``decode_request``, ``decode_body``...) return the body as
``Any``.

Reading::

    header, body = decode_request(frame)                 # header.api_key, .api_version
    for topic in body.topics:                            # FetchRequest v13+: topic.topic_id
        for partition in topic.partitions:
            ranges = partition.key_ranges or body.key_ranges   # None when absent

Building from scratch (every field not given is at its Kafka default)::

    F = FetchRequest                                     # from proxy.protocol.message_types
    body = F(max_wait_ms=500, topics=[                   # nested classes by struct name
        F.FetchTopic(topic_id=tid, partitions=[F.FetchPartition(partition=0, fetch_offset=7)])])
    frame = encode_request(new_request_header(ApiKey.FETCH, 18, correlation_id, "client"), body)

Values are mutable: rewrite in place (``broker.host = ...``) and re-encode. A tagged
field equal to its default is not sent; our list extensions default to None, so setting
``key_ranges = None`` strips it from the wire even if the client sent it, which is how the
proxy forwards a request without tag-10000 fields (``strip_extensions`` does it for all).
A tagged field with a non-None default that arrived explicitly set to its default is
re-sent as it came, so re-encoding stays byte-identical.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from proxy.protocol.api_keys import ApiKey, api_name
from proxy.protocol.compiler import MessageCodec, as_view, compile_message
from proxy.protocol.constants import ErrorCode
from proxy.protocol.errors import ProtocolError, UnsupportedVersionError
from proxy.protocol.framing import GatheredFrame, peek_correlation_id
from proxy.protocol.message_types import RequestHeader, ResponseHeader
from proxy.protocol.primitives import GatheringBuffer
from proxy.protocol.schema import MessageDef, View, registry
from proxy.protocol.values import message_classes, strip_extensions, to_dict

__all__ = [
    "REGISTRY",
    "ApiKey",
    "FrameCodec",
    "MessageRegistry",
    "RequestHeader",
    "ResponseHeader",
    "api_name",
    "body_class",
    "data_class",
    "data_version",
    "decode_api_versions_response",
    "decode_body",
    "decode_body_as",
    "decode_data",
    "decode_data_as",
    "decode_request",
    "decode_request_as",
    "decode_response",
    "decode_response_as",
    "decode_response_by_correlation",
    "encode_body",
    "encode_data",
    "encode_request",
    "encode_response",
    "encode_response_gathered",
    "is_flexible",
    "new_body",
    "new_data",
    "new_request_header",
    "new_response_header",
    "precompile",
    "request_header_flexible",
    "request_header_version",
    "response_header_version",
    "strip_extensions",
    "supported_versions",
    "to_dict",
]

Kind = Literal["request", "response"]
# A frame or body as the decoders take it: any bytes-like value, read without copying.
Frame = bytes | bytearray | memoryview
B = TypeVar("B")  # a message class of message_types

_API_KEY_AND_VERSION = struct.Struct(">hh")
_DATA_VERSION = struct.Struct(">h")


# --------------------------------------------------------------------------- schema facts


def _message(api_key: int, kind: str, view: View = "ours") -> MessageDef:
    message = registry(view).message(api_key, kind)
    if message is None:
        raise UnsupportedVersionError(f"no {kind} schema for {api_name(api_key)}", api_key=api_key)
    return message


@functools.cache
def supported_versions(api_key: int) -> tuple[int, int] | None:
    """The (min, max) versions we can decode for ``api_key``, or None if we cannot.

    Both the request and the response must be defined. A request version Kafka marks
    unstable (``latestVersionUnstable``) is left out: brokers do not advertise it by
    default, and its layout may still change under the same number.
    """
    request = registry().message(api_key, "request")
    response = registry().message(api_key, "response")
    if request is None or response is None:
        return None
    versions = request.valid_versions.intersect(response.valid_versions)
    hi = versions.hi - 1 if request.latest_version_unstable else versions.hi
    if hi < versions.lo:
        return None
    return versions.lo, hi


def is_flexible(api_key: int, version: int) -> bool:
    """True when (api key, version) uses compact encodings and tagged fields."""
    return _message(api_key, "request").is_flexible(version)


def request_header_version(api_key: int, version: int) -> int:
    """2 for flexible request versions, 1 otherwise (ControlledShutdown v0 is gone)."""
    return 2 if is_flexible(api_key, version) else 1


# The first flexible version of every request Kafka defines, for deciding whether a request
# header (v2) ends with a tagged-field section: our schemas' own, plus the keys they lack
# but Kafka defines with versions before their first flexible one (``flexibleVersions`` of
# Kafka's message definitions). Every other key they lack was added after KIP-482 (Kafka
# 2.4), which made each new API flexible from its version 0; a key no Kafka defines is
# refused by the broker before it reads the header's tagged fields, so reading them costs
# nothing either. ``_NEVER_FLEXIBLE`` is above every int16 version.
_NEVER_FLEXIBLE = 1 << 15
_FIRST_FLEXIBLE_BEYOND_SCHEMAS = {
    4: 4,  # LeaderAndIsr
    5: 2,  # StopReplica
    6: 6,  # UpdateMetadata
    7: 3,  # ControlledShutdown
    38: 2,  # CreateDelegationToken
    39: 2,  # RenewDelegationToken
    40: 2,  # ExpireDelegationToken
    41: 2,  # DescribeDelegationToken
    53: 1,  # BeginQuorumEpoch
    54: 1,  # EndQuorumEpoch
}


def _first_flexible_requests() -> dict[int, int]:
    table = dict(_FIRST_FLEXIBLE_BEYOND_SCHEMAS)
    for (api_key, kind), message in registry().by_api.items():
        if kind == "request" and api_key is not None:
            flexible = message.flexible_versions
            table[api_key] = _NEVER_FLEXIBLE if flexible.empty else flexible.lo
    return table


_FIRST_FLEXIBLE_REQUEST = _first_flexible_requests()


def request_header_flexible(api_key: int, version: int) -> bool:
    """Whether a request of (api key, version) has a flexible header (v2: the client id is
    followed by a tagged-field section), as the broker reads it; for every key and version,
    including those the proxy does not decode (versions past the newest our schemas know
    keep their key's flexibility, as in Kafka). One dictionary lookup: it is asked of
    every request (``framing.check_request_header_tags``) and fills the native relay's
    table (``FeatureChain.native_classes``)."""
    if api_key < 0:
        return False
    return version >= _FIRST_FLEXIBLE_REQUEST.get(api_key, 0)


def response_header_version(api_key: int, version: int) -> int:
    """1 for flexible versions, 0 otherwise; ApiVersions always answers with v0 (KIP-511),
    so a client that sent a too-new request can still read the error."""
    if api_key == ApiKey.API_VERSIONS:
        return 0
    return 1 if is_flexible(api_key, version) else 0


def _header_version(api_key: int, version: int, kind: str) -> int:
    if kind == "request":
        return request_header_version(api_key, version)
    return response_header_version(api_key, version)


@functools.cache
def _header_codec(kind: str, header_version: int) -> MessageCodec:
    return compile_message("ours", "RequestHeader" if kind == "request" else "ResponseHeader", header_version)


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True, slots=True)
class FrameCodec:
    """Everything needed to read or write one (api key, version, kind) frame: the header
    codec of the right header version and the body codec, resolved once."""

    api_key: int
    version: int
    kind: str
    header: MessageCodec
    body: MessageCodec

    def decode(self, frame: Frame, *, to_end: bool = True) -> tuple[Any, Any]:
        """``(header, body)``; with ``to_end`` false, bytes after the body are ignored."""
        view = as_view(frame)
        try:
            header, pos = self.header.decode(view, 0, to_end=False)
        except ProtocolError as exc:
            raise ProtocolError(
                f"{self.kind} header: {exc.reason}",
                api_key=self.api_key,
                version=self.version,
                offset=exc.offset,
            ) from None
        if not to_end:
            body, _ = self.body.decode(view, pos, to_end=False)
            return header, body
        return header, self.body.decode(view, pos)

    def encode(self, header: object, body: object) -> bytes:
        out = bytearray()
        self.header.encode_into(out, header)
        self.body.encode_into(out, body)
        return bytes(out)

    def encode_gathered(self, header: object, body: object) -> bytes | GatheredFrame:
        """Like ``encode``, but record sets of ``GATHER_MIN_BYTES`` or more are not copied:
        the frame is returned as the buffers to write in order when it has any."""
        out = GatheringBuffer()
        self.header.encode_into(out, header)
        self.body.encode_into(out, body)
        if not out.gathered:
            return bytes(out)
        encoded = memoryview(out)
        parts: list = []
        start = 0
        for position, records in out.gathered:
            if position > start:
                parts.append(encoded[start:position])
            parts.append(records)
            start = position
        if start < len(out):
            parts.append(encoded[start:])
        return GatheredFrame(tuple(parts))


class MessageRegistry:
    """Frame codecs of one schema view by (api key, version, kind), built on first use.

    One dictionary lookup takes a frame to its codec; the schema is consulted (and the
    message compiled) only the first time a combination is seen.
    """

    def __init__(self, view: View = "ours") -> None:
        self.view = view
        self._frames: dict[tuple[int, int, str], FrameCodec] = {}

    def frame(self, api_key: int, version: int, kind: str) -> FrameCodec:
        """The codec of an (api key, version) request or response; UnsupportedVersionError
        when our schemas lack either."""
        key = (api_key, version, kind)
        codec = self._frames.get(key)
        if codec is None:
            codec = self._frames[key] = self._build(api_key, version, kind)
        return codec

    def body(self, api_key: int, version: int, kind: str) -> MessageCodec:
        return self.frame(api_key, version, kind).body

    def _build(self, api_key: int, version: int, kind: str) -> FrameCodec:
        body = compile_message(self.view, _message(api_key, kind, self.view).name, version)
        header = _header_codec(kind, _header_version(api_key, version, kind))
        return FrameCodec(api_key, version, kind, header, body)


REGISTRY = MessageRegistry("ours")
_REGISTRIES: dict[str, MessageRegistry] = {"ours": REGISTRY, "standard": MessageRegistry("standard")}


def _body_codec(api_key: int, version: int, kind: str, view: View = "ours") -> MessageCodec:
    return _REGISTRIES[view].frame(api_key, version, kind).body


def new_request_header(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None = None
) -> RequestHeader:
    return RequestHeader(
        request_api_key=api_key,
        request_api_version=api_version,
        correlation_id=correlation_id,
        client_id=client_id,
    )


def new_response_header(correlation_id: int) -> ResponseHeader:
    return ResponseHeader(correlation_id=correlation_id)


def precompile(api_keys: Iterable[int] | None = None) -> int:
    """Compile every supported version of ``api_keys`` (default: all) now, instead of on
    first use (about 5 ms each), so no request pays for it. Returns how many it compiled."""
    count = 0
    for api_key in registry().api_keys() if api_keys is None else api_keys:
        versions = supported_versions(api_key)
        if versions is None:
            continue
        for version in range(versions[0], versions[1] + 1):
            for kind in ("request", "response"):
                REGISTRY.frame(api_key, version, kind)
                count += 1
    return count


# --------------------------------------------------------------------------- bodies


def body_class(api_key: int, kind: Kind, *, view: View = "ours") -> Any:
    """The generated root class of a request or response; nested struct classes are its
    attributes by Kafka struct name, e.g. ``body_class(1, "request").FetchPartition``."""
    return message_classes(view, _message(api_key, kind, view).name).root


def new_body(api_key: int, version: int, kind: Kind, *, view: View = "ours", **fields: Any) -> Any:
    """A request or response body with every field at its default except ``fields``.

    ``version`` is checked against the schema (so a typo fails here, not at encode);
    the object itself is version-independent.
    """
    return _body_codec(api_key, version, kind, view).root_class(**fields)


def decode_body(
    api_key: int, version: int, kind: Kind, data: Frame, offset: int = 0, *, view: View = "ours"
) -> Any:
    """Decode a body that runs from ``offset`` to the end of ``data``."""
    return _body_codec(api_key, version, kind, view).decode(data, offset)


def encode_body(api_key: int, version: int, kind: Kind, body: object, *, view: View = "ours") -> bytes:
    return _body_codec(api_key, version, kind, view).encode(body)


_API_OF: dict[tuple[type, str], int] = {}


def _api_of(cls: type, kind: str) -> int:
    """The API key whose ``kind`` (request or response) body class ``cls`` is."""
    api_key = _API_OF.get((cls, kind))
    if api_key is None:
        message = registry().by_name.get(cls.__name__)
        if message is None or message.kind != kind or message_classes("ours", message.name).root is not cls:
            raise TypeError(f"{cls.__qualname__} is not a {kind} class of message_types")
        assert message.api_key is not None
        api_key = _API_OF[(cls, kind)] = message.api_key
    return api_key


def _as(cls: type[B], body: object) -> B:
    if type(body) is not cls:
        raise TypeError(f"decoded {type(body).__qualname__} where {cls.__qualname__} was expected")
    return body


def decode_body_as(cls: type[B], version: int, data: Frame, offset: int = 0) -> B:
    """``decode_body`` typed: the body of request or response class ``cls`` (``FetchRequest``)."""
    kind: Kind = "request" if cls.__name__.endswith("Request") else "response"
    return _as(cls, decode_body(_api_of(cls, kind), version, kind, data, offset))


# --------------------------------------------------------------------------- frames


def decode_request(frame: Frame, *, strict: bool = True) -> tuple[RequestHeader, Any]:
    """Decode a whole request frame (header and body) into ``(header, body)``.

    ``strict`` false ignores bytes after the body, as a broker does: a client that pads
    a request (librdkafka's all-topics Metadata) is served by the broker, so the proxy
    must serve it too wherever it reads requests on their way.
    """
    view = as_view(frame)
    if len(view) < _API_KEY_AND_VERSION.size:
        raise ProtocolError(f"request header truncated: {len(view)} bytes", offset=len(view))
    api_key, version = _API_KEY_AND_VERSION.unpack_from(view, 0)
    return REGISTRY.frame(api_key, version, "request").decode(view, to_end=strict)


def decode_request_as(cls: type[B], frame: Frame, *, strict: bool = True) -> tuple[RequestHeader, B]:
    """``decode_request`` typed: a frame known to hold a request of class ``cls``
    (TypeError when it holds another API's)."""
    header, body = decode_request(frame, strict=strict)
    return header, _as(cls, body)


def encode_request(header: RequestHeader, body: object) -> bytes:
    """A request frame (without size prefix) for ``header`` and ``body``."""
    return REGISTRY.frame(header.request_api_key, header.request_api_version, "request").encode(
        header, body
    )


def decode_response(api_key: int, api_version: int, frame: Frame) -> tuple[ResponseHeader, Any]:
    """Decode a response frame to the request (api key, version) it answers.

    Responses do not name their API; look it up by correlation id first, see
    ``decode_response_by_correlation``. ApiVersions responses fall back to the v0 layout
    like Kafka clients do (see ``decode_api_versions_response``).
    """
    if api_key == ApiKey.API_VERSIONS:
        header, body, _ = decode_api_versions_response(api_version, frame)
        return header, body
    return REGISTRY.frame(api_key, api_version, "response").decode(frame)


def decode_response_as(cls: type[B], api_version: int, frame: Frame) -> tuple[ResponseHeader, B]:
    """``decode_response`` typed: the API is the one whose response class ``cls`` is
    (``decode_response_as(FetchResponse, 12, frame)``)."""
    header, body = decode_response(_api_of(cls, "response"), api_version, frame)
    return header, _as(cls, body)


def decode_api_versions_response(api_version: int, frame: Frame) -> tuple[ResponseHeader, Any, int]:
    """Decode an ApiVersions response, falling back to the v0 layout as Kafka clients do.

    A broker that does not support the request's version answers UNSUPPORTED_VERSION (35)
    in a v0 body. Returns ``(header, body, layout_version)``; re-encoding the body at the
    client's requested version is fine (every client reads its own version), forwarding
    the original bytes is too.
    """
    try:
        header, body = REGISTRY.frame(ApiKey.API_VERSIONS, api_version, "response").decode(frame)
        return header, body, api_version
    except ProtocolError as first:
        if api_version == 0 or isinstance(first, UnsupportedVersionError):
            raise
        try:
            header, body = REGISTRY.frame(ApiKey.API_VERSIONS, 0, "response").decode(frame)
        except ProtocolError:
            raise first from None
        if body.error_code != ErrorCode.UNSUPPORTED_VERSION:
            raise first from None
        return header, body, 0


def decode_response_by_correlation(
    frame: Frame, lookup: Callable[[int], tuple[int, int]]
) -> tuple[ResponseHeader, Any]:
    """Decode a response when only its correlation id identifies it.

    ``lookup(correlation_id)`` returns the (api key, version) of the request it answers
    (typically popping an in-flight table); a KeyError from it becomes a ProtocolError.
    """
    correlation_id = peek_correlation_id(frame)
    try:
        api_key, api_version = lookup(correlation_id)
    except KeyError:
        raise ProtocolError(f"response to unknown correlation id {correlation_id}", offset=0) from None
    return decode_response(api_key, api_version, frame)


def encode_response(api_key: int, api_version: int, header: ResponseHeader, body: object) -> bytes:
    """A response frame (without size prefix)."""
    return REGISTRY.frame(api_key, api_version, "response").encode(header, body)


def encode_response_gathered(api_key: int, api_version: int, header: ResponseHeader,
                             body: object) -> bytes | GatheredFrame:
    """A response frame (without size prefix) to be sent as it is: its large record sets
    are not copied (``FrameCodec.encode_gathered``)."""
    return REGISTRY.frame(api_key, api_version, "response").encode_gathered(header, body)


# --------------------------------------------------------------------------- data structures


def _data_message(name: str) -> MessageDef:
    message = registry().by_name.get(name)
    if message is None or message.kind != "data":
        raise UnsupportedVersionError(f"no data structure named {name!r}")
    return message


def data_version(data: Frame) -> int:
    """The int16 version that prefixes every versioned data structure."""
    view = as_view(data)
    if len(view) < 2:
        raise ProtocolError(f"data version truncated: {len(view)} bytes", offset=0)
    return _DATA_VERSION.unpack_from(view, 0)[0]


def decode_data(name: str, data: Frame) -> Any:
    """Decode a version-prefixed data structure (consumer protocol, individual commit).

    Layout: int16 version, then the structure in that version. A version newer than we
    know is read with our newest layout and its trailing bytes are ignored, as Kafka does
    for the consumer protocol (newer versions only append fields); for known versions
    trailing bytes are an error.
    """
    message = _data_message(name)
    version = data_version(data)
    valid = message.valid_versions
    if version < valid.lo:
        raise UnsupportedVersionError(f"{name} version {version} is older than {valid}", version=version, offset=0)
    if version > valid.hi:
        value, _ = compile_message("ours", name, valid.hi).decode(data, 2, to_end=False)
        return value
    return compile_message("ours", name, version).decode(data, 2)


def decode_data_as(cls: type[B], data: Frame) -> B:
    """``decode_data`` typed: the data structure of class ``cls`` (``IndividualCommitKey``)."""
    return _as(cls, decode_data(cls.__name__, data))


def encode_data(name: str, value: object, version: int | None = None) -> bytes:
    """``value`` with its int16 version prefix; ``version`` defaults to the newest."""
    message = _data_message(name)
    if version is None:
        version = message.valid_versions.hi
    out = bytearray(_DATA_VERSION.pack(version))
    compile_message("ours", name, version).encode_into(out, value)
    return bytes(out)


def data_class(name: str) -> Any:
    """The generated class of a data structure; nested structs are its attributes."""
    return message_classes("ours", _data_message(name).name).root


def new_data(name: str, **fields: Any) -> Any:
    """A data structure value with defaults, e.g. ``new_data("IndividualCommitKey", ...)``."""
    return data_class(name)(**fields)
