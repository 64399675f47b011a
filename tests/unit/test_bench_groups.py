"""The groups benchmark's reading of member logs: counts, gaps and bins from P/S/A lines."""

from __future__ import annotations

import pytest

from benchmarks.bench_groups import finished, java_settled, keyrange_settled, longest_gap, parse, rates, timeline


def test_parse_reads_every_kind_of_line() -> None:
    log = parse("J 10.0\nP 10.1 10.149 50\nS 10.2 3 stable 0 t-0[0.25]\nA m1 10.05 t-0,t-1\nbroken line\n")
    assert log.joined == 10.0
    assert log.batches == [(10.1, 10.149, 50)]
    assert log.states == [(10.2, 3, "stable", False, "t-0[0.25]")]
    assert log.changes == [("A", 10.05, "t-0,t-1")]
    assert log.last_change == 10.2


def test_finished_prorates_a_batch_across_the_window_edge() -> None:
    batch = [(0.0, 0.099, 100)]  # one record per ms
    assert finished(batch, 0.0, 1.0) == pytest.approx(100)
    assert finished(batch, 0.05, 1.0) == pytest.approx(50)
    assert finished(batch, 0.2, 1.0) == 0
    assert finished([(0.5, 0.5, 1)], 0.0, 0.5) == 0
    assert finished([(0.5, 0.5, 1)], 0.0, 0.6) == 1


def test_longest_gap_sees_stops_between_polls_and_an_open_stop_at_the_end() -> None:
    batches = [(0.0, 0.049, 50), (0.052, 0.101, 50), (0.5, 0.549, 50)]
    assert longest_gap(batches, 0.0, 0.549) == pytest.approx(0.399)
    assert longest_gap(batches[:2], 0.0, 0.101) == pytest.approx(0.003)
    assert longest_gap(batches[:2], 0.0, 1.0) == pytest.approx(0.899)  # nothing finished after 0.101
    assert longest_gap(batches, 0.6, 0.7) == pytest.approx(0.1)


def test_rates_bins_the_whole_group() -> None:
    a = parse("P 0.0 0.999 1000\n")
    b = parse("P 0.5 0.9995 1000\n")
    assert rates([a, b], 0.0, 1.0) == pytest.approx([1000, 3000])


def test_settled_needs_every_member_stable_in_one_generation() -> None:
    one = parse("S 1.0 2 stable 0 t-0[0.50]\n")
    other = parse("S 1.0 2 stable 0 t-0[0.50]\n")
    assert keyrange_settled([one, other], 2)
    assert not keyrange_settled([one], 2)
    assert not keyrange_settled([one, parse("S 1.0 2 stable 1 t-0[0.50]\n")], 2)  # still revoking
    assert not keyrange_settled([one, parse("S 1.0 3 stable 0 t-0[0.50]\n")], 2)
    assert not keyrange_settled([one, parse("S 1.0 2 joining 0 nothing\n")], 2)


def test_java_settled_needs_all_partitions_owned_and_a_quiet_second() -> None:
    logs = [parse("A m 1.0 t-0,t-1\n"), parse("A m 1.0 t-2\n"), parse("A m 1.0 t-3\n")]
    assert java_settled(logs, 3, 4, now=2.5)
    assert not java_settled(logs, 3, 4, now=1.5)
    assert not java_settled(logs[:2], 2, 4, now=2.5)
    assert not java_settled([*logs[:2], parse("R m 1.0 t-3\n")], 3, 4, now=2.5)


def test_timeline_puts_state_changes_and_stops_in_order() -> None:
    log = parse("\n".join([
        "P 10.000 10.049 50", "S 10.050 5 stable 1 t-0[0.20]", "P 10.150 10.199 50", "R m 10.200 t-0[0.05]",
        "P 10.210 10.259 50"]))
    assert timeline(log, 9.0, 11.0, 10.0) == [
        "+49 stop 101 ms", "+50 S gen 5 stable revoking t-0[0.20]", "+200 R t-0[0.05]"]
    assert timeline(log, 10.1, 11.0, 10.0) == ["+200 R t-0[0.05]"]
