"""The one-pass split of a Records blob by key ranges, with both kernel implementations.

``split_records``, ``match_offsets`` and ``filter_by_offsets`` read broker bytes through
the record-walking kernels, a C accelerator and its pure-Python reference that must give
identical results, errors included (``proxy/records/_kernels_py.py``). Each input runs
through both and their outcomes are compared. Where the strict record parser of
``batch.py`` can read every data batch, the split is also checked against it: each set
gets exactly the records whose key hash its ranges hold, in batches that keep the source
batches' offsets.

Input: a plan byte (how many equal shares, plus an overlapping set and a whole-partition
set), an options byte (CRC checking, output codec), then the Records blob.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from fuzz.common import Choices, InvariantBroken
from proxy.protocol.errors import ProtocolError
from proxy.ranges import HASH_MAX, KeyRange, contains, equal_shares
from proxy.records import _kernels_py, kernels
from proxy.records.batch import LegacyBatch, PartialBatch, RecordBatch, iter_batches
from proxy.records.compression import Codec
from proxy.records.keyhash import key_hash
from proxy.records.plan import RangePlan
from proxy.records.split import filter_by_offsets, match_offsets, split_records

MAX_DECOMPRESSED = 1 << 20

IMPLEMENTATIONS: list[ModuleType] = [_kernels_py]
try:
    IMPLEMENTATIONS.append(importlib.import_module("proxy.records._ckernels"))
except ImportError:  # not built: the reference runs alone
    pass




def _plan(control: int) -> RangePlan:
    sets: list[list[KeyRange] | None] = [[share] for share in equal_shares(1 + control % 4)]
    if control & 0x10:
        sets.append([KeyRange(0, HASH_MAX // 3), KeyRange(HASH_MAX // 2, HASH_MAX // 2 + (1 << 40))])
    if control & 0x20:
        sets.append(None)
    return RangePlan(sets)


def _outcome(run: Callable[[], Any]) -> Any:
    try:
        return run()
    except ProtocolError as exc:
        return ("ProtocolError", exc.offset)


def _shape(result: Any) -> Any:
    """The comparable content of a split, match or filter result."""
    if isinstance(result, tuple):
        return result
    if hasattr(result, "outputs"):
        return ([(o.records, o.stats) for o in result.outputs], result.bytes_in, result.partial_bytes,
                result.next_offset)
    if hasattr(result, "offsets"):
        return (result.offsets, result.records, result.next_offset)
    return (result.records, result.stats)


def _runs(blob: bytes, plan: RangePlan, verify: bool, codec: Codec | None) -> list[Any]:
    matched = _outcome(lambda: match_offsets(blob, plan, verify_crc=verify, max_decompressed_bytes=MAX_DECOMPRESSED))
    wanted = matched.offsets[0][::2] if not isinstance(matched, tuple) else []
    one = RangePlan([plan.sets[-1]])
    known_below = matched.next_offset - 1 if not isinstance(matched, tuple) and matched.next_offset else 0
    return [
        _shape(_outcome(lambda: split_records(blob, plan, codec=codec, verify_crc=verify,
                                              max_decompressed_bytes=MAX_DECOMPRESSED))),
        _shape(matched),
        _shape(_outcome(lambda: filter_by_offsets(blob, wanted, codec=codec, verify_crc=verify,
                                                  max_decompressed_bytes=MAX_DECOMPRESSED))),
        _shape(_outcome(lambda: filter_by_offsets(blob, wanted, known_below=known_below, plan=one, codec=codec,
                                                  verify_crc=verify, max_decompressed_bytes=MAX_DECOMPRESSED))),
    ]


def _strict_offsets(blob: bytes, plan: RangePlan) -> list[list[int]] | None:
    """Per set, the offsets the strict parser says it should get; None where the strict
    parser refuses a data batch (the kernels check framing only, so they may accept it)."""
    expected: list[list[int]] = [[] for _ in range(len(plan))]
    try:
        for entry in iter_batches(blob):
            if isinstance(entry, PartialBatch):
                break
            if isinstance(entry, LegacyBatch) or entry.header.is_control:
                continue
            for record in entry.records(max_bytes=MAX_DECOMPRESSED):
                h = key_hash(record.key, record.offset)
                for k, ranges in enumerate(plan.sets):
                    if contains(ranges, h):
                        expected[k].append(record.offset)
    except ProtocolError:
        return None
    return expected


def _data_offsets(blob: bytes) -> tuple[list[int], list[tuple[int, int]]]:
    """Offsets of the data records of a split's output, and each data batch's offset span."""
    offsets, spans = [], []
    for entry in iter_batches(blob):
        if isinstance(entry, RecordBatch) and not entry.header.is_control:
            spans.append((entry.header.base_offset, entry.header.last_offset))
            offsets += [record.offset for record in entry.records(max_bytes=4 * MAX_DECOMPRESSED)]
    return offsets, spans


def _check_against_strict(blob: bytes, plan: RangePlan, split: Any, matched: Any) -> None:
    expected = _strict_offsets(blob, plan)
    if expected is None or isinstance(matched, tuple) or isinstance(split, tuple):
        return
    if matched[0] != expected:
        raise InvariantBroken(f"match_offsets gave {matched[0]}, key hashes say {expected}")
    _, source_spans = _data_offsets(blob[:len(blob) - split[2]])
    for k, (records, _stats) in enumerate(split[0]):
        try:
            offsets, spans = _data_offsets(records)
        except ProtocolError as exc:
            raise InvariantBroken(f"split output {k} does not parse: {exc}") from exc
        if offsets != expected[k]:
            raise InvariantBroken(f"split set {k} holds offsets {offsets}, key hashes say {expected[k]}")
        if spans != source_spans:
            raise InvariantBroken(f"split set {k} batches span {spans}, the source's {source_spans}")


def one_input(data: bytes) -> None:
    choices = Choices(data)
    plan = _plan(choices.byte())
    options = choices.byte()
    verify = not options & 1
    codec = Codec.NONE if options & 2 else None
    blob = choices.rest()
    outcomes = []
    for impl in IMPLEMENTATIONS:
        with kernels.using(impl):
            outcomes.append(_runs(blob, plan, verify, codec))
    for other in outcomes[1:]:
        for name, ours, theirs in zip(("split_records", "match_offsets", "filter_by_offsets",
                                       "filter_by_offsets(known_below)"), outcomes[0], other):
            if ours != theirs:
                raise InvariantBroken(f"{name}: the Python kernels give {ours!r:.300}, the C kernels {theirs!r:.300}")
    _check_against_strict(blob, plan, outcomes[0][0], outcomes[0][1])
