"""The benchmark runner's pure parts: round order, paired ratios, goals and the table."""

from __future__ import annotations

from benchmarks import report
from benchmarks.rounds import Row, goal, rotation


def test_rotation_gives_every_contender_every_slot():
    names = ["direct", "relay", "proxy"]
    orders = [rotation(names, n) for n in range(3)]
    assert orders[0] == names
    assert orders[1] == ["relay", "proxy", "direct"]
    for slot in range(3):
        assert {order[slot] for order in orders} == set(names)


def test_ratio_is_the_median_of_paired_round_ratios():
    row = Row("consume", "proxy", "MB/s", [90.0, 50.0, 99.0], "direct", [100.0, 100.0, 100.0])
    assert row.ratios == [0.9, 0.5, 0.99]
    assert row.ratio == 0.9
    assert row.as_dict()["ratio_spread"] == [0.5, 0.99]
    assert Row("x", "y", "u", [1.0]).ratio is None


def test_goal_direction_and_missing_measurement():
    assert goal("at least", 0.97, 0.97)["met"]
    assert not goal("at least", 0.96, 0.97)["met"]
    assert goal("at most", 1.05, 1.1, at_least=False)["met"]
    assert not goal("at most", 1.46, 1.1, at_least=False)["met"]
    assert not goal("nothing measured", None, 1.0)["met"]


def test_table_lists_rows_goals_and_quoted_figures():
    result = {
        "benchmark": "passthrough", "title": "Passthrough", "command": "python -m benchmarks passthrough",
        "started": "2026-01-01T00:00:00+00:00",
        "machine": {"cpus": 2, "load_average_at_start": [1.5, 1, 1], "load_average_at_end": [2.0, 1, 1]},
        "method": "rounds", "sizes": {"consume MB": 1024},
        "rows": [Row("consume MB/s", "proxy", "MB/s", [300.0, 320.0], "direct", [400.0, 400.0]).as_dict()],
        "goals": [goal("consume: proxy >= 0.97 x bare relay", 0.95, 0.97)],
        "quoted": {"source": "issue", "consume": {"kroxylicious": [0.57, 0.6]}},
        "notes": ["a note"],
    }
    text = report.render([result], others=["codecs.json"])
    assert "| consume MB/s | proxy | 310.0 MB/s | 300.0, 320.0 | direct | 0.775 | 0.75 – 0.8 |" in text
    assert "| consume: proxy >= 0.97 x bare relay | 0.95 | **no** |" in text
    assert "kroxylicious 0.57 / 0.60" in text
    assert "[codecs.json](codecs.json)" in text
    assert "![passthrough](passthrough.png)" in text


def test_goals_at_a_glance_and_notes_come_before_the_sections():
    result = {
        "benchmark": "virtual", "title": "Virtual range topics: K consumers on T.krK", "command": "c",
        "started": "2026-01-01T00:00:00+00:00",
        "machine": {"cpus": 2, "load_average_at_start": [1.0, 1, 1]}, "method": "m",
        "rows": [], "goals": [goal("per-key order violations", 0, 0, at_least=False)],
    }
    text = report.render([result], notes="## Where the time goes\n\nnotes text\n")
    assert "| [virtual](#virtual-range-topics-k-consumers-on-tkrk) | per-key order violations | 0 | yes |" in text
    assert text.index("## Goals at a glance") < text.index("## Where the time goes") < text.index(
        "## Virtual range topics")
    assert report.anchor("Connection load: 5,000 idle, max.connections") == "connection-load-5000-idle-maxconnections"


def test_non_default_settings_are_named_for_the_run_and_for_each_contender_that_has_its_own():
    row = Row("delivery", "N=4", "records/s", [2.0], "direct", [4.0], settings={"reserve.message.value.range.fetch": "false"})
    assert row.as_dict()["settings"] == {"reserve.message.value.range.fetch": "false"}
    result = {
        "benchmark": "virtual", "title": "Virtual", "command": "c", "started": "2026-01-01T00:00:00+00:00",
        "machine": {"cpus": 2, "load_average_at_start": [1.0, 1, 1]}, "method": "m",
        "settings": {"virtual.topics.enabled": "true"},
        "rows": [row.as_dict(), Row("delivery", "N=1", "records/s", [3.0], "direct", [4.0]).as_dict()], "goals": [],
    }
    text = report.render([result])
    assert "every proxy of this benchmark: `virtual.topics.enabled=true` (and where a contender names its own)." in text
    assert "| delivery | N=4 (`reserve.message.value.range.fetch=false`) | 2" in text
    assert "| delivery | N=1 | 3" in text
    assert "Proxy settings: the defaults." in report.render([{**result, "settings": {}, "rows": result["rows"][1:]}])
    older = {k: v for k, v in result.items() if k != "settings"}  # a run from before settings were recorded
    assert "Proxy settings" not in report.render([older])


def test_coop_rounds_change_which_contender_of_an_n_runs_first():
    """Over as many rounds as an N has contenders, each contender of each N runs first once
    (with two Ns and two contenders, the order of the rounds used to stay the same)."""
    from argparse import Namespace

    from benchmarks.bench_coop import contenders, round_order

    for workers in ([16], [4, 16], [4, 8, 16]):
        args = Namespace(workers=workers, instances=[1, 3], coop_contenders=["coop"], coop_build=None,
                         coop_cases=["delivery", "work"], coop_seconds=1, coop_delivery_records=1000)
        for case in ("delivery", "work"):
            for n in workers:
                names = contenders(args, case, n)
                firsts = {[c for k, m, c in round_order(args, number) if (k, m) == (case, n)][0]
                          for number in range(len(names))}
                assert firsts == set(names), (workers, case, n, firsts)
