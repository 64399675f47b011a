"""Rewriting requests that name virtual topics into requests naming real ones, and their
responses back, without I/O: Metadata, ListOffsets, OffsetsForLeaderEpoch, DescribeConfigs,
and the refusals of writes and topic administration.

Each ``*_request`` function changes the decoded request body in place and returns what
its response rewrite needs (None when the request names no virtual topic, so the request
goes on untouched). The broker never sees a virtual name.
"""

from __future__ import annotations

import copy
import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.pipeline.route import OwnRequest, own_correlation_id
from proxy.protocol import messages
from proxy.protocol.constants import ErrorCode
from proxy.protocol.message_types import (
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeTopicPartitionsRequest,
    DescribeTopicPartitionsResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    MetadataRequest,
    MetadataResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
    RequestHeader,
)
from proxy.protocol.message_versions import METADATA_FIRST_ALLOW_AUTO_TOPIC_CREATION, METADATA_FIRST_TOPIC_ID
from proxy.virtual.names import VirtualTopic

# the requests whose partitions ``_partition_request`` spreads over several requests
PartitionRequest = ListOffsetsRequest | OffsetForLeaderEpochRequest

_TOPIC_RESOURCE = 2  # ConfigResource type TOPIC


class Resolver(Protocol):
    """What the rewrites need to know of the cluster."""

    def virtual(self, name: str) -> VirtualTopic | None:
        """The virtual topic ``name`` stands for, None for a real or unknown name."""

    def refusal(self, name: str) -> str | None:
        """Why ``name`` has the virtual form but is not served (K out of bounds, the real
        topic does not accept range fetches); None otherwise."""

    def by_id(self, topic_id: uuid.UUID) -> VirtualTopic | None:
        """The virtual topic of a derived id, None for any other id."""

    def real_id(self, real: str) -> uuid.UUID | None:
        """The real topic's id, when known."""


# -- Metadata --------------------------------------------------------------------------------


@dataclass(slots=True)
class MetadataPlan:
    """The topics a client asked for, in order, and what each became upstream."""

    asked: list[tuple[str | None, uuid.UUID | None, VirtualTopic | None, str | None]] = field(default_factory=list)
    # (name asked, id asked, its virtual topic or None, refusal message or None)
    reals_asked: set[str] = field(default_factory=set)  # real topics the client named itself
    real_ids_asked: set[uuid.UUID] = field(default_factory=set)


def metadata_request(body: MetadataRequest, version: int, resolver: Resolver) -> MetadataPlan | None:
    """Virtual names become their real topics (once each); a name of the virtual form that
    is not served goes nowhere. When only virtual names are asked, auto-creation is off."""
    if not body.topics:
        return None  # every topic: virtual topics are never listed
    plan = MetadataPlan()
    request_topic = MetadataRequest.MetadataRequestTopic
    kept: list[MetadataRequest.MetadataRequestTopic] = []
    upstream_names: set[str] = set()
    any_virtual = any_real = False
    for topic in body.topics:
        name = topic.name
        topic_id = topic.topic_id  # the zero id before v10, or where only the name is asked
        vt = None
        if name:
            vt = resolver.virtual(name)
            refusal = None if vt is not None else resolver.refusal(name)
        else:
            refusal = None
            vt = resolver.by_id(topic_id)
        if refusal is not None:
            plan.asked.append((name, topic_id, None, refusal))
            any_virtual = True
            continue
        if vt is None:
            plan.asked.append((name, topic_id, None, None))
            if name:
                plan.reals_asked.add(name)
                upstream_names.add(name)
            else:
                plan.real_ids_asked.add(topic_id)
            kept.append(topic)
            any_real = True
            continue
        any_virtual = True
        plan.asked.append((name, topic_id, vt, None))
        if vt.real not in upstream_names:
            upstream_names.add(vt.real)
            entry = request_topic(name=vt.real)
            if version >= METADATA_FIRST_TOPIC_ID:
                entry.topic_id = uuid.UUID(int=0)
            kept.append(entry)
    if not any_virtual:
        return None
    body.topics = kept
    if not any_real and version >= METADATA_FIRST_ALLOW_AUTO_TOPIC_CREATION:
        body.allow_auto_topic_creation = False
    return plan


