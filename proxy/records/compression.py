"""Record-batch compression codecs, bounded on the way in and Java-compatible on the way out.

The codec id is bits 0-2 of a v2 batch's attributes. Everything runs through cramjam (one
native dependency for all four codecs). Two wire details matter for interoperability:

* snappy: Java's producer writes the *xerial* stream framing (snappy-java's
  ``SnappyOutputStream``): an 8-byte magic ``\\x82SNAPPY\\x00``, a big-endian int32 version
  and int32 compatible-version, then blocks of (big-endian int32 length, raw snappy). Java,
  librdkafka and kafka-python consumers all read that framing and also fall back to a bare
  raw-snappy payload, which some producers send. We read both and write xerial, like Java.
* lz4: Kafka uses the LZ4 *frame* format, and Java's ``Lz4BlockInputStream`` refuses frames
  whose blocks are linked ("Dependent block stream is unsupported"). cramjam's one-shot
  ``lz4.compress`` links blocks, and its streaming compressor costs ~8 us of setup per
  call, which dominates when a split recompresses many small batches. So we write the
  frame ourselves exactly as Java's ``Lz4BlockOutputStream`` does: FLG 0x60 (version 1,
  independent blocks, no checksums), BD 0x40 (64 KiB blocks), the header checksum byte,
  then blocks from cramjam's block compressor (stored raw when they do not shrink) and
  the zero end mark. Reading accepts any valid frame.

Decompression is bounded: a batch is untrusted input and a few KiB of zstd can claim
gigabytes. Output goes into a buffer that grows geometrically up to ``max_bytes``; cramjam
stops writing as soon as the buffer is full, so a bomb costs at most ``max_bytes`` of memory
and the time to produce it, and then raises ``ProtocolError``.
"""

from __future__ import annotations

import enum
import struct

import cramjam
import xxhash

from proxy.protocol.errors import ProtocolError

# The broker's default message.max.bytes is ~1 MiB and its hard ceiling for a fetch is
# fetch.max.bytes (50 MiB by default); 64 MiB of records in one batch is beyond anything a
# sane producer writes, yet small enough to hold in memory for one batch at a time.
DEFAULT_MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024

XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = struct.Struct(">8sii")
_XERIAL_VERSION = 1
_XERIAL_COMPAT_VERSION = 1
_XERIAL_BLOCK_LEN = struct.Struct(">i")
# snappy-java's default block size: each block holds at most 32 KiB of input.
XERIAL_BLOCK_SIZE = 32 * 1024

_INITIAL_GUESS_FACTOR = 8
_MIN_INITIAL_BYTES = 64 * 1024
_GROWTH = 4


_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_LZ4_FLG = 0x60  # version 01, block independence, no block/content checksum, no size
_LZ4_BD = 0x40  # block maximum size 64 KiB
_LZ4_BLOCK = 64 * 1024
_LZ4_UNCOMPRESSED = 0x80000000
_LZ4_BLOCK_LEN = struct.Struct("<I")


def _lz4_header() -> bytes:
    # The descriptor checksum is the second byte of xxh32(FLG, BD).
    hc = (xxhash.xxh32_intdigest(bytes((_LZ4_FLG, _LZ4_BD))) >> 8) & 0xFF
    return _LZ4_MAGIC + bytes((_LZ4_FLG, _LZ4_BD, hc))


_LZ4_HEADER = _lz4_header()
_LZ4_END = _LZ4_BLOCK_LEN.pack(0)


class Codec(enum.IntEnum):
    """Compression codec ids of the batch attributes (bits 0-2)."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


_CODECS = tuple(Codec)


def codec_of(attributes: int, *, offset: int | None = None) -> Codec:
    """The codec named by a batch's attributes; ids 5-7 are not codecs."""
    cid = attributes & 0x07
    if cid < len(_CODECS):
        return _CODECS[cid]
    raise ProtocolError(f"unknown compression codec id {cid}", offset=offset)


def compress(codec: Codec | int, data) -> bytes:
    """Compress a records section for a batch of the given codec, as a Java producer would."""
    if codec == Codec.NONE:
        return bytes(data)
    if codec == Codec.LZ4:
        return _lz4_frame(data)
    if codec == Codec.ZSTD:
        return bytes(cramjam.zstd.compress(data))
    if codec == Codec.SNAPPY:
        return _xerial_compress(data)
    if codec == Codec.GZIP:
        return bytes(cramjam.gzip.compress(data))
    raise ValueError(f"unknown codec {codec!r}")


def _lz4_frame(data) -> bytes:
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else data
    parts = [_LZ4_HEADER]
    for start in range(0, len(view), _LZ4_BLOCK):
        chunk = view[start : start + _LZ4_BLOCK]
        block = cramjam.lz4.compress_block(chunk, store_size=False)
        if len(block) < len(chunk):
            parts.append(_LZ4_BLOCK_LEN.pack(len(block)))
            parts.append(bytes(block))
        else:
            parts.append(_LZ4_BLOCK_LEN.pack(len(chunk) | _LZ4_UNCOMPRESSED))
            parts.append(bytes(chunk))
    parts.append(_LZ4_END)
    return b"".join(parts)


