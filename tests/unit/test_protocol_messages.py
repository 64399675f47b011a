"""The public codec API of proxy.protocol.messages."""

from __future__ import annotations

import uuid

import pytest

from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey, api_name
from proxy.protocol.errors import MessageEncodeError, ProtocolError, UnsupportedVersionError


def test_header_versions():
    assert messages.request_header_version(ApiKey.FETCH, 11) == 1
    assert messages.request_header_version(ApiKey.FETCH, 12) == 2
    assert messages.response_header_version(ApiKey.FETCH, 11) == 0
    assert messages.response_header_version(ApiKey.FETCH, 12) == 1
    assert messages.response_header_version(ApiKey.API_VERSIONS, 4) == 0
    assert messages.request_header_version(ApiKey.API_VERSIONS, 4) == 2


def test_supported_versions_and_flexibility():
    assert messages.supported_versions(ApiKey.FETCH) == (4, 18)
    assert messages.supported_versions(ApiKey.SHARE_FETCH) == (1, 2)
    assert messages.supported_versions(ApiKey.LEADER_AND_ISR) is None
    assert messages.supported_versions(9999) is None
    # InitProducerId's newest request version is marked unstable by Kafka: not advertised
    from proxy.protocol.schema import registry

    init_pid = registry().message(ApiKey.INIT_PRODUCER_ID, "request")
    assert init_pid.latest_version_unstable
    assert messages.supported_versions(ApiKey.INIT_PRODUCER_ID)[1] == init_pid.valid_versions.hi - 1
    list_offsets = registry().message(ApiKey.LIST_OFFSETS, "request")
    assert messages.supported_versions(ApiKey.LIST_OFFSETS)[1] == list_offsets.valid_versions.hi
    assert messages.is_flexible(ApiKey.METADATA, 9) and not messages.is_flexible(ApiKey.METADATA, 8)
    with pytest.raises(UnsupportedVersionError):
        messages.is_flexible(9999, 0)


def test_api_names():
    assert api_name(1) == "Fetch"
    assert api_name(ApiKey.OFFSET_COMMIT) == "OffsetCommit"
    assert api_name(9999) == "Unknown(9999)"


def test_new_body_defaults_and_nested_classes():
    body = messages.new_body(ApiKey.FETCH, 16, "request")
    assert body.max_bytes == 0x7FFFFFFF and body.replica_id == -1 and body.topics == []
    assert body.key_ranges is None
    F = messages.body_class(ApiKey.FETCH, "request")
    partition = F.FetchPartition()
    assert partition.current_leader_epoch == -1 and partition.log_start_offset == -1
    assert F.FetchTopic().topic_id == uuid.UUID(int=0)
    with pytest.raises(TypeError):
        messages.new_body(ApiKey.FETCH, 16, "request", no_such_field=1)
    with pytest.raises(UnsupportedVersionError):
        messages.new_body(ApiKey.FETCH, 99, "request")
    # defaults are fresh per instance
    assert messages.new_body(ApiKey.FETCH, 16, "request").topics is not body.topics


def test_request_round_trip_and_header_fields():
    M = messages.body_class(ApiKey.METADATA, "request")
    body = messages.new_body(ApiKey.METADATA, 12, "request", topics=[M.MetadataRequestTopic(name="a")])
    frame = messages.encode_request(messages.new_request_header(ApiKey.METADATA, 12, 77, "me"), body)
    header, decoded = messages.decode_request(frame)
    assert (header.api_key, header.api_version, header.correlation_id) == (3, 12, 77)
    assert decoded.topics[0].name == "a"


def test_metadata_response_rewrite_flow():
    """Decode, change a broker address, re-encode: the proxy's rewrite pattern."""
    R = messages.body_class(ApiKey.METADATA, "response")
    body = messages.new_body(
        ApiKey.METADATA,
        12,
        "response",
        brokers=[R.MetadataResponseBroker(node_id=1, host="broker-1", port=9092)],
        cluster_id="c",
    )
    frame = messages.encode_response(ApiKey.METADATA, 12, messages.new_response_header(5), body)
    header, decoded = messages.decode_response(ApiKey.METADATA, 12, frame)
    decoded.brokers[0].host, decoded.brokers[0].port = "proxy", 19092
    again = messages.encode_response(ApiKey.METADATA, 12, header, decoded)
    assert messages.decode_response(ApiKey.METADATA, 12, again)[1].brokers[0].host == "proxy"


