"""KIP-848 consumer groups (ConsumerGroupHeartbeat) subscribing to a virtual range topic are
refused with a message saying why: the broker assigns them and knows no virtual topic."""

from __future__ import annotations

from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import ErrorCode
from proxy.virtual import refusals
from proxy.virtual.names import VirtualNames
from proxy.virtual.precheck import Precheck
from proxy.virtual.refusals import heartbeat_refusal, refuse_heartbeat

NAMES = VirtualNames(".kr", 64)
REAL = {"orders", "orders.kr9"}  # a real topic named like a virtual one wins


def _lookup(name: str):
    return None if name in REAL else NAMES.parse(name)


def _heartbeat(names=None, regex=None, version=1) -> tuple[bytes, object]:
    body = messages.new_body(ApiKey.CONSUMER_GROUP_HEARTBEAT, version, "request", group_id="billing",
                             member_id="m-1", member_epoch=0, subscribed_topic_names=names)
    if version >= 1:
        body.subscribed_topic_regex = regex
    frame = messages.encode_request(messages.new_request_header(ApiKey.CONSUMER_GROUP_HEARTBEAT, version, 5, "c"),
                                    body)
    return bytes(frame), messages.decode_request(frame)[1]


def test_a_subscribed_virtual_name_is_refused_with_the_reason():
    frame, body = _heartbeat(["payments", "orders.kr4"])
    assert Precheck(".kr").may_name_virtual(frame)
    message = heartbeat_refusal(body, _lookup, NAMES)
    assert message is not None
    assert "orders.kr4" in message and "group.protocol=classic" in message and "orders" in message


def test_real_topics_and_unchanged_subscriptions_pass():
    for names in (["orders", "payments"], ["orders.kr9"], None):
        _, body = _heartbeat(names)
        assert heartbeat_refusal(body, _lookup, NAMES) is None
    frame, _ = _heartbeat(["orders"], version=0)
    assert not Precheck(".kr").may_name_virtual(frame)  # goes on undecoded


def test_a_regex_spelling_a_virtual_name_is_refused():
    for regex in (r"orders\.kr4", r"^(orders\.kr8|payments)$"):
        _, body = _heartbeat(regex=regex)
        message = heartbeat_refusal(body, _lookup, NAMES)
        assert message is not None and "regular expression" in message, regex
    for regex in (r"orders.*", r"orders\.kr", r"orders\.kr9"):  # no virtual name spelled out
        _, body = _heartbeat(regex=regex)
        assert heartbeat_refusal(body, _lookup, NAMES) is None, regex


def test_a_regex_that_matches_a_virtual_name_of_a_known_topic_is_refused():
    topics = ["__consumer_offsets", "orders", "payments"]
    for regex, example in ((r".*\.kr[0-9]+", "orders.kr2"), (r"pay.*\.kr(8|16)", "payments.kr8"),
                           (r"(orders|payments)\.kr1[0-9]", "orders.kr10")):
        _, body = _heartbeat(regex=regex)
        message = heartbeat_refusal(body, _lookup, NAMES, topics)
        assert message is not None and example in message and "matched by the regular expression" in message, regex


def test_a_heartbeat_whose_regex_mentions_the_suffix_is_decoded():
    frame, _ = _heartbeat(regex=r".*\.kr[0-9]+")
    precheck = Precheck(".kr")
    assert not precheck.may_name_virtual(frame)  # no digit after the suffix
    assert precheck.may_match_virtual(frame)
    frame, _ = _heartbeat(regex=r"orders.*")
    assert not precheck.may_match_virtual(frame)  # goes on undecoded


def test_a_regex_that_matches_no_virtual_name_passes():
    topics = ["orders", "orders.kr9", "payments"]
    for regex in (r"orders.*", r".*", r"orders\.kr9", r".*\.kr(1|65|99)", r"orders\.kr[", r"other\.kr[0-9]+"):
        _, body = _heartbeat(regex=regex)
        assert heartbeat_refusal(body, _lookup, NAMES, topics) is None, regex


def test_the_regex_probe_is_bounded(monkeypatch):
    monkeypatch.setattr(refusals, "REGEX_PROBES", 63)  # K = 2..64 of the first topic only
    _, body = _heartbeat(regex=r"zeta\.kr[0-9]+")
    assert heartbeat_refusal(body, _lookup, NAMES, ["alpha", "zeta"]) is None
    assert heartbeat_refusal(body, _lookup, NAMES, ["zeta"]) is not None


def test_the_refusal_response_encodes_with_its_error():
    response = refuse_heartbeat(1, "why")
    frame = messages.encode_response(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, messages.new_response_header(5), response)
    header, decoded = messages.decode_response(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, bytes(frame))
    assert decoded.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION and decoded.error_message == "why"
    assert decoded.assignment is None and decoded.member_epoch == -1
