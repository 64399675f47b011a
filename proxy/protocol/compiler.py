"""One message, one version, one codec: the step that joins the tree and its code.

``compile_message(view, name, version)`` builds the construct tree of that version
(``codec_tree``: ``StructCodec``, ``ArrayCodec``, ``NullableStructCodec`` and the
primitives of ``primitives.py``) and hands it to ``codegen.compile_tree``, which turns
each struct into one straight-line Python function through construct's compile
machinery. Construct's own ``Struct`` would create two ``Container`` objects and a
context per struct instance, which is what makes it slow.

The generated functions work on ``(buf, pos, end)`` rather than a stream; the compiled
construct still parses from and builds to streams (a thin wrapper), but ``MessageCodec``
calls the buffer-level functions directly so that record sets stay zero-copy views and
no ``BytesIO`` is involved. Results are cached: each (view, message, version) compiles
once per process, on first use.

``mode="interpreted"`` skips code generation and runs the same construct tree through
its ``read``/``write`` methods: the reference the compiled code is tested against.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from proxy.protocol import primitives as prim
from proxy.protocol.codec_tree import build_codec_tree
from proxy.protocol.codegen import compile_tree
from proxy.protocol.errors import (
    MessageEncodeError,
    ProtocolError,
    UnsupportedVersionError,
)
from proxy.protocol.once import built_once
from proxy.protocol.primitives import KafkaConstruct
from proxy.protocol.schema import View, registry

Mode = Literal["compiled", "interpreted"]


@dataclass(frozen=True)
class MessageCodec:
    """Decoder and encoder for one message in one version.

    ``read(buf, pos, end)`` and ``write(out, value)`` are the buffer-level entry points
    (generated functions in compiled mode); ``construct`` is the construct structure.
    """

    name: str
    version: int
    api_key: int | None
    flexible: bool
    mode: Mode
    construct: KafkaConstruct
    root_class: type
    read: Callable[[Any, int, int], tuple[Any, int]]
    write: Callable[[bytearray, Any], None]

    def decode(self, data, offset: int = 0, *, to_end: bool = True):
        """Decode from ``data[offset:]``; with ``to_end`` trailing bytes are an error.

        Returns the value, or ``(value, end_position)`` when ``to_end`` is false.
        """
        view = as_view(data)
        end = len(view)
        try:
            if offset < 0 or offset > end:
                prim.fail(f"offset {offset} outside the {end}-byte buffer", offset)
            value, pos = self.read(view, offset, end)
        except ProtocolError as exc:
            raise ProtocolError(
                exc.reason, api_key=self.api_key, version=self.version, offset=exc.offset
            ) from None
        except Exception as exc:  # a decoder bug must still surface as ProtocolError
            raise ProtocolError(
                f"internal decoder error in {self.name}: {type(exc).__name__}: {exc}",
                api_key=self.api_key,
                version=self.version,
            ) from exc
        if not to_end:
            return value, pos
        if pos != end:
            raise ProtocolError(
                f"{end - pos} trailing bytes after {self.name}",
                api_key=self.api_key,
                version=self.version,
                offset=pos,
            )
        return value

    def encode_into(self, out: bytearray, value) -> None:
        if not isinstance(value, self.root_class):
            raise TypeError(
                f"{self.name} v{self.version} encodes {self.root_class.__qualname__}, "
                f"not {type(value).__name__}"
            )
        try:
            self.write(out, value)
        except (struct.error, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise MessageEncodeError(
                f"cannot encode {self.name} v{self.version}: {type(exc).__name__}: {exc}"
            ) from exc

    def encode(self, value) -> bytes:
        out = bytearray()
        self.encode_into(out, value)
        return bytes(out)


def as_view(data) -> memoryview:
    """A flat unsigned-byte view of ``data`` without copying it."""
    view = data if isinstance(data, memoryview) else memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


@built_once
def compile_message(view: View, name: str, version: int, mode: Mode = "compiled") -> MessageCodec:
    """The codec for message ``name`` at ``version`` in schema ``view``, built once."""
    message = registry(view).by_name.get(name)
    if message is None:
        raise UnsupportedVersionError(f"no definition for message {name}")
    if version not in message.valid_versions:
        raise UnsupportedVersionError(
            f"{name} has no version {version} (valid {message.valid_versions})",
            api_key=message.api_key,
            version=version,
        )
    tree = build_codec_tree(message, view, version)
    read: Callable[[Any, int, int], tuple[Any, int]]
    write: Callable[[bytearray, Any], None]
    construct_obj: Any
    if mode == "compiled":
        compiled = compile_tree(tree)
        read, write, construct_obj = compiled.read, compiled.write, compiled.construct
    elif mode == "interpreted":
        read, write, construct_obj = tree.read, tree.write, tree
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return MessageCodec(
        name=name,
        version=version,
        api_key=message.api_key,
        flexible=message.is_flexible(version),
        mode=mode,
        construct=construct_obj,
        root_class=tree.cls,
        read=read,
        write=write,
    )

