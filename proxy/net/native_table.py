"""The native relay's table: for each API key and version, how its C loop may carry a
request. Declared here once; the chain fills it (``FeatureChain.native_classes``) from
what its features declare, the relay hands it to the loop, and the loop's own copies of
these numbers (``_cpump.c`` compiles them in) are checked against this module when the
extension is loaded (``check_extension``), so the two can never drift apart silently.

A table is ``KEYS * VERSIONS`` bytes, one per (API key, version) at
``api_key * VERSIONS + version``: a ``NativeClass``, with ``FLEXIBLE_HEADER`` added when
the request's header is flexible (the loop then counts its header's tagged fields, and
leaves a request declaring too many to the event loop, which refuses it).
"""

from __future__ import annotations

import enum
from types import ModuleType

KEYS = 128  # API keys 0..127
VERSIONS = 32  # versions 0..31 of each
FLEXIBLE_HEADER = 0x80  # a flag on a class other than PYTHON
_CLASS_MASK = 0x7F


class NativeClass(enum.IntEnum):
    """How the loop may carry a request of one (API key, version)."""

    PYTHON = 0  # never: a feature reads the request, or the chain answers or checks it
    OPAQUE = 1  # carried, its response relayed untouched
    PRODUCE = 2  # carried, its response read and relayed untouched unless it has top-level tagged fields


def entry(native_class: NativeClass, flexible_header: bool) -> int:
    """The table's byte for a class and a header kind."""
    if native_class is NativeClass.PYTHON:
        return 0
    return int(native_class) | (FLEXIBLE_HEADER if flexible_header else 0)


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
    start = api_key * VERSIONS
    return bytes(start) + table[start:start + VERSIONS] + bytes(len(table) - start - VERSIONS)


def check_extension(module: ModuleType) -> None:
    """Raise ImportError when the C loop was compiled with other numbers than these (a
    stale build): the relay then stays off, never carrying requests by a wrong table."""
    expected = {"KEYS": KEYS, "VERSIONS": VERSIONS, "CLASS_PYTHON": NativeClass.PYTHON,
                "CLASS_OPAQUE": NativeClass.OPAQUE, "CLASS_PRODUCE": NativeClass.PRODUCE,
                "CLASS_FLEXIBLE_HEADER": FLEXIBLE_HEADER}
    wrong = {name: getattr(module, name, None) for name, value in expected.items()
             if getattr(module, name, None) != value}
    if wrong:
        raise ImportError(f"{module.__name__} was built with another native table: {wrong}; rebuild it")


__all__ = ["FLEXIBLE_HEADER", "KEYS", "VERSIONS", "NativeClass", "check_extension", "class_of", "entry",
           "new_table", "only_key", "put"]
