"""Golden Kafka frames: byte-identical round trips through our codec, and their files.

Recorded traffic (see :mod:`harness.tap`) is checked frame by frame: a request frame
is decoded with ``decode_request`` and re-encoded with ``encode_request``; a response frame
is decoded with ``decode_response`` under its request's api key and version and re-encoded
with ``encode_response``. Both must give back exactly the recorded bytes.

A golden file is JSON lines: a first line ``{"golden": 1, ...}`` describing the run
(versions of the broker and the clients), then one line per exchange::

    {"client": "java-producer", "api_key": 0, "api_version": 13, "api": "Produce",
     "request": "<hex>", "response": "<hex>" | null}
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from proxy.protocol.api_keys import api_name
from proxy.protocol.errors import ProtocolError, UnsupportedVersionError
from proxy.protocol.messages import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)

__all__ = [
    "GoldenExchange",
    "RoundTrip",
    "librdkafka_all_topics_metadata",
    "read_golden",
    "roundtrip_request",
    "roundtrip_response",
    "select_exchanges",
    "write_golden",
]

GOLDEN_FORMAT = 1


@dataclass(frozen=True, slots=True)
class RoundTrip:
    """The outcome of decoding and re-encoding one frame.

    ``status`` is "ok", "unsupported" (our schemas lack the key or version), "decode"
    (our codec refused bytes a real peer sent) or "mismatch" (re-encoding differs);
    ``detail`` says where.
    """

    direction: str
    api_key: int
    api_version: int
    status: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _first_difference(a: bytes, b: bytes) -> str:
    n = min(len(a), len(b))
    at = next((i for i in range(n) if a[i] != b[i]), n)
    return (
        f"{len(a)} bytes recorded, {len(b)} re-encoded, first difference at byte {at}: "
        f"recorded {a[at:at + 16].hex()} re-encoded {b[at:at + 16].hex()}"
    )


def roundtrip_request(frame: bytes) -> RoundTrip:
    """Decode and re-encode a request frame (size prefix removed)."""
    api_key, api_version = int.from_bytes(frame[0:2], "big", signed=True), int.from_bytes(frame[2:4], "big", signed=True)
    try:
        header, body = decode_request(frame)
    except UnsupportedVersionError as exc:
        return RoundTrip("request", api_key, api_version, "unsupported", str(exc))
    except ProtocolError as exc:
        return RoundTrip("request", api_key, api_version, "decode", str(exc))
    again = encode_request(header, body)
    if again != frame:
        return RoundTrip("request", api_key, api_version, "mismatch", _first_difference(frame, again))
    return RoundTrip("request", api_key, api_version, "ok")


def roundtrip_response(api_key: int, api_version: int, frame: bytes) -> RoundTrip:
    """Decode and re-encode a response frame under its request's key and version."""
    try:
        header, body = decode_response(api_key, api_version, frame)
    except UnsupportedVersionError as exc:
        return RoundTrip("response", api_key, api_version, "unsupported", str(exc))
    except ProtocolError as exc:
        return RoundTrip("response", api_key, api_version, "decode", str(exc))
    again = encode_response(api_key, api_version, header, body)
    if again != frame:
        return RoundTrip("response", api_key, api_version, "mismatch", _first_difference(frame, again))
    return RoundTrip("response", api_key, api_version, "ok")


def librdkafka_all_topics_metadata(frame: bytes) -> bytes | None:
    """The frame as the broker reads it, if ``frame`` is librdkafka's padded all-topics
    Metadata request; else None.

    librdkafka (rd_kafka_MetadataRequest0, still in 2.x) reserves 4 bytes for the topic
    array count and, for an all-topics request at v9+ (flexible), leaves them as they are
    instead of shrinking them to the one-byte compact-array count: the body is
    ``00 00 00 00 <AllowAutoTopicCreation> <IncludeTopicAuthorizedOperations> 00``. A Java
    broker reads ``00`` as a null (all topics) array, the next three zero bytes as
    AllowAutoTopicCreation=false, IncludeTopicAuthorizedOperations=false and no tagged
    fields, and ignores the 3 bytes left over (it does not check for trailing bytes). Our
    strict codec refuses them, so such a frame cannot round-trip; the frame without its
    last 3 bytes is exactly what the broker understood.
    """
    if len(frame) < 12 or frame[0:2] != b"\x00\x03" or int.from_bytes(frame[2:4], "big") < 9:
        return None
    tail = frame[-7:]
    if tail[:4] != b"\x00\x00\x00\x00" or tail[4] > 1 or tail[5] > 1 or tail[6] != 0:
        return None
    trimmed = frame[:-3]
    try:
        _, body = decode_request(trimmed)
    except ProtocolError:
        return None
    if body.topics is not None or body.allow_auto_topic_creation:
        return None
    return trimmed


