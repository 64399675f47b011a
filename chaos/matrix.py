"""Which (workload, fault) cells the matrix runs, and the smoke's few."""

from __future__ import annotations

import fnmatch

from chaos.faults import FAULTS
from chaos.workloads import WORKLOADS

Cell = tuple[str, str]  # (workload, fault)

# A fault that only means something for some workloads is left out of the others.
_NOT_FOR: dict[str, set[str]] = {}

# `make test` runs these: one kill of each kind of process, each on a different consumer.
SMOKE: list[Cell] = [
    ("group-ranges", "proxy-kill"),
    ("virtual-rdkafka", "leader-kill"),
    ("assign-ranges", "member-kill"),
]


def full() -> list[Cell]:
    return [(w, f) for w in WORKLOADS for f in FAULTS if f not in _NOT_FOR.get(w, set())]


def select(patterns: list[str]) -> list[Cell]:
    """Cells whose ``workload:fault`` matches any pattern (shell globs: ``group-*:*kill``)."""
    cells = full()
    if not patterns:
        return cells
    return [c for c in cells if any(fnmatch.fnmatchcase(f"{c[0]}:{c[1]}", p) for p in patterns)]


def exclude(workload: str, *faults: str) -> None:
    _NOT_FOR.setdefault(workload, set()).update(faults)


def load_optional() -> None:
    """Import the workload modules that need Java or Spark; each registers what it can run."""
    import importlib

    for module in ("chaos.java_workloads", "chaos.spark_workload"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
