"""The build-against-build benchmark's arguments: mistakes are named before any broker starts."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks import bench_builds

REPO = Path(__file__).resolve().parents[2]


def test_a_build_is_a_name_and_a_checkout():
    assert bench_builds.parse_build(f"after={REPO}") == ("after", REPO)


@pytest.mark.parametrize("text, message", [
    ("after", "NAME=FOLDER"),
    ("=.", "NAME=FOLDER"),
    ("direct=.", "NAME=FOLDER"),
    ("after=/", "not a checkout of the proxy"),
])
def test_a_bad_build_is_refused_with_what_was_expected(text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        bench_builds.parse_build(text)


def test_one_build_is_not_a_comparison(capsys):
    with pytest.raises(SystemExit):
        bench_builds.main(["--build", f"only={REPO}"])
    assert "at least two --build" in capsys.readouterr().err
