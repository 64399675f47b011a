"""Kafka's primitive wire types as construct ``Construct`` subclasses.

Every type here works on a buffer (``bytes`` or ``memoryview``) with an explicit position
and end, instead of construct's stream: ``read(buf, pos, end) -> (value, new_pos)`` and
``write(out: bytearray, value)``. Positions make zero-copy slices possible (``records``
fields come back as ``memoryview`` slices of the frame) and let every length and count
be checked against the bytes that remain *before* anything is allocated.

The same module-level ``read_*``/``write_*`` functions serve three callers:

* the interpreted path (``Construct.parse``/``build`` through ``KafkaConstruct``);
* the compiled path: ``compiler.py`` emits Python source that calls these functions by
  name (fixed-size fields are inlined there as ``struct`` unpacks instead);
* tests, which compare the two paths.

Decoding accepts only the canonical encoding of a value: a varint with a redundant
trailing zero byte, a boolean byte other than 0/1, or a length below -1 is a
``ProtocolError``. That makes ``encode(decode(b)) == b`` hold for every accepted input,
which the proxy relies on when it forwards what it decoded.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any, NoReturn

from construct import (
    Construct,
    SizeofError,
    stream_read_entire,
    stream_seek,
    stream_write,
)

from proxy.protocol.constants import MAX_ARRAY_ELEMENTS, MAX_TAGGED_FIELDS
from proxy.protocol.errors import ProtocolError

INT16 = struct.Struct(">h")
INT32 = struct.Struct(">i")
INT64 = struct.Struct(">q")

NULL_INT16 = b"\xff\xff"
NULL_INT32 = b"\xff\xff\xff\xff"
ZERO_UUID = uuid.UUID(int=0)
EMPTY_FROZENSET: frozenset[int] = frozenset()

# Kafka's unsigned varints for lengths, counts and tags are at most 5 bytes (32 bits).
MAX_UVARINT = 0xFFFFFFFF


def fail(reason: str, offset: int) -> NoReturn:
    """Raise the codec's one error type; the message codec adds api key and version."""
    raise ProtocolError(reason, offset=offset)


def short(pos: int, need: int, end: int) -> NoReturn:
    fail(f"truncated: need {need} bytes, {end - pos} left", pos)


# --------------------------------------------------------------------------- declared counts
# Every reader of a count checks it here first, before the count is compared with the
# bytes left or drives a loop (constants.py says why the limits exist).


def check_array_count(n: int, offset: int) -> None:
    """Refuse an array (or compact array) that declares more than MAX_ARRAY_ELEMENTS."""
    if n > MAX_ARRAY_ELEMENTS:
        fail(f"array of {n} elements exceeds the limit of {MAX_ARRAY_ELEMENTS}", offset)


def check_tag_count(n: int, offset: int) -> None:
    """Refuse a tagged-field section that declares more than MAX_TAGGED_FIELDS fields."""
    if n > MAX_TAGGED_FIELDS:
        fail(f"tagged-field section of {n} fields exceeds the limit of {MAX_TAGGED_FIELDS}", offset)


# --------------------------------------------------------------------------- varints


def read_uvarint(buf: Any, pos: int, end: int | None = None) -> tuple[int, int]:
    """An unsigned varint (7 bits per byte, little-endian groups), canonical form only:
    ``(value, position after it)``. It reads no byte at or past ``end`` (default: the end
    of ``buf``).

    The proxy's one reader of Kafka's unsigned varints (lengths, counts, tags): every
    codec, peek and rewrite uses it, so all of them agree on what is malformed.
    """
    if end is None:
        end = len(buf)
    if pos >= end:
        fail("truncated unsigned varint", pos)
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    start = pos
    value = b & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= end:
            fail("truncated unsigned varint", start)
        b = buf[pos]
        pos += 1
        if shift == 28:
            if b > 0x0F:
                fail("unsigned varint longer than 32 bits", start)
            value |= b << 28
            break
        value |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
    if b == 0:
        fail("unsigned varint with a redundant zero byte", start)
    return value, pos


def write_uvarint(out: bytearray, value: int) -> None:
    if value < 0x80:
        if value < 0:
            raise ValueError(f"unsigned varint cannot hold {value}")
        out.append(value)
        return
    if value > MAX_UVARINT:
        raise ValueError(f"unsigned varint cannot hold {value}")
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def uvarint_bytes(value: int) -> bytes:
    out = bytearray()
    write_uvarint(out, value)
    return bytes(out)


# --------------------------------------------------------------------------- strings


def _decode_utf8(buf, pos: int, n: int) -> str:
    try:
        return str(buf[pos : pos + n], "utf-8")
    except UnicodeDecodeError as exc:
        fail(f"string is not valid UTF-8 ({exc.reason})", pos + exc.start)


