"""The benchmark registry: every benchmark is declared once, named in one place, and listed
by ``python -m benchmarks --list``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import registry
from benchmarks.benchmark import Benchmark

ROOT = Path(__file__).resolve().parents[2]
COMPARISON = ["passthrough", "key_ordered", "keyrange_delivery", "virtual", "live_tail", "eos", "coop",
              "keyrange_instances"]
WITH_ALL = ["bench_proxy", "bench_hop", "bench_keyrange", "bench_consumer", "bench_commits", "bench_codecs",
            "bench_split", "bench_groups"]


def test_every_benchmark_is_registered_in_order():
    found = registry.load()
    assert [name for name, b in found.items() if b.comparison] == COMPARISON
    assert [name for name, b in found.items() if b.default] == COMPARISON[:5]
    assert [name for name, b in found.items() if b.with_all] == WITH_ALL
    assert all(b.module == module for b, module in zip(found.values(), registry.MODULES, strict=True))


def test_every_module_that_declares_a_benchmark_is_named_in_the_registry():
    declaring = set()
    for path in (ROOT / "benchmarks").rglob("*.py"):
        tree = ast.parse(path.read_text())
        if any(isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "BENCHMARK" for t in node.targets)
               for node in tree.body):
            declaring.add(".".join(path.relative_to(ROOT).with_suffix("").parts))
    assert declaring == set(registry.MODULES)


def test_a_benchmark_is_one_kind_or_the_other():
    with pytest.raises(ValueError, match="either"):
        Benchmark("x", "X")
    with pytest.raises(ValueError, match="either"):
        Benchmark("x", "X", method="m", steps=lambda args: 1, run=lambda report, progress, args: None,
                  main=lambda argv: 0)
    with pytest.raises(ValueError, match="default set"):
        Benchmark("x", "X", main=lambda argv: 0, default=True)


def test_a_name_is_taken_once():
    with pytest.raises(ValueError, match="taken"):
        registry.load(("benchmarks.bench_proxy", "benchmarks.bench_proxy"))


def test_the_runner_lists_every_benchmark():
    listed = subprocess.run([sys.executable, "-m", "benchmarks", "--list"], cwd=ROOT, capture_output=True,
                            text=True, check=True, timeout=60).stdout
    names = [line.split()[0] for line in listed.splitlines()]
    assert names == list(registry.load())


def test_a_recorded_command_keeps_option_values_that_name_a_benchmark():
    from benchmarks.__main__ import _options
    argv = ["coop", "--coop-contenders", "coop", "share", "--workers", "4", "--plain"]
    assert _options(argv) == ["--coop-contenders", "coop", "share", "--workers", "4"]
    assert _options(["passthrough", "keyrange_delivery"]) == []
