"""Python classes for decoded Kafka messages, generated from the definitions.

Every struct of a message gets one slotted dataclass, named after the struct type
(``FetchTopic``, ``FetchPartition``; the message itself is the root, ``FetchRequest``).
A class covers the union of the struct's fields over *all* versions, so proxy code can
read ``topic.topic_id`` or ``topic.topic`` whatever the version; a field the decoded
version lacks holds its default. Attribute names are the snake_case Kafka field names.

Two extra dataclass fields carry what tagged-field round trips need:

* ``_unknown_tagged``: ``tuple[(tag, bytes), ...]`` of tagged fields this schema does not
  know, re-emitted verbatim on encode (compared by ``==``, hidden from ``repr``);
* ``_present_tags``: ``frozenset`` of known tags that were on the wire, so a tagged field
  sent with its default value is re-emitted (not compared, not shown). Fields whose
  default is None are the exception: None always means "not sent", so setting such a
  field to None strips it (an explicit null on the wire is normalized away).

Nested classes hang off the root class by struct name (``FetchRequest.FetchPartition``).
"""

from __future__ import annotations

import base64
import dataclasses
import operator
import uuid
from typing import Any, TypeVar

from proxy.protocol.once import built_once
from proxy.protocol.primitives import EMPTY_FROZENSET, ZERO_UUID
from proxy.protocol.schema import FieldDef, MessageDef, SchemaError, View, registry

V = TypeVar("V")  # a message or struct value
UNKNOWN_TAGGED = "_unknown_tagged"
PRESENT_TAGS = "_present_tags"

# Shorter read-only names for fields every caller reads: message -> {alias: field attribute}.
ALIASES: dict[str, dict[str, str]] = {
    "RequestHeader": {"api_key": "request_api_key", "api_version": "request_api_version"},
}


def parse_default(f: FieldDef) -> Any:
    """The field's default as a Python value (not for arrays or structs)."""
    raw = f.default
    if raw == "null":
        return None
    t = f.type
    if t in ("int8", "int16", "uint16", "int32", "uint32", "int64"):
        if raw is None or raw == "":
            return 0
        return raw if isinstance(raw, int) and not isinstance(raw, bool) else int(str(raw), 0)
    if t == "bool":
        if isinstance(raw, bool):
            return raw
        if raw in (None, "", "false"):
            return False
        if raw == "true":
            return True
        raise SchemaError(f"{f.name}: bad bool default {raw!r}")
    if t == "float64":
        return 0.0 if raw in (None, "") else float(raw)
    if t == "string":
        return "" if raw is None else str(raw)
    if t == "bytes":
        return b""
    if t == "records":
        return None
    if t == "uuid":
        if raw in (None, ""):
            return ZERO_UUID
        padded = str(raw) + "=" * (-len(str(raw)) % 4)
        return uuid.UUID(bytes=base64.urlsafe_b64decode(padded))
    raise SchemaError(f"{f.name}: no default for type {t}")


def default_spec(f: FieldDef, nested: type | None) -> tuple[Any, Any]:
    """``(default, default_factory)`` for a field; exactly one is meaningful."""
    if f.default == "null":
        return None, None
    if f.is_array:
        return None, list
    if nested is not None:
        return None, nested
    return parse_default(f), None


class MessageClasses:
    """The generated classes of one message: ``root`` plus one per struct name."""

    def __init__(self, message: MessageDef) -> None:
        self.message = message
        self.by_struct: dict[str, type] = {}
        self.root = self._make(message.name, message.fields)
        for name, cls in self.by_struct.items():
            setattr(self.root, name, cls)
        for alias, attr in ALIASES.get(message.name, {}).items():
            setattr(self.root, alias, property(operator.attrgetter(attr), doc=attr))

    def _make(self, name: str, fields: tuple[FieldDef, ...]) -> type:
        spec: list[tuple[str, Any, Any]] = []
        for f in fields:
            nested = None
            if f.fields is not None:
                struct_name = f.element_type  # a field with fields is a struct (array)
                nested = self.by_struct.get(struct_name)
                if nested is None:
                    nested = self._make(struct_name, f.fields)
                    self.by_struct[struct_name] = nested
            default, factory = default_spec(f, nested)
            if factory is not None:
                spec.append((f.attr, Any, dataclasses.field(default_factory=factory)))
            else:
                spec.append((f.attr, Any, dataclasses.field(default=default)))
        spec.append((UNKNOWN_TAGGED, tuple, dataclasses.field(default=(), repr=False)))
        spec.append(
            (
                PRESENT_TAGS,
                frozenset,
                dataclasses.field(default=EMPTY_FROZENSET, repr=False, compare=False),
            )
        )
        cls: Any = dataclasses.make_dataclass(name, spec, slots=True, eq=True)
        cls.__module__ = __name__
        # what strip_extensions needs: our added fields, and where nested structs hang
        cls._kafka_ours = tuple((f.attr, f.tag) for f in fields if f.ours)
        cls._kafka_struct_attrs = tuple(f.attr for f in fields if f.fields is not None)
        cls.__qualname__ = name if name == self.message.name else f"{self.message.name}.{name}"
        cls.__doc__ = (
            f"Kafka {self.message.name} struct {name}: "
            + ", ".join(f"{f.attr} ({f.type}, v{f.versions})" for f in fields)
        )
        return cls

    def class_for(self, f: FieldDef) -> type | None:
        """The class of a struct or struct-array field (struct names are unique per
        message; the schema loader rejects a name defined twice differently)."""
        return self.by_struct.get(f.element_type) if f.fields is not None else None


@built_once
def message_classes(view: View, name: str) -> MessageClasses:
    """Generated classes for message ``name`` in schema ``view`` (built once)."""
    message = registry(view).by_name.get(name)
    if message is None:
        raise KeyError(f"no message definition named {name!r}")
    return MessageClasses(message)


def strip_extensions(value: V) -> V:
    """Reset every field our overlays add (tag 10000) to its default, in place, through
    all nested structs, so the value encodes exactly as a stock Kafka peer would send it.
    Returns ``value``."""
    cls: Any = type(value)  # a generated class: its attributes are made with it
    ours = cls._kafka_ours
    if ours:
        fields = cls.__dataclass_fields__
        for attr, _ in ours:
            f = fields[attr]
            if f.default_factory is not dataclasses.MISSING:
                setattr(value, attr, f.default_factory())
            else:
                setattr(value, attr, f.default)
        present = getattr(value, PRESENT_TAGS)
        if present:
            setattr(value, PRESENT_TAGS, present - {tag for _, tag in ours})
    for attr in cls._kafka_struct_attrs:
        nested = getattr(value, attr)
        if isinstance(nested, list):
            for item in nested:
                strip_extensions(item)
        elif nested is not None:
            strip_extensions(nested)
    return value


def to_dict(value: Any) -> Any:
    """A decoded value as plain dicts and lists (for logs, JSON and test diffs)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: to_dict(getattr(value, f.name)) for f in dataclasses.fields(value)}
        out.pop(PRESENT_TAGS, None)
        if not out.get(UNKNOWN_TAGGED):
            out.pop(UNKNOWN_TAGGED, None)
        return out
    if isinstance(value, list):
        return [to_dict(v) for v in value]
    if isinstance(value, memoryview):
        return bytes(value)
    return value
