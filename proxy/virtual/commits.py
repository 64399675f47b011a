"""Commits of virtual partitions by share watermark: the requests and responses, without
I/O (docs/wire-contract.md#9-virtual-range-topics).

A standard OffsetCommit of offset X on virtual partition (p, share i) means "share i of p
is processed below X": the share's watermark W(i) = X. The watermarks live in the real
partition's record of ``__individual_commit_offsets``, next to its individual-commit state;
the commit layer (``proxy.commits.writes``) plans each commit: the real partition's S (at
least the lowest watermark once every share has one) and the watermarks as metadata, both
sent to the coordinator in the client's own OffsetCommit (so the broker checks the
member's generation and id), then, for partitions the coordinator accepted, the log
record, before the client is answered.

This module turns the client's request into the real one (``commit_plan``,
``commit_request``) and the coordinator's answer into the client's (``commit_response``);
OffsetFetch of a virtual partition answers W(i), or S where share i has none yet.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from proxy.protocol.constants import ErrorCode
from proxy.protocol.message_types import (
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from proxy.protocol.message_versions import OFFSET_FETCH_FIRST_GROUPS
from proxy.virtual.names import VirtualTopic
from proxy.virtual.rewrite import Resolver

RealKey = tuple[str, int]  # (real topic, real partition)


# -- OffsetCommit ------------------------------------------------------------------------------


@dataclass(slots=True)
class CommitPlan:
    group: str
    topics: list[tuple[str, VirtualTopic | None, list[int]]] = field(default_factory=list)  # as asked
    edits: dict[RealKey, dict[int, dict[int, int]]] = field(default_factory=dict)  # real -> K -> share -> W
    plain: dict[RealKey, int] = field(default_factory=dict)  # real partitions committed plainly
    refused: dict[RealKey, int] = field(default_factory=dict)  # real partitions answered without the broker


def commit_plan(body: OffsetCommitRequest, resolver: Resolver) -> CommitPlan | None:
    """What the commit asks: watermarks per real partition, plain commits of real
    partitions beside them. A real partition with offset ranges in the same request is
    refused (INVALID_REQUEST): the request is the virtual topics' to complete, and range
    commits are individual commit's. None when the request names no virtual partition."""
    plan = CommitPlan(body.group_id)
    for topic in body.topics:
        vt = resolver.virtual(topic.name) if topic.name else None
        plan.topics.append((topic.name, vt, [p.partition_index for p in topic.partitions]))
        for part in topic.partitions:
            if vt is None:
                key = (topic.name, part.partition_index)
                if part.offset_ranges:
                    plan.refused[key] = int(ErrorCode.INVALID_REQUEST)
                else:
                    plan.plain[key] = part.committed_offset
                continue
            key = (vt.real, vt.real_partition(part.partition_index))
            plan.edits.setdefault(key, {}).setdefault(vt.mark_k, {})[vt.share(part.partition_index)] = \
                part.committed_offset
    if not plan.edits:
        return None
    for key in plan.edits:
        if key in plan.plain:  # a real partition committed both ways at once: the plain one is refused
            plan.refused[key] = int(ErrorCode.INVALID_REQUEST)
            del plan.plain[key]
    return plan


def commit_request(body: OffsetCommitRequest, plan: CommitPlan, offsets: dict[RealKey, tuple[int, str]],
                   refused: dict[RealKey, int]) -> bool:
    """Rewrite ``body`` into the real commit: every real partition with watermarks at
    ``offsets[key]`` (S and the metadata), plain ones as asked, ``refused`` ones left out.
    Returns whether anything is left to send."""
    cls = OffsetCommitRequest
    virtual = {vt.name for _, vt, _ in plan.topics if vt is not None}
    body.topics = real_topics(body.topics, virtual, offsets, refused, cls.OffsetCommitRequestTopic,
                              cls.OffsetCommitRequestPartition)
    return bool(body.topics)


def real_topics(topics: list, virtual: set[str], offsets: dict[RealKey, tuple[int, str]],
                refused: dict[RealKey, int], topic_class, partition_class) -> list:
    """The topics of a commit request (OffsetCommit or TxnOffsetCommit: ``topic_class``,
    ``partition_class``) with its ``virtual`` topics taken out, the real partitions of
    ``offsets`` put in at (offset, metadata), and ``refused`` partitions left out."""
    out: dict[str, Any] = {}
    for topic in topics:
        if topic.name in virtual:
            continue
        kept = [p for p in topic.partitions if (topic.name, p.partition_index) not in refused]
        if kept:
            out.setdefault(topic.name, topic_class(name=topic.name, partitions=[])).partitions.extend(kept)
    for (real, partition), (offset, metadata) in sorted(offsets.items()):
        if (real, partition) in refused:
            continue
        target = out.get(real)
        if target is None:
            target = out[real] = topic_class(name=real, partitions=[])
        target.partitions.append(partition_class(partition_index=partition, committed_offset=offset,
                                                 committed_leader_epoch=-1, committed_metadata=metadata))
    return list(out.values())


