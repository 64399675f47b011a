"""Wire-level checks through the proxy with our own codec: version clamping and every
response that carries a broker address."""

from __future__ import annotations

import struct

import pytest

from harness.raw_client import RawClient
from harness.wait import wait_until
from proxy.protocol import messages
from proxy.protocol.messages import ApiKey

from .conftest import proxy_ports, real_ports


@pytest.fixture
def raw(proxy):
    with RawClient.connect(proxy.bootstrap_servers) as client:
        yield client


def test_api_versions_clamped_to_what_the_proxy_decodes(raw):
    body = raw.call(ApiKey.API_VERSIONS, 3, client_software_name="raw", client_software_version="1")
    assert body.error_code == 0
    advertised = {entry.api_key: (entry.min_version, entry.max_version) for entry in body.api_keys}
    for key in (ApiKey.METADATA, ApiKey.FETCH, ApiKey.PRODUCE, ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER):
        assert advertised[key][1] <= messages.supported_versions(key)[1]


def test_commit_apis_are_offered_by_name_while_virtual_topics_are_on(kafka, raw):
    """OffsetCommit and OffsetFetch v10 name topics by id only; virtual topics are
    committed by name, so the proxy (virtual topics on) offers v9 and refuses v10."""
    with RawClient.connect(kafka.bootstrap_servers) as direct:
        broker = direct.call(ApiKey.API_VERSIONS, 3, client_software_name="raw", client_software_version="1")
    ours = raw.call(ApiKey.API_VERSIONS, 3, client_software_name="raw", client_software_version="1")
    for key in (ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH):
        broker_max = next(e.max_version for e in broker.api_keys if e.api_key == key)
        assert next(e.max_version for e in ours.api_keys if e.api_key == key) == min(9, broker_max)


def test_api_versions_newer_than_known_gets_unsupported_version(raw):
    newest = messages.supported_versions(ApiKey.API_VERSIONS)[1]
    # Hand-built: a version past what our schemas define (body as in v3).
    header = struct.pack(">hhih", ApiKey.API_VERSIONS, newest + 1, 99, 3) + b"raw" + b"\x00"
    frame = header + b"\x04raw\x021\x00"
    raw.sock.sendall(struct.pack(">i", len(frame)) + frame)
    header, body = messages.decode_response(ApiKey.API_VERSIONS, 0, raw.receive())
    assert header.correlation_id == 99
    assert body.error_code == 35  # UNSUPPORTED_VERSION, as a broker answers
    assert [(e.api_key, e.max_version) for e in body.api_keys] == [(ApiKey.API_VERSIONS, newest)]


@pytest.mark.parametrize("version", [1, 4, 9, 12, 13])
def test_metadata_addresses_rewritten(kafka, proxy, raw, version):
    fields = {"topics": None} if version >= 1 else {}
    body = raw.call(ApiKey.METADATA, version, **fields)
    ports = {broker.port for broker in body.brokers}
    assert ports and ports <= proxy_ports(proxy)
    assert not ports & real_ports(kafka)


@pytest.mark.parametrize("version", [1, 3, 4, 6])
def test_find_coordinator_rewritten(kafka, proxy, raw, version):
    def coordinators():
        if version >= 4:
            body = raw.call(ApiKey.FIND_COORDINATOR, version, key_type=0, coordinator_keys=["group-a", "group-b"])
            entries = body.coordinators
        else:
            entries = [raw.call(ApiKey.FIND_COORDINATOR, version, key="group-a", key_type=0)]
        # COORDINATOR_NOT_AVAILABLE while __consumer_offsets is being created: ask again.
        return entries if all(entry.error_code == 0 for entry in entries) else None

    entries = wait_until(coordinators, timeout=30, interval=0.2, what="coordinator found")
    assert {entry.port for entry in entries} <= proxy_ports(proxy)


def test_describe_cluster_rewritten(kafka, proxy, raw):
    body = raw.call(ApiKey.DESCRIBE_CLUSTER, 1, include_cluster_authorized_operations=False, endpoint_type=1)
    assert body.error_code == 0
    ports = {broker.port for broker in body.brokers}
    assert ports and ports <= proxy_ports(proxy)
