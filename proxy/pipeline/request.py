"""One client request as the request stages see it: the header peek, the frame, and its
decoded form, made at most once however many stages read it."""

from __future__ import annotations

from typing import Any

from proxy.protocol import messages
from proxy.protocol.framing import RequestHeaderPeek


class Request:
    __slots__ = ("peek", "frame", "_decoded")

    def __init__(self, peek: RequestHeaderPeek, frame: bytes | bytearray) -> None:
        self.peek = peek
        self.frame = frame
        self._decoded: tuple[Any, Any] | None = None

    @property
    def api_key(self) -> int:
        return self.peek.api_key

    @property
    def version(self) -> int:
        return self.peek.api_version

    @property
    def correlation_id(self) -> int:
        return self.peek.correlation_id

    def decoded(self) -> tuple[Any, Any]:
        """``(header, body)`` of the request, decoded on first use. Bytes after the body are
        ignored, as the broker ignores them (some clients pad requests)."""
        if self._decoded is None:
            self._decoded = messages.decode_request(self.frame, strict=False)
        return self._decoded

    def replace(self, frame: bytes | bytearray, decoded: tuple[Any, Any] | None = None) -> None:
        """Stages after this one, and the default route, see ``frame`` instead (a feature
        that rewrites a request but leaves its routing to others)."""
        self.frame = frame
        self._decoded = decoded
