"""Kafka message definitions: Apache Kafka's JSON files plus our overlays.

Apache Kafka describes every request, response, header and "data" structure in JSON files
(with ``//`` comments). kafka-python ships those files as package data, so we read them
from there instead of re-typing them (docs/wire-contract.md#7-message-definitions). Our own additions live in the
top-level ``protocol_schemas`` package (see ``protocol_schemas/README.md``):

* a file with ``"extends": "<MessageName>"`` adds fields (tag-10000 tagged fields) at
  nested paths of a standard message;
* any other file is a complete message definition (ShareFetch, ShareAcknowledge, the
  individual-commit log key and value).

Two views are built: ``"ours"`` (standard + complete definitions + extensions) is what the
proxy decodes with; ``"standard"`` (standard + complete definitions, no extensions) is what
a stock Kafka peer sees, used to check that our extensions are skippable.

This module only parses and validates; ``compiler.py`` turns a definition into a codec.
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
import importlib.util
import json
import re
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Literal

KAFKA_SCHEMA_PACKAGE = "kafka.protocol.schemas.resources"
OVERLAY_PACKAGE = "protocol_schemas"

View = Literal["ours", "standard"]
VIEWS: tuple[View, ...] = ("ours", "standard")

MAX_VERSION = 0x7FFF  # versions are int16 on the wire; "N+" is open-ended up to here

PRIMITIVE_TYPES = frozenset(
    {
        "bool",
        "int8",
        "int16",
        "uint16",
        "int32",
        "uint32",
        "int64",
        "float64",
        "string",
        "bytes",
        "records",
        "uuid",
    }
)


class SchemaError(Exception):
    """A message definition or overlay that cannot be loaded or merged.

    This is a bug in a JSON file (ours, or an incompatible package bump), never a
    runtime input problem, so it is deliberately not a ``ProtocolError``.
    """


# --------------------------------------------------------------------------- versions


@dataclass(frozen=True, slots=True)
class Versions:
    """An inclusive version range; empty when ``lo > hi`` ("none")."""

    lo: int
    hi: int

    @classmethod
    def parse(cls, text: Any) -> Versions:
        """Parse Kafka's version syntax: ``"3"``, ``"1-4"``, ``"2+"`` or ``"none"``."""
        if isinstance(text, int):
            return cls(text, text)
        if not isinstance(text, str):
            raise SchemaError(f"bad version range {text!r}")
        text = text.strip()
        if text == "none":
            return NONE
        try:
            if text.endswith("+"):
                return cls(int(text[:-1]), MAX_VERSION)
            if "-" in text:
                lo, hi = text.split("-", 1)
                return cls(int(lo), int(hi))
            return cls(int(text), int(text))
        except ValueError:
            raise SchemaError(f"bad version range {text!r}") from None

    def __contains__(self, version: int) -> bool:
        return self.lo <= version <= self.hi

    @property
    def empty(self) -> bool:
        return self.lo > self.hi

    def intersect(self, other: Versions) -> Versions:
        return Versions(max(self.lo, other.lo), min(self.hi, other.hi))

    def issubset(self, other: Versions) -> bool:
        return self.empty or (other.lo <= self.lo and self.hi <= other.hi)

    def __str__(self) -> str:
        if self.empty:
            return "none"
        if self.hi == MAX_VERSION:
            return f"{self.lo}+"
        if self.lo == self.hi:
            return str(self.lo)
        return f"{self.lo}-{self.hi}"


NONE = Versions(1, 0)


# --------------------------------------------------------------------------- model


def snake_case(name: str) -> str:
    """Kafka's CamelCase field name as a Python attribute: ``TopicId`` -> ``topic_id``.

    A boundary is inserted before an upper-case letter that follows a lower-case letter
    or digit, and before the last capital of an acronym run (``IsKRaftX`` -> ``is_k_raft_x``).
    """
    s = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)
    s = re.sub(r"(?<=[A-Z])(?=[A-Z][a-z])", "_", s)
    return s.lower()


