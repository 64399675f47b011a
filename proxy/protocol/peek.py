"""Cheap reads of single fields deep enough in a frame to route it, without a full decode."""

from __future__ import annotations

import struct

from proxy.protocol.errors import ProtocolError
from proxy.protocol.framing import RequestHeaderPeek

_INT16 = struct.Struct(">h")

PRODUCE_API_KEY = 0
PRODUCE_FIRST_FLEXIBLE_VERSION = 9


def read_uvarint(data, pos: int) -> tuple[int, int]:
    """An unsigned varint at ``pos``: (value, position after it)."""
    result = 0
    shift = 0
    n = len(data)
    while True:
        if pos >= n:
            raise ProtocolError("varint runs past the end of the frame", offset=pos)
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtocolError("varint longer than 10 bytes", offset=pos)


def skip_tagged_fields(data, pos: int) -> int:
    count, pos = read_uvarint(data, pos)
    for _ in range(count):
        _tag, pos = read_uvarint(data, pos)
        size, pos = read_uvarint(data, pos)
        pos += size
        if pos > len(data):
            raise ProtocolError("tagged field runs past the end of the frame", offset=pos)
    return pos


def produce_acks(frame, peek: RequestHeaderPeek) -> int:
    """The ``acks`` of a Produce request: acks=0 means the broker sends no response."""
    version = peek.api_version
    pos = peek.header_end_v1
    try:
        if version >= PRODUCE_FIRST_FLEXIBLE_VERSION:
            pos = skip_tagged_fields(frame, pos)
            length_plus_one, pos = read_uvarint(frame, pos)
            pos += max(length_plus_one - 1, 0)
        else:
            (length,) = _INT16.unpack_from(frame, pos)
            pos += 2 + max(length, 0)
        if pos + 2 > len(frame):
            raise ProtocolError("Produce request ends before acks", api_key=0, version=version, offset=pos)
        return _INT16.unpack_from(frame, pos)[0]
    except ProtocolError as exc:
        raise ProtocolError(exc.reason, api_key=PRODUCE_API_KEY, version=version, offset=exc.offset) from None
    except struct.error:
        raise ProtocolError("Produce request truncated", api_key=0, version=version, offset=pos) from None
