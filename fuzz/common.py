"""What every target shares: the finding type and a reader of control bytes.

Targets must not depend on atheris (the corpus replay runs without it), so instead of
atheris' ``FuzzedDataProvider`` they take their few control choices from the head of the
input with ``Choices``; the rest of the input is the bytes under test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from proxy.protocol.compiler import MessageCodec
from proxy.protocol.errors import ProtocolError


class InvariantBroken(AssertionError):
    """The parser returned, but what it returned breaks a property the code promises
    (two implementations disagree, a round trip changes bytes, a rewrite changes a length).
    Raised by the targets, so it is a finding like any unexpected exception."""


def check_not_internal(exc: ProtocolError) -> None:
    """The codecs turn any exception of a generated decoder into a ProtocolError whose
    reason starts with "internal": that is a decoder bug wearing the bad-input error type."""
    if exc.reason.startswith("internal"):
        raise InvariantBroken(f"decoder bug reported as bad input: {exc}") from exc


class Choices:
    """Control values taken from the front of the input, never failing: a short input
    gives zeros, so every input is valid and the fuzzer never wastes runs on framing."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        value = self.data[self.pos]
        self.pos += 1
        return value

    def uint(self, size: int) -> int:
        value = 0
        for _ in range(size):
            value = (value << 8) | self.byte()
        return value

    def rest(self) -> bytes:
        """Everything not taken yet: the bytes under test."""
        return self.data[self.pos:]


def generated_functions(codecs: Iterable[MessageCodec]) -> list[Callable[..., Any]]:
    """The functions code generation made for ``codecs`` (compiled mode), each once."""
    found: dict[int, Callable[..., Any]] = {}
    for codec in codecs:
        module = getattr(codec.construct, "module", None)
        if module is None:
            continue
        namespace = vars(module)
        for value in namespace.values():
            if callable(value) and getattr(value, "__globals__", None) is namespace:
                found[id(value)] = value
    return list(found.values())
