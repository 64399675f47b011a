"""Which (workload, fault) cells the matrix runs in each topology, and the smoke's few."""

from __future__ import annotations

import fnmatch

from chaos.env import REPLICAS, SIDECAR
from chaos.faults import FAULTS, applies
from chaos.workloads import WORKLOADS

Cell = tuple[str, str]  # (workload, fault)
SmokeCell = tuple[str, str, str]  # (workload, fault, topology)

# A fault that only means something for some workloads is left out of the others.
_NOT_FOR: dict[str, set[str]] = {}

# `make test` runs these: one kill of each kind of process, each on a different consumer;
# a rolling restart of the sidecars; a replica killed behind the load balancer.
SMOKE: list[SmokeCell] = [
    ("group-ranges", "proxy-kill", SIDECAR),
    ("virtual-rdkafka", "leader-kill", SIDECAR),
    ("assign-ranges", "member-kill", SIDECAR),
    ("group-coop", "rolling-restart", SIDECAR),
    ("group-ranges", "replica-kill", REPLICAS),
]


def full(topology: str = SIDECAR) -> list[Cell]:
    return [(w, f) for w in WORKLOADS for f in FAULTS if f not in _NOT_FOR.get(w, set()) and applies(f, topology)]


def select(patterns: list[str], topology: str = SIDECAR) -> list[Cell]:
    """Cells of ``topology`` whose ``workload:fault`` matches any pattern (shell globs:
    ``group-*:*kill``)."""
    cells = full(topology)
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
