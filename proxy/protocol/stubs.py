"""Typed descriptions of the message classes, and the schema facts the code names.

The message classes are made at run time from the definitions (``values.py``), so a type
checker cannot see their fields. This module writes, from the same definitions, what it
needs instead, and the version numbers the hand-written code relies on:

* ``message_types.pyi``: one class per message (requests, responses, headers, data
  structures), its structs nested in it by Kafka struct name as at run time
  (``FetchRequest.FetchTopic``), each field with its Python type (``int``, ``str``,
  ``list[...]``, ``... | None`` when some version may carry null or the field defaults
  to null) and, in a comment, the versions it exists in, is tagged in or may be null in.
  ``message_types.py`` hands out the run-time classes under those names;
* ``message_versions.py``: per API the first flexible version (``FETCH_FIRST_FLEXIBLE``),
  and the versions where the fields the proxy branches on appear or end
  (``FETCH_FIRST_TOPIC_ID``), from ``NOTABLE_FIELDS`` below.

Both are committed; ``make stubs`` (``python -m proxy.protocol.stubs``) rewrites them after
a schema change, and ``tests/unit/test_message_types.py`` fails while they are stale.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from proxy.protocol.api_keys import ApiKey
from proxy.protocol.schema import FieldDef, MessageDef, Registry, SchemaError, Versions, registry
from proxy.protocol.values import ALIASES, PRESENT_TAGS, UNKNOWN_TAGGED

HERE = Path(__file__).resolve().parent
STUB_PATH = HERE / "message_types.pyi"
VERSIONS_PATH = HERE / "message_versions.py"

_PYTHON_TYPES = {
    "bool": "bool",
    "int8": "int",
    "int16": "int",
    "uint16": "int",
    "int32": "int",
    "uint32": "int",
    "int64": "int",
    "float64": "float",
    "string": "str",
    "bytes": "bytes",
    "records": "Records",
    "uuid": "uuid.UUID",
}


@dataclass(frozen=True)
class Notable:
    """A field whose first (or last) version the code branches on: ``constant`` is the
    name in ``message_versions``; ``path`` the field's Kafka names from the message root."""

    constant: str
    message: str
    path: str
    edge: str = "first"  # "first": the first version with the field; "last": the last one


# The versions the proxy's code branches on, by the field that makes the difference.
NOTABLE_FIELDS: tuple[Notable, ...] = (
    Notable("PRODUCE_FIRST_TRANSACTIONAL_ID", "ProduceRequest", "TransactionalId"),
    Notable("PRODUCE_FIRST_TOPIC_ID", "ProduceRequest", "TopicData.TopicId"),
    Notable("PRODUCE_FIRST_NODE_ENDPOINTS", "ProduceResponse", "NodeEndpoints"),
    Notable("FETCH_FIRST_ISOLATION_LEVEL", "FetchRequest", "IsolationLevel"),
    Notable("FETCH_FIRST_SESSION_ID", "FetchRequest", "SessionId"),
    Notable("FETCH_LAST_REPLICA_ID", "FetchRequest", "ReplicaId", "last"),
    Notable("FETCH_FIRST_TOPIC_ID", "FetchRequest", "Topics.TopicId"),
    Notable("FETCH_FIRST_NODE_ENDPOINTS", "FetchResponse", "NodeEndpoints"),
    Notable("METADATA_FIRST_ALLOW_AUTO_TOPIC_CREATION", "MetadataRequest", "AllowAutoTopicCreation"),
    Notable("METADATA_FIRST_TOPIC_ID", "MetadataResponse", "Topics.TopicId"),
    Notable("OFFSET_COMMIT_FIRST_TOPIC_ID", "OffsetCommitRequest", "Topics.TopicId"),
    Notable("OFFSET_FETCH_FIRST_GROUPS", "OffsetFetchRequest", "Groups"),
    Notable("API_VERSIONS_FIRST_SUPPORTED_FEATURES", "ApiVersionsResponse", "SupportedFeatures"),
)


# --------------------------------------------------------------------------- field facts


def _within(versions: Versions, parent: Versions) -> Versions:
    return versions.intersect(parent)


def may_be_null(f: FieldDef, versions: Versions) -> bool:
    """Whether a decoded or default value of ``f`` can be None: a null-default field, a
    record set (always nullable on the wire), or one nullable in a version it exists in."""
    if f.default == "null" or f.type == "records":
        return True
    return not f.nullable_versions.intersect(versions).empty