def decompress(
    codec: Codec | int,
    data,
    *,
    max_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    offset: int | None = None,
) -> bytes | bytearray | memoryview:
    """Decompress a records section; never produce more than ``max_bytes``.

    Returns a bytes-like object (``data`` itself for ``Codec.NONE``, which the cap does
    not apply to). Corrupt input and output beyond ``max_bytes`` both raise ``ProtocolError`` with ``offset`` (the caller's
    byte offset of the compressed section).
    """
    codec = codec if isinstance(codec, Codec) else Codec(codec)
    if codec is Codec.NONE:  # nothing inflates: the bytes are already at hand
        return data
    if codec is Codec.SNAPPY:
        return _snappy_decompress(data, max_bytes, offset)
    module = {Codec.GZIP: cramjam.gzip, Codec.LZ4: cramjam.lz4, Codec.ZSTD: cramjam.zstd}[codec]
    return _bounded(module.decompress_into, data, max_bytes, codec.name.lower(), offset)


def _bounded(decompress_into, data, max_bytes: int, name: str, offset: int | None):
    """Run a cramjam ``decompress_into`` with a growing, capped output buffer.

    cramjam reports a full output buffer as an error; we then retry with a buffer
    ``_GROWTH`` times larger. Retries redo the work, but the geometric growth keeps the total
    within a small constant of the final size.
    """
    size = min(max_bytes, max(_MIN_INITIAL_BYTES, len(data) * _INITIAL_GUESS_FACTOR))
    while True:
        out = bytearray(size)
        try:
            n = decompress_into(data, out)
        except cramjam.DecompressionError as exc:
            if not _is_output_full(exc):
                raise ProtocolError(f"corrupt {name} data: {exc}", offset=offset) from None
            if size >= max_bytes:
                raise ProtocolError(
                    f"{name} data inflates beyond {max_bytes} bytes", offset=offset
                ) from None
            size = min(max_bytes, size * _GROWTH)
            continue
        except (ValueError, TypeError, OSError) as exc:  # defensive: any codec complaint
            raise ProtocolError(f"corrupt {name} data: {exc}", offset=offset) from None
        del out[n:]
        return out


def _is_output_full(exc: Exception) -> bool:
    text = str(exc)
    return "whole buffer" in text or "smaller than required" in text


def _snappy_decompress(data, max_bytes: int, offset: int | None):
    """Snappy in either xerial framing or bare raw format."""
    view = memoryview(data)
    if len(view) >= _XERIAL_HEADER.size and bytes(view[:8]) == XERIAL_MAGIC:
        return _xerial_decompress(view, max_bytes, offset)
    return _raw_snappy_decompress(view, max_bytes, offset)


def _raw_snappy_decompress(block, max_bytes: int, offset: int | None, *, already: int = 0):
    """A raw snappy block states its uncompressed length up front; check it before work.

    ``already`` is what earlier xerial blocks produced; it counts against ``max_bytes``.
    """
    try:
        claimed = cramjam.snappy.decompress_raw_len(block)
    except (cramjam.DecompressionError, ValueError) as exc:
        raise ProtocolError(f"corrupt snappy data: {exc}", offset=offset) from None
    if claimed > max_bytes - already:
        raise ProtocolError(f"snappy data inflates beyond {max_bytes} bytes", offset=offset)
    out = bytearray(claimed)
    try:
        n = cramjam.snappy.decompress_raw_into(block, out)
    except (cramjam.DecompressionError, ValueError) as exc:
        raise ProtocolError(f"corrupt snappy data: {exc}", offset=offset) from None
    del out[n:]
    return out


def _xerial_decompress(view: memoryview, max_bytes: int, offset: int | None) -> bytearray:
    _magic, _version, _compat = _XERIAL_HEADER.unpack_from(view, 0)
    pos = _XERIAL_HEADER.size
    end = len(view)
    out = bytearray()
    while pos < end:
        if end - pos < 4:
            raise ProtocolError("truncated xerial snappy block length", offset=offset)
        (block_len,) = _XERIAL_BLOCK_LEN.unpack_from(view, pos)
        pos += 4
        if block_len < 0 or block_len > end - pos:
            raise ProtocolError(f"bad xerial snappy block length {block_len}", offset=offset)
        out += _raw_snappy_decompress(
            view[pos : pos + block_len], max_bytes, offset, already=len(out)
        )
        pos += block_len
    return out


def _xerial_compress(data) -> bytes:
    view = memoryview(data).cast("B") if not isinstance(data, (bytes, bytearray)) else data
    parts = [_XERIAL_HEADER.pack(XERIAL_MAGIC, _XERIAL_VERSION, _XERIAL_COMPAT_VERSION)]
    for start in range(0, len(view), XERIAL_BLOCK_SIZE):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + XERIAL_BLOCK_SIZE]))
        parts.append(_XERIAL_BLOCK_LEN.pack(len(block)))
        parts.append(block)
    return b"".join(parts)
