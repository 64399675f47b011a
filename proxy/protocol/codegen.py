"""Python source generation for a codec tree (construct's compile machinery).

``compile_tree(tree)`` is the entry point: it turns the ``codec_tree`` of one message
version into straight-line Python functions. ``Generator`` writes, into construct's
``CodeGen``, one parse and one build function per struct. The functions work on
``(buf, pos, end)`` and a ``bytearray``; fixed-size fields are unpacked in runs with one
``struct`` call, primitive readers and writers are called by name, and the generated
dataclass is built with positional arguments. Construct's ``Construct.compile`` then
``exec``s the module. This module reads the tree; the tree never refers back to it.
"""

from __future__ import annotations

import dataclasses
import itertools
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from construct import Construct
from construct.core import CodeGen

from proxy.protocol import primitives as prim
from proxy.protocol.codec_tree import (
    ArrayCodec,
    Member,
    NullableStructCodec,
    StructCodec,
)
from proxy.protocol.primitives import Bool, Fixed, KafkaConstruct, Uuid, Varlen

# Objects the generated modules refer to by number (classes, struct formats, codecs).
# Generated code binds them to module globals once, at exec time.
LINKED: dict[int, Any] = {}
_link_ids = itertools.count(1)


_HELPERS = (
    "read_uvarint",
    "write_uvarint",
    "read_array_count",
    "read_nullable_struct_marker",
    "fail",
    "short",
    "EMPTY_FROZENSET",
    "INT32",
)