def metadata_response(body: MetadataResponse, version: int, plan: MetadataPlan, resolver: Resolver) -> None:
    response_class = MetadataResponse
    by_name = {t.name: t for t in body.topics or () if t.name}
    by_id = {t.topic_id: t for t in body.topics or ()}
    out: list[MetadataResponse.MetadataResponseTopic] = []
    done: set[int] = set()  # ids of the entries already in ``out``
    for name, topic_id, vt, refusal in plan.asked:
        if refusal is not None:
            out.append(response_class.MetadataResponseTopic(
                error_code=int(ErrorCode.INVALID_TOPIC_EXCEPTION), name=name, partitions=[]))
            continue
        if vt is None:
            real = by_name.get(name) if name else by_id.get(topic_id) if topic_id is not None else None
            if real is not None and id(real) not in done:
                done.add(id(real))
                out.append(real)
            continue
        real = by_name.get(vt.real)
        out.append(virtual_metadata_topic(real, vt, response_class, resolver))
    for topic in body.topics or ():  # anything else the broker added (none expected)
        if topic.name not in by_name or id(topic) in done:
            continue
        if topic.name in plan.reals_asked or topic.topic_id in plan.real_ids_asked:
            if id(topic) not in done:
                done.add(id(topic))
                out.append(topic)
    body.topics = out


def virtual_metadata_topic(real: MetadataResponse.MetadataResponseTopic | None, vt: VirtualTopic,
                           response_class: type[MetadataResponse],
                           resolver: Resolver) -> MetadataResponse.MetadataResponseTopic:
    """The virtual topic's Metadata entry from its real topic's: K partitions per real
    partition, each led by the real partition's leader."""
    if real is None or real.error_code != ErrorCode.NONE:
        error = real.error_code if real is not None else int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        if error == ErrorCode.INVALID_TOPIC_EXCEPTION:
            error = int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        return response_class.MetadataResponseTopic(error_code=error, name=vt.name, partitions=[])
    entry = copy.copy(real)
    entry.name = vt.name
    real_id = real.topic_id
    if real_id != uuid.UUID(int=0):
        entry.topic_id = vt.topic_id(real_id)
    entry.is_internal = False
    partitions = []
    for part in sorted(real.partitions or (), key=lambda p: p.partition_index):
        for share in range(vt.shares):
            virtual = copy.copy(part)
            virtual.partition_index = vt.virtual_partition(part.partition_index, share)
            partitions.append(virtual)
    entry.partitions = partitions
    return entry


# -- partition-level requests: ListOffsets, OffsetsForLeaderEpoch ----------------------------


# Answered to a share whose own question went in a further request that was never answered:
# every client asks again for the partitions answered this (Kafka's answer while a new
# leader's high watermark is not yet known), never someone else's answer.
UNANSWERED = ErrorCode.OFFSET_NOT_AVAILABLE


@dataclass(slots=True)
class PartitionPlan:
    """Which virtual partitions a request asked for: per response topic position, the
    virtual topic and its requested partitions, in order.

    A broker takes one question per partition in a request (ListOffsets answers a partition
    named twice INVALID_REQUEST), yet shares of one real partition may ask different ones
    (``seekToEnd`` of one share and ``seekToBeginning`` of another; OffsetsForLeaderEpoch
    for the epochs each share last fetched in). The client's request carries the first
    question asked of each real partition; each further distinct question goes in a
    request of its own (``extra``, numbered from 1), sent just before the client's on the
    same connection, and every share is answered its own question's answer.
    """

    topics: list[tuple[str, VirtualTopic | None, list[int]]] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # topic name -> message
    # Per ``topics`` entry, per partition asked: the request that asks its question (0: the client's).
    numbers: list[list[int]] = field(default_factory=list)
    # bodies of requests 1, 2, ...: ListOffsets or OffsetsForLeaderEpoch requests
    extra: list[PartitionRequest] = field(default_factory=list)
    # request number -> its response body, once in
    answers: dict[int, ListOffsetsResponse | OffsetForLeaderEpochResponse] = field(default_factory=dict)


