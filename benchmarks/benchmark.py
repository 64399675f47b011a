"""What a benchmark declares about itself: ``BENCHMARK = Benchmark(...)`` in its module,
which ``benchmarks/registry.py`` names (see there for the two kinds)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class Progress(Protocol):
    """What a comparison benchmark reports through: ``step(text)`` at the start of each step."""

    def step(self, text: str) -> None: ...


@dataclass(frozen=True)
class Benchmark:
    name: str
    title: str
    # a comparison benchmark
    method: str = ""
    steps: Callable[[argparse.Namespace], int] | None = None
    run: Callable[[dict, Progress, argparse.Namespace], None] | None = None
    default: bool = False  # part of a plain ``python -m benchmarks``
    # a benchmark with its own command line
    main: Callable[[list[str]], int | None] | None = None
    # run with its defaults by ``python -m benchmarks --all`` or when named there; False: only
    # by its own command (it needs options, or takes the benchmark lock itself)
    with_all: bool = False
    module: str = ""  # set by load()

    def __post_init__(self) -> None:
        comparison = self.run is not None and self.steps is not None and bool(self.method)
        if comparison == (self.main is not None):
            raise ValueError(f"benchmark {self.name!r}: give either method, steps and run, or main")
        if self.main is not None and self.default:
            raise ValueError(f"benchmark {self.name!r}: only a comparison benchmark is in the default set")

    @property
    def comparison(self) -> bool:
        return self.main is None

    @property
    def command(self) -> str:
        return f"python -m benchmarks {self.name}" if self.comparison else f"python -m {self.module}"
