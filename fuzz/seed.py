"""The seed corpora: real traffic first, synthetic inputs only for what it lacks.

Frames, message bodies and record batches come from ``tests/golden/kafka-traffic.jsonl``,
what the Java clients, librdkafka and kafka-python exchanged with a real broker; a fuzzer
that starts from them spends its time on the structure of real messages instead of
rediscovering the size prefix. Some things no recorded exchange holds (snappy, magic 0
and 1, transaction markers, range commits, SASL, the commit log, configuration files) are
built here from the documented layouts, with kafka-python's encoders where it has one.

Each input is laid out as its target reads it (control bytes first, see each target's
docstring). Files are named after what they hold, stay below 64 KiB, and a target keeps
a few dozen of them.
"""

from __future__ import annotations

import hashlib
import shutil
import struct
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from fuzz import CORPUS, DICTIONARIES, ROOT
from fuzz.surface import decoded_versions
from harness.batches import Rec, control_batch, fix_crcs, kafka_python_batch, legacy_batch
from harness.golden import GoldenExchange, read_golden
from proxy.commits.codec import encode_key, encode_value, encode_value_generic
from proxy.commits.state import CommitState
from proxy.commits.watermarks import PREFIX, encode_metadata
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey, api_name
from proxy.protocol.constants import MAX_ARRAY_ELEMENTS, MAX_TAGGED_FIELDS
from proxy.protocol.framing import frame_bytes
from proxy.protocol.primitives import uvarint_bytes
from proxy.records.batch import TRANSACTIONAL_BIT, RecordBatch, iter_batches
from proxy.records.builder import build_batch, encode_record
from proxy.records.compression import Codec
from proxy.records.varint import encode_varint
from proxy.server.config import every_key

GOLDEN = ROOT.parent / "tests" / "golden" / "kafka-traffic.jsonl"
MAX_SEED_BYTES = 64 * 1024
Seed = tuple[str, bytes]

_KEY_AND_VERSION = struct.Struct(">hh")


def _golden() -> list[GoldenExchange]:
    return read_golden(GOLDEN)[1]


def _label(ex: GoldenExchange) -> str:
    return f"{ex.client}-{api_name(ex.api_key)}-v{ex.api_version}"


def _one_per_kind(exchanges: Iterable[GoldenExchange]) -> Iterator[GoldenExchange]:
    """The first exchange of each (api key, version), so no kind crowds out the others."""
    seen = set()
    for ex in exchanges:
        if (ex.api_key, ex.api_version) not in seen:
            seen.add((ex.api_key, ex.api_version))
            yield ex


# -- record sets --------------------------------------------------------------------------------

def _golden_record_sets() -> list[Seed]:
    """Record sets of recorded Produce requests and Fetch responses (lz4, zstd, gzip)."""
    found: list[Seed] = []
    for ex in _golden():
        if ex.api_key == ApiKey.PRODUCE:
            _, body = messages.decode_request(ex.request)
            sets = [p.records for t in body.topic_data for p in t.partition_data]
        elif ex.api_key == ApiKey.FETCH and ex.response:
            _, body = messages.decode_response(ex.api_key, ex.api_version, ex.response)
            sets = [p.records for t in body.responses for p in t.partitions]
        else:
            continue
        for number, records in enumerate(r for r in sets if r):
            found.append((f"golden-{_label(ex)}-{number}", bytes(records)))
    return found


def _records(n: int, *, start: int = 0, null_keys: bool = False) -> list[Rec]:
    return [Rec(i, None if null_keys and i % 3 == 0 else b"key-%d" % (start + i % 5), b"value-%d" % i * (1 + i % 4),
                1_700_000_000_000 + 17 * i, [("trace", b"%d" % i)] if i % 2 else [])
            for i in range(n)]


