"""The protocol package's shape: imports point one way, one varint reader and one
tagged-field skipper serve every walker, and the message registry resolves a frame's
codecs once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from proxy.protocol import messages, peek
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.errors import ProtocolError, UnsupportedVersionError
from proxy.protocol.primitives import read_uvarint, uvarint_bytes
from proxy.protocol.tagged import skip_tagged_fields

PACKAGE = Path(__file__).resolve().parents[2] / "proxy" / "protocol"


def _protocol_imports() -> dict[str, set[str]]:
    """Module -> protocol modules it imports, at any depth of its code (an import inside
    a function is still an edge)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.glob("*.py"):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == "proxy.protocol":
                    deps.update(alias.name for alias in node.names)
                elif node.module.startswith("proxy.protocol."):
                    deps.add(node.module.rsplit(".", 1)[1])
            elif isinstance(node, ast.Import):
                deps.update(
                    alias.name.rsplit(".", 1)[1]
                    for alias in node.names
                    if alias.name.startswith("proxy.protocol.")
                )
        graph[path.stem] = deps
    return graph


def test_no_import_cycle_in_protocol_package():
    graph = _protocol_imports()
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import cycle: {' -> '.join(path + (module,))}"
        if module in done:
            return
        for dep in sorted(graph.get(module, ())):
            visit(dep, path + (module,))
        done.add(module)

    for module in sorted(graph):
        visit(module, ())


def test_codec_pipeline_points_one_way():
    graph = _protocol_imports()
    order = ["schema", "values", "codec_tree", "codegen", "compiler", "messages"]
    for i, module in enumerate(order):
        later = set(order[i + 1 :])
        assert not graph[module] & later, f"{module} imports a later stage: {graph[module] & later}"


# --------------------------------------------------------------------------- varints, tags


def test_uvarint_reader_defaults_end_to_buffer_and_stays_strict():
    assert read_uvarint(b"\x90\x4e\x00", 0) == (10000, 2)
    assert read_uvarint(b"\x90\x4e", 0, 2) == (10000, 2)
    with pytest.raises(ProtocolError, match="truncated"):
        read_uvarint(b"\x90\x4e", 0, 1)  # end bounds the read, not the buffer
    with pytest.raises(ProtocolError, match="redundant zero"):
        read_uvarint(b"\x80\x00", 0)
    with pytest.raises(ProtocolError, match="32 bits"):
        read_uvarint(b"\xff\xff\xff\xff\x1f", 0)
    assert peek.read_uvarint is read_uvarint  # the name callers import from peek


def _section(*fields: tuple[int, bytes]) -> bytes:
    out = uvarint_bytes(len(fields))
    for tag, data in fields:
        out += uvarint_bytes(tag) + uvarint_bytes(len(data)) + data
    return out


def test_skip_tagged_fields():
    section = _section((0, b"abc"), (10000, b"\x01\x02"))
    frame = b"xx" + section + b"tail"
    assert skip_tagged_fields(frame, 2) == 2 + len(section)
    assert skip_tagged_fields(frame, 2, 2 + len(section)) == 2 + len(section)
    assert skip_tagged_fields(b"\x00", 0) == 1


@pytest.mark.parametrize(
    ("section", "reason"),
    [
        (_section((5, b"a"), (3, b"b")), "ascend"),
        (_section((5, b"a"), (5, b"b")), "ascend"),
        (_section((1, b"abc"))[:-1], "exceeds"),
        (b"\x05\x00\x00", "cannot fit"),
    ],
)
def test_skip_tagged_fields_rejects_what_the_decoder_rejects(section, reason):
    with pytest.raises(ProtocolError, match=reason):
        skip_tagged_fields(section, 0)


def test_has_tag_uses_the_strict_reader():
    section = _section((0, b"n"), (7, b""))
    assert peek.has_tag(b"zz" + section, 2, 7)
    assert not peek.has_tag(b"zz" + section, 2, 3)
    with pytest.raises(ProtocolError, match="after its last field"):
        peek.has_tag(b"zz" + section + b"!", 2, 7)
    with pytest.raises(ProtocolError, match="ascend"):
        peek.has_tag(_section((7, b""), (0, b"n")), 0, 7)


# --------------------------------------------------------------------------- registry


def test_registry_resolves_a_frame_codec_once():
    first = messages.REGISTRY.frame(ApiKey.FETCH, 13, "request")
    assert messages.REGISTRY.frame(ApiKey.FETCH, 13, "request") is first
    assert first.header.version == 2 and first.body.name == "FetchRequest"
    old = messages.REGISTRY.frame(ApiKey.FETCH, 11, "response")
    assert old.header.version == 0 and old.body.version == 11
    api_versions = messages.REGISTRY.frame(ApiKey.API_VERSIONS, 3, "response")
    assert api_versions.header.version == 0  # KIP-511: always a v0 response header


def test_registry_frame_codec_round_trips_what_the_functions_produce():
    header = messages.new_request_header(ApiKey.FETCH, 13, 42, "c")
    body = messages.new_body(ApiKey.FETCH, 13, "request", max_wait_ms=9)
    frame = messages.encode_request(header, body)
    codec = messages.REGISTRY.frame(ApiKey.FETCH, 13, "request")
    assert codec.encode(header, body) == frame
    assert codec.decode(frame) == messages.decode_request(frame) == (header, body)


def test_registry_reports_unknown_versions_every_time():
    for _ in range(2):  # a failure is not cached as a codec
        with pytest.raises(UnsupportedVersionError):
            messages.REGISTRY.frame(ApiKey.FETCH, 999, "request")
    frame = b"\x00\x01\x03\xe7" + b"\x00" * 8  # Fetch v999
    with pytest.raises(UnsupportedVersionError):
        messages.decode_request(frame)


def test_header_errors_name_the_frame():
    frame = messages.encode_request(
        messages.new_request_header(ApiKey.FETCH, 13, 1, "client"),
        messages.new_body(ApiKey.FETCH, 13, "request"),
    )
    with pytest.raises(ProtocolError, match="request header") as info:
        messages.decode_request(frame[:9])  # inside the client id
    assert (info.value.api_key, info.value.version) == (ApiKey.FETCH, 13)
