"""The one error type that bad bytes may raise.

Everything that parses untrusted input (frames, message bodies, record batches) turns
construct, struct and index errors into ``ProtocolError`` so callers can refuse the
offending request or connection without guessing which exceptions can escape.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Bytes that do not form a valid Kafka frame, message or record batch.

    ``api_key`` and ``version`` are None where the failure is below the message level
    (for example a record batch or a frame length); ``offset`` is the byte offset of the
    failure within the buffer that was being parsed, when known.
    """

    def __init__(
        self,
        reason: str,
        *,
        api_key: int | None = None,
        version: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.reason = reason
        self.api_key = api_key
        self.version = version
        self.offset = offset
        where = []
        if api_key is not None:
            where.append(f"api_key={api_key}")
        if version is not None:
            where.append(f"version={version}")
        if offset is not None:
            where.append(f"offset={offset}")
        suffix = f" ({', '.join(where)})" if where else ""
        super().__init__(f"{reason}{suffix}")


def exceeded_limit(error: ProtocolError) -> str | None:
    """Which protocol limit ``error`` refused ("array" or "tagged_fields", see
    ``constants.MAX_ARRAY_ELEMENTS``), or None for any other malformation. Read from the
    reason, which every reader words alike ("... of N elements exceeds the limit of ...",
    "... of N fields exceeds the limit of ..."), because codecs re-raise a reader's error
    with the message's api key and version added, as a plain ``ProtocolError``."""
    reason = error.reason
    if "exceeds the limit of" not in reason:
        return None
    if " elements exceeds" in reason:
        return "array"
    if " fields exceeds" in reason:
        return "tagged_fields"
    return None


class UnsupportedVersionError(ProtocolError):
    """An API key, version or message that our merged schemas do not define.

    A ``ProtocolError`` so that callers who only guard against bad bytes still catch it;
    callers that can forward such frames opaquely should check ``supported_versions``
    first or catch this subclass.
    """


class MessageEncodeError(ValueError):
    """A decoded-value object that cannot be encoded (wrong type, out-of-range integer,
    None in a non-nullable field). Always a bug in the code that built the value."""