class Generator:
    """Emits the Python source of struct parse/build functions into a construct CodeGen."""

    def __init__(self, code: CodeGen) -> None:
        self.code = code
        self.struct_names: dict[int, tuple[str, str]] = {}
        prelude = [
            "from proxy.protocol import primitives as k_prim",
            "from proxy.protocol.codegen import LINKED as k_linked",
            "from proxy.protocol.tagged import write_tag_entries as k_write_tags",
            "from proxy.protocol.tagged import read_tag_count as k_read_tag_count",
            "from proxy.protocol.tagged import read_tag_header as k_read_tag_header",
            "from proxy.protocol.tagged import tag_not_consumed as k_tag_not_consumed",
            "from struct import Struct as k_Struct",
            "from uuid import UUID as k_UUID",
        ]
        prelude += [f"k_{name} = k_prim.{name}" for name in _HELPERS]
        code.append("\n".join(prelude))

    @classmethod
    def of(cls, code: CodeGen) -> Generator:
        gen = getattr(code, "_kafka_generator", None)
        if gen is None:
            gen = cls(code)
            code._kafka_generator = gen
        return gen

    def fresh(self, prefix: str) -> str:
        return f"k_{prefix}_{self.code.allocateId()}"

    def link(self, obj: Any, prefix: str = "obj") -> str:
        """A module-global name bound to ``obj`` in the generated module."""
        link_id = next(_link_ids)
        LINKED[link_id] = obj
        name = f"k_{prefix}_{link_id}"
        self.code.append(f"{name} = k_linked[{link_id}]")
        return name

    def helper(self, name: str) -> str:
        """The generated-module name of a primitives.py function."""
        self.code.append(f"k_{name} = k_prim.{name}")
        return f"k_{name}"

    def literal(self, value: Any) -> str:
        """Source text producing ``value`` (a fresh object for mutable defaults)."""
        if value is None or isinstance(value, (bool, int, str, bytes)):
            return repr(value)
        if isinstance(value, float) and value == value and value not in (float("inf"), float("-inf")):
            return repr(value)
        if isinstance(value, list):
            if value:
                raise ValueError("non-empty list default")
            return "[]"
        if isinstance(value, uuid.UUID):
            return self.link(value, "uuid")
        if hasattr(value, "__dataclass_fields__"):
            return f"{self.link(type(value), 'cls')}()"
        return self.link(value, "const")

    # ----------------------------------------------------------- structs

    def struct_functions(self, codec: StructCodec) -> tuple[str, str]:
        names = self.struct_names.get(id(codec))
        if names is None:
            names = (self.fresh("parse"), self.fresh("build"))
            self.struct_names[id(codec)] = names
            self._emit_parse(codec, names[0])
            self._emit_build(codec, names[1])
        return names

    def _emit_parse(self, codec: StructCodec, fname: str) -> None:
        lines: list[str] = []
        var_of: dict[str, str] = {}
        members = codec.fixed_part
        i = 0
        while i < len(members):
            run = []
            while i < len(members) and members[i].codec.fixed_format is not None:
                run.append(members[i])
                i += 1
            if run:
                lines += self._parse_fixed_run(run, var_of)
                continue
            m = members[i]
            var = f"v_{m.attr}"
            var_of[m.attr] = var
            lines += self._parse_value(m.codec, var)
            i += 1
        extra_args = ""
        if codec.flexible:
            lines += self._parse_tagged(codec, var_of)
            extra_args = ", t__unknown, t__present"
        args = []
        class_fields = {f.name: f for f in dataclasses.fields(codec.cls)}
        for f, member in codec.all_members:
            if member is not None and member.attr in var_of:
                args.append(var_of[member.attr])
            else:
                args.append(self._default_expr(class_fields[f.attr]))
        cls_name = self.link(codec.cls, "cls")
        body = "\n".join("    " + line for line in lines) or "    pass"
        self.code.append(
            f"def {fname}(buf, pos, end):\n"
            f"    # {codec.label}\n"
            f"{body}\n"
            f"    return {cls_name}({', '.join(args)}{extra_args}), pos\n"
        )

    def _default_expr(self, dc_field) -> str:
        if dc_field.default_factory is not dataclasses.MISSING:
            factory = dc_field.default_factory
            return "[]" if factory is list else f"{self.link(factory, 'cls')}()"
        return self.literal(dc_field.default)

    def _parse_fixed_run(self, run: list[Member], var_of: dict[str, str]) -> list[str]:
        fmt = "".join(_fixed_format(m) for m in run)
        layout = struct.Struct(">" + fmt)
        st = self.link(layout, "st")
        names = []
        for m in run:
            var = f"v_{m.attr}"
            var_of[m.attr] = var
            names.append(var)
        lines = [
            f"if end - pos < {layout.size}: k_short(pos, {layout.size}, end)",
            f"{', '.join(names)}, = {st}.unpack_from(buf, pos)",
        ]
        offset = 0
        for m, var in zip(run, names):
            if isinstance(m.codec, Bool):
                lines.append(
                    f"if {var} > 1: k_fail('boolean byte ' + str({var}) + "
                    f"' is neither 0 nor 1', pos + {offset})"
                )
                lines.append(f"{var} = {var} == 1")
            elif isinstance(m.codec, Uuid):
                lines.append(f"{var} = k_UUID(bytes={var})")
            offset += struct.calcsize(">" + _fixed_format(m))
        lines.append(f"pos += {layout.size}")
        return lines

    def _parse_value(self, codec: KafkaConstruct, var: str) -> list[str]:
        """Statements that read one value of ``codec`` into ``var``, advancing ``pos``."""
        if isinstance(codec, Varlen):
            return [f"{var}, pos = {self.helper(codec.reader_name)}(buf, pos, end)"]
        if isinstance(codec, StructCodec):
            parse_name, _ = self.struct_functions(codec)
            return [f"{var}, pos = {parse_name}(buf, pos, end)"]
        if isinstance(codec, NullableStructCodec):
            parse_name, _ = self.struct_functions(codec.inner)
            return [
                f"{var}__present, pos = k_read_nullable_struct_marker(buf, pos, end)",
                f"if {var}__present: {var}, pos = {parse_name}(buf, pos, end)",
                f"else: {var} = None",
            ]
        if isinstance(codec, ArrayCodec):
            return self._parse_array(codec, var)
        return [f"{var}, pos = {self.link(codec, 'codec')}.read(buf, pos, end)"]

    def _parse_array(self, codec: ArrayCodec, var: str) -> list[str]:
        element = codec.element
        min_size = max(element.min_size, 1)
        count_call = (
            f"{var}__n, pos = k_read_array_count(buf, pos, end, {element.min_size}, "
            f"{codec.nullable}, {codec.compact})"
        )
        if codec.compact:
            # fast path: a one-byte count (under 127 elements, so far below
            # MAX_ARRAY_ELEMENTS) that fits what is left; any other count goes through
            # read_array_count, which refuses one above the limit before anything else
            lines = [
                f"if pos < end and 0 < ({var}__c := buf[pos]) < 0x80 "
                f"and ({var}__c - 1) * {min_size} < end - pos:",
                f"    {var}__n = {var}__c - 1",
                "    pos += 1",
                "else:",
                f"    {count_call}",
            ]
        else:
            lines = [count_call]
        if codec.nullable:
            lines.append(f"if {var}__n is None: {var} = None")
            lines.append("else:")
        else:
            lines.append("if True:")
        if isinstance(element, Fixed):
            fmt = element.fixed_format
            structs = prim.array_structs(fmt)
            linked = self.link(structs, "arrays")
            inner = [
                f"{var}__st = {linked}[{var}__n] if {var}__n < {len(structs)} "
                f"else k_Struct('>%d{fmt}' % {var}__n)",
                f"{var} = list({var}__st.unpack_from(buf, pos))",
                f"pos += {var}__n * {element.min_size}",
            ]
        else:
            if isinstance(element, Varlen):
                reader = self.helper(element.reader_name)
            elif isinstance(element, StructCodec):
                reader = self.struct_functions(element)[0]
            else:
                reader = f"{self.link(element, 'codec')}.read"
            inner = [
                f"{var} = []",
                f"{var}__append = {var}.append",
                f"for _ in range({var}__n):",
                f"    {var}__item, pos = {reader}(buf, pos, end)",
                f"    {var}__append({var}__item)",
            ]
        lines += ["    " + line for line in inner]
        return lines

    def _parse_tagged(self, codec: StructCodec, var_of: dict[str, str]) -> list[str]:
        """The tagged-fields section, inlined: a one-byte zero count is the fast path;
        otherwise the loop of ``tagged.read_tagged_section`` with a branch per known tag,
        after ``read_tag_count`` (which refuses a count above MAX_TAGGED_FIELDS)."""
        defaults = []
        for m in codec.tagged:
            var = f"v_{m.attr}"
            var_of[m.attr] = var
            defaults.append(f"{var} = {self.literal(m.default)}")
        lines = [
            "if pos < end and buf[pos] == 0:",
            "    pos += 1",
            "    t__unknown = ()",
            "    t__present = k_EMPTY_FROZENSET",
        ]
        lines += ["    " + line for line in defaults]
        lines += ["else:"]
        body = list(defaults)
        body += [
            "t__count, pos = k_read_tag_count(buf, pos, end)",
            "t__unknown = []",
            "t__present = set()",
            "t__tag = -1",
            "for _ in range(t__count):",
            "    t__tag, pos, t__end = k_read_tag_header(buf, pos, end, t__tag)",
        ]
        keyword = "if"
        for m in codec.tagged:
            reader = self._tag_reader(m)
            body += [
                f"    {keyword} t__tag == {m.tag}:",
                f"        v_{m.attr}, t__used = {reader}(buf, pos, t__end)",
                "        t__present.add(t__tag)",
            ]
            keyword = "elif"
        if codec.tagged:
            body += ["    else:"]
            indent = "        "
        else:
            indent = "    "
        body += [
            f"{indent}t__unknown.append((t__tag, bytes(buf[pos:t__end])))",
            f"{indent}t__used = t__end",
            "    if t__used != t__end: k_tag_not_consumed(t__tag, t__used, t__end)",
            "    pos = t__end",
            "t__present = frozenset(t__present) if t__present else k_EMPTY_FROZENSET",
            "t__unknown = tuple(t__unknown)",
        ]
        lines += ["    " + line for line in body]
        return lines

    def _tag_reader(self, m: Member) -> str:
        """A generated function reading one tagged field's value from its own bytes."""
        reader = self.fresh("tagread")
        body = "\n".join("    " + line for line in self._parse_value(m.codec, "value"))
        self.code.append(f"def {reader}(buf, pos, end):\n{body}\n    return value, pos\n")
        return reader

    # ----------------------------------------------------------- build

    def _emit_build(self, codec: StructCodec, fname: str) -> None:
        lines: list[str] = []
        members = codec.fixed_part
        i = 0
        while i < len(members):
            run = []
            while i < len(members) and members[i].codec.fixed_format is not None:
                run.append(members[i])
                i += 1
            if run:
                lines += self._build_fixed_run(run)
                continue
            m = members[i]
            lines += self._build_value(m.codec, f"obj.{m.attr}", f"w_{m.attr}")
            i += 1
        if codec.flexible:
            lines += self._build_tagged(codec)
        body = "\n".join("    " + line for line in lines) or "    pass"
        self.code.append(f"def {fname}(out, obj):\n    # {codec.label}\n{body}\n")

    def _build_fixed_run(self, run: list[Member]) -> list[str]:
        fmt = ""
        args = []
        for m in run:
            if isinstance(m.codec, Bool):
                fmt += "?"
                args.append(f"obj.{m.attr}")
            elif isinstance(m.codec, Uuid):
                fmt += "16s"
                args.append(f"obj.{m.attr}.bytes")
            else:
                fmt += _fixed_format(m)
                args.append(f"obj.{m.attr}")
        st = self.link(struct.Struct(">" + fmt), "st")
        return [f"out += {st}.pack({', '.join(args)})"]

    def _build_value(
        self, codec: KafkaConstruct, expr: str, var: str, out: str = "out"
    ) -> list[str]:
        """Statements that append ``expr`` encoded by ``codec`` to bytearray ``out``."""
        if isinstance(codec, Varlen):
            return [f"{self.helper(codec.writer_name)}({out}, {expr})"]
        if isinstance(codec, StructCodec):
            return [f"{self.struct_functions(codec)[1]}({out}, {expr})"]
        if isinstance(codec, NullableStructCodec):
            build_name = self.struct_functions(codec.inner)[1]
            return [
                f"{var} = {expr}",
                f"if {var} is None: {out}.append(255)",
                "else:",
                f"    {out}.append(1)",
                f"    {build_name}({out}, {var})",
            ]
        if isinstance(codec, ArrayCodec):
            return self._build_array(codec, expr, var, out)
        return [f"{self.link(codec, 'codec')}.write({out}, {expr})"]

    def _build_array(self, codec: ArrayCodec, expr: str, var: str, out: str) -> list[str]:
        lines = [f"{var} = {expr}"]
        if codec.compact:
            count = [
                f"{var}__n = len({var}) + 1",
                f"if {var}__n < 0x80: {out}.append({var}__n)",
                f"else: k_write_uvarint({out}, {var}__n)",
            ]
        else:
            count = [f"{out} += k_INT32.pack(len({var}))"]
        if codec.nullable:
            null = f"{out}.append(0)" if codec.compact else f"{out} += b'\\xff\\xff\\xff\\xff'"
            lines += [f"if {var} is None: {null}", "else:"]
        else:
            lines.append("if True:")
        inner = list(count)
        element = codec.element
        if isinstance(element, Fixed):
            fmt = element.fixed_format
            structs = prim.array_structs(fmt)
            linked = self.link(structs, "arrays")
            inner.append(
                f"{out} += ({linked}[len({var})] if len({var}) < {len(structs)} "
                f"else k_Struct('>%d{fmt}' % len({var}))).pack(*{var})"
            )
        else:
            item = f"{var}__item"
            if isinstance(element, Varlen):
                writer = f"{self.helper(element.writer_name)}({out}, {item})"
            elif isinstance(element, StructCodec):
                writer = f"{self.struct_functions(element)[1]}({out}, {item})"
            else:
                writer = f"{self.link(element, 'codec')}.write({out}, {item})"
            inner += [f"for {item} in {var}:", f"    {writer}"]
        lines += ["    " + line for line in inner]
        return lines

    def _build_tagged(self, codec: StructCodec) -> list[str]:
        if not codec.tagged:
            return [
                "t__unknown = obj._unknown_tagged",
                "if t__unknown: k_write_tags(out, list(t__unknown))",
                "else: out.append(0)",
            ]
        lines = ["t__entries = []", "t__present = obj._present_tags"]
        for m in codec.tagged:
            var = f"t_{m.attr}"
            default = self.link(m.default, "dflt")
            lines.append(f"{var} = obj.{m.attr}")
            if m.default is None:
                # None means "not sent": setting a nullable tagged field to None strips it,
                # even if it was on the wire (an explicit null is normalized away)
                lines.append(f"if {var} is not None:")
            else:
                lines.append(f"if {var} != {default} or {m.tag} in t__present:")
            lines.append(f"    {var}__out = bytearray()")
            body = self._build_value(m.codec, var, f"{var}__w", f"{var}__out")
            lines += ["    " + line for line in body]
            lines.append(f"    t__entries.append(({m.tag}, {var}__out))")
        lines.append("t__unknown = obj._unknown_tagged")
        lines.append("if t__unknown: t__entries.extend(t__unknown)")
        lines.append("k_write_tags(out, t__entries)")
        return lines



