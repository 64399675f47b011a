"""The construct tree of one message version: structs, arrays and nullable structs.

``build_codec_tree(message, view, version)`` turns a merged definition into construct
objects for exactly that version: which fields exist, which are tagged, which strings
are compact or nullable. Each node can ``read``/``write`` itself: the interpreted path,
and the reference the generated code is tested against. The tree knows nothing of code
generation; ``codegen`` reads it (one direction: schema -> tree -> generated code).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.protocol import primitives as prim
from proxy.protocol.primitives import KafkaConstruct, primitive
from proxy.protocol.schema import FieldDef, MessageDef, View
from proxy.protocol.tagged import KnownTags, read_tagged_section, write_tag_entries
from proxy.protocol.values import (
    PRESENT_TAGS,
    UNKNOWN_TAGGED,
    default_spec,
    message_classes,
)


@dataclass(frozen=True, slots=True)
class Member:
    """One field of a struct as encoded in one version."""

    attr: str
    codec: KafkaConstruct
    tag: int | None  # None for a field in the fixed (untagged) part of the struct
    default: Any  # a tagged field equal to this is left off the wire (unless it was sent)


class ArrayCodec(KafkaConstruct):
    """A Kafka array: int32 count (or compact uvarint count + 1), then the elements."""

    def __init__(self, element: KafkaConstruct, *, compact: bool, nullable: bool) -> None:
        super().__init__()
        self.element = element
        self.compact = compact
        self.nullable = nullable
        self.min_size = 1 if compact else 4

    def read(self, buf, pos, end):
        n, pos = prim.read_array_count(
            buf, pos, end, self.element.min_size, self.nullable, self.compact
        )
        if n is None:
            return None, pos
        items = []
        read = self.element.read
        for _ in range(n):
            item, pos = read(buf, pos, end)
            items.append(item)
        return items, pos

    def write(self, out, value):
        prim.write_array_count(out, value, self.nullable, self.compact)
        if value is not None:
            write = self.element.write
            for item in value:
                write(out, item)


class NullableStructCodec(KafkaConstruct):
    """A struct field that may be null: int8 -1 (null) or 1 (present), then the struct."""

    min_size = 1

    def __init__(self, inner: StructCodec) -> None:
        super().__init__()
        self.inner = inner

    def read(self, buf, pos, end):
        present, pos = prim.read_nullable_struct_marker(buf, pos, end)
        if not present:
            return None, pos
        return self.inner.read(buf, pos, end)

    def write(self, out, value):
        if value is None:
            out.append(0xFF)
        else:
            out.append(1)
            self.inner.write(out, value)


class StructCodec(KafkaConstruct):
    """One struct (or the message itself) in one version.

    ``members`` lists every field of the generated class in class order; a member whose
    codec is None is absent from this version and decodes to its default.
    """

    def __init__(
        self,
        cls: type,
        members: list[tuple[FieldDef, Member | None]],
        flexible: bool,
        label: str,
    ) -> None:
        super().__init__()
        self.cls = cls
        self.all_members = members
        self.flexible = flexible
        self.label = label
        self.fixed_part = [m for _, m in members if m is not None and m.tag is None]
        # (tag, member) in tag order: the tagged part of the struct
        self.tag_members: list[tuple[int, Member]] = sorted(
            ((m.tag, m) for _, m in members if m is not None and m.tag is not None),
            key=lambda entry: entry[0],
        )
        self.tagged = [m for _, m in self.tag_members]
        self.known_tags: KnownTags = {tag: (m.attr, m.codec.read) for tag, m in self.tag_members}
        self.min_size = sum(m.codec.min_size for m in self.fixed_part) + (1 if flexible else 0)

    def __repr__(self) -> str:
        return f"StructCodec({self.label})"

    # ----------------------------------------------------------- interpreted

    def read(self, buf, pos, end):
        values: dict[str, Any] = {}
        for m in self.fixed_part:
            values[m.attr], pos = m.codec.read(buf, pos, end)
        if self.flexible:
            tagged, present, unknown, pos = read_tagged_section(buf, pos, end, self.known_tags)
            values.update(tagged)
            values[PRESENT_TAGS] = present
            values[UNKNOWN_TAGGED] = unknown
        return self.cls(**values), pos

    def write(self, out, value):
        for m in self.fixed_part:
            m.codec.write(out, getattr(value, m.attr))
        if self.flexible:
            entries: list[tuple[int, Any]] = []
            present = getattr(value, PRESENT_TAGS)
            for tag, m in self.tag_members:
                field_value = getattr(value, m.attr)
                if field_value != m.default or (m.default is not None and tag in present):
                    encoded = bytearray()
                    m.codec.write(encoded, field_value)
                    entries.append((tag, encoded))
            entries.extend(getattr(value, UNKNOWN_TAGGED))
            write_tag_entries(out, entries)


# --------------------------------------------------------------------------- layout


def _field_codec(
    f: FieldDef, version: int, flexible: bool, classes, label: str
) -> KafkaConstruct:
    nullable = version in f.nullable_versions
    compact = flexible and (f.flexible_versions is None or version in f.flexible_versions)
    if f.fields is not None:
        struct_codec = build_struct(
            f.fields, classes.class_for(f), version, flexible, classes, f"{label}.{f.name}"
        )
        if f.is_array:
            return ArrayCodec(struct_codec, compact=compact, nullable=nullable)
        return NullableStructCodec(struct_codec) if nullable else struct_codec
    if f.is_array:
        element = primitive(f.element_type, compact=compact, nullable=False)
        return ArrayCodec(element, compact=compact, nullable=nullable)
    return primitive(f.type, compact=compact, nullable=nullable)


def build_struct(
    fields: tuple[FieldDef, ...], cls: type, version: int, flexible: bool, classes, label: str
) -> StructCodec:
    members: list[tuple[FieldDef, Member | None]] = []
    for f in fields:
        if version not in f.versions:
            members.append((f, None))
            continue
        codec = _field_codec(f, version, flexible, classes, label)
        tagged = flexible and version in f.tagged_versions
        nested = classes.class_for(f)
        default, factory = default_spec(f, nested)
        members.append(
            (
                f,
                Member(
                    attr=f.attr,
                    codec=codec,
                    tag=f.tag if tagged else None,
                    default=factory() if factory is not None else default,
                ),
            )
        )
    return StructCodec(cls, members, flexible, f"{label}@v{version}")


def build_codec_tree(message: MessageDef, view: View, version: int) -> StructCodec:
    classes = message_classes(view, message.name)
    return build_struct(
        message.fields,
        classes.root,
        version,
        message.is_flexible(version),
        classes,
        message.name,
    )
