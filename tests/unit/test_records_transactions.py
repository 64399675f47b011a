"""read_committed verdicts, batch by batch: markers and aborted data are skipped, committed
data and other producers' data delivered."""

from __future__ import annotations

from harness.batches import Rec, control_batch, kafka_python_batch
from proxy.records.batch import RecordBatch, iter_batches
from proxy.records.transactions import TransactionFilter, Verdict


def _batches(*blobs: bytes) -> list[RecordBatch]:
    return [entry for entry in iter_batches(b"".join(blobs)) if isinstance(entry, RecordBatch)]


def _log() -> list[RecordBatch]:
    """Offsets 0-1 producer 7 (aborted at 2), 3 producer 8 (committed at 5), 4 plain, 6 producer 7 again."""
    return _batches(
        kafka_python_batch([Rec(0, b"a", b"1"), Rec(1, b"b", b"2")], base_offset=0, transactional=True, producer_id=7),
        control_batch(base_offset=2, commit=False, producer_id=7),
        kafka_python_batch([Rec(0, b"c", b"3")], base_offset=3, transactional=True, producer_id=8),
        kafka_python_batch([Rec(0, b"d", b"4")], base_offset=4),
        control_batch(base_offset=5, commit=True, producer_id=8),
        kafka_python_batch([Rec(0, b"e", b"5")], base_offset=6, transactional=True, producer_id=7),
    )


def _verdicts(transactions: TransactionFilter) -> list[Verdict]:
    return [transactions.verdict(batch) for batch in _log()]  # one filter, in offset order


def test_read_committed_skips_aborted_data_until_its_marker_and_every_marker():
    verdicts = _verdicts(TransactionFilter([(7, 0)], read_committed=True))
    assert verdicts == [Verdict.ABORTED, Verdict.CONTROL, Verdict.DELIVER, Verdict.DELIVER, Verdict.CONTROL,
                        Verdict.DELIVER]  # producer 7's later transaction is not in the aborted list


def test_read_uncommitted_delivers_all_data_and_still_skips_markers():
    verdicts = _verdicts(TransactionFilter([(7, 0)], read_committed=False))
    assert verdicts == [Verdict.DELIVER, Verdict.CONTROL, Verdict.DELIVER, Verdict.DELIVER, Verdict.CONTROL,
                        Verdict.DELIVER]


def test_an_abort_listed_from_a_later_offset_starts_there():
    verdicts = _verdicts(TransactionFilter([(7, 6)], read_committed=True))
    assert verdicts[0] is Verdict.DELIVER and verdicts[-1] is Verdict.ABORTED
