"""The soak benchmark's figures and its record accounting (benchmarks/bench_soak.py)."""

from __future__ import annotations

import pytest

from benchmarks.bench_soak import Bits, Ledger, growth, parse_metrics, slope


def test_slope_is_the_least_squares_fit() -> None:
    assert slope([0, 1, 2, 3], [1, 3, 5, 7]) == pytest.approx(2.0)
    assert slope([0, 1, 2], [5, 5, 5]) == 0.0
    assert slope([1], [4]) == 0.0
    assert slope([2, 2], [1, 9]) == 0.0  # no spread in x: no slope
    # noise around a line: the fit recovers it
    assert slope([0, 1, 2, 3, 4], [10.1, 10.9, 12.1, 12.9, 14.0]) == pytest.approx(0.98)


def test_growth_is_per_hour_as_a_percentage_of_the_mean_after_the_warm_up() -> None:
    # 100 MB at t = 600 s growing 1 MB per 600 s; a warm-up spike before 300 s is left out
    samples = [{"t": 0.0, "rss": 500.0}, {"t": 100.0, "rss": 400.0}]
    samples += [{"t": t, "rss": 100.0 + (t - 600) / 600} for t in range(300, 3601, 10)]
    figures = growth(samples, "rss", 300, 3600)
    assert figures["per_hour"] == pytest.approx(6.0)
    assert figures["pct_per_hour"] == pytest.approx(6.0 / figures["mean"] * 100)
    assert figures["spread"] == pytest.approx(5.5)
    assert figures["first"] == pytest.approx(99.5) and figures["last"] == pytest.approx(105.0)
    # samples past the end of the load (the drain) are left out too
    assert growth([*samples, {"t": 4000.0, "rss": 1000.0}], "rss", 300, 3600) == figures


def test_growth_without_enough_samples_says_so() -> None:
    figures = growth([{"t": 10.0, "rss": 1.0}, {"t": 20.0, "rss": None}], "rss", 0, 100)
    assert figures["samples"] == 1 and figures["pct_per_hour"] is None


def test_flat_series_grow_zero() -> None:
    samples = [{"t": float(t), "fds": 40.0} for t in range(0, 600, 10)]
    assert growth(samples, "fds", 0, 600)["pct_per_hour"] == 0.0


def test_bits_count_and_compare() -> None:
    acked, seen = Bits(), Bits()
    for offset in (0, 1, 2, 7, 8, 1000):
        assert acked.add(offset)
    assert not acked.add(7)
    assert acked.count == 6
    for offset in (0, 2, 8):
        seen.add(offset)
    assert acked.missing_from(seen, examples=10) == (3, [1, 7, 1000])
    assert acked.missing_from(seen, examples=2) == (3, [1, 7])
    assert acked.missing_from(seen) == (3, [])
    assert seen.missing_from(acked) == (0, [])


def test_ledger_reports_lost_and_redelivered_per_role() -> None:
    ledger = Ledger()
    for offset in range(10):
        ledger.ack("soak-ranges", 0, offset)
    ledger.ack("soak-ranges", 1, 0)
    ledger.ack("soak-group", 0, 0)
    for offset in range(10):
        ledger.deliver("ranges", "soak-ranges", 0, offset)
    ledger.deliver("ranges", "soak-ranges", 0, 3)  # handed out twice
    assert ledger.lost("ranges", examples=5) == {("soak-ranges", 1): (1, [0])}
    assert ledger.missing("ranges") == 1
    assert ledger.redelivered["ranges"] == 1
    assert ledger.delivered_count("ranges") == 10
    assert ledger.acked_count("soak-ranges") == 11 and ledger.acked_count() == 12
    assert ledger.missing("plain") == 11  # reads the same topic, handed out nothing
    assert ledger.missing("group") == 1


def test_parse_metrics_keeps_unlabelled_samples() -> None:
    text = ("# TYPE process_open_fds gauge\nprocess_open_fds 42.0\n"
            "# TYPE kafka_proxy_requests counter\nkafka_proxy_requests_total{api=\"Fetch\"} 3.0\n"
            "# TYPE kafka_proxy_trio_tasks gauge\nkafka_proxy_trio_tasks 17.0\n")
    assert parse_metrics(text) == {"process_open_fds": 42.0, "kafka_proxy_trio_tasks": 17.0}
