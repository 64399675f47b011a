"""Commits of virtual partitions by share watermark, without I/O.

A standard OffsetCommit of offset X on virtual partition (p, share i) means "share i of p
is processed below X": the share's watermark W(i) = X. The real partition's stable offset
S is the lowest watermark once every share has one (a share without one counts as the S
it started from), and it reaches the coordinator as the real partition's committed offset,
in the client's own OffsetCommit (so the broker checks the member's generation and id, and
rejects a fenced member's commit as a whole). The watermarks travel with it, in the
committed offset's metadata string, so the coordinator stores them atomically with S and
any proxy instance reads them back (``OffsetFetch``) after a restart.

OffsetFetch of a virtual partition answers W(i), or S where share i has none yet.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import ErrorCode
from proxy.virtual.names import VirtualTopic
from proxy.virtual.rewrite import Resolver

_PREFIX = "keyrange.watermarks/1:"

Key = tuple[str, str, int]  # (group, real topic, real partition)


@dataclass(slots=True)
class Watermarks:
    """One real partition's state in one group: S, and W(i) per share (-1: none yet)."""

    shares: int
    marks: list[int]
    stable: int = -1

    def stable_after(self) -> int:
        """S as the watermarks make it: the lowest, a missing one counting as S."""
        lowest = None
        for mark in self.marks:
            value = mark if mark >= 0 else self.stable
            if value < 0:
                return -1
            lowest = value if lowest is None else min(lowest, value)
        return lowest if lowest is not None else self.stable

    def mark(self, share: int) -> int:
        mark = self.marks[share]
        return mark if mark >= 0 else self.stable


def encode_marks(marks: Watermarks) -> str:
    return f"{_PREFIX}{marks.shares}:" + ",".join(str(mark) for mark in marks.marks)


def decode_marks(metadata: str | None, stable: int) -> Watermarks | None:
    """The watermarks in a committed offset's metadata, None when it holds none."""
    if not metadata or not metadata.startswith(_PREFIX):
        return None
    try:
        shares_text, _, rest = metadata[len(_PREFIX):].partition(":")
        shares = int(shares_text)
        marks = [int(part) for part in rest.split(",")]
    except ValueError:
        return None
    if shares < 1 or len(marks) != shares:
        return None
    return Watermarks(shares, marks, stable)


class WatermarkTable:
    """What this instance knows of every (group, real partition): learnt from the
    coordinator's answers and from the commits it accepted."""

    def __init__(self) -> None:
        self.entries: dict[Key, Watermarks] = {}

    def get(self, key: Key, shares: int) -> Watermarks | None:
        marks = self.entries.get(key)
        if marks is not None and marks.shares != shares:
            return None
        return marks

    def learn(self, key: Key, committed: int, metadata: str | None, shares: int | None = None) -> Watermarks | None:
        """The coordinator's word on ``key``: its committed offset and metadata. What this
        instance holds already stays (it has every commit it accepted; the coordinator's
        copy may be one written before another share's commit landed)."""
        held = self.entries.get(key)
        if held is not None and (shares is None or held.shares == shares):
            return held
        marks = decode_marks(metadata, committed)
        if marks is None:
            if shares is None:
                self.entries.pop(key, None)
                return None
            marks = Watermarks(shares, [-1] * shares, committed)
        self.entries[key] = marks
        return marks


# -- OffsetCommit ------------------------------------------------------------------------------


@dataclass(slots=True)
class CommitPlan:
    group: str
    topics: list[tuple[str, VirtualTopic | None, list[int]]] = field(default_factory=list)  # as asked
    new: dict[tuple[str, int], Watermarks] = field(default_factory=dict)  # real partition -> its new state
    reals_asked: set[tuple[str, int]] = field(default_factory=set)
    named: dict[tuple[str, int], set[int]] = field(default_factory=dict)  # shares this commit sets

    def keys(self) -> list[Key]:
        return [(self.group, real, partition) for real, partition in self.new]


def commit_targets(body: Any, resolver: Resolver) -> dict[tuple[str, int], int] | None:
    """(real topic, real partition) -> K of every virtual partition the commit names (so
    the caller can lock and load them first); None when it names none."""
    out: dict[tuple[str, int], int] = {}
    for topic in body.topics:
        vt = resolver.virtual(topic.name) if topic.name else None
        if vt is None:
            continue
        for part in topic.partitions:
            out[(vt.real, vt.real_partition(part.partition_index))] = vt.shares
    return out or None


def commit_request(body: Any, resolver: Resolver, table: WatermarkTable) -> CommitPlan | None:
    """Virtual partitions become their real partitions, committed at the new S with the
    watermarks in the metadata. Call with the keys loaded into ``table``."""
    cls = messages.body_class(ApiKey.OFFSET_COMMIT, "request")
    plan = CommitPlan(body.group_id)
    kept = []
    merged: dict[str, Any] = {t.name: t for t in body.topics if not (t.name and resolver.virtual(t.name))}
    any_virtual = False
    for topic in body.topics:
        vt = resolver.virtual(topic.name) if topic.name else None
        plan.topics.append((topic.name, vt, [p.partition_index for p in topic.partitions]))
        if vt is None:
            kept.append(topic)
            plan.reals_asked.update((topic.name, p.partition_index) for p in topic.partitions)
            continue
        any_virtual = True
        for part in topic.partitions:
            real_partition = vt.real_partition(part.partition_index)
            key = (vt.real, real_partition)
            marks = plan.new.get(key)
            if marks is None:
                known = table.get((plan.group, *key), vt.shares)
                marks = copy.deepcopy(known) if known is not None else Watermarks(vt.shares, [-1] * vt.shares)
                plan.new[key] = marks
            marks.marks[vt.share(part.partition_index)] = part.committed_offset
            plan.named.setdefault(key, set()).add(vt.share(part.partition_index))
    if not any_virtual:
        return None
    for (real, partition), marks in plan.new.items():
        target = merged.get(real)
        if target is None:
            target = merged[real] = cls.OffsetCommitRequestTopic(name=real, partitions=[])
            kept.append(target)
        target.partitions = [p for p in target.partitions if p.partition_index != partition]
        target.partitions.append(cls.OffsetCommitRequestPartition(
            partition_index=partition, committed_offset=marks.stable_after(), committed_leader_epoch=-1,
            committed_metadata=encode_marks(marks)))
    body.topics = kept
    return plan


