"""Imports in ``proxy/`` only point down the layers of docs/architecture.md, and never
reach outside the product (the harness, tests, benchmarks).

Every import counts, including those inside functions: an import moved into a function
to dodge a cycle is still an upward dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PROXY = Path(__file__).resolve().parents[2] / "proxy"

# Bottom to top. A package may import its own modules and anything in a lower layer;
# packages of one layer do not import each other.
LAYERS: list[set[str]] = [
    {"accelerators", "ranges", "offset_sets", "settings", "local_kafka"},
    {"protocol"},
    {"records"},
    {"net"},
    {"pipeline"},
    {"commits"},  # the commit layer the features stand on
    {"features", "keyrange", "individual", "prediction", "virtual", "coop", "client"},
    {"server", "spark"},
    {"demo"},
]
LAYER_OF = {package: level for level, packages in enumerate(LAYERS) for package in packages}
# The repository's top-level packages that are not the product: the product imports none.
NOT_PRODUCT = {"harness", "tests", "benchmarks", "chaos", "fuzz", "experiments"}


def _package(module: str) -> str | None:
    """``proxy.keyrange.engine`` -> ``keyrange``; None outside the proxy package."""
    parts = module.split(".")
    if parts[0] != "proxy" or len(parts) < 2:
        return None
    return parts[1]


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            # ``from proxy import pipeline`` names a package too
            if node.module == "proxy":
                found += [(node.lineno, f"proxy.{alias.name}") for alias in node.names]
    return found


def _modules() -> list[Path]:
    return sorted(path for path in PROXY.rglob("*.py"))


def test_every_package_of_proxy_has_a_layer():
    packages = {path.relative_to(PROXY).parts[0].removesuffix(".py") for path in _modules()} - {"__init__"}
    assert packages - set(LAYER_OF) == set(), "add the new package to LAYERS (and to docs/architecture.md)"


@pytest.mark.parametrize("path", _modules(), ids=lambda path: str(path.relative_to(PROXY)))
def test_imports_point_down(path: Path):
    own = path.relative_to(PROXY).parts[0].removesuffix(".py")
    if own == "__init__":
        return
    level = LAYER_OF[own]
    upward = []
    for line, module in _imports(path):
        if module.split(".")[0] in NOT_PRODUCT:
            upward.append(f"line {line}: {module} (not part of the product)")
            continue
        target = _package(module)
        if target is None or target == own:
            continue
        if target not in LAYER_OF:
            upward.append(f"line {line}: {module} (no layer)")
        elif LAYER_OF[target] >= level:
            upward.append(f"line {line}: {module} ({target} is not below {own})")
    assert upward == []