def _int16_length(buf, pos: int, end: int) -> tuple[int, int]:
    if end - pos < 2:
        short(pos, 2, end)
    return INT16.unpack_from(buf, pos)[0], pos + 2


def _int32_length(buf, pos: int, end: int) -> tuple[int, int]:
    if end - pos < 4:
        short(pos, 4, end)
    return INT32.unpack_from(buf, pos)[0], pos + 4


def _compact_length(buf, pos: int, end: int) -> tuple[int, int]:
    """Compact lengths are stored as N + 1 so that 0 can mean null."""
    n, pos = read_uvarint(buf, pos, end)
    return n - 1, pos


def _check_length(n: int, nullable: bool, pos: int, end: int, what: str) -> None:
    if n < 0 and not (n == -1 and nullable):
        fail(f"invalid {what} length {n}", pos)
    if n > end - pos:
        fail(f"{what} length {n} exceeds the {end - pos} bytes left", pos)


def read_string(buf, pos, end):
    n, pos = _int16_length(buf, pos, end)
    _check_length(n, False, pos, end, "string")
    return _decode_utf8(buf, pos, n), pos + n


def read_nullable_string(buf, pos, end):
    n, pos = _int16_length(buf, pos, end)
    _check_length(n, True, pos, end, "string")
    if n < 0:
        return None, pos
    return _decode_utf8(buf, pos, n), pos + n


# The compact readers below take a fast path for the common one-byte length (strings up
# to 126 bytes): one Python call per string instead of four. Anything unusual falls
# through to the general path, which does every check and reports errors.


def read_compact_string(buf, pos, end):
    if pos < end:
        n = buf[pos] - 1
        if 0 <= n < 0x7F and n < end - pos:
            start = pos + 1
            try:
                return str(buf[start : start + n], "utf-8"), start + n
            except UnicodeDecodeError:
                pass  # the general path reports it with its offset
    n, pos = _compact_length(buf, pos, end)
    _check_length(n, False, pos, end, "string")
    return _decode_utf8(buf, pos, n), pos + n


def read_compact_nullable_string(buf, pos, end):
    if pos < end:
        n = buf[pos] - 1
        if 0 <= n < 0x7F and n < end - pos:
            start = pos + 1
            try:
                return str(buf[start : start + n], "utf-8"), start + n
            except UnicodeDecodeError:
                pass
        elif n == -1:
            return None, pos + 1
    n, pos = _compact_length(buf, pos, end)
    _check_length(n, True, pos, end, "string")
    if n < 0:
        return None, pos
    return _decode_utf8(buf, pos, n), pos + n


def _utf8(value: str) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"expected str, got {type(value).__name__}")
    return value.encode("utf-8")


def write_string(out: bytearray, value: str) -> None:
    data = _utf8(value)
    if len(data) > 0x7FFF:
        raise ValueError(f"string of {len(data)} bytes exceeds the int16 length")
    out += INT16.pack(len(data))
    out += data


def write_nullable_string(out: bytearray, value: str | None) -> None:
    if value is None:
        out += NULL_INT16
    else:
        write_string(out, value)


def write_compact_string(out: bytearray, value: str) -> None:
    data = _utf8(value)
    write_uvarint(out, len(data) + 1)
    out += data


def write_compact_nullable_string(out: bytearray, value: str | None) -> None:
    if value is None:
        out.append(0)
    else:
        write_compact_string(out, value)


# --------------------------------------------------------------------------- bytes


def read_bytes(buf, pos, end):
    n, pos = _int32_length(buf, pos, end)
    _check_length(n, False, pos, end, "bytes")
    return bytes(buf[pos : pos + n]), pos + n


def read_nullable_bytes(buf, pos, end):
    n, pos = _int32_length(buf, pos, end)
    _check_length(n, True, pos, end, "bytes")
    if n < 0:
        return None, pos
    return bytes(buf[pos : pos + n]), pos + n


def read_compact_bytes(buf, pos, end):
    n, pos = _compact_length(buf, pos, end)
    _check_length(n, False, pos, end, "bytes")
    return bytes(buf[pos : pos + n]), pos + n


def read_compact_nullable_bytes(buf, pos, end):
    n, pos = _compact_length(buf, pos, end)
    _check_length(n, True, pos, end, "bytes")
    if n < 0:
        return None, pos
    return bytes(buf[pos : pos + n]), pos + n


# Record sets are opaque here (proxy.records parses them); they stay views of the frame.


def read_records(buf, pos, end):
    n, pos = _int32_length(buf, pos, end)
    _check_length(n, True, pos, end, "records")
    if n < 0:
        return None, pos
    return buf[pos : pos + n], pos + n


