"""Hypothesis strategies that generate Kafka message values from the schemas themselves.

``message_values(view, name, version)`` walks the same per-version codec tree the codec
uses, so every field the version carries gets a random value of its wire type (ints over
their whole range, nullable values sometimes None, tagged fields sometimes at their
default so they are left off the wire) and flexible structs sometimes carry unknown
tagged fields. Fields the version lacks stay at their defaults, which is exactly what a
decode of that version produces, so values round-trip by ``==``.
"""

from __future__ import annotations

import functools

from hypothesis import strategies as st

from proxy.protocol.codec_tree import ArrayCodec, NullableStructCodec, StructCodec, build_codec_tree
from proxy.protocol.primitives import Bool, Fixed, KafkaConstruct, Uuid, Varlen
from proxy.protocol.schema import View, registry
from proxy.protocol.values import UNKNOWN_TAGGED

INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "uint16": (0, 2**16 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
}

MAX_LIST = 3
MAX_TEXT = 12

# Tags no schema uses, for unknown tagged fields (ours is 10000; Kafka's are small).
UNKNOWN_TAGS = st.sampled_from([7, 99, 127, 128, 16383, 16384, 20000])


def _text() -> st.SearchStrategy:
    return st.text(max_size=MAX_TEXT)


def codec_values(codec: KafkaConstruct) -> st.SearchStrategy:
    """Values of one codec (a field's wire type in one version)."""
    if isinstance(codec, Fixed):
        if codec.type_name == "float64":
            return st.floats(allow_nan=False)
        lo, hi = INT_RANGES[codec.type_name]
        return st.integers(lo, hi)
    if isinstance(codec, Bool):
        return st.booleans()
    if isinstance(codec, Uuid):
        return st.uuids()
    if isinstance(codec, Varlen):
        base = _text() if "string" in codec.reader_name else st.binary(max_size=MAX_TEXT)
        nullable = "nullable" in codec.reader_name or "records" in codec.reader_name
        return st.none() | base if nullable else base
    if isinstance(codec, ArrayCodec):
        items = st.lists(codec_values(codec.element), max_size=MAX_LIST)
        return st.none() | items if codec.nullable else items
    if isinstance(codec, NullableStructCodec):
        return st.none() | struct_values(codec.inner)
    if isinstance(codec, StructCodec):
        return struct_values(codec)
    raise TypeError(f"no strategy for {codec!r}")


def _unknown_tags(known: set[int]) -> st.SearchStrategy:
    pairs = st.lists(
        st.tuples(UNKNOWN_TAGS.filter(lambda t: t not in known), st.binary(max_size=6)),
        max_size=2,
        unique_by=lambda pair: pair[0],
    )
    return pairs.map(lambda items: tuple(sorted(items)))


def struct_values(codec: StructCodec) -> st.SearchStrategy:
    fields = {}
    for m in codec.fixed_part:
        fields[m.attr] = codec_values(m.codec)
    for m in codec.tagged:
        # often the default, so the field is left off the wire
        fields[m.attr] = st.just(m.default) | codec_values(m.codec)
    if codec.flexible:
        fields[UNKNOWN_TAGGED] = st.just(()) | _unknown_tags({m.tag for m in codec.tagged if m.tag is not None})
    return st.builds(codec.cls, **fields)


@functools.cache
def message_values(view: View, name: str, version: int) -> st.SearchStrategy:
    """Random values of message ``name`` (any kind) at ``version``."""
    message = registry(view).by_name[name]
    return struct_values(build_codec_tree(message, view, version))
