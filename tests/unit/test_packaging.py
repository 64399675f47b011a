"""The installed package is the product: the wheel's package list, as pyproject.toml
configures setuptools to find it, holds no test harness."""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_namespace_packages, find_packages

ROOT = Path(__file__).resolve().parents[2]
# Top-level packages of the repository that are not the product.
NOT_PRODUCT = {"harness", "tests", "benchmarks", "chaos", "fuzz", "experiments", "scripts"}


def _packages() -> list[str]:
    """What ``[tool.setuptools.packages.find]`` puts in the wheel (namespace packages
    included, as setuptools does by default for pyproject.toml)."""
    setuptools_config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    find = setuptools_config["packages"]["find"]
    finder = find_namespace_packages if find.get("namespaces", True) else find_packages
    return finder(where=str(ROOT / find.get("where", ["."])[0]), include=find.get("include", ("*",)),
                  exclude=find.get("exclude", ()))


def test_the_wheel_holds_the_product_and_no_harness():
    packages = _packages()
    assert "proxy" in packages and "protocol_schemas" in packages
    assert (ROOT / "harness" / "__init__.py").is_file()  # it exists, and is left out
    assert [name for name in packages if name.split(".")[0] in NOT_PRODUCT] == []
    assert [name for name in packages if "testing" in name.split(".")] == []
    assert {name.split(".")[0] for name in packages} == {"proxy", "protocol_schemas"}