def commit_response(body: Any, plan: CommitPlan, table: WatermarkTable) -> None:
    """Virtual partitions get their real partition's answer; accepted watermarks are kept."""
    cls = messages.body_class(ApiKey.OFFSET_COMMIT, "response")
    errors = {(t.name, p.partition_index): p.error_code for t in body.topics for p in t.partitions}
    for key, marks in plan.new.items():
        if errors.get(key) != ErrorCode.NONE:
            continue
        # Only the shares this commit named change: a commit of another share accepted
        # meanwhile (another member, another connection) stays.
        current = table.entries.get((plan.group, *key))
        if current is None or current.shares != marks.shares:
            current = table.entries[(plan.group, *key)] = Watermarks(marks.shares, [-1] * marks.shares, marks.stable)
        for share in plan.named.get(key, ()):
            current.marks[share] = marks.marks[share]
        current.stable = current.stable_after()
    answered = {t.name: t for t in body.topics}
    out = []
    for name, vt, parts in plan.topics:
        if vt is None:
            if name in answered:
                entry = copy.copy(answered[name])
                entry.partitions = [p for p in entry.partitions if p.partition_index in set(parts)]
                out.append(entry)
            continue
        out.append(cls.OffsetCommitResponseTopic(name=name, partitions=[
            cls.OffsetCommitResponsePartition(
                partition_index=index,
                error_code=errors.get((vt.real, vt.real_partition(index)), int(ErrorCode.UNKNOWN_SERVER_ERROR)))
            for index in parts]))
    body.topics = out


# -- OffsetFetch -------------------------------------------------------------------------------


@dataclass(slots=True)
class FetchPlan:
    """Per group (None: the single-group form v0-7), the topics asked, in order."""

    groups: dict[str | None, list[tuple[str, VirtualTopic | None, list[int] | None]]] = field(default_factory=dict)
    all_topics: set[str | None] = field(default_factory=set)  # groups asked for every topic
    group_id: str = ""  # the single-group form's group


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


def offset_fetch_request(body: Any, version: int, resolver: Resolver) -> FetchPlan:
    """Virtual partitions become their real partitions; always returns a plan, since a
    request for every topic gets the virtual partitions the watermarks show."""
    cls = messages.body_class(ApiKey.OFFSET_FETCH, "request")
    plan = FetchPlan()
    if version >= 8:
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


def offset_fetch_response(body: Any, version: int, plan: FetchPlan, table: WatermarkTable,
                          name_of_virtual) -> None:
    """Answer virtual partitions with W(i) (or S); learn what the coordinator holds. For a
    request of every topic, add the virtual partitions of every real partition holding
    watermarks (``name_of_virtual(real, K)`` names them)."""
    cls = messages.body_class(ApiKey.OFFSET_FETCH, "response")
    if version >= 8:
        for group in body.groups or ():
            asked = plan.groups.get(group.group_id)
            if asked is None:
                continue
            group.topics = _answer(group.group_id, group.topics, asked, group.group_id in plan.all_topics, table,
                                   cls.OffsetFetchResponseTopics, cls.OffsetFetchResponsePartitions, name_of_virtual)
    else:
        asked = plan.groups.get(None, [])
        body.topics = _answer(plan.group_id, body.topics, asked, None in plan.all_topics, table,
                              cls.OffsetFetchResponseTopic, cls.OffsetFetchResponsePartition, name_of_virtual)


def _answer(group: str, topics: list, asked: list, every: bool, table: WatermarkTable, topic_class, part_class,
            name_of_virtual) -> list:
    answered = {t.name: t for t in topics or ()}
    sources = {(t.name, p.partition_index): p for t in topics or () for p in t.partitions}
    virtual_shares = {vt.real: vt.shares for _, vt, _ in asked if vt is not None}
    for (real, partition), part in sources.items():
        if part.error_code == ErrorCode.NONE:
            table.learn((group, real, partition), part.committed_offset, part.metadata, virtual_shares.get(real))
    out = []
    if every:
        out = list(topics or ())
        extra: dict[str, Any] = {}
        for (real, partition), part in sorted(sources.items()):
            marks = table.entries.get((group, real, partition))
            if marks is None or part.error_code != ErrorCode.NONE:
                continue
            name = name_of_virtual(real, marks.shares)
            topic = extra.get(name)
            if topic is None:
                topic = extra[name] = topic_class(name=name, partitions=[])
                out.append(topic)
            for share in range(marks.shares):
                topic.partitions.append(part_class(partition_index=partition * marks.shares + share,
                                                   committed_offset=marks.mark(share), committed_leader_epoch=-1,
                                                   metadata="", error_code=int(ErrorCode.NONE)))
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
            marks = table.get((group, vt.real, real_partition), vt.shares)
            offset = marks.mark(vt.share(index)) if marks is not None else source.committed_offset
            entries.append(part_class(partition_index=index, committed_offset=offset, committed_leader_epoch=-1,
                                      metadata="", error_code=source.error_code))
        out.append(topic_class(name=name, partitions=entries))
    return out
