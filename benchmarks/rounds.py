"""Alternating rounds and their summary, without I/O.

Every figure the benchmarks report is a ratio against a baseline measured in the same run:
each round runs every contender once, back to back, in an order that rotates from round to
round (so no contender always gets the warmer or the quieter slot), and a contender's
ratio is the median over rounds of its value / the baseline's value in that round (paired:
both saw the same machine load). The spread is the lowest and highest round ratio.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


def rotation(names: Sequence[str], round_number: int) -> list[str]:
    """``names`` rotated by the round number: round 0 as given, round 1 starting at the
    second, and so on."""
    if not names:
        return []
    shift = round_number % len(names)
    return list(names[shift:]) + list(names[:shift])


@dataclass
class Row:
    """One contender's values over the rounds against one baseline's values of the same
    rounds. ``higher_is_better`` only labels the goal direction for readers and charts.
    ``settings``: the proxy settings this contender ran with that are not the proxy's
    defaults (the table and the chart name them beside it); those every proxy of the
    benchmark ran with are the report's ``settings`` instead."""

    group: str
    name: str
    unit: str
    values: list[float]
    baseline: str | None = None
    baseline_values: list[float] = field(default_factory=list)
    higher_is_better: bool = True
    note: str = ""
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def value(self) -> float:
        return statistics.median(self.values)

    @property
    def ratios(self) -> list[float]:
        return [v / b for v, b in zip(self.values, self.baseline_values) if b]

    @property
    def ratio(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios else None

    def as_dict(self) -> dict:
        ratios = self.ratios
        return {
            "group": self.group, "name": self.name, "unit": self.unit, "values": self.values,
            "value": self.value, "spread": [min(self.values), max(self.values)],
            "baseline": self.baseline, "baseline_values": self.baseline_values,
            "round_ratios": ratios, "ratio": self.ratio,
            "ratio_spread": [min(ratios), max(ratios)] if ratios else None,
            "higher_is_better": self.higher_is_better, "note": self.note, "settings": dict(self.settings),
        }


def settings_text(settings: Mapping[str, str] | None) -> str:
    """``k=v, k=v`` of non-default proxy settings, for a table cell or a chart label."""
    return ", ".join(f"{key}={value}" for key, value in (settings or {}).items())


def paired(values: Mapping[str, Sequence[float]], contender: str, baseline: str) -> list[float]:
    """Per-round ratios contender / baseline."""
    return [c / b for c, b in zip(values[contender], values[baseline]) if b]


def goal(text: str, measured: float | None, threshold: float, *, at_least: bool = True,
         unit: str = "") -> dict:
    """A goal as the results table shows it: met when ``measured`` is on the right side of
    ``threshold`` (missing measurements are not met)."""
    met = measured is not None and (measured >= threshold if at_least else measured <= threshold)
    return {"goal": text, "measured": measured, "threshold": threshold,
            "direction": ">=" if at_least else "<=", "unit": unit, "met": met}
