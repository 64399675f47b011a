"""Codecs: round trips, interoperability with kafka-python's codecs, bounded inflation."""

from __future__ import annotations

import os
import struct

import cramjam
import pytest
from kafka import codec as kafka_codec

from proxy.protocol.errors import ProtocolError
from proxy.records.compression import XERIAL_MAGIC, Codec, compress, decompress

DATA = os.urandom(3000) * 50 + b"tail"


@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("data", [b"", b"x", DATA])
def test_round_trip(codec: Codec, data: bytes) -> None:
    assert bytes(decompress(codec, compress(codec, data))) == data


KAFKA_PYTHON = {
    Codec.GZIP: (kafka_codec.gzip_encode, kafka_codec.gzip_decode),
    Codec.SNAPPY: (kafka_codec.snappy_encode, kafka_codec.snappy_decode),
    Codec.LZ4: (kafka_codec.lz4_encode, kafka_codec.lz4_decode),
    Codec.ZSTD: (kafka_codec.zstd_encode, kafka_codec.zstd_decode),
}


@pytest.mark.parametrize("codec", list(KAFKA_PYTHON))
def test_interoperates_with_kafka_python(codec: Codec) -> None:
    encode, decode = KAFKA_PYTHON[codec]
    assert decode(compress(codec, DATA)) == DATA
    assert bytes(decompress(codec, encode(DATA))) == DATA


def test_snappy_writes_xerial_framing_and_reads_raw_too() -> None:
    framed = compress(Codec.SNAPPY, DATA)
    magic, version, compat = struct.unpack_from(">8sii", framed)
    assert (magic, version, compat) == (XERIAL_MAGIC, 1, 1)
    # blocks of at most 32 KiB of input, each length-prefixed
    (first_len,) = struct.unpack_from(">i", framed, 16)
    assert len(cramjam.snappy.decompress_raw(framed[20 : 20 + first_len])) == 32 * 1024
    raw = kafka_codec.snappy_encode(DATA, xerial_compatible=False)
    assert not raw.startswith(XERIAL_MAGIC)
    assert bytes(decompress(Codec.SNAPPY, raw)) == DATA


def test_lz4_frame_uses_independent_blocks() -> None:
    """Java's Lz4BlockInputStream rejects frames whose blocks depend on each other."""
    frame = compress(Codec.LZ4, DATA)
    assert frame[:4] == b"\x04\x22\x4d\x18"
    flg, bd = frame[4], frame[5]
    assert flg >> 6 == 1  # version 01
    assert flg & 0x20  # block independence
    assert not flg & 0x03  # reserved bits
    assert (bd >> 4) & 7 in (4, 5, 6, 7) and not bd & 0x8F
    # exactly the descriptor Java's Lz4BlockOutputStream writes: FLG 0x60, BD 0x40, HC
    assert frame[4:7] == b"\x60\x40\x82"
    assert compress(Codec.LZ4, b"") == b"\x04\x22\x4d\x18\x60\x40\x82\x00\x00\x00\x00"


def test_lz4_incompressible_blocks_are_stored() -> None:
    noise = os.urandom(200_000)  # four 64 KiB blocks, none of which shrinks
    frame = compress(Codec.LZ4, noise)
    assert len(frame) == 7 + 4 * 4 + len(noise) + 4
    assert kafka_codec.lz4_decode(frame) == noise
    assert bytes(decompress(Codec.LZ4, frame)) == noise


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD])
def test_inflation_beyond_cap_raises(codec: Codec) -> None:
    bomb = compress(codec, bytes(2_000_000))
    assert bytes(decompress(codec, bomb, max_bytes=2_000_000)) == bytes(2_000_000)
    with pytest.raises(ProtocolError, match="beyond"):
        decompress(codec, bomb, max_bytes=1_999_999, offset=5)


def test_raw_snappy_claiming_huge_length_is_refused_before_allocating() -> None:
    claim = bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x0F])  # varint 2^32-1 uncompressed length
    with pytest.raises(ProtocolError):
        decompress(Codec.SNAPPY, claim + b"\x00" * 10)


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD])
def test_corrupt_or_truncated_input_raises_protocol_error(codec: Codec) -> None:
    good = compress(codec, DATA)
    for bad in (good[: len(good) // 2], good[:3], b"\x00" * 40, bytes(reversed(good))):
        try:
            out = decompress(codec, bad, offset=99)
        except ProtocolError as exc:
            assert exc.offset == 99
        else:  # some garbage happens to be valid; it must still be bounded
            assert len(out) <= 64 * 1024 * 1024


def test_uncompressed_section_is_returned_as_is() -> None:
    data = memoryview(b"abc")
    assert decompress(Codec.NONE, data, max_bytes=2) is data


def test_unknown_codec_id_is_a_value_error_for_callers() -> None:
    with pytest.raises(ValueError):
        compress(6, b"")