def _partition_request(topics: list, partition_field: str, topic_class: Callable[..., Any],
                       resolver: Resolver, name_field: str = "name") -> tuple[list, list[list], PartitionPlan] | None:
    """The client's request's topics, those of each further request, and the plan."""
    plan = PartitionPlan()
    # A real topic the client names itself takes its virtual topics' partitions too: the
    # broker refuses a request naming one topic twice.
    merged: dict[str, Any] = {getattr(t, name_field): t for t in topics
                              if resolver.virtual(getattr(t, name_field)) is None}
    # The questions asked of each real partition, in order: question i goes in request i.
    # The client's own questions of real partitions stay in its request as they are.
    asked: dict[tuple[str, int], list[Any]] = {}
    for topic in topics:
        name = getattr(topic, name_field)
        if resolver.virtual(name) is None and resolver.refusal(name) is None:
            for part in topic.partitions:
                asked.setdefault((name, getattr(part, partition_field)), [part])
    out: list[Any] = []
    further: list[dict[str, Any]] = []  # per request 1, 2, ...: real topic -> its entry
    any_virtual = False
    for topic in topics:
        name = getattr(topic, name_field)
        vt = resolver.virtual(name)
        refusal = None if vt is not None else resolver.refusal(name)
        parts = [getattr(p, partition_field) for p in topic.partitions]
        if refusal is not None:
            any_virtual = True
            plan.refused[name] = refusal
            plan.topics.append((name, None, parts))
            plan.numbers.append([0] * len(parts))
            continue
        if vt is None:
            plan.topics.append((name, None, parts))
            plan.numbers.append([0] * len(parts))
            out.append(topic)
            continue
        any_virtual = True
        plan.topics.append((name, vt, parts))
        numbers: list[int] = []
        plan.numbers.append(numbers)
        for part in topic.partitions:
            real_part = vt.real_partition(getattr(part, partition_field))
            moved = copy.copy(part)
            setattr(moved, partition_field, real_part)
            questions = asked.setdefault((vt.real, real_part), [])
            if moved in questions:  # another share asked the same: one answer serves both
                numbers.append(questions.index(moved))
                continue
            number = len(questions)
            questions.append(moved)
            numbers.append(number)
            if number == 0:
                target = merged.get(vt.real)
                if target is None:
                    target = merged[vt.real] = topic_class(**{name_field: vt.real, "partitions": []})
                    out.append(target)
            else:
                if len(further) < number:
                    further.append({})
                request = further[number - 1]
                target = request.get(vt.real)
                if target is None:
                    target = request[vt.real] = topic_class(**{name_field: vt.real, "partitions": []})
            target.partitions.append(moved)
    if not any_virtual:
        return None
    return out, [list(request.values()) for request in further], plan


def _with_topics(body: PartitionRequest, topics: list) -> PartitionRequest:
    extra = copy.copy(body)
    extra.topics = topics
    return extra


def list_offsets_request(body: ListOffsetsRequest, resolver: Resolver) -> PartitionPlan | None:
    topic_class = ListOffsetsRequest.ListOffsetsTopic
    done = _partition_request(body.topics, "partition_index", topic_class, resolver)
    if done is None:
        return None
    body.topics, further, plan = done
    plan.extra = [_with_topics(body, topics) for topics in further]
    return plan


def list_offsets_response(body: ListOffsetsResponse, plan: PartitionPlan) -> None:
    cls = ListOffsetsResponse
    _partition_response(body, plan, "topics", "name", "partitions", "partition_index",
                        lambda name: cls.ListOffsetsTopicResponse(name=name, partitions=[]),
                        lambda index: cls.ListOffsetsPartitionResponse(
                            partition_index=index, error_code=int(ErrorCode.INVALID_TOPIC_EXCEPTION)))