def _fixed_format(m: Member) -> str:
    """The struct format of a member the caller found fixed-size."""
    fmt = m.codec.fixed_format
    if fmt is None:
        raise TypeError(f"{m.attr} is not a fixed-size field")
    return fmt


# --------------------------------------------------------------------------- entry point


@dataclass(frozen=True)
class CompiledTree:
    """The generated functions of one message version.

    ``read(buf, pos, end) -> (value, pos)`` and ``write(out, value)`` are what codecs
    call; ``construct`` is construct's ``Compiled`` object (``parse``/``build`` on
    bytes, ``source`` for inspection).
    """

    read: Callable[[Any, int, int], tuple[Any, int]]
    write: Callable[[bytearray, Any], None]
    construct: Any


class _TreeRoot(Construct):  # construct ships no type hints: Construct is Any
    """Construct's compile hooks for a codec tree: the root struct's generated functions,
    wrapped in construct's stream calling convention (for ``parse``/``build`` on the
    compiled construct). The proxy itself calls the buffer-level functions directly."""

    def __init__(self, tree: StructCodec) -> None:
        super().__init__()
        self.tree = tree
        self.functions: tuple[str, str] | None = None  # (parse, build) names, once emitted

    def _parse(self, stream, context, path):
        return self.tree._parse(stream, context, path)

    def _build(self, obj, stream, context, path):
        return self.tree._build(obj, stream, context, path)

    def _emitted(self, code: CodeGen) -> tuple[Generator, tuple[str, str]]:
        gen = Generator.of(code)
        self.functions = gen.struct_functions(self.tree)
        return gen, self.functions

    def _emitparse(self, code):
        gen, (parse_name, _) = self._emitted(code)
        wrapper = gen.fresh("stream_parse")
        code.append(
            f"""
            def {wrapper}(io, this):
                data = io.read()
                view = memoryview(data)
                obj, used = {parse_name}(view, 0, len(view))
                if used != len(data):
                    io.seek(used - len(data), 1)
                return obj
            """
        )
        return f"{wrapper}(io, this)"

    def _emitbuild(self, code):
        gen, (_, build_name) = self._emitted(code)
        wrapper = gen.fresh("stream_build")
        code.append(
            f"""
            def {wrapper}(obj, io, this):
                out = bytearray()
                {build_name}(out, obj)
                io.write(out)
                return obj
            """
        )
        return f"{wrapper}(obj, io, this)"


def compile_tree(tree: StructCodec) -> CompiledTree:
    """Generate, exec and link the parse/build functions of ``tree`` (a message root)."""
    root = _TreeRoot(tree)
    compiled = root.compile()
    assert root.functions is not None
    parse_name, build_name = root.functions
    return CompiledTree(
        read=getattr(compiled.module, parse_name),
        write=getattr(compiled.module, build_name),
        construct=compiled,
    )
