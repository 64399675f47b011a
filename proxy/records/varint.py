"""Kafka's zig-zag varints, bounded and strict.

Record fields are LEB128 unsigned varints holding zig-zag encoded signed values: at most
5 bytes for a varint (int32) and 10 for a varlong (int64), as Java's ``ByteUtils`` enforces.
Readers take an explicit ``end`` so a field can never be read past the record that holds it,
and every failure is a ``ProtocolError`` carrying the byte offset, never an ``IndexError``.
"""

from __future__ import annotations

from proxy.protocol.errors import ProtocolError

VARINT_MAX_BYTES = 5
VARLONG_MAX_BYTES = 10


def zigzag_encode(n: int) -> int:
    """Signed value to its zig-zag unsigned form (64-bit domain)."""
    return ((n << 1) ^ (n >> 63)) & 0xFFFF_FFFF_FFFF_FFFF


def read_varint(buf, pos: int, end: int, max_bytes: int = VARINT_MAX_BYTES) -> tuple[int, int]:
    """Read one signed zig-zag varint at ``pos``; return ``(value, next_pos)``.

    ``max_bytes`` is 5 for varint fields and 10 for varlong fields; a longer encoding is
    malformed rather than merely large, as in Java.
    """
    result = 0
    shift = 0
    limit = min(end, pos + max_bytes)
    p = pos
    while p < limit:
        b = buf[p]
        p += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if result >> (32 if max_bytes == VARINT_MAX_BYTES else 64):
                raise ProtocolError("varint value out of range", offset=pos)
            return (result >> 1) ^ -(result & 1), p
        shift += 7
    if p >= end and p - pos < max_bytes:
        raise ProtocolError("varint runs past the end of its field", offset=pos)
    raise ProtocolError(f"varint longer than {max_bytes} bytes", offset=pos)


def read_varlong(buf, pos: int, end: int) -> tuple[int, int]:
    """Read one signed zig-zag varlong (up to 10 bytes)."""
    return read_varint(buf, pos, end, VARLONG_MAX_BYTES)


def encode_varint(n: int) -> bytes:
    """Zig-zag encode ``n`` (int32 or int64 range) as an unsigned LEB128 varint."""
    u = zigzag_encode(n)
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)