def read_compact_records(buf, pos, end):
    n, pos = _compact_length(buf, pos, end)
    _check_length(n, True, pos, end, "records")
    if n < 0:
        return None, pos
    return buf[pos : pos + n], pos + n


# Record sets at least this large are left out of a ``GatheringBuffer`` (noted, not copied).
GATHER_MIN_BYTES = 32 * 1024


class GatheringBuffer(bytearray):
    """An encoder's output that leaves large record sets out of itself: each is noted
    with the position it belongs at (``gathered``), so that a frame of megabytes of
    records reaches the socket from the buffers the records already sit in, written with
    one writev, instead of being copied into this buffer and again into a ``bytes``."""

    __slots__ = ("gathered",)

    def __init__(self) -> None:
        super().__init__()
        self.gathered: list[tuple[int, Any]] = []


def _append_records(out: bytearray, value) -> None:
    """A record set's bytes after its length: noted, not copied, in a ``GatheringBuffer``."""
    if len(value) >= GATHER_MIN_BYTES and type(out) is GatheringBuffer:
        out.gathered.append((len(out), value))
    else:
        out += value


def write_records(out: bytearray, value) -> None:
    if value is None:
        out += NULL_INT32
        return
    out += INT32.pack(len(value))
    _append_records(out, value)


def write_compact_records(out: bytearray, value) -> None:
    if value is None:
        out.append(0)
        return
    write_uvarint(out, len(value) + 1)
    _append_records(out, value)


def write_bytes(out: bytearray, value) -> None:
    if value is None:
        raise TypeError("non-nullable bytes field is None")
    out += INT32.pack(len(value))
    out += value


def write_nullable_bytes(out: bytearray, value) -> None:
    if value is None:
        out += NULL_INT32
    else:
        out += INT32.pack(len(value))
        out += value


def write_compact_bytes(out: bytearray, value) -> None:
    if value is None:
        raise TypeError("non-nullable bytes field is None")
    write_uvarint(out, len(value) + 1)
    out += value


def write_compact_nullable_bytes(out: bytearray, value) -> None:
    if value is None:
        out.append(0)
    else:
        write_uvarint(out, len(value) + 1)
        out += value


# --------------------------------------------------------------------------- arrays


def read_array_count(buf, pos, end, min_element_size: int, nullable: bool, compact: bool):
    """An array's element count, or None for null, bounded by the bytes left.

    A count above MAX_ARRAY_ELEMENTS is refused first, whatever follows it. Elements of
    at least ``min_element_size`` bytes (at least 1 is assumed, as Kafka does, even for
    elements that could be empty) must then fit in what remains, so a hostile count can
    never make the decoder loop or allocate beyond the frame's size.
    """
    start = pos
    if compact:
        n, pos = _compact_length(buf, pos, end)
    else:
        n, pos = _int32_length(buf, pos, end)
    if n < 0:
        if n == -1 and nullable:
            return None, pos
        fail(f"invalid array length {n}", start)
    check_array_count(n, start)
    if n * (min_element_size or 1) > end - pos:
        fail(f"array of {n} elements cannot fit in the {end - pos} bytes left", start)
    return n, pos


def array_structs(fmt: str, count: int = 64) -> tuple[struct.Struct, ...]:
    """Precompiled ``struct`` layouts for 0..count-1 repetitions of ``fmt``: decoding an
    int32 array of n elements is then one ``unpack_from`` call."""
    return tuple(struct.Struct(f">{n}{fmt}") for n in range(count))


def write_array_count(out: bytearray, value, nullable: bool, compact: bool) -> None:
    if value is None:
        if not nullable:
            raise TypeError("non-nullable array field is None")
        out += b"\x00" if compact else NULL_INT32
    elif compact:
        write_uvarint(out, len(value) + 1)
    else:
        out += INT32.pack(len(value))


# --------------------------------------------------------------------------- fixed size


def read_bool(buf, pos, end):
    if pos >= end:
        short(pos, 1, end)
    b = buf[pos]
    if b > 1:
        fail(f"boolean byte {b} is neither 0 nor 1", pos)
    return b == 1, pos + 1


def write_bool(out: bytearray, value) -> None:
    out.append(1 if value else 0)


def read_uuid(buf, pos, end):
    if end - pos < 16:
        short(pos, 16, end)
    return uuid.UUID(bytes=bytes(buf[pos : pos + 16])), pos + 16


def write_uuid(out: bytearray, value: uuid.UUID) -> None:
    out += value.bytes


def read_nullable_struct_marker(buf, pos, end) -> tuple[bool, int]:
    """KIP-893 nullable struct prefix: int8 -1 for null, 1 for present."""
    if pos >= end:
        short(pos, 1, end)
    b = buf[pos]
    if b == 0xFF:
        return False, pos + 1
    if b == 1:
        return True, pos + 1
    fail(f"nullable struct marker {b} is neither -1 nor 1", pos)


