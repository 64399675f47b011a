"""Writes and topic administration naming a virtual topic are refused, without I/O; so is a
KIP-848 consumer group (ConsumerGroupHeartbeat) subscribing to one.

The proxy answers such a request itself (nothing reaches the broker): every topic of it
gets INVALID_TOPIC_EXCEPTION, the virtual ones with a message naming the real topic, any
real one alongside with a message saying the request was refused as a whole (a request
is answered whole, and a write must not half-happen because of a typo in one name).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import ErrorCode
from proxy.protocol.message_types import ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse
from proxy.virtual.names import MIN_SHARES, VirtualNames, VirtualTopic
from proxy.virtual.rewrite import refusal_message

_TOPIC_RESOURCE = 2
_INVALID = int(ErrorCode.INVALID_TOPIC_EXCEPTION)

Lookup = Callable[[str], "VirtualTopic | None"]
IdLookup = Callable[[uuid.UUID], "VirtualTopic | None"]

_ACTIONS = {
    ApiKey.PRODUCE: "producing",
    ApiKey.DELETE_RECORDS: "deleting records",
    ApiKey.CREATE_TOPICS: "creating it",
    ApiKey.DELETE_TOPICS: "deleting it",
    ApiKey.CREATE_PARTITIONS: "adding partitions",
    ApiKey.ALTER_CONFIGS: "altering its configs",
    ApiKey.INCREMENTAL_ALTER_CONFIGS: "altering its configs",
}
REFUSED_APIS = tuple(_ACTIONS)


def _names(api_key: int, body: Any, by_id: IdLookup | None) -> list[str]:
    if api_key == ApiKey.PRODUCE:
        # v13+ names a topic by id only: a virtual id is the one Metadata handed out
        return [t.name or _virtual_name(t.topic_id, by_id) for t in body.topic_data]
    if api_key in (ApiKey.DELETE_RECORDS, ApiKey.CREATE_TOPICS, ApiKey.CREATE_PARTITIONS):
        return [t.name for t in body.topics]
    if api_key == ApiKey.DELETE_TOPICS:
        if body.topics:
            return [t.name or "" for t in body.topics]
        return list(body.topic_names or ())
    return [r.resource_name if r.resource_type == _TOPIC_RESOURCE else "" for r in body.resources]


def _virtual_name(topic_id: uuid.UUID | None, by_id: IdLookup | None) -> str:
    vt = by_id(topic_id) if by_id is not None and topic_id is not None else None
    return vt.name if vt is not None else ""


def refuse(api_key: int, version: int, body: Any, lookup: Lookup, by_id: IdLookup | None = None) -> Any | None:
    """The response body refusing ``body`` when it names a virtual topic (by name, or for
    Produce v13+ by the id ``by_id`` knows), else None."""
    names = _names(api_key, body, by_id)
    virtual = {name: vt for name in names if name and (vt := lookup(name)) is not None}
    if not virtual:
        return None
    action = _ACTIONS[ApiKey(api_key)]
    first = next(iter(virtual.values()))

    def message(name: str) -> str:
        vt = virtual.get(name)
        if vt is not None:
            return refusal_message(vt, action)
        return f"refused with {first.name}, a virtual range topic of {first.real} in the same request"

    cls = messages.body_class(api_key, "response")
    response = messages.new_body(api_key, version, "response")
    if api_key == ApiKey.PRODUCE:
        response.responses = [cls.TopicProduceResponse(
            name=t.name, topic_id=t.topic_id,
            partition_responses=[cls.PartitionProduceResponse(index=p.index, error_code=_INVALID, base_offset=-1,
                                                              error_message=message(name))
                                 for p in t.partition_data]) for t, name in zip(body.topic_data, names)]
    elif api_key == ApiKey.DELETE_RECORDS:
        response.topics = [cls.DeleteRecordsTopicResult(name=t.name, partitions=[
            cls.DeleteRecordsPartitionResult(partition_index=p.partition_index, low_watermark=-1, error_code=_INVALID)
            for p in t.partitions]) for t in body.topics]
    elif api_key == ApiKey.CREATE_TOPICS:
        response.topics = [cls.CreatableTopicResult(name=t.name, error_code=_INVALID, error_message=message(t.name))
                           for t in body.topics]
    elif api_key == ApiKey.DELETE_TOPICS:
        response.responses = [cls.DeletableTopicResult(name=name, error_code=_INVALID, error_message=message(name))
                              for name in names]
    elif api_key == ApiKey.CREATE_PARTITIONS:
        response.results = [cls.CreatePartitionsTopicResult(name=t.name, error_code=_INVALID,
                                                            error_message=message(t.name)) for t in body.topics]
    else:
        response.responses = [cls.AlterConfigsResourceResponse(
            error_code=_INVALID, error_message=message(r.resource_name if r.resource_type == _TOPIC_RESOURCE else ""),
            resource_type=r.resource_type, resource_name=r.resource_name) for r in body.resources]
    return response


# -- KIP-848 consumer groups ---------------------------------------------------------------------


# Most names a regular expression is tried against (known real topics x every K), so a
# subscription change costs at most a few milliseconds of the event loop.
REGEX_PROBES = 20_000


def heartbeat_refusal(body: ConsumerGroupHeartbeatRequest, lookup: Lookup, names: VirtualNames, real_topics: Iterable[str] = ()) -> str | None:
    """Why a ConsumerGroupHeartbeat must be refused, or None.

    A ``group.protocol=consumer`` group is assigned by the broker, which knows no virtual
    topic: a member subscribing to one would wait for an assignment forever. Detected where
    the heartbeat names one: a subscribed name; a regular expression that spells a virtual
    name (``orders\\.kr4``); or one that mentions the suffix and matches ``<topic>.kr<K>``
    for a known real topic and a K the proxy serves (``.*\\.kr[0-9]+``). A pattern that
    does not mention the suffix (``orders.*``) subscribes to real topics, as the user meant."""
    for name in body.subscribed_topic_names or ():
        vt = lookup(name) if name else None
        if vt is not None:
            return _heartbeat_message(vt.name, vt.real)
    regex = regex_mentions_suffix(body, names.suffixes)
    if regex is None:
        return None
    for suffix in names.suffixes:
        for candidate in _virtual_candidates(regex.replace("\\", ""), suffix):
            vt = lookup(candidate)
            if vt is not None:
                return _heartbeat_message(f"{vt.name} (in the regular expression {regex!r})", vt.real)
    vt = _first_virtual_match(regex, lookup, names, real_topics)
    if vt is not None:
        return _heartbeat_message(f"{vt.name} (matched by the regular expression {regex!r})", vt.real)
    return None


def regex_mentions_suffix(body: ConsumerGroupHeartbeatRequest, suffixes: str | tuple[str, ...]) -> str | None:
    """The heartbeat's subscription regular expression if it spells a virtual suffix
    (escaped or not), else None: only such an expression is read for virtual names."""
    if isinstance(suffixes, str):
        suffixes = (suffixes,)
    regex = body.subscribed_topic_regex
    if not regex:
        return None
    plain = regex.replace("\\", "")
    return regex if any(suffix in plain for suffix in suffixes) else None


def _first_virtual_match(regex: str, lookup: Lookup, names: VirtualNames,
                         real_topics: Iterable[str]) -> VirtualTopic | None:
    """The first virtual name of a known real topic that ``regex`` matches whole, trying at
    most ``REGEX_PROBES`` names. The broker reads the pattern as RE2J; one that Python's
    ``re`` cannot compile is left to it."""
    try:
        pattern = re.compile(regex)
    except (re.error, RecursionError):
        return None
    probes = 0
    for real in sorted(t for t in real_topics if not t.startswith("__")):
        for shares in range(MIN_SHARES, names.max_shares + 1):
            for striped in (False, True):
                if probes >= REGEX_PROBES:
                    return None
                probes += 1
                name = names.name(real, shares, striped)
                if pattern.fullmatch(name):
                    vt = lookup(name)
                    if vt is not None:
                        return vt
    return None


def _virtual_candidates(text: str, suffix: str) -> list[str]:
    """The names of the form ``<topic><suffix><K>`` in ``text``: each occurrence of the
    suffix with its digits, and the longest topic-name characters before it."""
    out = []
    at = text.find(suffix)
    while at > 0:
        end = at + len(suffix)
        while end < len(text) and text[end].isdigit():
            end += 1
        start = at
        while start > 0 and (text[start - 1].isalnum() or text[start - 1] in "._-"):
            start -= 1
        if end > at + len(suffix):
            out.append(text[start:end])
        at = text.find(suffix, at + 1)
    return out


def _heartbeat_message(what: str, real: str) -> str:
    return (f"virtual range topic {what} of {real} needs the classic group protocol (group.protocol=classic): "
            f"a group.protocol=consumer group is assigned by the broker, which does not know virtual topics")


def refuse_heartbeat(version: int, message: str) -> ConsumerGroupHeartbeatResponse:
    """The ConsumerGroupHeartbeat response refusing the member (it does not join)."""
    return ConsumerGroupHeartbeatResponse(throttle_time_ms=0, error_code=_INVALID, error_message=message,
                                          member_id=None, member_epoch=-1, heartbeat_interval_ms=0, assignment=None)