def python_type(f: FieldDef, root: str, versions: Versions) -> str:
    """The annotation of field ``f`` of a class nested in (or being) message ``root``."""
    if f.fields is not None:
        element = f"{root}.{f.element_type}"
    else:
        element = _PYTHON_TYPES[f.element_type]
    annotation = f"list[{element}]" if f.is_array else element
    return f"{annotation} | None" if may_be_null(f, versions) else annotation


def _describe(f: FieldDef, versions: Versions) -> str:
    """``v13+; tagged v12+ (tag 1); nullable v12+; ours``: where the field exists."""
    parts = [f"v{versions}" if not versions.empty else "no version"]
    tagged = f.tagged_versions.intersect(versions)
    if not tagged.empty:
        parts.append(f"tagged v{tagged} (tag {f.tag})")
    nullable = f.nullable_versions.intersect(versions)
    if not nullable.empty:
        parts.append(f"nullable v{nullable}")
    if f.ours:
        parts.append("ours")
    return "; ".join(parts)


# --------------------------------------------------------------------------- the stub


_STUB_HEAD = '''\
# Generated by `python -m proxy.protocol.stubs` from Kafka's message definitions and
# protocol_schemas/; do not edit (tests/unit/test_message_types.py keeps it current).
"""The classes of decoded messages, for the type checker (run time: ``message_types.py``).

One class per message and, nested in it, one per struct, as ``values.py`` makes them. A
class covers every version of its message: a field the decoded version lacks holds its
default. The comment after a field gives the versions it exists in, is tagged in (with
its tag) and may be null in; ``ours`` marks our tag-10000 extensions.
"""

import uuid
from dataclasses import dataclass

# A record set: a view of the frame when decoded; any bytes-like value to encode.
Records = bytes | bytearray | memoryview
'''


class _StubWriter:
    def __init__(self, message: MessageDef) -> None:
        self.message = message
        self.lines: list[str] = []

    def write(self) -> list[str]:
        m = self.message
        kind = m.kind if m.api_key is None else f"{m.kind} of API key {m.api_key} ({ApiKey(m.api_key).name})"
        flexible = "none" if m.flexible_versions.empty else f"{m.flexible_versions}"
        doc = f"{m.name}: {kind}; versions {m.valid_versions}, flexible {flexible}."
        self._class(m.name, m.fields, m.valid_versions, doc, indent="")
        return self.lines

    def _class(self, name: str, fields: tuple[FieldDef, ...], versions: Versions, doc: str, indent: str) -> None:
        root = self.message.name
        out = self.lines
        out.append(f"{indent}@dataclass(kw_only=True, slots=True)")
        out.append(f"{indent}class {name}:")
        inner = indent + "    "
        out.append(f'{inner}"""{doc}"""')
        out.append("")
        for f in fields:
            present = _within(f.versions, versions)
            out.append(f"{inner}{f.attr}: {python_type(f, root, present)} = ...  # {_describe(f, present)}")
        out.append(f"{inner}{UNKNOWN_TAGGED}: tuple[tuple[int, bytes], ...] = ...  # tagged fields this schema does not know")
        out.append(f"{inner}{PRESENT_TAGS}: frozenset[int] = ...  # known tags that were on the wire")
        for alias, target in (ALIASES.get(name, {}) if indent == "" else {}).items():
            out.append(f"{inner}@property")
            out.append(f"{inner}def {alias}(self) -> int: ...  # {target}")
        if indent == "":
            for struct_name, struct_fields, struct_versions, field_name in self._structs():
                out.append("")
                struct_doc = f"{root}.{struct_name}: the value of {field_name} (v{struct_versions})."
                self._class(struct_name, struct_fields, struct_versions, struct_doc, inner)

    def _structs(self) -> list[tuple[str, tuple[FieldDef, ...], Versions, str]]:
        """Every struct of the message once, in the order ``values.MessageClasses`` makes
        them (depth first), with the versions of its first use."""
        found: dict[str, tuple[str, tuple[FieldDef, ...], Versions, str]] = {}

        def visit(fields: tuple[FieldDef, ...], versions: Versions) -> None:
            for f in fields:
                if f.fields is None:
                    continue
                present = _within(f.versions, versions)
                if f.element_type not in found:
                    visit(f.fields, present)
                    found[f.element_type] = (f.element_type, f.fields, present, f.name)

        visit(self.message.fields, self.message.valid_versions)
        return list(found.values())