# --------------------------------------------------------------------------- constructs


class KafkaConstruct(Construct):
    """A construct that parses from a buffer position instead of a stream.

    Subclasses implement ``read``/``write``; this base class adapts them to construct's
    ``parse``/``build`` (reading the rest of the stream and seeking back over what it
    did not use). ``min_size`` is the fewest bytes an encoded value can take; array
    decoding uses it to bound element counts. ``fixed_format`` is set on fixed-size
    types so the compiler can unpack runs of them in one ``struct`` call.
    """

    min_size = 0
    fixed_format: str | None = None

    def read(self, buf, pos: int, end: int) -> tuple[Any, int]:
        raise NotImplementedError

    def write(self, out: bytearray, value: Any) -> None:
        raise NotImplementedError

    def _parse(self, stream, context, path):
        data = stream_read_entire(stream, path)
        view = memoryview(data)
        value, used = self.read(view, 0, len(view))
        if used != len(data):
            stream_seek(stream, used - len(data), 1, path)
        return value

    def _build(self, obj, stream, context, path):
        out = bytearray()
        self.write(out, obj)
        stream_write(stream, bytes(out), len(out), path)
        return obj

    def _sizeof(self, context, path):
        raise SizeofError("Kafka values have no static size", path=path)


class Fixed(KafkaConstruct):
    """int8/16/32/64, uint16/32 and float64: one ``struct`` format character each."""

    fixed_format: str

    def __init__(self, type_name: str, fmt: str) -> None:
        super().__init__()
        self.type_name = type_name
        self.fixed_format = fmt
        self._struct = struct.Struct(">" + fmt)
        self.min_size = self._struct.size

    def read(self, buf, pos, end):
        if end - pos < self.min_size:
            short(pos, self.min_size, end)
        return self._struct.unpack_from(buf, pos)[0], pos + self.min_size

    def write(self, out, value):
        out += self._struct.pack(value)

    def __repr__(self) -> str:
        return f"Fixed({self.type_name})"


class Bool(KafkaConstruct):
    """A boolean byte; the compiler unpacks it as ``B`` and checks it is 0 or 1."""

    min_size = 1
    fixed_format = "B"

    def read(self, buf, pos, end):
        return read_bool(buf, pos, end)

    def write(self, out, value):
        write_bool(out, value)


class Uuid(KafkaConstruct):
    """16 bytes, decoded as ``uuid.UUID``."""

    min_size = 16
    fixed_format = "16s"

    def read(self, buf, pos, end):
        return read_uuid(buf, pos, end)

    def write(self, out, value):
        write_uuid(out, value)


class Varlen(KafkaConstruct):
    """A string, bytes or records field: its read/write are module functions by name.

    Keeping the functions at module level lets generated code call them directly.
    """

    def __init__(self, reader_name: str, writer_name: str, min_size: int) -> None:
        super().__init__()
        self.reader_name = reader_name
        self.writer_name = writer_name
        self.min_size = min_size
        # the module function itself, not a method calling it: one call less per value
        self.read = globals()[reader_name]  # type: ignore[method-assign]
        self._writer = globals()[writer_name]

    def write(self, out, value):
        self._writer(out, value)

    def __repr__(self) -> str:
        return f"Varlen({self.reader_name})"


FIXED_FORMATS = {
    "int8": "b",
    "int16": "h",
    "uint16": "H",
    "int32": "i",
    "uint32": "I",
    "int64": "q",
    "float64": "d",
}


def primitive(type_name: str, *, compact: bool, nullable: bool) -> KafkaConstruct:
    """The construct for one primitive Kafka type in one encoding."""
    if type_name in FIXED_FORMATS:
        return Fixed(type_name, FIXED_FORMATS[type_name])
    if type_name == "bool":
        return Bool()
    if type_name == "uuid":
        return Uuid()
    if type_name == "records":
        nullable = True  # Kafka record fields are always nullable on the wire
    if type_name not in ("string", "bytes", "records"):
        raise ValueError(f"not a primitive type: {type_name}")
    compact_part = "compact_" if compact else ""
    if type_name == "records":
        reader = f"read_{compact_part}records"
        writer = f"write_{compact_part}records"
    else:
        nullable_part = "nullable_" if nullable else ""
        reader = f"read_{compact_part}{nullable_part}{type_name}"
        writer = f"write_{compact_part}{nullable_part}{type_name}"
    # a null or empty value: 1 byte compact, 2 (string) or 4 (bytes) bytes otherwise
    min_size = 1 if compact else (2 if type_name == "string" else 4)
    return Varlen(reader, writer, min_size)