def commit_response(body: OffsetCommitResponse, plan: CommitPlan, errors: dict[RealKey, int],
                    refused: dict[RealKey, int]) -> None:
    """Each partition asked gets its real partition's answer: ``refused`` first, then
    ``errors`` (the log's outcome), then the coordinator's."""
    cls = OffsetCommitResponse
    broker = {(t.name, p.partition_index): p.error_code for t in body.topics for p in t.partitions}

    def error_of(key: RealKey) -> int:
        if key in refused:
            return refused[key]
        if key in errors:
            return errors[key]
        return broker.get(key, int(ErrorCode.UNKNOWN_SERVER_ERROR))

    out = []
    for name, vt, parts in plan.topics:
        if vt is None:
            out.append(cls.OffsetCommitResponseTopic(name=name, partitions=[
                cls.OffsetCommitResponsePartition(partition_index=index, error_code=error_of((name, index)))
                for index in parts]))
            continue
        out.append(cls.OffsetCommitResponseTopic(name=name, partitions=[
            cls.OffsetCommitResponsePartition(partition_index=index,
                                              error_code=error_of((vt.real, vt.real_partition(index))))
            for index in parts]))
    body.topics = out


# -- OffsetFetch -------------------------------------------------------------------------------


@dataclass(slots=True)
class OffsetFetchPlan:
    """Per group (None: the single-group form v0-7), the topics asked, in order."""

    groups: dict[str | None, list[tuple[str, VirtualTopic | None, list[int] | None]]] = field(default_factory=dict)
    all_topics: set[str | None] = field(default_factory=set)  # groups asked for every topic
    group_id: str = ""  # the single-group form's group
    unavailable: set[str] = field(default_factory=set)  # groups whose log could not be read
    # (group, real topic, real partition, K, share) -> (error, client metadata) of the
    # share's shadow group (transactional commits): UNSTABLE_OFFSET_COMMIT while its
    # transaction is open (RequireStable), else the metadata the client committed with W(i)
    shadows: dict[tuple[str, str, int, int, int], tuple[int, str]] = field(default_factory=dict)
    # (group, real key) -> the committed shadow watermarks (K, share, W, epoch, sequence)
    shadow_marks: dict[tuple[str, RealKey], list[tuple[int, int, int, int, int]]] = field(default_factory=dict)

    def virtual_partitions(self) -> list[tuple[str, VirtualTopic, int]]:
        """(group, virtual topic, virtual partition) of every virtual partition asked by name."""
        out: list[tuple[str, VirtualTopic, int]] = []
        for group, asked in self.groups.items():
            group_id = group if group is not None else self.group_id
            for _name, vt, parts in asked:
                if vt is not None:
                    out.extend((group_id, vt, index) for index in parts or ())
        return out

    def group_ids(self) -> list[str]:
        return [group if group is not None else self.group_id for group in self.groups]


def _rewrite_topics(topics: list | None, topic_class, names_field: str, resolver: Resolver,
                    asked: list) -> tuple[list | None, bool]:
    if topics is None:
        return None, False
    out, any_virtual = [], False
    merged = {t.name: t for t in topics if not (t.name and resolver.virtual(t.name))}
    for topic in topics:
        vt = resolver.virtual(topic.name) if topic.name else None
        parts = list(getattr(topic, names_field))
        asked.append((topic.name, vt, parts))
        if vt is None:
            out.append(topic)
            continue
        any_virtual = True
        target = merged.get(vt.real)
        if target is None:
            target = merged[vt.real] = topic_class(name=vt.real, **{names_field: []})
            out.append(target)
        for index in parts:
            real_partition = vt.real_partition(index)
            if real_partition not in getattr(target, names_field):
                getattr(target, names_field).append(real_partition)
    return out, any_virtual


def offset_fetch_request(body: OffsetFetchRequest, version: int, resolver: Resolver) -> OffsetFetchPlan:
    """Virtual partitions become their real partitions; always returns a plan, since a
    request for every topic gets the virtual partitions the watermarks show."""
    cls = OffsetFetchRequest
    plan = OffsetFetchPlan()
    if version >= OFFSET_FETCH_FIRST_GROUPS:
        for group in body.groups:
            asked: list = []
            group.topics, _ = _rewrite_topics(group.topics, cls.OffsetFetchRequestTopics, "partition_indexes",
                                              resolver, asked)
            plan.groups[group.group_id] = asked
            if group.topics is None:
                plan.all_topics.add(group.group_id)
    else:
        asked = []
        plan.group_id = body.group_id
        body.topics, _ = _rewrite_topics(body.topics, cls.OffsetFetchRequestTopic, "partition_indexes",
                                         resolver, asked)
        plan.groups[None] = asked
        if body.topics is None:
            plan.all_topics.add(None)
    return plan


MarksOf = Callable[[str, str, int, int, "str | None"], "tuple[int, dict[int, list[int]]]"]


