"""The schema codecs, for every API key and version the proxy decodes, both directions.

The codec's promises (``proxy/protocol/messages.py``): only ``ProtocolError`` escapes a
decode, a decoder bug surfaces as one whose reason starts with "internal" (a finding
here), and decoding is strict, so whatever decodes encodes back to the same bytes, except
that an explicit null for a tagged field whose default is null is dropped. On top of
that the proxy re-encodes what it decoded after its own edits: without our extensions
(what goes to a broker) and, for responses that carry broker addresses, after the
address rewrite every such response goes through. Neither may fail on a body the codec
accepted. The codec holds every array to MAX_ARRAY_ELEMENTS and every tagged-field
section to MAX_TAGGED_FIELDS; the cheap check of a request header's tagged fields that
every request goes through must count what the codec decodes, and refuse whenever the
codec refuses the header for its count.

Input: one byte, even for a request and odd for a response. A request is the frame
itself (its header names the key and version); a response is int16 api key, int16
version, then the frame. Keys and versions the proxy does not decode are skipped.
"""

from __future__ import annotations

import struct
from typing import Any

from fuzz.common import InvariantBroken, check_not_internal, generated_functions
from fuzz.surface import decoded_versions, is_decoded
from proxy.features.addresses import ADDRESS_REWRITERS, FIRST_VERSION_WITH_ADDRESSES
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.errors import ProtocolError, UnsupportedVersionError
from proxy.protocol.framing import check_request_header_tags

_KEY_AND_VERSION = struct.Struct(">hh")


class _Book:
    def learn(self, node_id: int, host: str, port: int) -> None:
        pass

    def advertised(self, node_id: int) -> tuple[str, int]:
        return "proxy.example", 9192 + node_id % 1000


_BOOK = _Book()
_REWRITERS: dict[int, Any] = {int(key): rewriter for key, rewriter in ADDRESS_REWRITERS.items()}
_FIRST_WITH_ADDRESSES: dict[int, int] = {int(key): first for key, first in FIRST_VERSION_WITH_ADDRESSES.items()}


def generated_code() -> list:
    """The decoders and encoders generated at run time for the decoded keys: the runner
    instruments them, since import hooks never see code built by ``exec``."""
    codecs = []
    for api_key, (low, high) in decoded_versions().items():
        for version in range(low, high + 1):
            for kind in ("request", "response"):
                frame = messages.REGISTRY.frame(api_key, version, kind)
                codecs += [frame.header, frame.body]
    return generated_functions(codecs)


def _same_after_reencode(frame: bytes, again: bytes, redecode) -> None:
    """The one tolerated difference is a dropped explicit null: shorter, and stable."""
    if again == frame:
        return
    if len(again) >= len(frame):
        raise InvariantBroken(f"re-encoding changed {len(frame)} bytes into {len(again)}")
    once, twice = redecode(again)
    if once != twice:
        raise InvariantBroken("a re-encoded frame does not encode to itself")


def _header_tags(frame: bytes, api_key: int, version: int) -> tuple[int | None, ProtocolError | None]:
    try:
        return check_request_header_tags(frame, messages.request_header_flexible(api_key, version)), None
    except ProtocolError as exc:
        return None, exc


def _request(frame: bytes) -> None:
    if len(frame) < 4:
        return
    api_key, version = _KEY_AND_VERSION.unpack_from(frame, 0)
    if not is_decoded(api_key, version):
        return
    count, refused = _header_tags(frame, api_key, version)
    try:
        header, body = messages.decode_request(frame)
    except ProtocolError as exc:
        check_not_internal(exc)
        if refused is None and exc.reason.startswith("request header:") and "exceeds the limit" in exc.reason:
            raise InvariantBroken(f"the header check passed a header the codec refuses: {exc}") from None
        try:  # as the proxy reads a request on its way (a broker ignores trailing bytes)
            messages.decode_request(frame, strict=False)
        except ProtocolError as lenient:
            check_not_internal(lenient)
        return
    decoded = len(header._unknown_tagged) + len(header._present_tags) if messages.is_flexible(api_key, version) else 0
    if refused is not None or count != decoded:
        raise InvariantBroken(f"the header check read {count} tagged fields ({refused}), the codec {decoded}")

    def redecode(again: bytes) -> tuple[bytes, bytes]:
        h, b = messages.decode_request(again)
        return again, messages.encode_request(h, b)

    _same_after_reencode(frame, messages.encode_request(header, body), redecode)
    messages.strip_extensions(body)
    stripped = messages.encode_request(header, body)
    messages.decode_request(stripped)


def _response(api_key: int, version: int, frame: bytes) -> None:
    if not is_decoded(api_key, version):
        return
    layout = version
    try:
        if api_key == ApiKey.API_VERSIONS:
            header, body, layout = messages.decode_api_versions_response(version, frame)
        else:
            header, body = messages.decode_response(api_key, version, frame)
    except UnsupportedVersionError:
        raise InvariantBroken(f"no codec for a version the proxy decodes: {api_key} v{version}") from None
    except ProtocolError as exc:
        check_not_internal(exc)
        return

    def redecode(again: bytes) -> tuple[bytes, bytes]:
        h, b = messages.decode_response(api_key, layout, again)
        return again, messages.encode_response(api_key, layout, h, b)

    _same_after_reencode(frame, messages.encode_response(api_key, layout, header, body), redecode)
    rewriter = _REWRITERS.get(api_key)
    if rewriter is not None and version >= _FIRST_WITH_ADDRESSES.get(api_key, 0) and rewriter(body, _BOOK):
        rewritten = messages.encode_response(api_key, layout, header, body)
        messages.decode_response(api_key, layout, rewritten)


def one_input(data: bytes) -> None:
    if not data:
        return
    if data[0] & 1 == 0:
        _request(data[1:])
    elif len(data) >= 5:
        api_key, version = _KEY_AND_VERSION.unpack_from(data, 1)
        _response(api_key, version, data[5:])
