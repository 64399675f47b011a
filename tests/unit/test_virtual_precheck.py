"""The raw-bytes pre-check: a request that cannot name a virtual topic is not decoded."""

from __future__ import annotations

import uuid

import pytest

from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.virtual.precheck import Precheck, names_any_id, names_suffix


def _commit(*topics: str, client_id: str = "app") -> bytes:
    cls = messages.body_class(ApiKey.OFFSET_COMMIT, "request")
    body = messages.new_body(ApiKey.OFFSET_COMMIT, 8, "request", group_id="g", generation_id_or_member_epoch=1,
                             member_id="m", group_instance_id=None, topics=[
                                 cls.OffsetCommitRequestTopic(name=name, partitions=[
                                     cls.OffsetCommitRequestPartition(partition_index=0, committed_offset=5,
                                                                      committed_metadata="")])
                                 for name in topics])
    header = messages.new_request_header(ApiKey.OFFSET_COMMIT, 8, 7, client_id)
    return bytes(messages.encode_request(header, body))


def _fetch(topic_id: uuid.UUID) -> bytes:
    cls = messages.body_class(ApiKey.FETCH, "request")
    body = messages.new_body(ApiKey.FETCH, 13, "request", max_wait_ms=500, min_bytes=1, max_bytes=1 << 20,
                             isolation_level=0, session_id=0, session_epoch=-1, topics=[
                                 cls.FetchTopic(topic_id=topic_id, partitions=[cls.FetchPartition(
                                     partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])],
                             forgotten_topics_data=[], rack_id="")
    return bytes(messages.encode_request(messages.new_request_header(ApiKey.FETCH, 13, 1, "app"), body))


def test_a_virtual_name_is_seen_in_the_bytes():
    check = Precheck(".kr")
    assert check.may_name_virtual(_commit("orders.kr4"))
    assert check.may_name_virtual(_commit("plain", "orders.kr16"))


def test_requests_without_a_virtual_name_pass_untouched():
    check = Precheck(".kr")
    assert not check.may_name_virtual(_commit("orders", "payments.v2"))
    assert not check.may_name_virtual(_commit("orders.kr"))  # the suffix without K
    assert not check.may_name_virtual(_commit("orders.kr0"))  # K never starts with 0


def test_a_false_alarm_only_costs_a_decode():
    # The suffix in a client id says yes; the stage then decodes and finds nothing virtual.
    assert Precheck(".kr").may_name_virtual(_commit("orders", client_id="svc.kr2"))


def test_a_custom_suffix():
    check = Precheck("-shares-")
    assert check.may_name_virtual(_commit("orders-shares-8"))
    assert not check.may_name_virtual(_commit("orders.kr8"))


def test_ids_handed_out_are_found_in_id_based_requests():
    check = Precheck(".kr")
    virtual_id, other = uuid.uuid4(), uuid.uuid4()
    assert not check.may_name_virtual(_fetch(virtual_id))
    check.remember(virtual_id)
    check.remember(None)
    check.remember(uuid.UUID(int=0))  # no id: never remembered (it would match every null id)
    assert check.may_name_virtual(_fetch(virtual_id))
    assert not check.may_name_virtual(_fetch(other))


def test_remembered_ids_are_bounded():
    check = Precheck(".kr", max_ids=2)
    first, second, third = (uuid.uuid4() for _ in range(3))
    for topic_id in (first, second, second, third):
        check.remember(topic_id)
    assert not check.may_name_virtual(_fetch(first))
    assert check.may_name_virtual(_fetch(second)) and check.may_name_virtual(_fetch(third))


def test_pure_helpers():
    assert names_suffix(bytearray(b"\x00\x0aorders.kr4"), b".kr")
    assert names_suffix(memoryview(b"x.kr.kr9"), b".kr")  # a later occurrence counts
    assert not names_suffix(b"x.kr", b".kr")  # at the very end
    assert not names_any_id(b"anything", [])
    assert names_any_id(memoryview(b"--" + uuid.UUID(int=7).bytes), [uuid.UUID(int=7).bytes])
    with pytest.raises(ValueError):
        Precheck("")