@dataclass(frozen=True, slots=True)
class FieldDef:
    """One field of a message or struct, as the JSON states it (versions unresolved)."""

    name: str
    attr: str  # snake_case Python attribute name
    type: str  # as written: "int32", "[]string", "[]FetchTopic", "Cursor"
    versions: Versions
    nullable_versions: Versions
    tagged_versions: Versions
    tag: int | None
    default: Any  # the raw JSON default, None when absent
    fields: tuple[FieldDef, ...] | None  # struct fields (array-of-struct or struct)
    flexible_versions: Versions | None  # field-level override (RequestHeader.ClientId)
    ours: bool  # added by one of our overlays

    @property
    def is_array(self) -> bool:
        return self.type.startswith("[]")

    @property
    def element_type(self) -> str:
        """The type without the array marker."""
        return self.type[2:] if self.is_array else self.type

    @property
    def is_struct(self) -> bool:
        """True for a struct or an array of structs."""
        return self.element_type not in PRIMITIVE_TYPES

    @property
    def struct_name(self) -> str | None:
        return self.element_type if self.is_struct else None


@dataclass(frozen=True, slots=True)
class MessageDef:
    """A whole message (request, response, header or data structure)."""

    name: str
    kind: str  # "request" | "response" | "header" | "data"
    api_key: int | None
    valid_versions: Versions
    flexible_versions: Versions
    fields: tuple[FieldDef, ...]
    latest_version_unstable: bool
    origin: str  # "kafka", "ours" or "kafka+ours" (extended by an overlay)

    def is_flexible(self, version: int) -> bool:
        return version in self.flexible_versions


# --------------------------------------------------------------------------- JSON input


_STRING_OR_COMMENT = re.compile(r'"(?:\\.|[^"\\])*"|//[^\n]*')


def strip_json_comments(text: str) -> str:
    """Remove ``//`` line comments, leaving ``//`` inside string literals alone.

    Kafka's files only use line comments. A comment is replaced by nothing up to the
    newline, so line numbers in ``json`` error messages stay correct. One regular
    expression walks strings and comments together, so a ``//`` inside a string is seen
    as part of the string (every process that decodes messages parses ~120 files).
    """
    return _STRING_OR_COMMENT.sub(lambda m: "" if m.group().startswith("//") else m.group(), text)


def parse_json_with_comments(text: str, source: str) -> dict:
    try:
        data = json.loads(strip_json_comments(text))
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{source}: {exc}") from None
    if not isinstance(data, dict):
        raise SchemaError(f"{source}: top level is not an object")
    return data


def _package_directory(package: str) -> Traversable:
    """The folder of ``package``, found without running any ``__init__`` on the way.

    ``importlib.resources.files("kafka.protocol...")`` would import kafka-python's whole
    client (a quarter of a second) only to locate data files; a process that just decodes
    messages, such as a Spark worker starting a read, should not pay for it. A package
    that is not a plain folder (a zip) falls back to ``importlib.resources``."""
    top, _, rest = package.partition(".")
    spec = importlib.util.find_spec(top)
    locations = list(spec.submodule_search_locations or ()) if spec else []
    for location in locations:
        folder = Path(location, *rest.split("."))
        if folder.is_dir():
            return folder
    return importlib.resources.files(package)


def _read_package_json(package: str) -> dict[str, dict]:
    """Every ``*.json`` resource of ``package``, parsed, keyed by file name."""
    out: dict[str, dict] = {}
    root = _package_directory(package)
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json") and entry.is_file():
            out[entry.name] = parse_json_with_comments(
                entry.read_text(encoding="utf-8"), f"{package}/{entry.name}"
            )
    return out


@functools.cache
def kafka_json() -> dict[str, dict]:
    """Apache Kafka's definitions from kafka-python, keyed by message name."""
    return {d["name"]: d for d in _read_package_json(KAFKA_SCHEMA_PACKAGE).values()}


@functools.cache
def overlay_json() -> dict[str, dict]:
    """Our overlay files, keyed by file name."""
    return _read_package_json(OVERLAY_PACKAGE)


# --------------------------------------------------------------------------- merging


def _find_struct_field(fields: list[dict], path: list[str], source: str) -> list[dict]:
    """The ``fields`` list of the struct reached by following field names in ``path``."""
    current = fields
    walked: list[str] = []
    for name in path:
        walked.append(name)
        match = [f for f in current if f.get("name") == name]
        if len(match) != 1:
            raise SchemaError(f"{source}: no single field {'.'.join(walked)!r} to extend")
        if "fields" not in match[0]:
            raise SchemaError(f"{source}: {'.'.join(walked)!r} is not a struct")
        current = match[0]["fields"]
    return current


