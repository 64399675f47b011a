"""One-pass split of a Fetch ``Records`` blob into per-requester filtered blobs.

The result cache (docs/wire-contract.md#5-result-cache) reads a partition once and serves every active
range set from that read. Each input batch is decompressed and walked once; every record
is hashed once and copied to the sets whose ranges hold its hash. Each set then gets, for
every input batch, a batch with the same identity holding its share of the records, even
when that share is empty, so consumer positions advance exactly as without the proxy.

Entries that are not filtered:

* control batches (transaction markers) go unchanged to every set: consumers need them to
  finish or abort transactions whatever their range;
* magic 0/1 entries (message sets written before KIP-98, possible in old segments) go
  unchanged to every set. They cannot be filtered safely: the format has no empty
  container, so dropping the last messages would leave the consumer's position behind
  them and it would fetch them forever. Their records therefore reach every requester;
  ``SetStats.passed_through`` counts them so the caller can notice;
* the trailing partial batch is dropped from every output; a consumer would discard it
  anyway and fetch again from the same offset.

A set that keeps every record of a batch (and asked for no codec change) gets the source
batch's bytes unchanged: nothing is rebuilt, recompressed or re-checksummed.

When the C accelerator is built, ``split_records`` first hands the whole blob to its
``split_blob``: entry walk, CRC checks, routing, copying and the rebuilt headers and CRCs in
one call that holds the GIL only to allocate the outputs. One GIL-free call per fetch is
what lets the proxy run the split on a worker thread, on another core, while its event loop
keeps relaying; the per-batch loop below holds the GIL for everything but the record walk.
It covers blobs of uncompressed data batches and control batches, the common case, and
returns None for anything else (compressed or magic 0/1 entries, any malformed input), so
the loop below runs then and raises its usual errors; both give the same bytes and stats.

``match_offsets`` is the offsets-only variant (``reserve.message.value.range.fetch=false``):
it returns which offsets each set wants, and ``filter_by_offsets`` later rebuilds the
filtered batches from a fresh read given those offsets, without hashing again. A fresh
read of the same fetch offset may reach further than the read the offsets came from (the
log grew in between): the offsets say nothing of those newer records, so they are hashed,
never taken as unwanted.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from proxy.protocol.errors import ProtocolError
from proxy.records import kernels
from proxy.records.batch import (
    RECORDS_OFFSET,
    LegacyBatch,
    PartialBatch,
    RecordBatch,
    iter_batches,
)
from proxy.records.builder import Rebuilder, rebuild_batch
from proxy.records.compression import DEFAULT_MAX_DECOMPRESSED_BYTES, Codec
from proxy.records.plan import RangePlan


@dataclass(slots=True)
class SetStats:
    """What one range set got out of one split."""

    records_kept: int = 0
    records_dropped: int = 0
    bytes_out: int = 0
    batches_out: int = 0
    empty_batches: int = 0  # filtered batches left with no record
    passed_through: int = 0  # control batches and magic 0/1 entries forwarded unchanged
    unfiltered: int = 0  # of those, magic 0/1 entries: records that reach the client unfiltered


@dataclass(slots=True)
class SetOutput:
    """The filtered Records blob of one range set, with its stats."""

    records: bytes
    stats: SetStats = field(default_factory=SetStats)


@dataclass(slots=True)
class SplitResult:
    """One output per range set, in the plan's order.

    ``next_offset`` is the offset after the last complete entry (None if there was none);
    ``partial_bytes`` is the size of the dropped truncated tail.
    """

    outputs: list[SetOutput]
    bytes_in: int
    partial_bytes: int
    next_offset: int | None


@dataclass(slots=True)
class OffsetMatch:
    """Which data-record offsets each set wants, in ascending order, from one read."""

    offsets: list[list[int]]
    records: int
    next_offset: int | None


def split_records(
    blob,
    plan: RangePlan,
    *,
    codec: Codec | int | None = None,
    verify_crc: bool = True,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> SplitResult:
    """Split ``blob`` into one filtered Records blob per set of ``plan``.

    ``codec`` None keeps each batch's codec; ``Codec.NONE`` writes filtered batches
    uncompressed. Bad input raises ``ProtocolError`` with the blob offset of the fault.
    """
    nsets = len(plan)
    all_full = len(plan.full_sets) == nsets
    whole = kernels.split_blob
    if whole is not None and (codec is None or int(codec) == Codec.NONE):
        # Any buffer will do (a view of the response frame): its bytes are copied out, and
        # a copy of the whole blob first would be a megabyte moved with the GIL held.
        done = whole(blob, plan.bounds, plan.members, nsets, all_full, verify_crc)
        if done is not None:
            return _whole_blob_result(done, len(blob))
    buf = blob if isinstance(blob, bytes) else bytes(blob)
    parts: list[list] = [[] for _ in range(nsets)]
    stats = [SetStats() for _ in range(nsets)]
    kept_counts = [0] * nsets
    empties = [0] * nsets
    batches = records = 0
    partial = 0
    next_offset = None
    for entry in iter_batches(buf):
        if isinstance(entry, PartialBatch):
            partial = len(entry.data)
            break
        if isinstance(entry, LegacyBatch) or entry.header.is_control:
            next_offset = _pass_through(entry, parts, stats, verify_crc)
            continue
        header = entry.header
        next_offset = header.next_offset
        if verify_crc:
            entry.verify_crc()
        keeps_codec = codec is None or int(codec) == header.codec
        if all_full and keeps_codec:
            counts, total, outs = [header.record_count] * nsets, header.record_count, None
        else:
            payload, start, end = _payload(entry, buf, max_decompressed_bytes)
            outs, counts, total = _run(
                entry, kernels.split, payload, start, end, header.base_offset,
                plan.bounds, plan.members, nsets,
            )
            _check_count(entry, total)
        rebuild = None
        for k in range(nsets):
            kept = counts[k]
            if kept == total and keeps_codec:
                parts[k].append(entry.data)
            else:
                if rebuild is None:
                    rebuild = Rebuilder(header, codec)
                assert outs is not None  # not every record kept: the batch was split
                parts[k].append(rebuild(outs[k], kept))
            kept_counts[k] += kept
            if kept == 0 and total:
                empties[k] += 1
        batches += 1
        records += total
    outputs = []
    for k in range(nsets):
        data = b"".join(parts[k])
        s = stats[k]
        s.bytes_out = len(data)
        s.records_kept = kept_counts[k]
        s.records_dropped = records - kept_counts[k]
        s.batches_out += batches
        s.empty_batches = empties[k]
        outputs.append(SetOutput(data, s))
    return SplitResult(outputs, len(buf), partial, next_offset)


def _whole_blob_result(done: tuple, bytes_in: int) -> SplitResult:
    """The ``SplitResult`` of a ``kernels.split_blob`` return."""
    outs, kept, empties, controls, batches, records, partial, next_offset = done
    outputs = [
        SetOutput(data, SetStats(
            records_kept=kept[k],
            records_dropped=records - kept[k],
            bytes_out=len(data),
            batches_out=batches + controls,
            empty_batches=empties[k],
            passed_through=controls,
        ))
        for k, data in enumerate(outs)
    ]
    return SplitResult(outputs, bytes_in, partial, next_offset)


def match_offsets(
    blob,
    plan: RangePlan,
    *,
    verify_crc: bool = True,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> OffsetMatch:
    """For each set, the absolute offsets of the data records it wants.

    Control batches and magic 0/1 entries are not listed: ``filter_by_offsets`` passes
    them through regardless.
    """
    buf = blob if isinstance(blob, bytes) else bytes(blob)
    nsets = len(plan)
    offsets: list[list[int]] = [[] for _ in range(nsets)]
    records = 0
    next_offset = None
    for entry in iter_batches(buf):
        if isinstance(entry, PartialBatch):
            break
        if isinstance(entry, LegacyBatch):
            next_offset = entry.base_offset + 1
            continue
        header = entry.header
        next_offset = header.next_offset
        if verify_crc:
            entry.verify_crc()
        if header.is_control:
            continue
        payload, start, end = _payload(entry, buf, max_decompressed_bytes)
        per_set, total = _run(
            entry, kernels.match, payload, start, end, header.base_offset,
            plan.bounds, plan.members, nsets,
        )
        _check_count(entry, total)
        records += total
        for k in range(nsets):
            offsets[k].extend(per_set[k])
    return OffsetMatch(offsets, records, next_offset)


def filter_by_offsets(
    blob,
    offsets: Collection[int],
    *,
    known_below: int | None = None,
    plan: RangePlan | None = None,
    codec: Codec | int | None = None,
    verify_crc: bool = True,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> SetOutput:
    """Rebuild ``blob`` keeping only data records whose offset is in ``offsets``.

    ``known_below``: ``offsets`` were matched on a read that ended there, so they only
    decide for batches that end at or below it. A batch reaching past it (the log grew
    after that read) is filtered by hashing its keys against ``plan``, a plan of the one
    wanted range set; leaving it to ``offsets`` would drop its wanted records while its
    empty batch moves the consumer past them. None: ``offsets`` cover the whole blob.

    Same output rules as ``split_records`` (identity kept, empty batches kept, control and
    magic 0/1 entries unchanged, partial tail dropped).
    """
    if known_below is not None and (plan is None or len(plan) != 1):
        raise ValueError("offsets known below an offset need the plan of the one wanted set")
    wanted = offsets if isinstance(offsets, (set, frozenset)) else frozenset(offsets)
    buf = blob if isinstance(blob, bytes) else bytes(blob)
    parts: list = []
    stats = SetStats()
    for entry in iter_batches(buf):
        if isinstance(entry, PartialBatch):
            break
        if isinstance(entry, LegacyBatch) or entry.header.is_control:
            _pass_through(entry, [parts], [stats], verify_crc)
            continue
        header = entry.header
        if verify_crc:
            entry.verify_crc()
        keeps_codec = codec is None or int(codec) == header.codec
        payload, start, end = _payload(entry, buf, max_decompressed_bytes)
        if known_below is None or header.next_offset <= known_below:
            kept_bytes, kept, total = _run(
                entry, kernels.keep, payload, start, end, header.base_offset, wanted
            )
        else:
            assert plan is not None
            outs, counts, total = _run(
                entry, kernels.split, payload, start, end, header.base_offset,
                plan.bounds, plan.members, 1,
            )
            kept_bytes, kept = outs[0], counts[0]
        _check_count(entry, total)
        if kept == total and keeps_codec:
            parts.append(entry.data)
        else:
            parts.append(rebuild_batch(header, kept_bytes, kept, codec=codec))
        stats.records_kept += kept
        stats.records_dropped += total - kept
        stats.batches_out += 1
        if kept == 0 and total:
            stats.empty_batches += 1
    data = b"".join(parts)
    stats.bytes_out = len(data)
    return SetOutput(data, stats)


def _pass_through(entry, parts, stats, verify_crc: bool) -> int:
    """Forward a control batch or magic 0/1 entry unchanged to every set."""
    if isinstance(entry, RecordBatch):
        if verify_crc:
            entry.verify_crc()
        next_offset = entry.header.next_offset
    else:
        next_offset = entry.base_offset + 1
    legacy = not isinstance(entry, RecordBatch)
    for p, s in zip(parts, stats):
        p.append(entry.data)
        s.passed_through += 1
        s.unfiltered += legacy
        s.batches_out += 1
    return next_offset


def _payload(batch: RecordBatch, buf: bytes, max_bytes: int):
    """(buffer, start, end) of the decompressed records; no copy when uncompressed."""
    if batch.header.codec is Codec.NONE:
        return buf, batch.position + RECORDS_OFFSET, batch.position + len(batch.data)
    payload = batch.records_payload(max_bytes=max_bytes)
    return payload, 0, len(payload)


def _run(batch: RecordBatch, kernel, payload, start: int, *args):
    """Call a kernel, turning a fault in decompressed bytes into a blob position."""
    try:
        return kernel(payload, start, *args)
    except ProtocolError as exc:
        if batch.header.codec is Codec.NONE:
            raise
        raise ProtocolError(
            f"{exc.reason} (byte {exc.offset} of decompressed records)", offset=batch.position
        ) from None


def _check_count(batch: RecordBatch, total: int) -> None:
    if total != batch.header.record_count:
        raise ProtocolError(
            f"batch holds {total} records but declares {batch.header.record_count}",
            offset=batch.position + 57,
        )