def _synthetic_record_sets() -> list[Seed]:
    sets: list[Seed] = [
        ("kafka-python-none", kafka_python_batch(_records(6), base_offset=40)),
        ("kafka-python-snappy", kafka_python_batch(_records(12) * 3, codec=2, base_offset=7)),
        ("transactional", kafka_python_batch(_records(4), transactional=True, base_offset=100)),
        ("control-commit", control_batch(base_offset=104, commit=True)),
        ("control-abort", control_batch(base_offset=104, commit=False)),
        ("legacy-magic0", legacy_batch(_records(3), magic=0, base_offset=5)),
        ("legacy-magic1", legacy_batch(_records(3), magic=1, base_offset=8)),
        ("legacy-magic1-gzip", legacy_batch(_records(5), magic=1, codec=1, base_offset=11)),
        ("null-keys", kafka_python_batch(_records(8, null_keys=True), base_offset=2**40)),
    ]
    raw = [encode_record(offset_delta=i, timestamp_delta=i, key=b"k%d" % i, value=b"v" * i) for i in range(5)]
    for codec in (Codec.SNAPPY, Codec.LZ4, Codec.ZSTD, Codec.GZIP):
        sets.append((f"ours-{codec.name.lower()}", build_batch(
            base_offset=50, last_offset_delta=4, records=raw, record_count=5, base_timestamp=1_700_000_000_000,
            max_timestamp=1_700_000_000_004, codec=codec)))
    empty = build_batch(base_offset=60, last_offset_delta=3, records=b"", record_count=0,
                        base_timestamp=1_700_000_000_000, max_timestamp=1_700_000_000_000,
                        attributes=TRANSACTIONAL_BIT, producer_id=9, producer_epoch=1, base_sequence=0)
    sets.append(("empty-after-filtering", empty))
    mixed = kafka_python_batch(_records(3), transactional=True, base_offset=0) + \
        control_batch(base_offset=3, commit=False) + legacy_batch(_records(2), magic=1, base_offset=4) + \
        kafka_python_batch(_records(4), base_offset=6)
    sets.append(("mixed-log", mixed))
    sets.append(("partial-tail", mixed + kafka_python_batch(_records(4), base_offset=10)[:45]))
    return sets


def _record_sets() -> list[Seed]:
    return _golden_record_sets()[:14] + _synthetic_record_sets()


def _sections() -> list[tuple[str, Codec, bytes]]:
    """Compressed records sections, each with its codec."""
    found: list[tuple[str, Codec, bytes]] = []
    for name, blob in _record_sets():
        for number, entry in enumerate(iter_batches(blob)):
            if isinstance(entry, RecordBatch) and entry.header.codec is not Codec.NONE:
                found.append((f"{name}-{number}", entry.header.codec, bytes(entry.records_section())))
    return found


# -- declared counts at and over the limits ------------------------------------------------------
# MAX_ARRAY_ELEMENTS and MAX_TAGGED_FIELDS (proxy/protocol/constants.py): a count over them
# is refused from its few bytes, so these inputs are short; one of exactly the limit passes
# the count check and fails on the bytes that are missing, except where every byte fits.

_OVER_ARRAY = MAX_ARRAY_ELEMENTS + 1
_OVER_TAGS = MAX_TAGGED_FIELDS + 1


def _tag_section(count: int) -> bytes:
    """``count`` empty tagged fields, every byte there (three bytes each at most)."""
    return uvarint_bytes(count) + b"".join(uvarint_bytes(tag) + b"\x00" for tag in range(count))


def _raw_request(api_key: int, version: int, header_tags: bytes | None, body: bytes) -> bytes:
    head = struct.pack(">hhih", api_key, version, 9, 4) + b"seed"
    return head + (header_tags if header_tags is not None else b"") + body


def _limit_requests() -> list[Seed]:
    fetch_v13 = struct.pack(">iiiibii", -1, 500, 1, 1024, 0, 0, -1)
    return [
        ("api-versions-v3-header-5M-tags", _raw_request(ApiKey.API_VERSIONS, 3, uvarint_bytes(5_000_000), b"\x00")),
        ("api-versions-v3-header-at-tag-limit",
         _raw_request(ApiKey.API_VERSIONS, 3, _tag_section(MAX_TAGGED_FIELDS), b"\x02a\x02b\x00")),
        ("heartbeat-v4-header-over-tag-limit", _raw_request(ApiKey.HEARTBEAT, 4, uvarint_bytes(_OVER_TAGS), b"\x00")),
        ("metadata-v12-2M-topics", _raw_request(ApiKey.METADATA, 12, b"\x00", uvarint_bytes(2_000_001) + b"\x00" * 3)),
        ("metadata-v12-at-array-limit",
         _raw_request(ApiKey.METADATA, 12, b"\x00", uvarint_bytes(MAX_ARRAY_ELEMENTS + 1) + b"\x00" * 3)),
        ("list-offsets-v1-2M-topics",
         _raw_request(ApiKey.LIST_OFFSETS, 1, None, struct.pack(">ii", -1, 2_000_000) + b"\x00" * 8)),
        ("fetch-v13-over-array-limit",
         _raw_request(ApiKey.FETCH, 13, b"\x00", fetch_v13 + uvarint_bytes(_OVER_ARRAY + 1) + b"\x00" * 8)),
        ("produce-v9-header-over-tag-limit", _raw_request(ApiKey.PRODUCE, 9, uvarint_bytes(_OVER_TAGS),
                                                          b"\x00" + struct.pack(">hi", -1, 1000) + b"\x01\x00")),
    ]