def render_stub(reg: Registry) -> str:
    """The text of ``message_types.pyi`` for the definitions of ``reg``."""
    out = [_STUB_HEAD]
    for name in sorted(reg.by_name):
        out.append("")
        out.extend(_StubWriter(reg.by_name[name]).write())
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- versions


_VERSIONS_HEAD = '''\
# Generated by `python -m proxy.protocol.stubs` from Kafka's message definitions and
# protocol_schemas/; do not edit (tests/unit/test_message_types.py keeps it current).
"""Schema facts by name: the first flexible version of each API our definitions know
(requests and responses agree), and the versions where the fields the proxy branches on
appear (``FIRST``) or end (``LAST``), from ``stubs.NOTABLE_FIELDS``."""
'''


def _api_constant(api_key: int) -> str:
    return ApiKey(api_key).name


def find_field(message: MessageDef, path: str) -> tuple[FieldDef, Versions]:
    """The field at ``path`` (Kafka names joined by dots) and the versions it exists in."""
    fields = message.fields
    versions = message.valid_versions
    found: FieldDef | None = None
    for name in path.split("."):
        match = [f for f in fields or () if f.name == name]
        if len(match) != 1:
            raise SchemaError(f"{message.name} has no field {path}")
        found = match[0]
        versions = versions.intersect(found.versions)
        fields = found.fields or ()
    assert found is not None
    return found, versions


def first_flexible(reg: Registry) -> dict[int, int | None]:
    """API key -> first flexible version (None: never flexible), checked to agree between
    request and response."""
    table: dict[int, int | None] = {}
    for api_key in reg.api_keys():
        request = reg.by_api[(api_key, "request")].flexible_versions
        response = reg.by_api[(api_key, "response")].flexible_versions
        if request != response:
            raise SchemaError(f"API key {api_key}: request flexible {request}, response {response}")
        table[api_key] = None if request.empty else request.lo
    return table


def notable_versions(reg: Registry) -> dict[str, int]:
    out: dict[str, int] = {}
    for notable in NOTABLE_FIELDS:
        _, versions = find_field(reg.by_name[notable.message], notable.path)
        if versions.empty:
            raise SchemaError(f"{notable.message}.{notable.path} exists in no version")
        out[notable.constant] = versions.lo if notable.edge == "first" else versions.hi
    return out


def render_versions(reg: Registry) -> str:
    """The text of ``message_versions.py`` for the definitions of ``reg``."""
    out = [_VERSIONS_HEAD]
    flexible = first_flexible(reg)
    out.append("# -- the first flexible version (compact encodings, tagged fields) of each API")
    for api_key, version in flexible.items():
        name = _api_constant(api_key)
        out.append(f"{name}_FIRST_FLEXIBLE: int | None = None  # never flexible"
                   if version is None else f"{name}_FIRST_FLEXIBLE = {version}")
    out.append("")
    out.append("# -- where the fields the proxy branches on appear or end")
    values = notable_versions(reg)
    for notable in NOTABLE_FIELDS:
        out.append(f"{notable.constant} = {values[notable.constant]}  # {notable.message} {notable.path}")
    out.append("")
    out.append("# API key -> its first flexible version, for every API above")
    out.append("FIRST_FLEXIBLE: dict[int, int | None] = {")
    for api_key, version in flexible.items():
        out.append(f"    {api_key}: {version},  # {_api_constant(api_key)}")
    out.append("}")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- command line


def outputs() -> dict[Path, str]:
    """Every generated file and the text it should hold."""
    reg = registry("ours")
    return {STUB_PATH: render_stub(reg), VERSIONS_PATH: render_versions(reg)}


def stale() -> list[Path]:
    """The generated files whose text differs from what the definitions give."""
    return [path for path, text in outputs().items() if not path.exists() or path.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proxy.protocol.stubs", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only report stale files (exit 1), write nothing")
    args = parser.parse_args(argv)
    if args.check:
        old = stale()
        for path in old:
            print(f"{path} is stale: run python -m proxy.protocol.stubs", file=sys.stderr)
        return 1 if old else 0
    for path, text in outputs().items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