@dataclass(frozen=True, slots=True)
class GoldenExchange:
    client: str
    api_key: int
    api_version: int
    request: bytes
    response: bytes | None

    @property
    def size(self) -> int:
        return len(self.request) + len(self.response or b"")

    def to_json(self) -> str:
        return json.dumps(
            {
                "client": self.client,
                "api_key": self.api_key,
                "api_version": self.api_version,
                "api": api_name(self.api_key),
                "request": self.request.hex(),
                "response": None if self.response is None else self.response.hex(),
            },
            separators=(",", ":"),
        )


def select_exchanges(
    exchanges: Iterable[GoldenExchange],
    *,
    per_kind: int = 3,
    max_exchange_bytes: int = 32 * 1024,
    max_total_bytes: int = 600 * 1024,
) -> list[GoldenExchange]:
    """A small, varied sample: per (client, api key, version), up to ``per_kind`` exchanges.

    Prefers exchanges of different sizes (an empty Fetch and one with records, say), leaves
    out exchanges above ``max_exchange_bytes`` unless a kind has nothing smaller (then its
    smallest is kept), and stops at ``max_total_bytes`` of frames (hex doubles that on disk).
    Order of first appearance is kept.
    """
    groups: dict[tuple[str, int, int], list[GoldenExchange]] = defaultdict(list)
    for ex in exchanges:
        groups[(ex.client, ex.api_key, ex.api_version)].append(ex)
    chosen: set[int] = set()
    order = {id(ex): i for i, ex in enumerate(e for g in groups.values() for e in g)}
    total = 0
    for members in groups.values():
        fitting = [ex for ex in members if ex.size <= max_exchange_bytes]
        if not fitting:
            fitting = [min(members, key=lambda ex: ex.size)]
        picked: list[GoldenExchange] = []
        sizes: set[int] = set()
        # Distinct response sizes first (largest first, so a Fetch with records wins), then
        # whatever is left, up to per_kind.
        for ex in sorted(fitting, key=lambda ex: -ex.size):
            if len(picked) >= per_kind:
                break
            resp = len(ex.response or b"")
            if resp not in sizes:
                picked.append(ex)
                sizes.add(resp)
        for ex in fitting:
            if len(picked) >= per_kind:
                break
            if ex not in picked:
                picked.append(ex)
        for ex in picked:
            if total + ex.size > max_total_bytes:
                continue
            total += ex.size
            chosen.add(id(ex))
    result = [ex for g in groups.values() for ex in g if id(ex) in chosen]
    return sorted(result, key=lambda ex: order[id(ex)])


def write_golden(path: Path, exchanges: Sequence[GoldenExchange], meta: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"golden": GOLDEN_FORMAT, **meta}, sort_keys=True)]
    lines += [ex.to_json() for ex in exchanges]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def read_golden(path: Path) -> tuple[dict, list[GoldenExchange]]:
    """(metadata, exchanges) of a golden file."""
    with open(path, encoding="utf-8") as f:
        meta = json.loads(f.readline())
        if meta.get("golden") != GOLDEN_FORMAT:
            raise ValueError(f"{path} is not a golden frames file (format {GOLDEN_FORMAT})")
        exchanges = []
        for line in f:
            if not line.strip():
                continue
            item = json.loads(line)
            exchanges.append(
                GoldenExchange(
                    client=item["client"],
                    api_key=item["api_key"],
                    api_version=item["api_version"],
                    request=bytes.fromhex(item["request"]),
                    response=None if item["response"] is None else bytes.fromhex(item["response"]),
                )
            )
    return meta, exchanges
