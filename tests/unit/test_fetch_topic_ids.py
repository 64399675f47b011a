"""The pre-check's walk over a raw Fetch request to the topic ids it names (v13+)."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.protocol import messages
from proxy.protocol.messages import ApiKey
from proxy.virtual.precheck import fetch_topic_ids

F = messages.body_class(ApiKey.FETCH, "request")
_SUPPORTED = messages.supported_versions(ApiKey.FETCH)
assert _SUPPORTED is not None
VERSIONS = range(13, _SUPPORTED[1] + 1)


def _frame(version: int, topics: list[tuple[uuid.UUID, int]], *, client_id: str | None = "c",
           ranges: bool = False, forgotten: bool = False) -> bytes:
    wire = [F.KeyRange(start=0, end=99)] if ranges else None
    body = messages.new_body(
        ApiKey.FETCH, version, "request", max_wait_ms=500, min_bytes=1, max_bytes=1 << 20, session_id=0,
        session_epoch=-1,
        topics=[F.FetchTopic(topic_id=tid, partitions=[F.FetchPartition(partition=p, fetch_offset=7 * p,
                                                                        partition_max_bytes=1 << 20, key_ranges=wire)
                                                       for p in range(count)])
                for tid, count in topics],
        forgotten_topics_data=[F.ForgottenTopic(topic_id=uuid.uuid4(), partitions=[1])] if forgotten else [],
        rack_id="rack-a")
    header = messages.new_request_header(ApiKey.FETCH, version, 42, client_id)
    return messages.encode_request(header, body)


@pytest.mark.parametrize("version", list(VERSIONS))
def test_every_topic_id_is_found_in_every_version(version):
    topics = [(uuid.uuid4(), 3), (uuid.uuid4(), 0), (uuid.uuid4(), 1)]
    frame = _frame(version, topics, ranges=True, forgotten=True)
    assert fetch_topic_ids(frame, version) == [t.bytes for t, _ in topics]
    assert fetch_topic_ids(memoryview(frame), version) == [t.bytes for t, _ in topics]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(VERSIONS)), st.lists(st.tuples(st.uuids(), st.integers(0, 4)), max_size=5),
       st.one_of(st.none(), st.text(max_size=20)), st.booleans())
def test_ids_of_any_fetch_request(version, topics, client_id, ranges):
    frame = _frame(version, topics, client_id=client_id, ranges=ranges)
    assert fetch_topic_ids(frame, version) == [t.bytes for t, _ in topics]


def test_a_truncated_request_is_not_read():
    frame = _frame(17, [(uuid.uuid4(), 2), (uuid.uuid4(), 2)])
    cut_inside_topics = [n for n in range(10, len(frame) - 20)]
    for n in cut_inside_topics:
        ids = fetch_topic_ids(frame[:n], 17)
        assert ids is None or len(ids) < 2 or n >= len(frame) - 20


def test_versions_before_ids_are_not_read():
    assert fetch_topic_ids(b"\x00" * 64, 12) is None
