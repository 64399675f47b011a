"""The tagged-fields section that ends every struct in a flexible version (KIP-482).

Wire layout: ``uvarint count``, then per field ``uvarint tag``, ``uvarint size`` and
``size`` bytes of the field's value. A reader must skip tags it does not know, which is
how a stock Kafka peer ignores our tag-10000 extensions; we keep unknown fields as raw
bytes so that re-encoding a decoded message reproduces them.

Tags must strictly ascend (KIP-482); we reject anything else so a decoded struct always
re-encodes to the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from proxy.protocol.primitives import EMPTY_FROZENSET, check_tag_count, fail, read_uvarint, write_uvarint

# tag -> (attribute name, reader(buf, pos, end) -> (value, pos))
KnownTags = dict[int, tuple[str, Callable[[Any, int, int], tuple[Any, int]]]]


def read_tag_count(buf, pos: int, end: int) -> tuple[int, int]:
    """The number of tagged fields: at most MAX_TAGGED_FIELDS, and bounded by the bytes
    left (each takes at least a tag byte and a size byte)."""
    start = pos
    count, pos = read_uvarint(buf, pos, end)
    check_tag_count(count, start)
    if count * 2 > end - pos:
        fail(f"{count} tagged fields cannot fit in the {end - pos} bytes left", start)
    return count, pos


def read_tag_header(buf, pos: int, end: int, last_tag: int) -> tuple[int, int, int]:
    """One field's tag and size: returns ``(tag, value_start, value_end)``."""
    tag_pos = pos
    tag, pos = read_uvarint(buf, pos, end)
    if tag <= last_tag:
        fail(f"tagged field {tag} follows tag {last_tag}; tags must ascend", tag_pos)
    size, pos = read_uvarint(buf, pos, end)
    if size > end - pos:
        fail(f"tagged field {tag} of {size} bytes exceeds the {end - pos} bytes left", pos)
    return tag, pos, pos + size


def skip_tagged_fields(buf: Any, pos: int, end: int | None = None) -> int:
    """The position after the tagged-fields section at ``pos``, its values unread.

    The proxy's one skipper, for code that walks a frame without decoding it (peeks,
    in-place rewrites): it checks what the codecs check (ascending tags, every field
    inside ``end``, default the end of ``buf``), so a walk and a decode agree on what
    is malformed.
    """
    if end is None:
        end = len(buf)
    count, pos = read_tag_count(buf, pos, end)
    tag = -1
    for _ in range(count):
        tag, _, pos = read_tag_header(buf, pos, end, tag)
    return pos


def tag_not_consumed(tag: int, used_to: int, field_end: int) -> NoReturn:
    fail(f"tagged field {tag} has {field_end - used_to} unread bytes", used_to)


def read_tagged_section(
    buf, pos: int, end: int, known: KnownTags
) -> tuple[dict[str, Any], frozenset[int], tuple[tuple[int, bytes], ...], int]:
    """Parse a tagged-fields section.

    Returns the decoded known fields by attribute, the set of known tags present, the
    unknown fields as ``(tag, raw bytes)`` and the position after the section. (The
    compiled codecs inline this loop with the same helpers and messages.)
    """
    count, pos = read_tag_count(buf, pos, end)
    values: dict[str, Any] = {}
    present: set[int] = set()
    unknown: list[tuple[int, bytes]] = []
    last_tag = -1
    for _ in range(count):
        tag, pos, field_end = read_tag_header(buf, pos, end, last_tag)
        last_tag = tag
        entry = known.get(tag)
        if entry is None:
            unknown.append((tag, bytes(buf[pos:field_end])))
        else:
            attr, reader = entry
            value, used_to = reader(buf, pos, field_end)
            if used_to != field_end:
                tag_not_consumed(tag, used_to, field_end)
            values[attr] = value
            present.add(tag)
        pos = field_end
    return (
        values,
        frozenset(present) if present else EMPTY_FROZENSET,
        tuple(unknown),
        pos,
    )


def write_tag_entries(out: bytearray, entries: list[tuple[int, Any]]) -> None:
    """Write a tagged-fields section from ``(tag, encoded bytes)`` pairs in any order."""
    if not entries:
        out.append(0)
        return
    entries.sort(key=_tag_of)
    write_uvarint(out, len(entries))
    previous = -1
    for tag, data in entries:
        if tag == previous:
            raise ValueError(f"tagged field {tag} given twice (known and in _unknown_tagged)")
        previous = tag
        write_uvarint(out, tag)
        write_uvarint(out, len(data))
        out += data


def _tag_of(entry: tuple[int, Any]) -> int:
    return entry[0]