def offsets_for_leader_epoch_request(body: OffsetForLeaderEpochRequest, resolver: Resolver) -> PartitionPlan | None:
    topic_class = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
    done = _partition_request(body.topics, "partition", topic_class, resolver, name_field="topic")
    if done is None:
        return None
    body.topics, further, plan = done
    plan.extra = [_with_topics(body, topics) for topics in further]
    return plan


def offsets_for_leader_epoch_response(body: OffsetForLeaderEpochResponse, plan: PartitionPlan) -> None:
    cls = OffsetForLeaderEpochResponse
    _partition_response(body, plan, "topics", "topic", "partitions", "partition",
                        lambda name: cls.OffsetForLeaderTopicResult(topic=name, partitions=[]),
                        lambda index: cls.EpochEndOffset(partition=index,
                                                         error_code=int(ErrorCode.INVALID_TOPIC_EXCEPTION)))


def extra_requests(header: RequestHeader, api_key: int, plan: PartitionPlan) -> tuple[OwnRequest, ...]:
    """The plan's further requests as requests of the proxy's own, to go upstream right
    before the client's (``Route.before``) under the client's header (its version and
    client id): each one's response is kept in ``plan.answers`` for the response rewrite."""
    own = []
    for number, body in enumerate(plan.extra, start=1):
        correlation_id = own_correlation_id()
        frame = messages.encode_request(dataclasses.replace(header, correlation_id=correlation_id), body)
        own.append(OwnRequest(frame, api_key, header.request_api_version, correlation_id,
                              _keep_answer(plan, number, api_key, header.request_api_version)))
    return tuple(own)


def _keep_answer(plan: PartitionPlan, number: int, api_key: int, version: int) -> Callable[[bytes], Awaitable[None]]:
    async def keep(raw: bytes) -> None:
        _, plan.answers[number] = messages.decode_response(api_key, version, raw)

    return keep


def _partition_response(body: Any, plan: PartitionPlan, topics_field: str, name_field: str,
                        partitions_field: str, index_field: str, new_topic, new_refused) -> None:
    responses = {0: body, **plan.answers}  # request number -> the broker's response
    answered = {getattr(t, name_field): t for t in getattr(body, topics_field) or ()}
    indexed: dict[tuple[int, str], dict[int, Any]] = {}  # (request number, real topic) -> partition -> answer

    def answer_of(number: int, real: str, partition: int) -> Any:
        key = (number, real)
        if key not in indexed:
            topics = getattr(responses[number], topics_field) or ()
            indexed[key] = {getattr(p, index_field): p for t in topics if getattr(t, name_field) == real
                            for p in getattr(t, partitions_field) or ()}
        return indexed[key].get(partition)

    out = []
    for (name, vt, parts), numbers in zip(plan.topics, plan.numbers, strict=True):
        if name in plan.refused:
            topic = new_topic(name)
            setattr(topic, partitions_field, [new_refused(index) for index in parts])
            out.append(topic)
            continue
        if vt is None:
            real = answered.get(name)
            if real is not None:
                entry = copy.copy(real)
                asked = set(parts)
                setattr(entry, partitions_field,
                        [p for p in getattr(real, partitions_field) or () if getattr(p, index_field) in asked])
                out.append(entry)
            continue
        topic = new_topic(name)
        entries = []
        for index, number in zip(parts, numbers, strict=True):
            if number not in responses:
                entry = new_refused(index)
                entry.error_code = int(UNANSWERED)
            elif (source := answer_of(number, vt.real, vt.real_partition(index))) is None:
                entry = new_refused(index)
                entry.error_code = int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            else:
                entry = copy.copy(source)
                setattr(entry, index_field, index)
            entries.append(entry)
        setattr(topic, partitions_field, entries)
        out.append(topic)
    setattr(body, topics_field, out)


# -- DescribeConfigs ---------------------------------------------------------------------------


