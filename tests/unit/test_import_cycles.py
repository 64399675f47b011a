"""No import cycles anywhere in the tree: the product, the harness, the benchmarks, chaos,
fuzz, the tests and the experiments.

Every import counts, including those inside functions and under ``if __name__ ==
"__main__"``, and so does a module named by a string (``importlib.import_module``, a
registry such as ``benchmarks/registry.py``): an import made by name to dodge a cycle is
still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ("proxy", "harness", "benchmarks", "chaos", "fuzz", "tests", "experiments")


def _modules() -> dict[str, Path]:
    found = {}
    for tree in TREES:
        for path in (ROOT / tree).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The module of the tree that ``name`` (a module, or a name inside one) belongs to."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    named: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            named += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            named += [f"{base}.{alias.name}" for alias in node.names]  # a submodule, or a name in base
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in modules:
            named.append(node.value)
    found = {_owner(name, modules) for name in named}
    return {target for target in found if target is not None and target != module}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in graph:
                    continue
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_a_module_named_by_a_string_counts_as_imported(tmp_path: Path):
    path = tmp_path / "registry.py"
    path.write_text('import importlib\nMODULES = ("pkg.bench",)\nimportlib.import_module("pkg.other")\n')
    modules = {"pkg.registry": path, "pkg.bench": path, "pkg.other": path}
    assert imports_of("pkg.registry", path, modules) == {"pkg.bench", "pkg.other"}


def test_no_import_cycles_in_the_tree():
    modules = _modules()
    graph = {module: imports_of(module, path, modules) for module, path in modules.items()}
    assert cycles(graph) == []