def _limit_responses() -> list[tuple[str, int, int, bytes]]:
    """(label, api key, version, frame) of responses declaring counts over the limits."""
    partition = struct.pack(">ihqqq", 0, 0, 5, -1, 0)
    return [
        ("fetch-v12-over-array-limit", ApiKey.FETCH, 12,
         struct.pack(">i", 7) + b"\x00" + struct.pack(">ihi", 0, 0, 0) + uvarint_bytes(_OVER_ARRAY + 1) + b"\x00"),
        ("fetch-v12-header-over-tag-limit", ApiKey.FETCH, 12,
         struct.pack(">i", 7) + uvarint_bytes(_OVER_TAGS) + struct.pack(">ihi", 0, 0, 0) + b"\x01\x00"),
        ("produce-v11-over-array-limit", ApiKey.PRODUCE, 11,
         struct.pack(">i", 7) + b"\x00\x02\x02t\x02" + partition + uvarint_bytes(_OVER_ARRAY + 1) + b"\x00" * 8),
        ("produce-v11-over-tag-limit", ApiKey.PRODUCE, 11,
         struct.pack(">i", 7) + b"\x00\x01" + struct.pack(">i", 0) + uvarint_bytes(_OVER_TAGS) + b"\x00" * 4),
    ]


def _limit_offset_commits() -> list[Seed]:
    head = _raw_request(ApiKey.OFFSET_COMMIT, 9, b"\x00", b"\x02g" + struct.pack(">i", 1) + b"\x02m\x00")
    partition = struct.pack(">iqi", 0, 5, -1) + b"\x00"
    ranges_field = uvarint_bytes(10000) + b"\x03" + uvarint_bytes(_OVER_ARRAY + 1)
    return [
        ("offset-commit-v9-over-topics", head + uvarint_bytes(_OVER_ARRAY + 1) + b"\x00" * 4),
        ("offset-commit-v9-over-partitions", head + b"\x02\x02t" + uvarint_bytes(_OVER_ARRAY + 1) + b"\x00" * 4),
        ("offset-commit-v9-over-partition-tags", head + b"\x02\x02t\x02" + partition + uvarint_bytes(_OVER_TAGS)),
        ("offset-commit-v9-over-ranges", head + b"\x02\x02t\x02" + partition + b"\x01" + ranges_field + b"\x00\x00"),
    ]


def _record_with_headers(declared: int) -> bytes:
    body = b"\x00" + encode_varint(0) + encode_varint(0) + encode_varint(-1) + encode_varint(-1) + encode_varint(declared)
    return encode_varint(len(body)) + body


def _limit_batches() -> list[Seed]:
    over_headers = build_batch(base_offset=0, last_offset_delta=0, records=[_record_with_headers(_OVER_ARRAY)],
                               record_count=1, base_timestamp=1, max_timestamp=1)
    records = [encode_record(offset_delta=i, key=b"k%d" % i, value=b"v") for i in range(3)]
    over_count = bytearray(build_batch(base_offset=0, last_offset_delta=2, records=records, record_count=3,
                                       base_timestamp=1, max_timestamp=1))
    struct.pack_into(">i", over_count, 57, 2**31 - 1)  # a record count its bytes cannot hold
    return [("record-over-header-limit", over_headers), ("record-count-beyond-its-bytes", fix_crcs(over_count))]


# -- per target ---------------------------------------------------------------------------------

def records_seeds() -> list[Seed]:
    seeds = [(f"blob-{name}", b"\x00" + blob) for name, blob in _record_sets()]
    seeds += [(f"section-{name}", b"\x01" + bytes((codec,)) + section) for name, codec, section in _sections()[:8]]
    plain = b"".join(encode_record(offset_delta=i, key=b"k%d" % i, value=b"x" * (i * 13)) for i in range(40))
    seeds += [(f"roundtrip-{codec.name.lower()}", b"\x02" + bytes((codec,)) + plain) for codec in Codec]
    seeds += [(f"blob-{name}", b"\x00" + blob) for name, blob in _limit_batches()]
    return seeds


