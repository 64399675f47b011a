"""Cutting a Fetch answer to one cooperative chunk (proxy.coop.chunks)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.batches import Rec, control_batch, kafka_python_batch
from proxy.coop.chunks import batch_bounds, cut_chunk, first_batch_bytes
from proxy.coop.feature import _Partition
from proxy.coop.grants import Grant, KeyGrants, Lease, place
from proxy.records.batch import PartialBatch, RecordBatch, iter_batches


def batch(base: int, count: int, *, codec: int = 0) -> bytes:
    return kafka_python_batch([Rec(i, f"k{base + i}".encode(), b"v" * 20) for i in range(count)],
                              base_offset=base, codec=codec)


def offsets(blob) -> list[int]:
    out = []
    for entry in iter_batches(blob):
        assert isinstance(entry, RecordBatch)
        out += [record.offset for record in entry.records()]
    return out


LOG = batch(10, 5) + batch(15, 5) + batch(20, 5)  # offsets 10..24


def test_whole_batches_from_the_marker_pass_unchanged():
    chunk = cut_chunk(LOG, 10)
    assert (chunk.start, chunk.end) == (10, 24)
    assert chunk.records == LOG


def test_batches_below_the_start_are_left_out_and_one_reaching_below_is_rebuilt():
    chunk = cut_chunk(LOG, 17)
    assert (chunk.start, chunk.end) == (17, 24)
    assert offsets(chunk.records) == list(range(17, 25))
    first = next(iter_batches(chunk.records))
    assert first.header.base_offset == 15 and first.header.last_offset == 19  # keeps its span
    first.verify_crc()


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_a_span_ending_inside_a_batch_keeps_only_its_records(codec):
    log = batch(0, 10, codec=codec) + batch(10, 10, codec=codec)
    chunk = cut_chunk(log, 3, 12)
    assert (chunk.start, chunk.end) == (3, 12)
    assert offsets(chunk.records) == list(range(3, 13))


def test_a_partial_tail_is_not_part_of_the_chunk():
    chunk = cut_chunk(LOG + batch(25, 5)[:30], 10)
    assert chunk.end == 24
    assert not any(isinstance(e, PartialBatch) for e in iter_batches(chunk.records))


def test_nothing_complete_at_the_start_is_no_chunk():
    assert cut_chunk(b"", 10) is None
    assert cut_chunk(LOG, 25) is None
    assert cut_chunk(batch(0, 5)[:40], 0) is None


def test_a_batch_past_the_span_proves_the_span_has_nothing_more():
    # span [5, 14] over a log compacted to 0..4 and 15..: the chunk covers the hole too
    log = batch(0, 5) + batch(15, 5)
    chunk = cut_chunk(log, 3, 14)
    assert (chunk.start, chunk.end) == (3, 14)
    assert offsets(chunk.records) == [3, 4]
    hole = cut_chunk(batch(15, 5), 5, 14)
    assert (hole.start, hole.end, hole.records) == (5, 14, b"")


def test_control_batches_come_with_the_chunk():
    log = batch(0, 3) + control_batch(base_offset=3, commit=True) + batch(4, 2)
    chunk = cut_chunk(log, 0)
    assert (chunk.start, chunk.end) == (0, 5)
    assert chunk.records == log


def test_an_ask_names_the_batches_the_read_holds_as_a_cut_would_find_them():
    sizes = [len(batch(10, 5)), len(batch(15, 5)), len(batch(20, 5))]
    assert batch_bounds(LOG, 10) == ([(14, sizes[0]), (19, sizes[1]), (24, sizes[2])], 24)
    assert batch_bounds(LOG, 17) == ([(19, sizes[1]), (24, sizes[2])], 24)
    assert batch_bounds(LOG, 10, 17) == ([(14, sizes[0]), (17, sizes[1])], 17)  # ends inside a batch
    assert batch_bounds(LOG, 25) is None and batch_bounds(b"", 0) is None
    assert batch_bounds(LOG[:-3], 20) is None  # the only batch there is cut short
    # a batch past the span: the span has nothing more, as cut_chunk says
    assert batch_bounds(batch(30, 5), 25, 28) == ([], 28)
    for start, end in [(10, None), (12, 18), (15, 24), (25, 28)]:
        blob = LOG if start < 25 else batch(30, 5)
        bounds, last = batch_bounds(blob, start, end)
        assert cut_chunk(blob, start, last).end == last


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 6)), min_size=1, max_size=6), st.integers(0, 30),
       st.one_of(st.none(), st.integers(0, 40)), st.integers(0, 400),
       st.lists(st.tuples(st.integers(0, 40), st.integers(0, 6)), max_size=3))
def test_the_chunk_an_ask_gets_is_always_cut_whole_from_its_read(layout, start, end, max_bytes, held):
    """Whatever the log assigns an ask within what ``batch_bounds`` named, ``cut_chunk``
    finds exactly that chunk in the read (so the proxy never hands out less than it leased)."""
    blob, at = b"", 0
    for gap, count in layout:  # batches with gaps between them (compacted offsets)
        at += gap
        blob += batch(at, count)
        at += count
    if end is not None and end < start:
        return
    named = batch_bounds(blob, start, end)
    if named is None:
        return
    batches, last = named
    ask = Grant(1, "i", "m", start, start, last, start, 1000, 0, 0, -1, -1, False,
                tuple(Lease("o", 0, lo, lo + size, 0, 1000) for lo, size in held), max_bytes, -1, tuple(batches))
    chunk = place(ask, 0, ask.held, -1)
    if chunk is None:
        return
    cut = cut_chunk(blob, max(chunk[0], start), chunk[1])
    assert cut is not None and cut.end == chunk[1], (chunk, batches, last, held)


def test_the_read_of_a_chunk_holds_the_batch_it_begins_in():
    """A 16 KiB member limit and 16 KiB producer batches: a chunk of 0.9 of the limit begins
    and ends inside batches, so its read must hold both (the broker cuts a read at its limit),
    or it comes back with the first batch only and the member fetches again for the rest."""
    assert first_batch_bytes(LOG) == len(batch(10, 5))
    assert first_batch_bytes(b"") == 0 and first_batch_bytes(None) == 0
    state = _Partition(KeyGrants())
    assert state.chunk_read_bytes(0, 99, 16384) == 16384  # nothing seen yet: the member's limit
    state.offset_bytes = 140.0
    state.read_began_in(16500)
    assert state.chunk_read_bytes(0, 104, 16384) == 105 * 140 + 2 * 16500  # the chunk, its edge batches
    assert state.chunk_read_bytes(0, 999, 16384) == 3 * 16384  # three times the limit at most
    assert state.chunk_read_bytes(0, 9, 1 << 20) == 1 << 20  # never below the member's limit
    state.read_began_in(4000)
    assert state.batch_bytes == 16500 * 3 // 4  # the largest lately, fading
