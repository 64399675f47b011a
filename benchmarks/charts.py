"""One PNG per benchmark: each row's ratio to its baseline (the median over rounds) as a
bar, the lowest and highest round ratio as its error bar, rows grouped as in the table,
and a dashed line at 1 (the baseline). Proxy settings other than the defaults are named:
the benchmark's in the title, a row's own in its label."""

from __future__ import annotations

import textwrap
from pathlib import Path

from benchmarks.rounds import settings_text


def draw(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["rows"] if r.get("ratio") is not None]
    if not rows:
        return
    labels = [f"{r['group']}: {r['name']}" + (f" [{settings_text(r['settings'])}]" if r.get("settings") else "")
              + f" / {r['baseline']}" for r in rows]
    ratios = [r["ratio"] for r in rows]
    low = [r["ratio"] - r["ratio_spread"][0] for r in rows]
    high = [r["ratio_spread"][1] - r["ratio"] for r in rows]
    groups = sorted({r["group"] for r in rows}, key=[r["group"] for r in rows].index)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = [colours[groups.index(r["group"]) % len(colours)] for r in rows]
    figure, axes = plt.subplots(figsize=(10, 0.42 * len(rows) + 1.6))
    positions = list(range(len(rows)))[::-1]
    axes.barh(positions, ratios, xerr=[low, high], color=colour, capsize=3)
    axes.set_yticks(positions, labels, fontsize=8)
    axes.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    for y, ratio in zip(positions, ratios):
        axes.text(ratio, y, f" {ratio:.2f}", va="center", fontsize=7)
    rounds = max(len(r["round_ratios"]) for r in rows)
    # wrapped: long row labels leave the axes narrow, and a title wider than them is cut
    axes.set_xlabel(f"ratio to the baseline of the same round\n(median of {rounds} rounds; bars: lowest-highest)")
    common = settings_text(report.get("settings"))
    title = report["title"] + (f" (non-default: {common})" if common else " (default settings)")
    axes.set_title(textwrap.fill(title, 60), fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
