"""Pure-Python hot loops over a decompressed records section.

These walk records reading only what routing needs: the record length, the key (or, for
a null key, the offset delta) and nothing of the value or headers. They check framing
(every record and key inside the section, the section filled exactly) but not every
field, since kept records are copied verbatim and the broker validated them on produce.

The optional C module ``proxy.records._ckernels`` implements the same three functions with
the same results; ``proxy.records.kernels`` picks one. Positions in errors are relative to
``buf`` (``ProtocolError.offset``). The C module also has ``split_blob``, a whole
``split_records`` without the GIL, which has no counterpart here: the Python loop of
``split_records`` is its reference.

Signatures shared with the C module::

    split(buf, start, end, base_offset, bounds, members, nsets)
        -> (list[bytes] per set, list[int] counts per set, total records)
    match(buf, start, end, base_offset, bounds, members, nsets)
        -> (list[list[int]] absolute offsets per set, total records)
    keep(buf, start, end, base_offset, offsets)
        -> (bytes, kept count, total records)
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from typing import Any

import xxhash

from proxy.protocol.errors import ProtocolError
from proxy.records.varint import read_varint as _varint

_xxh3 = xxhash.xxh3_64_intdigest
_pack_offset = struct.Struct(">q").pack


def _route(buf, pos: int, rec_end: int, base_offset: int) -> int:
    """Key hash of the record whose attributes byte is at ``pos``; the non-hot cases.

    Used for records whose fields are not all one-byte varints: decodes timestamp delta,
    offset delta and key length strictly, then hashes.
    """
    pos += 1
    _, pos = _varint(buf, pos, rec_end, 10)
    offset_delta, pos = _varint(buf, pos, rec_end)
    key_len, pos = _varint(buf, pos, rec_end)
    if key_len >= 0:
        if pos + key_len > rec_end:
            raise ProtocolError(f"key length {key_len} does not fit its record", offset=pos)
        return _xxh3(buf[pos : pos + key_len]) >> 1
    if key_len == -1:
        return _xxh3(_pack_offset(base_offset + offset_delta)) >> 1
    raise ProtocolError(f"negative key length {key_len}", offset=pos)


def _offset_delta(buf, pos: int, rec_end: int) -> int:
    """Offset delta of the record whose attributes byte is at ``pos``."""
    _, pos = _varint(buf, pos + 1, rec_end, 10)
    offset_delta, _ = _varint(buf, pos, rec_end)
    return offset_delta


def _walk_error(exc: Exception, rec_start: int) -> ProtocolError:
    """Every fault is reported at the start of the record that holds it.

    Both kernel implementations do this, so they agree on offsets even where they
    notice a fault at different bytes of the record.
    """
    if isinstance(exc, ProtocolError):
        return ProtocolError(exc.reason, offset=rec_start)
    return ProtocolError("record runs past the end of the records section", offset=rec_start)


# Offsets are int64 and offset deltas int32: a base offset this far from the int64 edge
# keeps every base + delta representable (and such offsets never occur in a real log).
MAX_BASE_OFFSET = (1 << 63) - 1 - (1 << 31)


def _check_base(base_offset: int, start: int) -> None:
    if not 0 <= base_offset <= MAX_BASE_OFFSET:
        raise ProtocolError(f"base offset {base_offset} out of range", offset=start)


def split(buf, start: int, end: int, base_offset: int, bounds, members, nsets: int):
    """Route every record to the sets containing its key hash; copy raw bytes per set."""
    _check_base(base_offset, start)
    outs: list[list] = [[] for _ in range(nsets)]
    table: list[Any]
    if all(len(m) <= 1 for m in members):
        table = [outs[m[0]].append if m else None for m in members]
        total = _split_disjoint(buf, start, end, base_offset, bounds, table)
    else:
        table = [tuple(outs[k].append for k in m) for m in members]
        total = _split_overlapping(buf, start, end, base_offset, bounds, table)
    return [b"".join(o) for o in outs], [len(o) for o in outs], total


def _hashed_records(buf, pos: int, end: int, base_offset: int, with_offsets: bool = False):
    """Each record of ``buf[pos:end]``: (start, end, key hash, absolute offset or None).

    The common case inline (a non-null key shorter than 64 bytes), anything else through
    the general readers: this is the reference the C kernels are tested against, so it is
    written to be read, not to be fast. Framing is checked (every record inside the
    section, every key inside its record); a fault raises ``ProtocolError`` at the record."""
    xxh3 = _xxh3
    rec_start = pos
    try:
        while pos < end:
            rec_start = pos
            length, pos = _varint(buf, pos, end)
            rec_end = pos + length
            if length < 1 or rec_end > end:
                raise ProtocolError(f"record length {length} does not fit", offset=rec_start)
            # attributes (1 byte), then skip the timestamp and offset delta varints and
            # read the key length; the common key is non-null and shorter than 64 bytes.
            p = pos + 1
            while buf[p] > 0x7F:
                p += 1
            p += 1
            od_pos = p
            while buf[p] > 0x7F:
                p += 1
            p += 1
            kl = buf[p]
            offset = None
            if 1 < kl < 0x80 and not kl & 1:
                p += 1
                key_end = p + (kl >> 1)
                if key_end > rec_end:
                    raise ProtocolError("key does not fit its record", offset=p)
                h = xxh3(buf[p:key_end]) >> 1
                if with_offsets:
                    if p - od_pos == 2:  # one-byte offset delta
                        od = buf[od_pos]
                        offset = base_offset + ((od >> 1) ^ -(od & 1))
                    else:
                        offset = base_offset + _varint(buf, od_pos, rec_end)[0]
            else:
                h = _route(buf, pos, rec_end, base_offset)
                if with_offsets:
                    offset = base_offset + _offset_delta(buf, pos, rec_end)
            yield rec_start, rec_end, h, offset
            pos = rec_end
    except (IndexError, ProtocolError) as exc:
        raise _walk_error(exc, rec_start) from None


def _split_disjoint(buf, pos, end, base_offset, bounds, table) -> int:
    """When every hash belongs to at most one set (``table`` holds appenders)."""
    bisect = bisect_right
    total = 0
    for rec_start, rec_end, h, _ in _hashed_records(buf, pos, end, base_offset):
        append = table[bisect(bounds, h)]
        if append is not None:
            append(buf[rec_start:rec_end])
        total += 1
    return total


def _split_overlapping(buf, pos, end, base_offset, bounds, table) -> int:
    """When sets overlap (``table`` holds tuples of appenders)."""
    bisect = bisect_right
    total = 0
    for rec_start, rec_end, h, _ in _hashed_records(buf, pos, end, base_offset):
        appenders = table[bisect(bounds, h)]
        if appenders:
            raw = buf[rec_start:rec_end]
            for append in appenders:
                append(raw)
        total += 1
    return total


def match(buf, start: int, end: int, base_offset: int, bounds, members, nsets: int):
    """Like ``split`` but collect absolute offsets instead of bytes."""
    _check_base(base_offset, start)
    outs: list[list[int]] = [[] for _ in range(nsets)]
    table = [tuple(outs[k].append for k in m) for m in members]
    bisect = bisect_right
    total = 0
    for _, _, h, offset in _hashed_records(buf, start, end, base_offset, with_offsets=True):
        for append in table[bisect(bounds, h)]:
            append(offset)
        total += 1
    return outs, total


def keep(buf, start: int, end: int, base_offset: int, offsets):
    """Copy the records whose absolute offset is in ``offsets`` (a set or frozenset)."""
    _check_base(base_offset, start)
    out = []
    pos = start
    total = 0
    rec_start = pos
    try:
        while pos < end:
            rec_start = pos
            length, pos = _varint(buf, pos, end)
            rec_end = pos + length
            if length < 1 or rec_end > end:
                raise ProtocolError(f"record length {length} does not fit", offset=rec_start)
            delta = _offset_delta(buf, pos, rec_end)
            if base_offset + delta in offsets:
                out.append(buf[rec_start:rec_end])
            total += 1
            pos = rec_end
    except (IndexError, ProtocolError) as exc:
        raise _walk_error(exc, rec_start) from None
    return b"".join(out), len(out), total
