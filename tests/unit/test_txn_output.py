"""The exactly-once checker of transactional relays' output (harness/txn_output.py):
acknowledged input records against committed output records, without a broker."""

from __future__ import annotations

from harness.history import Ack
from harness.txn_output import OutputRecord, check_output, parse


def _ack(offset: int, partition: int = 0, key: bytes | None = b"k", value: bytes | None = None) -> Ack:
    return Ack("t", partition, offset, key, str(offset).encode() if value is None else value)


def _out(offset: int, source: str, writer: str = "g-r0/1/1", *, key: bytes | None = b"k", value: str | None = None,
         at: int | None = None) -> OutputRecord:
    input_value = str(offset) if value is None else value
    return OutputRecord(0, at if at is not None else offset, key, f"{source}:{offset}\t{writer}\t{input_value}".encode())


def test_parse_names_the_real_partition_of_a_virtual_one():
    relayed = parse(OutputRecord(1, 9, b"k", b"t.kr4:6:17\tg-r0/99/3\ta\\tb"))
    assert relayed is not None
    assert relayed.source == ("t", 1, 17) and relayed.seen == ("t.kr4", 6, 17)
    assert relayed.writer == "g-r0/99/3" and relayed.input_value == "a\tb"
    null = parse(OutputRecord(0, 0, b"k", b"t:0:1\tw\t\\N"))
    assert null is not None and null.input_value is None
    assert parse(OutputRecord(0, 0, b"k", b"just a value")) is None
    assert parse(OutputRecord(0, 0, b"k", b"t:x:1\tw\tv")) is None
    assert parse(OutputRecord(0, 0, b"k", None)) is None
    assert parse(OutputRecord(0, 0, b"k", b"\xff\tw\tv")) is None


def test_exact_output_is_ok():
    acks = [_ack(0), _ack(1), _ack(2, partition=1)]
    output = [_out(0, "t.kr4:1"), _out(1, "t.kr4:2"), _out(2, "t.kr4:5", at=7)]
    verdict = check_output(acks, output)
    assert verdict.ok(), verdict.summary()
    assert (verdict.acknowledged, verdict.output, verdict.delivered) == (3, 3, 3)
    assert "3 input records acknowledged, 3 output records committed" in verdict.summary()


def test_lost_duplicated_stray_and_mismatched_are_reported():
    acks = [_ack(0), _ack(1), _ack(2), _ack(3)]
    output = [
        _out(0, "t:0", "w/1/1"), _out(0, "t:0", "w/1/2", at=10),  # twice
        _out(2, "t:0", key=b"other"),  # another key
        _out(3, "t:0", value="33"),  # another value
        _out(9, "t:0", at=11),  # an input record never acknowledged
        OutputRecord(0, 12, b"k", b"garbage"),
    ]
    verdict = check_output(acks, output)
    assert not verdict.ok()
    assert verdict.lost == [("t", 0, 1)]
    assert list(verdict.duplicated) == [("t", 0, 0)]
    assert [r.writer for r in verdict.duplicated[("t", 0, 0)]] == ["w/1/1", "w/1/2"]
    assert [r.offset for r in verdict.stray] == [11, 12]
    assert [r.source for r in verdict.mismatched] == [("t", 0, 2), ("t", 0, 3)]
    assert verdict.delivered == 3
    text = verdict.summary()
    assert "1 lost" in text and "1 duplicated (1 extra copies)" in text and "2 stray" in text
    assert "lost: t:0@1" in text and "w/1/1, w/1/2" in text


def test_output_of_an_aborted_transaction_is_reported_and_redone_work_counted():
    acks = [_ack(0), _ack(1), _ack(2), _ack(3)]
    # transaction w/1/2 read t.kr4:1 offsets 1..3 and aborted; w/1/3 redid 1 and 3 (offset 2 is
    # another share's record, read from t.kr4:2 by another member's committed transaction)
    output = [_out(0, "t.kr4:1", "w/1/1"), _out(1, "t.kr4:1", "w/1/3"), _out(2, "t.kr4:2", "v/2/1"),
              _out(3, "t.kr4:1", "w/1/3")]
    verdict = check_output(acks, output, aborted_writers={"w/1/2"}, aborted_ranges=[("t.kr4", 1, 1, 3)])
    assert verdict.ok(), verdict.summary()
    assert verdict.redone == 2
    leaked = check_output(acks, [*output[:3], _out(3, "t.kr4:1", "w/1/2")], aborted_writers={"w/1/2"},
                          aborted_ranges=[("t.kr4", 1, 1, 3)])
    assert not leaked.ok()
    assert [r.source for r in leaked.from_aborted] == [("t", 0, 3)]


def test_nothing_acknowledged_and_nothing_written_is_ok():
    verdict = check_output([], [])
    assert verdict.ok() and verdict.acknowledged == verdict.output == 0