def offset_fetch_response(body: OffsetFetchResponse, version: int, plan: OffsetFetchPlan, marks_of: MarksOf,
                          name_of_virtual: Callable[[str, int], str]) -> None:
    """Answer virtual partitions with W(i) (or S). ``marks_of(group, real, partition,
    committed, metadata)`` gives S and W per share per K of a real partition (the log's
    record combined with the coordinator's answer). For a request of every topic, add the
    virtual partitions of every real partition holding watermarks (``name_of_virtual(real,
    K)`` names them). A group whose log could not be read is answered
    COORDINATOR_NOT_AVAILABLE (retriable), never from state older than the log."""
    cls = OffsetFetchResponse
    if version >= OFFSET_FETCH_FIRST_GROUPS:
        for group in body.groups or ():
            asked = plan.groups.get(group.group_id)
            if asked is None:
                continue
            if group.group_id in plan.unavailable and group.error_code == ErrorCode.NONE:
                group.error_code = int(ErrorCode.COORDINATOR_NOT_AVAILABLE)
                group.topics = []
                continue
            group.topics = _answer(group.group_id, group.topics, asked, group.group_id in plan.all_topics, marks_of,
                                   cls.OffsetFetchResponseTopics, cls.OffsetFetchResponsePartitions, name_of_virtual,
                                   plan.shadows)
    else:
        if plan.group_id in plan.unavailable and body.error_code == ErrorCode.NONE:
            body.error_code = int(ErrorCode.COORDINATOR_NOT_AVAILABLE)
            body.topics = []
            return
        asked = plan.groups.get(None, [])
        body.topics = _answer(plan.group_id, body.topics, asked, None in plan.all_topics, marks_of,
                              cls.OffsetFetchResponseTopic, cls.OffsetFetchResponsePartition, name_of_virtual,
                              plan.shadows)


def _answer(group: str, topics: list, asked: list, every: bool, marks_of: MarksOf, topic_class, part_class,
            name_of_virtual, shadows: dict[tuple[str, str, int, int, int], tuple[int, str]]) -> list:
    answered = {t.name: t for t in topics or ()}
    sources = {(t.name, p.partition_index): p for t in topics or () for p in t.partitions}
    known: dict[RealKey, tuple[int, dict[int, list[int]]]] = {}
    pending_carrier: set[RealKey] = set()
    for (real, partition), part in sources.items():
        if part.error_code == ErrorCode.NONE:
            known[(real, partition)] = marks_of(group, real, partition, part.committed_offset, part.metadata)
        elif part.error_code == ErrorCode.UNSTABLE_OFFSET_COMMIT:
            # Another share's transaction holds a carrier of the real partition: a share's own
            # pending commit shows in its shadow; the others read the log's state.
            known[(real, partition)] = marks_of(group, real, partition, -1, None)
            pending_carrier.add((real, partition))
    out = []
    if every:
        out = list(topics or ())
        extra: dict[str, Any] = {}
        for (real, partition), (stable, per_k) in sorted(known.items()):
            for shares, marks in sorted(per_k.items()):
                name = name_of_virtual(real, shares)
                topic = extra.get(name)
                if topic is None:
                    topic = extra[name] = topic_class(name=name, partitions=[])
                    out.append(topic)
                for share, mark in enumerate(marks):  # one per share: K is len(marks), whatever ``shares`` keys
                    topic.partitions.append(part_class(partition_index=partition * len(marks) + share,
                                                       committed_offset=mark if mark >= 0 else stable,
                                                       committed_leader_epoch=-1, metadata="",
                                                       error_code=int(ErrorCode.NONE)))
        return out
    for name, vt, parts in asked:
        if vt is None:
            if name in answered:
                entry = copy.copy(answered[name])
                wanted = set(parts or ())
                entry.partitions = [p for p in entry.partitions if p.partition_index in wanted]
                out.append(entry)
            continue
        entries = []
        for index in parts or ():
            real_partition = vt.real_partition(index)
            source = sources.get((vt.real, real_partition))
            if source is None:
                entries.append(part_class(partition_index=index, committed_offset=-1, committed_leader_epoch=-1,
                                          metadata="", error_code=int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)))
                continue
            offset, error = source.committed_offset, source.error_code
            if (vt.real, real_partition) in pending_carrier:
                error = int(ErrorCode.NONE)
            found = known.get((vt.real, real_partition))
            if found is not None:
                stable, per_k = found
                mark = per_k.get(vt.mark_k, [-1] * vt.shares)[vt.share(index)]
                offset = mark if mark >= 0 else stable
            metadata = ""
            shadow = shadows.get((group, vt.real, real_partition, vt.mark_k, vt.share(index)))
            if shadow is not None:
                shadow_error, metadata = shadow
                if error == ErrorCode.NONE and shadow_error != ErrorCode.NONE:
                    offset, error, metadata = -1, shadow_error, ""
            entries.append(part_class(partition_index=index, committed_offset=offset, committed_leader_epoch=-1,
                                      metadata=metadata, error_code=error))
        out.append(topic_class(name=name, partitions=entries))
    return out
