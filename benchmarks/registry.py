"""Every benchmark, in one place: what ``python -m benchmarks`` lists and runs.

A benchmark module declares ``BENCHMARK = Benchmark(...)`` (``benchmarks/benchmark.py``) and
is named in :data:`MODULES`; that is the only way to register one. :func:`load` imports the
modules of :data:`MODULES` by name when the runner asks; they import only the declaration,
never this module or the runner, so there is no import cycle.

Two kinds:

- a *comparison* benchmark gives ``method``, ``steps`` and ``run``: the runner makes its
  report (``benchmarks.results``), shows a progress bar of ``steps(args)`` steps, calls
  ``run(report, progress, args)`` and tabulates the report in
  ``benchmarks/results/README.md``;
- a benchmark with its *own command* gives ``main(argv)``: ``python -m benchmarks.<name>``
  runs it with its own options and JSON layout; with ``with_all`` the runner also calls
  ``main([])`` (its defaults) under ``--all`` or when it is named.
"""

from __future__ import annotations

import importlib
from dataclasses import replace

from benchmarks.benchmark import Benchmark

# In the order ``python -m benchmarks`` runs and lists them.
MODULES = (
    # comparison benchmarks
    "benchmarks.workloads.passthrough",
    "benchmarks.workloads.key_ordered",
    "benchmarks.workloads.keyrange_delivery",
    "benchmarks.bench_virtual",
    "benchmarks.workloads.live_tail",
    "benchmarks.bench_eos",
    "benchmarks.bench_coop",
    "benchmarks.workloads.keyrange_instances",
    # their own command; the first eight also run under --all
    "benchmarks.bench_proxy",
    "benchmarks.bench_hop",
    "benchmarks.bench_keyrange",
    "benchmarks.bench_consumer",
    "benchmarks.bench_commits",
    "benchmarks.bench_codecs",
    "benchmarks.bench_split",
    "benchmarks.bench_groups",
    "benchmarks.bench_spark",
    "benchmarks.bench_soak",
    "benchmarks.bench_connections",
    "benchmarks.bench_hostile",
    "benchmarks.bench_workers",
    "benchmarks.bench_virtual_commit",
    "benchmarks.bench_builds",
    "benchmarks.bench_cache_memory",
    "benchmarks.cpu_breakdown",
    "benchmarks.profile_proxy",
)


def load(modules: tuple[str, ...] = MODULES) -> dict[str, Benchmark]:
    """Every registered benchmark by name, in the order of ``modules``."""
    found: dict[str, Benchmark] = {}
    for name in modules:
        declared = getattr(importlib.import_module(name), "BENCHMARK", None)
        if not isinstance(declared, Benchmark):
            raise TypeError(f"{name} is in benchmarks.registry.MODULES but declares no BENCHMARK")
        if declared.name in found:
            raise ValueError(f"benchmark name {declared.name!r} of {name} is taken by {found[declared.name].module}")
        found[declared.name] = replace(declared, module=name)
    return found
