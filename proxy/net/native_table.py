"""The native relay's table: for each API key and version, how its C loop may carry a
request. Declared here once; the chain fills it (``FeatureChain.native_classes``) from
what its features declare, the relay hands it to the loop, and the loop's own copies of
these numbers (``_cpump.c`` compiles them in) are checked against this module when the
extension is loaded (``check_extension``), so the two can never drift apart silently.

A table is ``KEYS * VERSIONS`` bytes, one per (API key, version) at
``api_key * VERSIONS + version``: a ``NativeClass``, with ``FLEXIBLE_HEADER`` added when
the request's header is flexible (the loop then counts its header's tagged fields, and
leaves a request declaring too many to the event loop, which refuses it), and ``GUARDED``
on a Produce or Fetch a feature reads only when it names a virtual topic: the loop carries
it when its first bytes show every topic it names and none is virtual by the run's guard
(``guard_blob``: the virtual-topic suffixes, and the ids the proxy handed out for virtual
topics; for a Fetch by topic id, also ``known_blob``: the ids of the topics the proxy
knows), and leaves it to the event loop otherwise.

A Fetch is carried only when it is plain, whatever its entry: all of it in the loop's peek,
no tagged field in its body (``proxy.net.native_checks`` is the same read in Python).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from types import ModuleType

KEYS = 128  # API keys 0..127
VERSIONS = 32  # versions 0..31 of each
FLEXIBLE_HEADER = 0x80  # a flag on a class other than PYTHON
GUARDED = 0x40  # a flag on Produce and Fetch: carried only when it names no virtual topic (the run's guard)
_CLASS_MASK = 0x3F
TOPIC_ID_BYTES = 16


class NativeClass(enum.IntEnum):
    """How the loop may carry a request of one (API key, version)."""

    PYTHON = 0  # never: a feature reads the request, or the chain answers or checks it
    OPAQUE = 1  # carried, its response relayed untouched
    PRODUCE = 2  # carried, its response read and relayed untouched unless it has top-level tagged fields
    FETCH = 3  # carried, its response (Fetch v12+) walked and spliced, its top-level tagged fields handed back if any


def entry(native_class: NativeClass, flexible_header: bool, guarded: bool = False) -> int:
    """The table's byte for a class, a header kind and whether the request's topic names are
    checked against the run's guard (the loop checks those of Produce and Fetch requests
    only, and ignores the flag on any other API key)."""
    if native_class is NativeClass.PYTHON:
        return 0
    return int(native_class) | (FLEXIBLE_HEADER if flexible_header else 0) | (GUARDED if guarded else 0)


def guarded(table: bytes, api_key: int, version: int) -> bool:
    """Whether the table marks (API key, version) GUARDED."""
    if not (0 <= api_key < KEYS and 0 <= version < VERSIONS):
        return False
    return bool(table[api_key * VERSIONS + version] & GUARDED)


def guard_blob(suffixes: Iterable[bytes], topic_ids: Iterable[bytes]) -> bytes:
    """A run's guard, as the C loop reads it: a byte S, then S suffixes (a byte of length and
    its bytes), then the 16-byte topic ids in ascending byte order (it searches them by
    halves). A name holding a suffix followed by a digit 1-9 may be virtual; so is an id
    listed."""
    suffixes = list(suffixes)
    if len(suffixes) > 255 or not all(0 < len(suffix) < 256 for suffix in suffixes):
        raise ValueError("a guard holds at most 255 suffixes of 1-255 bytes")
    ids = sorted(set(topic_ids))
    if not all(len(topic_id) == TOPIC_ID_BYTES for topic_id in ids):
        raise ValueError("a topic id is 16 bytes")
    return bytes([len(suffixes)]) + b"".join(bytes([len(s)]) + s for s in suffixes) + b"".join(ids)


def known_blob(topic_ids: Iterable[bytes]) -> bytes:
    """The ids of the topics the proxy knows, as the C loop reads them (16 bytes each, in
    ascending byte order): a guarded Fetch by topic id is carried only when it names these
    alone (one naming an id the proxy does not know may name a virtual topic another proxy
    instance handed out, which the event loop looks up)."""
    ids = sorted(set(topic_ids))
    if not all(len(topic_id) == TOPIC_ID_BYTES for topic_id in ids):
        raise ValueError("a topic id is 16 bytes")
    return b"".join(ids)


def class_of(table: bytes, api_key: int, version: int) -> NativeClass:
    """The class a table gives (API key, version); PYTHON outside the table."""
    if not (0 <= api_key < KEYS and 0 <= version < VERSIONS):
        return NativeClass.PYTHON
    return NativeClass(table[api_key * VERSIONS + version] & _CLASS_MASK)


def new_table() -> bytearray:
    return bytearray(KEYS * VERSIONS)


def put(table: bytearray, api_key: int, version: int, value: int) -> None:
    table[api_key * VERSIONS + version] = value


def only_key(table: bytes, api_key: int) -> bytes:
    """A copy of ``table`` that carries ``api_key``'s versions only (the rest PYTHON)."""
    return only_keys(table, (api_key,))


def only_keys(table: bytes, api_keys: Iterable[int]) -> bytes:
    """A copy of ``table`` that carries the versions of ``api_keys`` only (the rest PYTHON)."""
    kept = bytearray(len(table))
    for api_key in api_keys:
        start = api_key * VERSIONS
        kept[start:start + VERSIONS] = table[start:start + VERSIONS]
    return bytes(kept)


def without_key(table: bytes, api_key: int) -> bytes:
    """A copy of ``table`` that carries none of ``api_key``'s versions."""
    start = api_key * VERSIONS
    return table[:start] + bytes(VERSIONS) + table[start + VERSIONS:]


def check_extension(module: ModuleType) -> None:
    """Raise ImportError when the C loop was compiled with other numbers than these (a
    stale build): the relay then stays off, never carrying requests by a wrong table."""
    expected = {"KEYS": KEYS, "VERSIONS": VERSIONS, "CLASS_PYTHON": NativeClass.PYTHON,
                "CLASS_OPAQUE": NativeClass.OPAQUE, "CLASS_PRODUCE": NativeClass.PRODUCE,
                "CLASS_FETCH": NativeClass.FETCH, "CLASS_FLEXIBLE_HEADER": FLEXIBLE_HEADER, "CLASS_GUARDED": GUARDED}
    wrong = {name: getattr(module, name, None) for name, value in expected.items()
             if getattr(module, name, None) != value}
    if wrong:
        raise ImportError(f"{module.__name__} was built with another native table: {wrong}; rebuild it")


__all__ = ["FLEXIBLE_HEADER", "GUARDED", "KEYS", "VERSIONS", "NativeClass", "check_extension", "class_of", "entry",
           "guard_blob", "guarded", "known_blob", "new_table", "only_key", "only_keys", "put", "without_key"]