def describe_configs_request(body: DescribeConfigsRequest, resolver: Resolver) -> dict[int, str] | None:
    """A virtual topic's configs are its real topic's: position in the request -> the name asked."""
    renamed: dict[int, str] = {}
    for number, resource in enumerate(body.resources or ()):
        if resource.resource_type != _TOPIC_RESOURCE:
            continue
        vt = resolver.virtual(resource.resource_name)
        if vt is not None:
            renamed[number] = resource.resource_name
            resource.resource_name = vt.real
    return renamed or None


def describe_configs_response(body: DescribeConfigsResponse, renamed: dict[int, str]) -> None:
    for number, result in enumerate(body.results or ()):
        if number in renamed:
            result.resource_name = renamed[number]


# -- refusals ----------------------------------------------------------------------------------


def refusal_message(vt: VirtualTopic, what: str) -> str:
    shares = f"{vt.shares} stripes" if vt.striped else f"{vt.shares} shares"
    return (f"{vt.name} is a virtual range topic of {vt.real} ({shares}): {what} is refused; "
            f"use {vt.real}")


# -- DescribeTopicPartitions (the admin client's describeTopics) --------------------------------


# A DescribeTopicPartitions request's topics, in order: the name asked, its virtual topic or refusal.
Described = list[tuple[str, VirtualTopic | None, str | None]]


def describe_topic_partitions_request(body: DescribeTopicPartitionsRequest, resolver: Resolver) -> Described | None:
    """Virtual names become their real topics; the names asked, in order, with their
    virtual topic or refusal. A cursor naming a virtual topic starts at its real one."""
    cls = DescribeTopicPartitionsRequest
    asked: Described = []
    kept: list[DescribeTopicPartitionsRequest.TopicRequest] = []
    upstream: set[str] = set()
    any_virtual = False
    for topic in body.topics or ():
        vt = resolver.virtual(topic.name)
        refusal = None if vt is not None else resolver.refusal(topic.name)
        asked.append((topic.name, vt, refusal))
        if refusal is not None:
            any_virtual = True
            continue
        real = vt.real if vt is not None else topic.name
        any_virtual |= vt is not None
        if real not in upstream:
            upstream.add(real)
            kept.append(topic if vt is None else cls.TopicRequest(name=real))
    if not any_virtual:
        return None
    body.topics = kept
    if body.cursor is not None:
        vt = resolver.virtual(body.cursor.topic_name)
        if vt is not None:
            body.cursor.topic_name = vt.real
            body.cursor.partition_index = vt.real_partition(body.cursor.partition_index)
    return asked


def describe_topic_partitions_response(body: DescribeTopicPartitionsResponse, asked: Described,
                                       resolver: Resolver) -> None:
    cls = DescribeTopicPartitionsResponse
    by_name = {t.name: t for t in body.topics or ()}
    out = []
    for name, vt, refusal in asked:
        if refusal is not None:
            out.append(cls.DescribeTopicPartitionsResponseTopic(
                error_code=int(ErrorCode.INVALID_TOPIC_EXCEPTION), name=name, partitions=[]))
        elif vt is None:
            if name in by_name:
                out.append(by_name[name])
        else:
            real = by_name.get(vt.real)
            if real is None or real.error_code != ErrorCode.NONE:
                out.append(cls.DescribeTopicPartitionsResponseTopic(
                    error_code=real.error_code if real is not None else int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                    name=name, partitions=[]))
                continue
            entry = copy.copy(real)
            entry.name = name
            if real.topic_id is not None and real.topic_id != uuid.UUID(int=0):
                entry.topic_id = vt.topic_id(real.topic_id)
            entry.is_internal = False
            entry.partitions = [_moved(part, vt.virtual_partition(part.partition_index, share))
                                for part in sorted(real.partitions or (), key=lambda p: p.partition_index)
                                for share in range(vt.shares)]
            out.append(entry)
    body.topics = out
    body.next_cursor = None


def _moved(part: DescribeTopicPartitionsResponse.DescribeTopicPartitionsResponsePartition,
           index: int) -> DescribeTopicPartitionsResponse.DescribeTopicPartitionsResponsePartition:
    moved = copy.copy(part)
    moved.partition_index = index
    return moved