def split_seeds() -> list[Seed]:
    seeds = []
    for number, (name, blob) in enumerate(_record_sets()):
        plan = (number % 4) | (0x10 if number % 3 == 0 else 0) | (0x20 if number % 5 == 0 else 0)
        options = number % 4
        seeds.append((f"{name}-plan{plan}-opt{options}", bytes((plan, options)) + blob))
    seeds += [(f"{name}-plan1-opt0", bytes((1, 0)) + blob) for name, blob in _limit_batches()]
    return seeds


def messages_seeds() -> list[Seed]:
    decoded = decoded_versions()
    seeds: list[Seed] = []
    covered = set()
    for ex in _one_per_kind(_golden()):
        if ex.api_key not in decoded:
            continue
        covered.add(ex.api_key)
        seeds.append((f"request-{_label(ex)}", b"\x00" + ex.request))
        if ex.response is not None:
            seeds.append((f"response-{_label(ex)}", b"\x01" + _KEY_AND_VERSION.pack(ex.api_key, ex.api_version)
                          + ex.response))
    # Keys no recorded client used: their default bodies at the newest version.
    for api_key, (_low, high) in decoded.items():
        if api_key in covered:
            continue
        for version in (high,):
            name = f"{api_name(api_key)}-v{version}"
            header = messages.new_request_header(api_key, version, 7, "seed")
            request = messages.encode_request(header, messages.new_body(api_key, version, "request"))
            response = messages.encode_response(api_key, version, messages.new_response_header(7),
                                                messages.new_body(api_key, version, "response"))
            seeds.append((f"request-default-{name}", b"\x00" + request))
            seeds.append((f"response-default-{name}", b"\x01" + _KEY_AND_VERSION.pack(api_key, version) + response))
    seeds += [(f"request-{label}", b"\x00" + frame) for label, frame in _limit_requests() + _limit_offset_commits()]
    seeds += [(f"response-{label}", b"\x01" + _KEY_AND_VERSION.pack(api_key, version) + frame)
              for label, api_key, version, frame in _limit_responses()]
    return seeds


def frames_seeds() -> list[Seed]:
    seeds: list[Seed] = []
    golden = list(_one_per_kind(_golden()))
    for ex in golden:
        if ex.api_key == ApiKey.FETCH and ex.response is not None:
            control = (ex.api_version - 12) << 2 | (0x80 if ex.api_version >= 16 else 0)
            seeds.append((f"fetch-response-{_label(ex)}", bytes((control, 3, 40)) + frame_bytes(ex.response)))
        elif ex.api_key in (ApiKey.PRODUCE, ApiKey.METADATA, ApiKey.API_VERSIONS, ApiKey.OFFSET_COMMIT):
            seeds.append((f"request-{_label(ex)}", bytes((0, 0, 0)) + frame_bytes(ex.request)))
        if ex.api_key == ApiKey.FETCH:  # which the native relay carries when it is plain
            seeds.append((f"request-{_label(ex)}", bytes((0, 0, 0)) + frame_bytes(ex.request)))
    seeds += [(label, bytes((0, 3, 40)) + frame_bytes(frame)) for label, frame in _fetch_requests()]
    stream = b"".join(frame_bytes(ex.request) for ex in golden[:6])
    seeds.append(("client-stream", bytes((1, 5, 2)) + stream))
    seeds.append(("oversized-prefix", bytes((1, 0, 0)) + struct.pack(">i", 5000) + b"\x00" * 64))
    seeds += [(label, bytes((0, 3, 40)) + frame_bytes(frame)) for label, frame in _limit_requests()]
    for label, api_key, version, frame in _limit_responses():
        control = (version - 12) << 2 if api_key == ApiKey.FETCH else (version - 10) << 5
        seeds.append((label, bytes((control, 3, 40)) + frame_bytes(frame)))
    return seeds


