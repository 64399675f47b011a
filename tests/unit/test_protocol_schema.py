"""Loading Kafka's JSON definitions and merging our overlays."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest

from proxy.protocol import schema
from proxy.protocol.schema import SchemaError, Versions, build_message, registry, snake_case


def test_comment_stripping_leaves_slashes_inside_strings():
    text = '{"a": "http://x//y", // comment "quoted"\n "b": "\\"//\\"" // tail\n}'
    assert schema.parse_json_with_comments(text, "t") == {"a": "http://x//y", "b": '"//"'}


def test_comment_stripping_keeps_escaped_quotes_inside_strings():
    text = '{"a": "say \\"//hi\\"", // gone\n "b": "c:\\\\" // gone too\n}'
    assert schema.strip_json_comments(text) == '{"a": "say \\"//hi\\"", \n "b": "c:\\\\" \n}'


def test_schema_files_are_found_without_importing_the_client_package():
    """A process that only decodes messages (a Spark worker) should not import
    kafka-python's client to locate the definitions."""
    folder = schema._package_directory(schema.KAFKA_SCHEMA_PACKAGE)
    assert any(entry.name == "FetchRequest.json" for entry in folder.iterdir())
    assert schema._package_directory("protocol_schemas").is_dir()
    probe = "import sys, proxy.protocol.messages as m; m.precompile(); print(sorted(n for n in sys.modules if n.split('.')[0] == 'kafka'))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_comment_only_lines_and_trailing_comments():
    text = "// header\n{\n  // inside\n  \"n\": 1 // after\n}\n// end"
    assert schema.parse_json_with_comments(text, "t") == {"n": 1}


@pytest.mark.parametrize(
    ("text", "lo", "hi"),
    [("0+", 0, schema.MAX_VERSION), ("3", 3, 3), ("1-4", 1, 4), ("none", 1, 0)],
)
def test_versions(text, lo, hi):
    v = Versions.parse(text)
    assert (v.lo, v.hi) == (lo, hi)
    assert str(v) == text


def test_snake_case():
    assert snake_case("TopicId") == "topic_id"
    assert snake_case("KeyRangesApplied") == "key_ranges_applied"
    assert snake_case("V3AndBelowTopics") == "v3_and_below_topics"
    assert snake_case("IsKRaftController") == "is_k_raft_controller"


def test_every_kafka_definition_loads_with_both_views():
    ours, standard = registry("ours"), registry("standard")
    assert set(schema.kafka_json()) <= set(ours.by_name)
    assert set(ours.by_name) == set(standard.by_name)
    for name in ("ConsumerProtocolSubscription", "ConsumerProtocolAssignment"):
        assert ours.by_name[name].kind == "data"


def test_complete_definitions_are_present_in_both_views():
    for view in ("ours", "standard"):
        reg = registry(view)
        assert reg.message(78, "request").name == "ShareFetchRequest"
        assert reg.message(78, "response").name == "ShareFetchResponse"
        assert reg.message(79, "request").name == "ShareAcknowledgeRequest"
        assert reg.message(79, "response").name == "ShareAcknowledgeResponse"
        assert reg.by_name["IndividualCommitKey"].kind == "data"
        assert reg.by_name["IndividualCommitValue"].kind == "data"
    share = registry().by_name["ShareFetchResponse"]
    assert str(share.valid_versions) == "1-2" and str(share.flexible_versions) == "0+"
    assert [f.attr for f in share.fields][-1] == "node_endpoints"


def test_extended_messages_are_marked():
    assert registry("ours").by_name["FetchRequest"].origin == "kafka+ours"
    assert registry("standard").by_name["FetchRequest"].origin == "kafka"
    assert registry("ours").by_name["ShareFetchRequest"].origin == "ours"
    assert registry("ours").by_name["MetadataRequest"].origin == "kafka"


# --------------------------------------------------------------------------- overlay rules


def _base():
    return copy.deepcopy(schema.kafka_json()["OffsetCommitResponse"])


def _extension(**field_overrides):
    field = {
        "name": "StableOffset",
        "type": "int64",
        "versions": "8+",
        "default": "-1",
        "taggedVersions": "8+",
        "tag": 10000,
        "ours": True,
    }
    field.update(field_overrides)
    return {
        "extends": "OffsetCommitResponse",
        "addFields": [{"path": ["Topics", "Partitions"], "fields": [field]}],
    }


def test_extension_merges_at_a_nested_path():
    merged = schema._apply_extension(_base(), _extension(), "test")
    message = build_message(merged)
    partitions = message.fields[-1].fields[-1].fields
    assert partitions[-1].attr == "stable_offset" and partitions[-1].ours


def test_added_fields_must_be_marked_ours():
    with pytest.raises(SchemaError, match="ours"):
        schema._apply_extension(_base(), _extension(ours=False), "test")


def test_added_fields_must_be_tagged():
    overlay = _extension()
    del overlay["addFields"][0]["fields"][0]["tag"]
    del overlay["addFields"][0]["fields"][0]["taggedVersions"]
    with pytest.raises(SchemaError, match="tagged"):
        build_message(schema._apply_extension(_base(), overlay, "test"))


def test_tags_only_in_flexible_versions():
    overlay = _extension(versions="0+", taggedVersions="0+")
    with pytest.raises(SchemaError, match="flexible"):
        build_message(schema._apply_extension(_base(), overlay, "test"))


def test_tag_collisions_and_unknown_paths_are_rejected():
    twice = _extension()
    twice["addFields"][0]["fields"].append(dict(twice["addFields"][0]["fields"][0], name="Other"))
    with pytest.raises(SchemaError, match="tag 10000"):
        build_message(schema._apply_extension(_base(), twice, "test"))
    wrong_path = _extension()
    wrong_path["addFields"][0]["path"] = ["Topics", "Nope"]
    with pytest.raises(SchemaError, match="Nope"):
        schema._apply_extension(_base(), wrong_path, "test")
    existing = _extension(name="ErrorCode")
    with pytest.raises(SchemaError, match="already exists"):
        schema._apply_extension(_base(), existing, "test")