def _apply_extension(base: dict, overlay: dict, source: str) -> dict:
    """A copy of ``base`` with the overlay's common structs and fields merged in."""
    merged = copy.deepcopy(base)
    existing_common = {s["name"] for s in merged.get("commonStructs", [])}
    for struct in overlay.get("commonStructs", []):
        if struct["name"] in existing_common:
            raise SchemaError(f"{source}: common struct {struct['name']!r} already exists")
        merged.setdefault("commonStructs", []).append(copy.deepcopy(struct))
    additions = overlay.get("addFields")
    if not isinstance(additions, list) or not additions:
        raise SchemaError(f"{source}: an extension needs a non-empty addFields list")
    for addition in additions:
        path = addition.get("path", [])
        new_fields = addition.get("fields")
        if not isinstance(path, list) or not isinstance(new_fields, list) or not new_fields:
            raise SchemaError(f"{source}: each addFields entry needs a path list and fields")
        target = _find_struct_field(merged["fields"], path, source)
        names = {f["name"] for f in target}
        for field in new_fields:
            if field.get("ours") is not True:
                raise SchemaError(f"{source}: added field {field.get('name')!r} lacks ours: true")
            if field["name"] in names:
                raise SchemaError(f"{source}: field {field['name']!r} already exists at {path}")
            target.append(copy.deepcopy(field))
            names.add(field["name"])
    return merged


def merged_json(view: View) -> dict[str, tuple[dict, str]]:
    """Raw JSON and origin of every message in ``view``, keyed by message name."""
    messages = dict(kafka_json())
    origins = {name: "kafka" for name in messages}
    extensions: list[tuple[str, dict]] = []
    for filename, data in overlay_json().items():
        if "extends" in data:
            extensions.append((filename, data))
            continue
        name = data.get("name")
        if not name:
            raise SchemaError(f"{OVERLAY_PACKAGE}/{filename}: complete definition without a name")
        if name in messages:
            raise SchemaError(
                f"{OVERLAY_PACKAGE}/{filename}: {name} now ships with kafka-python; "
                "delete our copy"
            )
        messages[name] = data
        origins[name] = "ours"
    if view == "ours":
        for filename, data in extensions:
            target = data["extends"]
            if target not in messages:
                raise SchemaError(f"{OVERLAY_PACKAGE}/{filename}: extends unknown {target!r}")
            messages[target] = _apply_extension(
                messages[target], data, f"{OVERLAY_PACKAGE}/{filename}"
            )
            origins[target] = "kafka+ours"
    return {name: (data, origins[name]) for name, data in messages.items()}


# --------------------------------------------------------------------------- model building


def _build_fields(
    raw_fields: list[dict],
    common: dict[str, list[dict]],
    source: str,
    defined_structs: dict[str, tuple],
) -> tuple[FieldDef, ...]:
    out: list[FieldDef] = []
    seen_names: set[str] = set()
    for raw in raw_fields:
        name = raw["name"]
        if name in seen_names:
            raise SchemaError(f"{source}: duplicate field {name!r}")
        seen_names.add(name)
        type_ = raw["type"]
        element = type_.removeprefix("[]")
        sub: tuple[FieldDef, ...] | None = None
        if element not in PRIMITIVE_TYPES:
            raw_sub = raw.get("fields")
            if raw_sub is None:
                if element not in common:
                    raise SchemaError(f"{source}: struct type {element!r} has no fields")
                raw_sub = common[element]
            sub = _build_fields(raw_sub, common, f"{source}.{name}", defined_structs)
            shape = tuple((f.name, f.type) for f in sub)
            previous = defined_structs.setdefault(element, shape)
            if previous != shape:
                raise SchemaError(f"{source}: struct {element!r} defined twice differently")
        tag = raw.get("tag")
        tagged = Versions.parse(raw["taggedVersions"]) if "taggedVersions" in raw else NONE
        if (tag is None) != tagged.empty:
            raise SchemaError(f"{source}.{name}: tag and taggedVersions go together")
        flexible = raw.get("flexibleVersions")
        out.append(
            FieldDef(
                name=name,
                attr=snake_case(name),
                type=type_,
                versions=Versions.parse(raw["versions"]),
                nullable_versions=Versions.parse(raw.get("nullableVersions", "none")),
                tagged_versions=tagged,
                tag=tag,
                default=raw.get("default"),
                fields=sub,
                flexible_versions=None if flexible is None else Versions.parse(flexible),
                ours=bool(raw.get("ours", False)),
            )
        )
    attrs = [f.attr for f in out]
    if len(set(attrs)) != len(attrs):
        raise SchemaError(f"{source}: two fields map to the same attribute name")
    return tuple(out)


