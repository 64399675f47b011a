"""Transactional commits of virtual partitions, without I/O (docs/individual-commit.md,
"Transactional commits (exactly-once on shared partitions)").

A TxnOffsetCommit of group G naming virtual partition (p, share i) of ``T.krK`` at offset
X means W(i) = X inside the client's transaction. Inside a transaction the watermarks of
one real partition cannot share a key (of two pending writes Kafka keeps the one appended
last), so the request becomes, on the client's own connection and in this order:

1. one TxnOffsetCommit per (K, share) named, to the share's *shadow group*
   (``proxy.commits.shadows``): the real (T, p) at X, with the client's transactional id,
   producer id and epoch, generation -1 and no member (``shadow_requests``);
2. the client's request itself, the *carrier*: G with the client's generation and member
   (the broker's KIP-447 fencing), each virtual partition replaced by its real partition at
   S_c, the S this instance computes with the request's watermarks applied, and the
   watermarks as metadata (``carrier_request``).

The broker answers in order; the client gets per virtual partition the carrier's error
for (T, p) if any, else its shadow's (``commit_response``). Once the transaction is
committed the shadows are folded into the log and S reaches the coordinator
(``proxy.commits.watermarks.fold``); until then, and for OffsetFetch, each committed
shadow newer than the log's watermark of its share counts (``watermarks.overlay``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from proxy.commits import shadows
from proxy.protocol.constants import ErrorCode
from proxy.protocol.message_types import TxnOffsetCommitRequest, TxnOffsetCommitResponse
from proxy.virtual.commits import real_topics
from proxy.virtual.names import VirtualTopic
from proxy.virtual.rewrite import Resolver

RealKey = tuple[str, int]  # (real topic, real partition)
Slot = tuple[int, int]  # (K, share)


@dataclass(slots=True)
class TxnPlan:
    """What a TxnOffsetCommit asks, by real partition."""

    group: str
    topics: list[tuple[str, VirtualTopic | None, list[int]]] = field(default_factory=list)  # as asked
    edits: dict[RealKey, dict[int, dict[int, int]]] = field(default_factory=dict)  # real -> K -> share -> X
    # (real, K, share) -> partition as sent
    sent: dict[tuple[RealKey, int, int], TxnOffsetCommitRequest.TxnOffsetCommitRequestPartition] = field(
        default_factory=dict)
    refused: dict[RealKey, int] = field(default_factory=dict)  # answered without the broker
    shadows: dict[Slot, str] = field(default_factory=dict)  # (K, share) -> shadow group
    answers: dict[Slot, TxnOffsetCommitResponse] = field(default_factory=dict)  # (K, share) -> the shadow's answer

    def slots(self) -> list[Slot]:
        return sorted({(shares, share) for by_k in self.edits.values() for shares, marks in by_k.items()
                       for share in marks})


def commit_plan(body: TxnOffsetCommitRequest, resolver: Resolver) -> TxnPlan | None:
    """None when the request names no virtual partition. A real partition named both plainly
    and through a virtual topic is refused (INVALID_REQUEST), as OffsetCommit does."""
    plan = TxnPlan(body.group_id)
    plain: set[RealKey] = set()
    for topic in body.topics:
        vt = resolver.virtual(topic.name) if topic.name else None
        plan.topics.append((topic.name, vt, [p.partition_index for p in topic.partitions]))
        for part in topic.partitions:
            if vt is None:
                plain.add((topic.name, part.partition_index))
                continue
            key = (vt.real, vt.real_partition(part.partition_index))
            share = vt.share(part.partition_index)
            plan.edits.setdefault(key, {}).setdefault(vt.mark_k, {})[share] = part.committed_offset
            plan.sent[(key, vt.mark_k, share)] = part
    if not plan.edits:
        return None
    for key in plan.edits:
        if key in plain:
            plan.refused[key] = int(ErrorCode.INVALID_REQUEST)
    return plan


Sequences = tuple[int, dict[Slot, int]]  # a key's reset epoch, and (K, share) -> its watermark's sequence


def shadow_requests(body: TxnOffsetCommitRequest, plan: TxnPlan, sequences: dict[RealKey, Sequences],
                    refused: dict[RealKey, int], metadata_limit: int = shadows.DEFAULT_METADATA_MAX
                    ) -> list[tuple[Slot, TxnOffsetCommitRequest]]:
    """One TxnOffsetCommit body per (K, share) of the plan (``plan.shadows`` names their
    groups): the client's transaction, no member, the real partitions at the client's
    offsets with the share's epoch and sequence in ``sequences`` (the key's state with the
    request's watermarks applied). A key whose metadata would be too long is added to
    ``refused`` (OFFSET_METADATA_TOO_LARGE), as the broker would have answered."""
    cls = TxnOffsetCommitRequest
    by_slot: dict[Slot, dict[str, list[TxnOffsetCommitRequest.TxnOffsetCommitRequestPartition]]] = {}
    for key, by_k in plan.edits.items():
        if key in refused or key not in sequences:
            continue
        epoch, sequence_of = sequences[key]
        parts = []
        for shares, marks in sorted(by_k.items()):
            for share in sorted(marks):
                sent = plan.sent[(key, shares, share)]
                try:
                    metadata = shadows.encode_share_metadata(epoch, sequence_of.get((shares, share), 0),
                                                       sent.committed_metadata, metadata_limit)
                except shadows.ShadowMetadataTooLarge:
                    refused[key] = int(ErrorCode.OFFSET_METADATA_TOO_LARGE)
                    break
                parts.append(((shares, share), cls.TxnOffsetCommitRequestPartition(
                    partition_index=key[1], committed_offset=sent.committed_offset,
                    committed_leader_epoch=sent.committed_leader_epoch, committed_metadata=metadata)))
            else:
                continue
            break
        if key in refused:
            continue
        for slot, part in parts:
            by_slot.setdefault(slot, {}).setdefault(key[0], []).append(part)
    out = []
    for slot, topics in sorted(by_slot.items()):
        shadow = copy.copy(body)
        shadow.group_id = plan.shadows[slot]
        shadow.generation_id = -1
        shadow.member_id = ""
        shadow.group_instance_id = None
        shadow.topics = [cls.TxnOffsetCommitRequestTopic(name=name, partitions=parts) for name, parts in topics.items()]
        out.append((slot, shadow))
    return out


def carrier_request(body: TxnOffsetCommitRequest, plan: TxnPlan, offsets: dict[RealKey, tuple[int, str]],
                    refused: dict[RealKey, int]) -> bool:
    """Rewrite ``body`` into the carrier: every real partition with watermarks at
    ``offsets[key]`` (S_c and the watermarks as metadata), the client's real partitions as
    sent, ``refused`` ones left out. Returns whether anything is left to send."""
    cls = TxnOffsetCommitRequest
    virtual = {vt.name for _, vt, _ in plan.topics if vt is not None}
    body.topics = real_topics(body.topics, virtual, {key: value for key, value in offsets.items() if key in plan.edits},
                              refused, cls.TxnOffsetCommitRequestTopic, cls.TxnOffsetCommitRequestPartition)
    return bool(body.topics)


def _errors(response: TxnOffsetCommitResponse) -> dict[RealKey, int]:
    return {(t.name, p.partition_index): p.error_code for t in response.topics or () for p in t.partitions}


def commit_response(body: TxnOffsetCommitResponse, plan: TxnPlan, refused: dict[RealKey, int]) -> dict[RealKey, int]:
    """Answer every partition asked: ``refused`` first, then the carrier's error for the
    real partition, then (virtual partitions) the shadow's. Returns the error each real
    partition with watermarks got (NONE: its shadows and carrier are in the transaction)."""
    cls = TxnOffsetCommitResponse
    carrier = _errors(body)
    shadow = {slot: _errors(answer) for slot, answer in plan.answers.items()}

    def error_of(key: RealKey, slot: Slot | None) -> int:
        if key in refused:
            return refused[key]
        code = carrier.get(key, int(ErrorCode.UNKNOWN_SERVER_ERROR))
        if code != ErrorCode.NONE or slot is None:
            return code
        return shadow.get(slot, {}).get(key, int(ErrorCode.UNKNOWN_SERVER_ERROR))

    outcome: dict[RealKey, int] = {}
    out = []
    for name, vt, parts in plan.topics:
        entries = []
        for index in parts:
            if vt is None:
                code = error_of((name, index), None)
            else:
                key = (vt.real, vt.real_partition(index))
                code = error_of(key, (vt.mark_k, vt.share(index)))
                if outcome.get(key, ErrorCode.NONE) == ErrorCode.NONE:
                    outcome[key] = code
            entries.append(cls.TxnOffsetCommitResponsePartition(partition_index=index, error_code=code))
        out.append(cls.TxnOffsetCommitResponseTopic(name=name, partitions=entries))
    body.topics = out
    return outcome
