"""Every seed and every saved crash of ``fuzz/``, replayed through its target without atheris.

Seeds must pass: they are real traffic the parsers accept or refuse with their documented
errors. A crash file stays in ``fuzz/crashes/<target>/`` as a regression input: once its
bug is fixed it passes like a seed. While the bug is open it is listed in
``fuzz/crashes/open.txt`` (target/file, the exception it raises, what is wrong), and its
replay must still raise exactly that; a listed crash that no longer reproduces fails, so
the list cannot go stale.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fuzz import CORPUS, CRASHES, OPEN_CRASHES, ROOT, TARGETS, load_target, open_crashes


def _inputs(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(path for path in folder.iterdir() if path.is_file() and not path.name.startswith("."))


SEEDS = [(target, path) for target in TARGETS for path in _inputs(CORPUS / target)]
CRASH_FILES = [(target, path) for target in TARGETS for path in _inputs(CRASHES / target)]


def _id(case: tuple[str, Path]) -> str:
    return f"{case[0]}/{case[1].name}"


def test_every_target_has_seeds():
    assert {target for target, _ in SEEDS} == set(TARGETS)
    assert all(path.stat().st_size < 64 * 1024 for _, path in SEEDS)


@pytest.mark.parametrize("target", list(TARGETS))
def test_seeds_replay_cleanly(target):
    one_input = load_target(target).one_input
    for path in _inputs(CORPUS / target):
        one_input(path.read_bytes())


@pytest.mark.parametrize("case", CRASH_FILES, ids=_id)
def test_crashes_replay(case):
    target, path = case
    one_input = load_target(target).one_input
    expected = open_crashes().get(f"{target}/{path.name}")
    if expected is None:
        one_input(path.read_bytes())
        return
    try:
        one_input(path.read_bytes())
    except Exception as exc:  # noqa: BLE001 - the open bug's exception, whatever its type
        assert type(exc).__name__ == expected, f"{path.name} now raises {type(exc).__name__}: {exc}"
        pytest.xfail(f"open bug: {type(exc).__name__}: {exc}")
    pytest.fail(f"{target}/{path.name} no longer crashes: remove it from {OPEN_CRASHES.name}")


def test_open_list_names_existing_crash_files():
    for listed in open_crashes():
        assert (CRASHES / listed).is_file(), f"{OPEN_CRASHES.name} lists {listed}, which is not there"


def test_targets_do_not_need_atheris():
    """Only the runner imports atheris; the targets and their helpers run without it."""
    for path in ROOT.rglob("*.py"):
        if path.name == "runner.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(name.split(".")[0] == "atheris" for name in names), f"{path} imports atheris"