def _validate_tags(
    fields: tuple[FieldDef, ...],
    parent_versions: Versions,
    flexible: Versions,
    source: str,
) -> None:
    # parent_versions starts as the message's valid versions, so open ranges ("12+")
    # are compared within what the message can actually carry.
    """Tagged fields only in flexible versions their parent exists in; unique tags."""
    tags_seen: dict[int, str] = {}
    for f in fields:
        if f.tag is not None:
            if f.tag in tags_seen:
                raise SchemaError(f"{source}: tag {f.tag} used by {tags_seen[f.tag]} and {f.name}")
            tags_seen[f.tag] = f.name
            allowed = flexible.intersect(parent_versions).intersect(f.versions)
            if not f.tagged_versions.intersect(parent_versions).issubset(allowed):
                raise SchemaError(
                    f"{source}.{f.name}: taggedVersions {f.tagged_versions} outside the "
                    f"flexible versions {allowed} where the field exists"
                )
        if f.ours and f.tag is None:
            raise SchemaError(f"{source}.{f.name}: our added fields must be tagged")
        if f.fields is not None:
            _validate_tags(f.fields, parent_versions.intersect(f.versions), flexible, f"{source}.{f.name}")


def build_message(data: dict, origin: str = "kafka") -> MessageDef:
    name = data["name"]
    kind = data["type"]
    if kind not in ("request", "response", "header", "data"):
        raise SchemaError(f"{name}: unknown message type {kind!r}")
    common = {s["name"]: s["fields"] for s in data.get("commonStructs", [])}
    fields = _build_fields(data["fields"], common, name, {})
    valid = Versions.parse(data["validVersions"])
    flexible = Versions.parse(data.get("flexibleVersions", "none"))
    _validate_tags(fields, valid, flexible, name)
    api_key = data.get("apiKey")
    if kind in ("request", "response") and not isinstance(api_key, int):
        raise SchemaError(f"{name}: requests and responses need an integer apiKey")
    return MessageDef(
        name=name,
        kind=kind,
        api_key=api_key,
        valid_versions=valid,
        flexible_versions=flexible,
        fields=fields,
        latest_version_unstable=bool(data.get("latestVersionUnstable", False)),
        origin=origin,
    )


# --------------------------------------------------------------------------- registry


class Registry:
    """All message definitions of one view, by name and by (api key, kind)."""

    def __init__(self, view: View, messages: dict[str, MessageDef]) -> None:
        self.view = view
        self.by_name = messages
        self.by_api: dict[tuple[int, str], MessageDef] = {}
        for msg in messages.values():
            if msg.kind in ("request", "response"):
                if msg.api_key is None:
                    raise SchemaError(f"{msg.kind} {msg.name} has no apiKey")
                key = (msg.api_key, msg.kind)
                if key in self.by_api:
                    raise SchemaError(f"two {msg.kind}s for api key {msg.api_key}")
                self.by_api[key] = msg

    def message(self, api_key: int, kind: str) -> MessageDef | None:
        return self.by_api.get((api_key, kind))

    def api_keys(self) -> list[int]:
        """API keys that have both a request and a response definition."""
        return sorted(
            k for (k, kind) in self.by_api if kind == "request" and (k, "response") in self.by_api
        )


@functools.cache
def registry(view: View = "ours") -> Registry:
    """The merged definitions of ``view``, loaded once per process."""
    if view not in VIEWS:
        raise ValueError(f"unknown schema view {view!r}")
    merged = merged_json(view)
    return Registry(view, {name: build_message(d, origin) for name, (d, origin) in merged.items()})
