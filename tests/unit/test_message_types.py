"""The typed view of the messages: ``message_types.pyi`` and ``message_versions.py`` are what
the definitions give today, and describe the classes the codecs really decode into."""

from __future__ import annotations

import ast
import dataclasses

import pytest

from proxy.protocol import message_types, message_versions, messages, stubs
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.compiler import compile_message
from proxy.protocol.schema import registry


def test_generated_files_are_current():
    """Regenerated in memory, both files are byte for byte what is committed; after a
    schema change run ``python -m proxy.protocol.stubs`` (``make stubs``)."""
    assert stubs.stale() == []


def _stub_classes() -> dict[str, ast.ClassDef]:
    tree = ast.parse(stubs.STUB_PATH.read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def _fields(node: ast.ClassDef) -> list[str]:
    return [item.target.id for item in node.body
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)]


def _nested(node: ast.ClassDef) -> dict[str, ast.ClassDef]:
    return {item.name: item for item in node.body if isinstance(item, ast.ClassDef)}


def test_every_message_has_a_stub_class_and_nothing_else():
    assert set(_stub_classes()) == set(registry().by_name)


@pytest.mark.parametrize("name", sorted(registry().by_name))
def test_stub_describes_the_runtime_class(name):
    """Same fields in the same order, same nested structs, each the class the codecs make."""
    node = _stub_classes()[name]
    runtime = getattr(message_types, name)
    assert runtime is compile_message("ours", name, registry().by_name[name].valid_versions.hi).root_class
    assert _fields(node) == [f.name for f in dataclasses.fields(runtime)]
    nested = _nested(node)
    assert set(nested) == {attr for attr, value in vars(runtime).items() if isinstance(value, type)}
    for struct_name, struct_node in nested.items():
        struct = getattr(runtime, struct_name)
        assert _fields(struct_node) == [f.name for f in dataclasses.fields(struct)], f"{name}.{struct_name}"
        assert not _nested(struct_node), "structs hang off the message class, not off each other"


def test_runtime_names_are_the_codec_classes():
    header, body = messages.decode_request(messages.encode_request(
        messages.new_request_header(ApiKey.FETCH, 12, 1, "c"), messages.new_body(ApiKey.FETCH, 12, "request")))
    assert type(header) is message_types.RequestHeader
    assert type(body) is message_types.FetchRequest
    assert message_types.FetchRequest.FetchTopic is messages.body_class(ApiKey.FETCH, "request").FetchTopic
    assert (header.api_key, header.api_version) == (ApiKey.FETCH, 12)
    with pytest.raises(AttributeError):
        message_types.NoSuchMessage  # noqa: B018


def test_version_constants():
    assert message_versions.FETCH_FIRST_FLEXIBLE == 12
    assert message_versions.FETCH_FIRST_TOPIC_ID == 13
    assert message_versions.FETCH_LAST_REPLICA_ID == 14
    assert message_versions.SASL_HANDSHAKE_FIRST_FLEXIBLE is None
    for api_key, first in message_versions.FIRST_FLEXIBLE.items():
        versions = messages.supported_versions(api_key)
        assert versions is not None
        for version in range(versions[0], versions[1] + 1):
            assert messages.is_flexible(api_key, version) == (first is not None and version >= first)


def test_typed_decoders_return_the_named_class_and_refuse_another():
    body = message_types.FetchRequest(max_wait_ms=5, topics=[message_types.FetchRequest.FetchTopic(topic="t")])
    frame = messages.encode_request(messages.new_request_header(ApiKey.FETCH, 12, 9, "c"), body)
    header, decoded = messages.decode_request_as(message_types.FetchRequest, frame)
    assert (header.correlation_id, decoded) == (9, body)
    with pytest.raises(TypeError):
        messages.decode_request_as(message_types.MetadataRequest, frame)
    response = message_types.FetchResponse(session_id=3)
    raw = messages.encode_response(ApiKey.FETCH, 12, messages.new_response_header(9), response)
    assert messages.decode_response_as(message_types.FetchResponse, 12, raw)[1] == response
    with pytest.raises(TypeError):
        messages.decode_response_as(message_types.FetchRequest, 12, raw)
    assert messages.decode_body_as(message_types.FetchResponse, 12, raw, 5) == response
    key = message_types.IndividualCommitKey(group="g", topic="t", partition=1)
    assert messages.decode_data_as(message_types.IndividualCommitKey, messages.encode_data("IndividualCommitKey", key)) == key
