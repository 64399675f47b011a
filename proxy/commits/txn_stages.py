"""Offset ranges committed inside a transaction, without I/O (docs/individual-commit.md,
"Offset ranges of extension clients"; wire contract section 3.6).

A member that owns key ranges of a partition commits the offsets it processed as ranges
that interleave with the other members'. Inside a transaction they cannot go into the
partition's one log record or committed offset (of two pending writes of a key Kafka
keeps the one appended last, and nobody may wait for another member's transaction), so
each transactional producer writes a *stage*: the committed offset of the real partition
in a shadow group of its own (``<G>.keyrange/<transactional id>#<salt>``, on G's
``__consumer_offsets`` partition), in its transaction, whose metadata holds the ranges:

    keyrange.txnranges/1:<epoch>:<s>.<l>,<g>.<l>,...

``epoch`` is the key's reset epoch when the stage was written; the ranges are sorted and
disjoint, written as the first start ``s``, then for each range its length less one ``l``
and the gap ``g`` before the next one (start less the previous end less one), all in base
36. A later write of the slot replaces the stage whole, so each write holds the union of
the slot's committed stage and the new ranges, less what the log already covers
(``next_stage``). Once the transaction is committed the stage is folded into the log like
a range commit; an aborted stage never shows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from proxy.commits.state import CommitState, Range, apply_ranges, normalise

__all__ = ["PREFIX", "StageTooLarge", "carrier_offset", "decode_stage", "encode_stage", "next_stage",
           "uncovered"]

PREFIX = "keyrange.txnranges/"
_V1 = PREFIX + "1:"
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
_INT64_MAX = (1 << 63) - 1


class StageTooLarge(ValueError):
    """The stage's metadata would exceed ``offset.metadata.max.bytes``: the commit is
    refused (INVALID_REQUEST), as a commit of more than ``max.individual.commit.ranges``."""


def _b36(value: int) -> str:
    if value < 0:
        raise ValueError(f"{value} is negative")
    if value == 0:
        return "0"
    out = []
    while value:
        value, digit = divmod(value, 36)
        out.append(_DIGITS[digit])
    return "".join(reversed(out))


def _number(text: str) -> int:
    if not text or len(text) > 13 or any(c not in _DIGITS for c in text) or (len(text) > 1 and text[0] == "0"):
        raise ValueError(f"{text!r} is not a base-36 number")
    value = int(text, 36)
    if value > _INT64_MAX:
        raise ValueError(f"{text!r} is beyond int64")
    return value


def encode_stage(epoch: int, ranges: Sequence[Range], limit: int = 4096) -> str:
    """The metadata of a stage holding ``ranges`` (any order, overlaps allowed)."""
    ordered = normalise(ranges)
    parts = []
    previous_end = None
    for start, end in ordered:
        if start < 0 or end < start:
            raise ValueError(f"range {start}-{end} is not a range of offsets")
        head = _b36(start) if previous_end is None else _b36(start - previous_end - 1)
        parts.append(f"{head}.{_b36(end - start)}")
        previous_end = end
    text = f"{_V1}{epoch}:{','.join(parts)}"
    if len(text) > limit:
        raise StageTooLarge(f"a stage of {len(ordered)} ranges takes {len(text)} characters of metadata; "
                            f"offset.metadata.max.bytes is {limit}")
    return text


def decode_stage(metadata: str | None) -> tuple[int, list[Range]] | None:
    """(epoch, ranges) of a stage's metadata; None when it is not one a proxy wrote (anyone
    may commit to any group by name: a malformed stage reads as none)."""
    if not metadata or not metadata.startswith(_V1):
        return None
    epoch_text, colon, body = metadata[len(_V1):].partition(":")
    if not colon or not epoch_text.isdigit():
        return None
    ranges: list[Range] = []
    try:
        previous_end = None
        for item in filter(None, body.split(",")):
            head, dot, length = item.partition(".")
            if not dot:
                return None
            start = _number(head) if previous_end is None else previous_end + 1 + _number(head)
            end = start + _number(length)
            if end > _INT64_MAX:
                return None
            ranges.append((start, end))
            previous_end = end
    except ValueError:
        return None
    return int(epoch_text), ranges


def uncovered(state: CommitState, ranges: Iterable[Range]) -> list[Range]:
    """The parts of ``ranges`` that ``state`` does not hold processed (below S or in R)."""
    held = [(-1, state.stable - 1), *state.ranges] if state.stable > 0 else list(state.ranges)
    out: list[Range] = []
    for start, end in normalise(ranges):
        cursor = start
        for low, high in held:
            if high < cursor or low > end:
                continue
            if low > cursor:
                out.append((cursor, low - 1))
            cursor = max(cursor, high + 1)
            if cursor > end:
                break
        if cursor <= end:
            out.append((cursor, end))
    return out


def next_stage(state: CommitState, committed: tuple[int, list[Range]] | None, commit: Sequence[Range]
               ) -> list[Range]:
    """The ranges a slot's next stage holds: its committed stage (of the state's epoch; a
    stage of an older one was reset since) joined with this commit's, less what the log
    already covers."""
    held = list(commit)
    if committed is not None and committed[0] == state.epoch:
        held += committed[1]
    return uncovered(state, held)


def carrier_offset(state: CommitState, stage: Sequence[Range]) -> int:
    """S once the stage is processed: what the carrier commits for the real partition
    (a lower bound: other members' ranges not folded yet may move S further)."""
    return apply_ranges(state, stage).stable if stage else state.stable