def _fetch_requests() -> Iterator[tuple[str, bytes]]:
    """Fetch requests the golden traffic lacks: with the proxy's extensions (key ranges at
    the top level and on a partition, a cooperative partition), forgotten topics, and names
    that may be a virtual topic's."""
    request = messages.body_class(ApiKey.FETCH, "request")
    ranges = [request.KeyRange(start=0, end=1 << 40)]
    member = request.CooperativeMember(group_id="workers", member_id="m-1", generation_id=2)

    def topic(cls: Any, version: int, name: str, **fields: Any) -> Any:
        if version >= 13:
            return cls(topic_id=uuid.uuid5(uuid.NAMESPACE_DNS, name), **fields)
        return cls(topic=name, **fields)

    for version in (11, 12, 13, 17):
        for label, extension in (("plain", {}), ("top-ranges", {"top": ranges}), ("ranges", {"part": ranges}),
                                 ("coop", {"coop": member})):
            if version < 12 and extension:
                continue
            partition = request.FetchPartition(partition=0, fetch_offset=40, partition_max_bytes=1 << 20,
                                               key_ranges=extension.get("part"), cooperative=extension.get("coop"))
            body = messages.new_body(
                ApiKey.FETCH, version, "request", max_wait_ms=500, min_bytes=1, max_bytes=50 << 20,
                session_id=9, session_epoch=3, rack_id="rack-a",
                topics=[topic(request.FetchTopic, version, "orders", partitions=[partition]),
                        topic(request.FetchTopic, version, "orders.kr4", partitions=[partition])],
                forgotten_topics_data=[topic(request.ForgottenTopic, version, "old", partitions=[1, 2])])
            body.key_ranges = extension.get("top")
            header = messages.new_request_header(ApiKey.FETCH, version, 21, "seed")
            yield f"fetch-v{version}-{label}", messages.encode_request(header, body)
    # sessionless key-range Fetches as range consumers send them: the native relay answers
    # these from its table when their shares are cached
    two = [request.KeyRange(start=0, end=99), request.KeyRange(start=1 << 40, end=(1 << 62) - 1)]
    for version in (13, 15, 17):
        for label, own, top in (("one", ranges, None), ("top", None, two), ("mixed", two, ranges)):
            partitions = [request.FetchPartition(partition=p, fetch_offset=40 + p, partition_max_bytes=1 << 20,
                                                 key_ranges=own if p != 2 else None) for p in range(3)]
            body = messages.new_body(
                ApiKey.FETCH, version, "request", max_wait_ms=100, min_bytes=1, max_bytes=1 << 20,
                isolation_level=version % 2, session_id=0, session_epoch=-1, key_ranges=top,
                topics=[topic(request.FetchTopic, version, "orders", partitions=partitions[:1 if label == "one" else 3]),
                        *([topic(request.FetchTopic, version, "old", partitions=partitions[1:])] if label == "mixed"
                          else [])])
            header = messages.new_request_header(ApiKey.FETCH, version, 22, "range-consumer")
            yield f"fetch-v{version}-sessionless-{label}", messages.encode_request(header, body)


def _commit_request(version: int, ranges: list[tuple[int, int]] | None, metadata: str | None = None) -> bytes:
    request = messages.body_class(ApiKey.OFFSET_COMMIT, "request")
    topic = request.OffsetCommitRequestTopic(
        name="orders" if version < 10 else "", topic_id=uuid.UUID(int=7) if version >= 10 else uuid.UUID(int=0),
        partitions=[request.OffsetCommitRequestPartition(
            partition_index=index, committed_offset=-1 if ranges else 42, committed_metadata=metadata,
            offset_ranges=None if ranges is None else [request.OffsetRange(start=s, end=e) for s, e in ranges])
            for index in (0, 3)])
    body = messages.new_body(ApiKey.OFFSET_COMMIT, version, "request", group_id="workers",
                             generation_id_or_member_epoch=3, member_id="member-1", topics=[topic])
    return messages.encode_request(messages.new_request_header(ApiKey.OFFSET_COMMIT, version, 11, "seed"), body)


def _commit_response(version: int, stable: bool) -> bytes:
    response = messages.body_class(ApiKey.OFFSET_COMMIT, "response")
    partitions = [response.OffsetCommitResponsePartition(partition_index=i, error_code=0,
                                                         stable_offset=90 if stable and i else -1)
                  for i in range(3)]
    topic = response.OffsetCommitResponseTopic(name="orders" if version < 10 else "",
                                               topic_id=uuid.UUID(int=7) if version >= 10 else uuid.UUID(int=0),
                                               partitions=partitions)
    body = messages.new_body(ApiKey.OFFSET_COMMIT, version, "response", topics=[topic])
    return messages.encode_response(ApiKey.OFFSET_COMMIT, version, messages.new_response_header(11), body)


