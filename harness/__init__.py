"""What the tests, benchmarks, chaos matrix, fuzzers and experiments run against: Kafka
clusters, Toxiproxy, Java and librdkafka programs, Spark members, raw protocol clients.

Not part of the installed product (``pyproject.toml`` packages ``proxy`` only): it is
imported from the root of a checkout, which is on ``sys.path`` when pytest, ``python -m
benchmarks``, ``python -m chaos`` or ``python -m fuzz`` run from there. A program of its own
started as ``python -m harness.<module>`` runs with ``cwd=ROOT`` or ``env=child_env()``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) with the checkout's root first on
    ``PYTHONPATH``, so a child imports ``harness`` whatever its working directory."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env
