"""The key hash that places a record in a key range (docs/wire-contract.md#2-key-hash-and-ranges).

``key_hash = xxh3_64(key, seed=0) >> 1``, a value in [0, 2^63 - 1] so it fits Kafka's
signed int64 range fields. A null key has no per-key order to preserve, so it hashes its
absolute offset (8-byte big-endian signed) instead, which spreads null-key records evenly.
The proxy and every client that computes ranges must agree on this bit for bit.
"""

from __future__ import annotations

import struct

import xxhash

HASH_MAX = (1 << 63) - 1
_OFFSET_BYTES = struct.Struct(">q")
_xxh3_64 = xxhash.xxh3_64_intdigest


def key_hash(key: bytes | bytearray | memoryview | None, offset: int) -> int:
    """Hash of a record's key, or of its absolute ``offset`` when the key is null."""
    if key is None:
        return _xxh3_64(_OFFSET_BYTES.pack(offset)) >> 1
    return _xxh3_64(key) >> 1


def null_key_hash(offset: int) -> int:
    """The hash a null-key record at absolute ``offset`` gets."""
    return _xxh3_64(_OFFSET_BYTES.pack(offset)) >> 1