def commit_wire_seeds() -> list[Seed]:
    seeds: list[Seed] = []
    for ex in _golden():
        if ex.api_key == ApiKey.OFFSET_COMMIT and ex.api_version >= 8:
            seeds.append((f"request-{_label(ex)}", b"\x00" + ex.request))
            if ex.response is not None:
                control = 1 | ((ex.api_version - 8) << 1)
                seeds.append((f"response-{_label(ex)}", bytes((control,)) + ex.response))
    for version in (8, 9, 10):
        seeds.append((f"request-ranges-v{version}", b"\x02" + _commit_request(version, [(50, 59), (43, 45)])))
        seeds.append((f"request-plain-v{version}", b"\x00" + _commit_request(version, None, "meta")))
        for stable in (False, True):
            control = 1 | ((version - 8) << 1) | (0x78 if stable else 0)
            seeds.append((f"response-v{version}-stable{int(stable)}", bytes((control,))
                          + _commit_response(version, stable)))
    seeds += [(f"request-{label}", b"\x00" + frame) for label, frame in _limit_offset_commits()]
    over_topics = struct.pack(">i", 7) + b"\x00" + struct.pack(">i", 0) + uvarint_bytes(_OVER_ARRAY + 1) + b"\x00"
    seeds.append(("response-v9-over-topics", bytes((1 | (1 << 1),)) + over_topics))
    return seeds


def commit_log_seeds() -> list[Seed]:
    states = {
        "plain": CommitState(120),
        "ranges": CommitState(40, [(43, 45), (50, 50), (70, 99)], epoch=2),
        "watermarks": CommitState(10, [(12, 14)], epoch=1, marks=((4, 0, 11, 3), (4, 1, 30, 1), (4, 3, 12, 2))),
    }
    key = encode_key("workers", "orders", 3)
    seeds: list[Seed] = [("tombstone", b"\x00" + struct.pack(">H", len(key)) + key)]
    for name, state in states.items():
        value = encode_value(state)
        seeds.append((f"record-{name}", b"\x00" + struct.pack(">H", len(key)) + key + value))
        if not state.marks:
            legacy = encode_value_generic(state, 0)
            seeds.append((f"record-{name}-v0", b"\x00" + struct.pack(">H", len(key)) + key + legacy))
    packed = struct.pack(">qqxqqx", 50, 59, 43, 45)
    deltas = bytes((3, 2, 4, 9))
    seeds.append(("kernels", b"\x01" + struct.pack(">q", 40) + b"\x01" + struct.pack(">H", len(packed)) + packed
                  + deltas))
    seeds.append(("kernels-unsorted", b"\x01" + struct.pack(">q", 0) + b"\x00" + struct.pack(">H", 34)
                  + struct.pack(">qqxqqx", 9, 12, 1, 3)))
    committed = struct.pack(">Q", (1 << 63) + 25)
    seeds.append(("metadata-v2", b"\x02" + committed + encode_metadata(states["watermarks"]).encode()))
    seeds.append(("metadata-v1", b"\x02" + committed + b"keyrange.watermarks/1:3:30,-1,12"))
    seeds.append(("metadata-foreign", b"\x02" + committed + b"a client's own metadata"))
    over_ranges = struct.pack(">hq", 0, 5) + uvarint_bytes(_OVER_ARRAY + 1) + b"\x00"  # v0: its Ranges array
    seeds.append(("record-v0-over-array-limit", b"\x00" + struct.pack(">H", len(key)) + key + over_ranges))
    return seeds


def _sasl_request(api_key: int, version: int, **fields: Any) -> bytes:
    header = messages.new_request_header(api_key, version, 2, "seed")
    return frame_bytes(messages.encode_request(header, messages.new_body(api_key, version, "request", **fields)))


