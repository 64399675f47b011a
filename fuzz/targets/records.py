"""Record batches as brokers hand them out, and the codecs inside them.

A Fetch partition's ``Records`` is whatever the broker's log holds: v2 batches of any
codec, control batches (transaction markers), magic 0 and 1 message sets, a truncated
last entry. ``iter_batches`` walks them, ``RecordBatch.records`` parses a batch (through
bounded decompression), ``TransactionFilter`` reads markers. All of them promise
``ProtocolError`` and nothing else for bad bytes. What parses must also survive the way
the proxy writes batches back: rebuilt with the same identity (``rebuild_batch``), in the
same codec or uncompressed, a batch reads back as the same records; and every codec we
write decompresses to what went in.

Input: one mode byte. Mode 0: a Records blob. Mode 1: a codec byte, then a compressed
records section. Mode 2: a codec byte, then bytes to compress and read back.
"""

from __future__ import annotations

from fuzz.common import Choices, InvariantBroken
from proxy.protocol.errors import ProtocolError
from proxy.records.batch import LegacyBatch, PartialBatch, Record, RecordBatch, iter_batches
from proxy.records.builder import rebuild_batch
from proxy.records.compression import Codec, compress, decompress
from proxy.records.transactions import TransactionFilter

# Far below the production cap (64 MiB): a bomb is refused as surely, in less time.
MAX_DECOMPRESSED = 1 << 20
CODECS = tuple(Codec)


def _fields(record: Record) -> tuple:
    return (record.offset, record.timestamp, record.attributes,
            None if record.key is None else bytes(record.key),
            None if record.value is None else bytes(record.value),
            tuple((bytes(h.key), None if h.value is None else bytes(h.value)) for h in record.headers))


def _check_rebuild(batch: RecordBatch, records: list[Record], codec: Codec | None) -> None:
    header = batch.header
    rebuilt = rebuild_batch(header, b"".join(bytes(r.raw) for r in records), len(records), codec=codec)
    entries = list(iter_batches(rebuilt))
    if len(entries) != 1 or not isinstance(entries[0], RecordBatch):
        raise InvariantBroken(f"a rebuilt batch reads back as {entries}")
    again = entries[0]
    if not again.crc_ok():
        raise InvariantBroken("a rebuilt batch has a bad CRC")
    same = (again.header.base_offset, again.header.last_offset_delta, again.header.producer_id,
            again.header.producer_epoch, again.header.base_sequence, again.header.is_transactional,
            again.header.is_control, again.header.base_timestamp, again.header.max_timestamp)
    if same != (header.base_offset, header.last_offset_delta, header.producer_id, header.producer_epoch,
                header.base_sequence, header.is_transactional, header.is_control, header.base_timestamp,
                header.max_timestamp):
        raise InvariantBroken(f"rebuilding changed the batch's identity: {header} -> {again.header}")
    read_back = [_fields(r) for r in again.records(max_bytes=MAX_DECOMPRESSED * 2)]
    if read_back != [_fields(r) for r in records]:
        raise InvariantBroken(f"a batch rebuilt as {codec!r} reads back as other records")


def _blob(blob: bytes) -> None:
    markers = TransactionFilter([], read_committed=True)
    try:
        for entry in iter_batches(blob, max_batch_bytes=None):
            if isinstance(entry, (LegacyBatch, PartialBatch)):
                continue  # forwarded as they are: nothing in them is parsed
            entry.crc_ok()
            records = list(entry.records(max_bytes=MAX_DECOMPRESSED))
            if entry.header.is_control:
                list(entry.control_records())
            filtering = TransactionFilter([(entry.header.producer_id, entry.header.base_offset)], read_committed=True)
            filtering.verdict(entry)
            markers.verdict(entry)
            _check_rebuild(entry, records, None)
            if entry.header.codec is not Codec.NONE:
                _check_rebuild(entry, records, Codec.NONE)
    except ProtocolError:
        return


def _decompress(codec: Codec, section: bytes) -> None:
    try:
        plain = decompress(codec, section, max_bytes=MAX_DECOMPRESSED)
    except ProtocolError:
        return
    if codec is not Codec.NONE:
        _round_trip(codec, bytes(plain))


def _round_trip(codec: Codec, plain: bytes) -> None:
    packed = compress(codec, plain)
    try:
        again = decompress(codec, packed, max_bytes=max(MAX_DECOMPRESSED, 2 * len(plain) + 1024))
    except ProtocolError as exc:
        raise InvariantBroken(f"{codec.name} output we wrote does not decompress: {exc}") from exc
    if bytes(again) != plain:
        raise InvariantBroken(f"{codec.name} round trip changed {len(plain)} bytes")


def one_input(data: bytes) -> None:
    choices = Choices(data)
    mode = choices.byte() % 3
    if mode == 0:
        _blob(choices.rest())
        return
    codec = CODECS[choices.byte() % len(CODECS)]
    if mode == 1:
        _decompress(codec, choices.rest())
    else:
        _round_trip(codec, choices.rest())
