"""Writing one benchmark's result: the JSON file, its chart, and the machine's state.

Every JSON file has the same outer shape, which the README table generator
(``benchmarks.report``) reads: ``benchmark``, ``title``, ``command``, ``machine`` (with the
load average at start and end, since other work on a shared machine moves the figures),
``method``, ``sizes``, ``settings`` (the proxy settings every proxy of the run had that
are not the proxy's defaults; a row names its own beyond those), ``rows``
(``rounds.Row.as_dict``), ``goals``, optional ``quoted`` and ``notes``.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path

import psutil

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    return {"python": platform.python_version(), "cpus": psutil.cpu_count(),
            "cpu": platform.processor() or platform.machine(),
            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}


def new_report(benchmark: str, title: str, command: str, method: str, sizes: dict) -> dict:
    return {"benchmark": benchmark, "title": title, "command": command,
            "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": machine(), "method": method, "sizes": sizes, "settings": {}, "rows": [], "goals": [],
            "notes": []}


def finish(report: dict, directory: Path = RESULTS) -> Path:
    """Stamp the end, write ``<benchmark>.json`` and ``<benchmark>.png``; return the JSON path."""
    report["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["finished"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{report['benchmark']}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    from benchmarks import charts

    charts.draw(report, directory / f"{report['benchmark']}.png")
    return path