def sasl_seeds() -> list[Seed]:
    api_versions = next(ex.request for ex in _golden() if ex.api_key == ApiKey.API_VERSIONS)
    plain_token = b"\x00alice\x00secret"
    scram_first = b"n,,n=alice,r=fyko+d2lbbFgONRv9qkxdawL"
    seeds: list[Seed] = []
    for version in (0, 1):
        handshake = _sasl_request(ApiKey.SASL_HANDSHAKE, version, mechanism="PLAIN")
        seeds.append((f"handshake-v{version}", frame_bytes(api_versions) + handshake))
    for version in (0, 1, 2):
        authenticate = _sasl_request(ApiKey.SASL_AUTHENTICATE, version, auth_bytes=plain_token)
        seeds.append((f"plain-v{version}", _sasl_request(ApiKey.SASL_HANDSHAKE, 1, mechanism="PLAIN") + authenticate))
    seeds.append(("scram-first", _sasl_request(ApiKey.SASL_HANDSHAKE, 1, mechanism="SCRAM-SHA-256")
                  + _sasl_request(ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=scram_first)))
    # After SaslHandshake v0 a client sends raw tokens without a Kafka header.
    seeds.append(("handshake-v0-raw-token", _sasl_request(ApiKey.SASL_HANDSHAKE, 0, mechanism="PLAIN")
                  + frame_bytes(plain_token)))
    return seeds


def config_seeds() -> list[Seed]:
    properties = "\n".join([
        "# a sidecar in front of one broker",
        "bootstrap.servers=broker1:9092",
        "topology=sidecar",
        "listen.host: 0.0.0.0",
        "listen.port = 9192",
        "sidecar.node.addresses=1@proxy-1:9192,2@[::1]:9193",
        "max.frame.bytes=0x100_000",
        "ssl.upstream.enabled=no",
        "virtual.topics.enabled=true",
        "virtual.topic.max.shares=16",
        "topic.orders.v2.key.range.fetch.enabled=false",
        "reserve.message.value.range.fetch=yes",
        "topic.orders.reserve.message.value.range.fetch=no",
        "log.level=DEBUG \\",
        "",
    ])
    # former names of renamed settings are read too
    overrides = ("bootstrap.servers=a:1,b:2\nmetrics.port=0\nfetch.prediction.enabled=on\nkey.range.fetch.compression=none"
                 "\naccept.individual.commit=false\ntopic.orders.accept.range.fetch=off")
    return [
        ("properties", b"\x00" + properties.encode()),
        ("file", b"\x01" + properties.encode()),
        ("overrides", b"\x02" + overrides.encode()),
        ("port-per-broker", b"\x00bootstrap.servers=localhost:9092\nnode.port.base=9300\nmax.connections=5\n"),
    ]


def _dictionaries() -> dict[str, list[bytes]]:
    """Tokens a mutation is unlikely to spell by chance: setting names, the metadata format
    of share watermarks, numbers at the edges of int64."""
    edges = [b"9223372036854775807", b"9223372036854775808", b"-1", b"99999999999999999999", b"0x7fffffff"]
    settings = [key.replace("<topic>", "orders").encode() for key in every_key(former=True)]
    return {
        "config": settings + edges + [b"=", b":", b"\\\n", b"true", b"false", b"sidecar", b"port-per-broker", b"[::1]:"],
        "commit_log": [PREFIX.encode() + b"2:", PREFIX.encode() + b"1:", b"/", b"=", b"@", b","] + edges,
    }


def write_dictionaries(folder: Path = DICTIONARIES) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for target, tokens in _dictionaries().items():
        lines = ['"' + "".join(chr(b) if 32 <= b < 127 and b not in b'"\\' else f"\\x{b:02x}" for b in token) + '"'
                 for token in tokens]
        (folder / f"{target}.dict").write_text("\n".join(lines) + "\n")


SEEDERS = {
    "frames": frames_seeds,
    "messages": messages_seeds,
    "records": records_seeds,
    "split": split_seeds,
    "commit_log": commit_log_seeds,
    "commit_wire": commit_wire_seeds,
    "sasl": sasl_seeds,
    "config": config_seeds,
}


def _file_name(label: str, data: bytes) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
    return f"{safe}-{hashlib.sha1(data).hexdigest()[:8]}"


def write_corpora(corpus: Path = CORPUS) -> dict[str, int]:
    """Rewrite every target's seed directory; returns how many seeds each got."""
    counts = {}
    for target, seeder in SEEDERS.items():
        folder = corpus / target
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        written = set()
        for label, data in seeder():
            if len(data) >= MAX_SEED_BYTES or data in written:
                continue
            written.add(data)
            (folder / _file_name(label, data)).write_bytes(data)
        counts[target] = len(written)
    write_dictionaries()
    return counts
