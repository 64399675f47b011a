"""What a hand-written partial reader assumes of a message's layout, stated as data.

Some frames are read without the codecs, for speed: a peek at one field, a walk over a
Fetch response to its last tagged fields, a range commit read in place. Each such reader
declares, next to its code, the fields it steps over as a ``Walk``: the message, the
struct (a path of Kafka field names from the message), the versions, and the untagged
fields of that struct in wire order, each with the encoding the reader assumes. The
reader derives its byte counts from the walk (``walk.size(...)``), and
``tests/unit/test_partial_readers.py`` checks every walk against the message
definitions, version by version, so a reader and the schema cannot drift apart.

An encoding is Kafka's type (``int32``, ``uuid``, ``string``, ``records``,
``[]FetchTopic``, ``EpochEndOffset``), preceded by ``compact`` for a length or count
written as an unsigned varint (flexible versions) and by ``nullable`` when null may be
sent: ``"GroupInstanceId compact nullable string"``.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.protocol.schema import FieldDef, MessageDef, registry

FIXED_SIZES = {"bool": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8,
               "float64": 8, "uuid": 16}


@dataclass(frozen=True)
class Walk:
    """The untagged fields of one struct a reader reads or steps over, in wire order, in
    versions ``first`` to ``last`` (None: every later version). ``prefix``: the reader
    stops after these fields, so the struct may go on."""

    message: str
    path: str  # "" for the message itself, else Kafka field names: "Responses.Partitions"
    first: int
    last: int | None
    fields: tuple[str, ...]  # "Name encoding"
    prefix: bool = False

    def size(self, *names: str) -> int:
        """The bytes of the named fixed-size fields together (all of them: ``size()``)."""
        sizes = {}
        for spec in self.fields:
            name, encoding = spec.split(" ", 1)
            sizes[name] = FIXED_SIZES.get(encoding)
        total = 0
        for name in names or tuple(sizes):
            size = sizes.get(name)
            if size is None:
                raise ValueError(f"{self.message} {self.path}: {name} is not a fixed-size field of this walk")
            total += size
        return total

    def mismatches(self) -> list[str]:
        """How the definitions differ from this walk, one line per version that differs."""
        message = registry().by_name.get(self.message)
        if message is None:
            return [f"no message {self.message}"]
        try:
            fields = _struct_fields(message, self.path)
        except KeyError as exc:
            return [f"{self.message} has no struct {exc.args[0]}"]
        valid = message.valid_versions
        last = valid.hi if self.last is None else self.last
        if self.first not in valid or last not in valid or last < self.first:
            return [f"{self.message} v{self.first}-{last} is outside its versions {valid}"]
        problems = []
        for version in range(self.first, last + 1):
            flexible = message.is_flexible(version)
            actual = tuple(wire_form(f, version, flexible) for f in fields
                           if version in f.versions and not (flexible and version in f.tagged_versions))
            if self.prefix:
                actual = actual[:len(self.fields)]
            if actual != self.fields:
                problems.append(f"{self.message} {self.path or '(message)'} v{version}: the schema has {list(actual)}")
        return problems


def _struct_fields(message: MessageDef, path: str) -> tuple[FieldDef, ...]:
    fields = message.fields
    for name in path.split(".") if path else ():
        match = [f for f in fields if f.name == name and f.fields is not None]
        if not match:
            raise KeyError(path)
        fields = match[0].fields or ()
    return fields


def wire_form(f: FieldDef, version: int, flexible: bool) -> str:
    """``"Name encoding"`` of field ``f`` as version ``version`` writes it."""
    if f.type in FIXED_SIZES:
        return f"{f.name} {f.type}"
    nullable = version in f.nullable_versions or f.type == "records"
    words = []
    if not f.is_struct or f.is_array:  # a length or count precedes it
        if flexible and (f.flexible_versions is None or version in f.flexible_versions):
            words.append("compact")
    if nullable:
        words.append("nullable")
    words.append(f.type)
    return f"{f.name} {' '.join(words)}"