def test_decode_response_by_correlation():
    body = messages.new_body(ApiKey.API_VERSIONS, 3, "response", error_code=35)
    frame = messages.encode_response(ApiKey.API_VERSIONS, 3, messages.new_response_header(41), body)
    inflight = {41: (ApiKey.API_VERSIONS, 3)}
    header, decoded = messages.decode_response_by_correlation(frame, inflight.pop)
    assert header.correlation_id == 41 and decoded.error_code == 35 and not inflight
    with pytest.raises(ProtocolError, match="unknown correlation id 41"):
        messages.decode_response_by_correlation(frame, inflight.pop)


def test_decode_body_at_offset_and_memoryview_input():
    body = messages.new_body(ApiKey.FIND_COORDINATOR, 6, "request", key_type=0, coordinator_keys=["g"])
    data = messages.encode_body(ApiKey.FIND_COORDINATOR, 6, "request", body)
    padded = b"HDR" + data
    assert messages.decode_body(ApiKey.FIND_COORDINATOR, 6, "request", padded, 3) == body
    view = memoryview(bytearray(padded))
    assert messages.decode_body(ApiKey.FIND_COORDINATOR, 6, "request", view, 3) == body


def test_encode_errors_are_value_errors_naming_the_message():
    body = messages.new_body(ApiKey.HEARTBEAT, 4, "request", group_id="g", generation_id=2**40)
    with pytest.raises(MessageEncodeError, match="HeartbeatRequest v4"):
        messages.encode_body(ApiKey.HEARTBEAT, 4, "request", body)
    body = messages.new_body(ApiKey.HEARTBEAT, 4, "request", group_id=None)
    with pytest.raises(MessageEncodeError):
        messages.encode_body(ApiKey.HEARTBEAT, 4, "request", body)
    with pytest.raises(TypeError, match="encodes HeartbeatRequest"):
        messages.encode_body(ApiKey.HEARTBEAT, 4, "request", messages.new_body(ApiKey.FETCH, 4, "request"))


def test_data_structures():
    key = messages.new_data("IndividualCommitKey", group="g", topic="t", partition=1)
    data = messages.encode_data("IndividualCommitKey", key)
    assert messages.data_version(data) == 0
    assert messages.decode_data("IndividualCommitKey", data) == key
    with pytest.raises(ProtocolError, match="trailing"):
        messages.decode_data("IndividualCommitKey", data + b"x")
    with pytest.raises(UnsupportedVersionError):
        messages.decode_data("IndividualCommitKey", b"\xff\xff" + data[2:])
    with pytest.raises(UnsupportedVersionError):
        messages.decode_data("FetchRequest", data)
    with pytest.raises(ProtocolError, match="truncated"):
        messages.data_version(b"\x00")


def test_to_dict_for_logs():
    body = messages.new_body(ApiKey.HEARTBEAT, 4, "request", group_id="g")
    assert messages.to_dict(body) == {
        "group_id": "g",
        "generation_id": 0,
        "member_id": "",
        "group_instance_id": None,
    }


def test_api_versions_response_falls_back_to_v0_on_unsupported_version():
    v0 = messages.new_body(ApiKey.API_VERSIONS, 0, "response", error_code=35)
    A = messages.body_class(ApiKey.API_VERSIONS, "response")
    v0.api_keys = [A.ApiVersion(api_key=18, min_version=0, max_version=3)]
    frame = messages.encode_response(ApiKey.API_VERSIONS, 0, messages.new_response_header(3), v0)
    header, body, layout = messages.decode_api_versions_response(4, frame)
    assert (header.correlation_id, body.error_code, layout) == (3, 35, 0)
    assert messages.decode_response(ApiKey.API_VERSIONS, 4, frame)[1] == body
    # any other v0-shaped answer to a v4 request is still an error
    v0.error_code = 0
    frame = messages.encode_response(ApiKey.API_VERSIONS, 0, messages.new_response_header(3), v0)
    with pytest.raises(ProtocolError):
        messages.decode_response(ApiKey.API_VERSIONS, 4, frame)


def test_precompile():
    assert messages.precompile([ApiKey.FETCH, ApiKey.LEADER_AND_ISR]) == 2 * (18 - 4 + 1)
