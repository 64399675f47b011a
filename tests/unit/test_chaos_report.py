"""docs/reliability.md's chaos sections from hand-made cells: the sidecar table, the
replicas topology's table with each member's longest gap, the rolling restarts."""

from __future__ import annotations

from chaos import report


def _cell(workload: str, fault: str, topology: str | None, **extra) -> dict:
    cell = {"workload": workload, "fault": fault, "seed": 1, "acknowledged": 2400, "lost": 0,
            "redelivered": {"member_lost": 3}, "order_violations": 0, "order_after_redelivery": 0,
            "committed_behind": {}, "recovery_max_s": 1.5, "ok": True, "command": "python -m chaos",
            "git_commit": "abc1234", "description": f"{workload} members", **extra}
    if topology is not None:
        cell["topology"] = topology
    return cell


def test_cells_are_keyed_by_topology_unless_sidecar():
    assert report.cell_key(_cell("group-ranges", "none", None)) == "group-ranges:none"
    assert report.cell_key(_cell("group-ranges", "none", "sidecar")) == "group-ranges:none"
    assert report.cell_key(_cell("group-ranges", "none", "replicas-2")) == "group-ranges:none@replicas-2"


def test_each_topology_has_its_table_and_rolling_restarts_theirs():
    pause = {"members": {"m0": 2.5, "m1": 4.0}, "max_s": 4.0, "median_s": 3.25, "producer_gap_s": 1.4,
             "window_s": 12.0}
    roll = [{"kind": "rolling-restart", "target": f"replica-{r}", "began": 3.0 + 5 * r, "healed": 8.0 + 5 * r}
            for r in (0, 1)]
    cells = {"group-ranges:proxy-kill": _cell("group-ranges", "proxy-kill", None),
             "group-ranges:replica-kill@replicas-2": _cell("group-ranges", "replica-kill", "replicas-2", pause=pause),
             "group-coop:rolling-restart@replicas-2": _cell("group-coop", "rolling-restart", "replicas-2",
                                                            pause=pause, actions=roll)}
    page = report.render({"chaos": {"cells": cells}})
    main, _, rest = page.partition("## Replicas behind a load balancer")
    replicas, _, rolling = rest.partition("## Rolling restarts")
    assert "| group-ranges | proxy-kill | 2400 | 0 | 0 / 3 / 0 |" in main
    assert "replica-kill" not in main
    assert "| replicas-2 | group-ranges | replica-kill | 2400 | 0 | 0 / 3 / 0 | 0 (0) | 1.5 | 4.0 (3.25) | 1.4 |" \
        in replicas
    assert "| replicas-2 | group-coop | 2400 | 0 | 0 / 3 / 0 | 10.0 | 4.0 (3.25) | 1.4 | ok |" in rolling
    assert "| 0 acknowledged records lost in every chaos cell | 0 lost in 3 cells | yes |" in page
