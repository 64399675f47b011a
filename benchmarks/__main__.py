"""``python -m benchmarks``: the comparison benchmarks, one after another, with a progress
display; each writes ``benchmarks/results/<name>.json`` and ``<name>.png``, and the results
table ``benchmarks/results/README.md`` is regenerated from every JSON file after each.

    python -m benchmarks                     # passthrough, key_ordered, keyrange_delivery, virtual, live_tail
    python -m benchmarks key_ordered         # only those named
    python -m benchmarks --quick             # small sizes: checks the harness, not the figures
    python -m benchmarks --list
    python -m benchmarks eos                 # by name only (not in the default set): about 12-15 minutes
    python -m benchmarks coop                # by name only: cooperative fetch against share groups and over
                                             # 1-3 proxy instances, ~20 minutes (--coop-build: another checkout too)
    python -m benchmarks keyrange_instances  # by name only: key ranges over 1-3 proxy instances, ~4 minutes

Each benchmark holds ``/tmp/keyrange-bench.lock`` (flock) while it runs, so benchmarks
started by different people on one machine never overlap (a second one waits).
The single-purpose benchmarks keep their own commands and JSON layout
(``python -m benchmarks.bench_codecs`` ...); ``--list`` shows them too, and
``python -m benchmarks --all`` runs the older ones after the comparison with their defaults.
Every benchmark is registered in ``benchmarks/registry.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

from benchmarks import registry, results
from benchmarks import report as tables
from benchmarks.bench_builds import parse_build
from benchmarks.benchmark import Benchmark
from benchmarks.lock import bench_lock

BENCHMARKS = registry.load()
DEFAULT = [name for name, bench in BENCHMARKS.items() if bench.default]
WITH_ALL = [name for name, bench in BENCHMARKS.items() if bench.with_all]


class _Progress:
    """What a workload reports through: ``step(text)`` at the start of each step."""

    def __init__(self, display, task) -> None:
        self.display, self.task = display, task

    def step(self, text: str) -> None:
        if self.display is None:
            print(f"  {time.strftime('%H:%M:%S')} {text}", flush=True)
        else:
            self.display.update(self.task, advance=1, description=text)
            self.display.console.log(text)


@contextlib.contextmanager
def _display(plain: bool) -> Iterator[object]:
    if plain:
        yield None
        return
    try:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    except ImportError:  # the bench extra is not installed: plain lines
        yield None
        return
    with Progress(TextColumn("[bold]{task.fields[bench]}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.description}")) as display:
        yield display


def _other_build(text: str) -> tuple[str, Path]:
    """``--coop-build NAME=FOLDER``: as ``bench_builds --build``, with a name no contender has."""
    name, folder = parse_build(text)
    if name in ("coop", "share", "striped", "keyrange") or name.startswith("coop x"):
        raise argparse.ArgumentTypeError(f"--coop-build: the name {name!r} is a contender's; choose another")
    return name, folder


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help=f"benchmarks to run (default: {', '.join(DEFAULT)})")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--all", action="store_true",
                        help=f"also run the single-purpose benchmarks with their defaults ({', '.join(WITH_ALL)})")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes and one round: checks that everything runs, the figures mean little")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--consume-mb", type=int, default=1024, help="passthrough: consume topic size")
    parser.add_argument("--produce-mb", type=int, default=512, help="passthrough: size of each produce run")
    parser.add_argument("--latency-seconds", type=int, default=15, help="passthrough: length of a 10 MB/s run")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--warmup", type=float, default=3.0, help="key_ordered: seconds before the window")
    parser.add_argument("--window", type=float, default=8.0, help="key_ordered: seconds counted")
    parser.add_argument("--delivery-mb", type=int, default=320, help="keyrange_delivery: partition size")
    parser.add_argument("--share-records", type=int, default=300_000,
                        help="keyrange_delivery: records the share group rows (and their baseline) read")
    parser.add_argument("--live-records", type=int, default=40_000, help="live_tail: records written per run")
    parser.add_argument("--live-seconds", type=float, default=20.0, help="live_tail: seconds the writing lasts")
    parser.add_argument("--partitions", type=int, default=1, help="eos: partitions P of the input topic T")
    parser.add_argument("--shares", type=int, default=4, help="eos: K, the shared run has K x P instances on T.krK")
    parser.add_argument("--eos-window", type=float, default=40.0, help="eos: seconds counted per run")
    parser.add_argument("--eos-delay-us", type=int, default=1000, help="eos: paced work per record (sleep)")
    parser.add_argument("--eos-proxy-baseline", action=argparse.BooleanOptionalAction, default=True,
                        help="eos: also run P instances on T through the proxy in every round")
    parser.add_argument("--coop-delivery-records", type=int, default=800_000,
                        help="coop: records of the topic the runs without work drain")
    parser.add_argument("--coop-seconds", type=float, default=10.0,
                        help="coop: seconds a run with 1 ms per record lasts at its goal (N x 1,000 x this many "
                             "records; half with the hot key)")
    parser.add_argument("--coop-batch-bytes", type=int, default=16_384,
                        help="coop: the producer's batch.size writing the topics (a chunk is at least one batch)")
    parser.add_argument("--instances", type=int, nargs="+", default=[1, 2, 3],
                        help="coop, keyrange_instances: spread the consumers over this many proxy instances "
                             "(consumer i through instance i mod R)")
    parser.add_argument("--coop-build", type=_other_build, metavar="NAME=FOLDER",
                        help="coop: also run the cooperative consumers through one proxy of this checkout (its C "
                             "kernels built in place), e.g. in-memory=/tmp/coop-before")
    parser.add_argument("--coop-cases", nargs="+", choices=("delivery", "work", "hot"),
                        help="coop: run only these cases (default: all)")
    parser.add_argument("--coop-contenders", nargs="+", choices=("coop", "share", "striped", "keyrange"),
                        help="coop: run only these of the base contenders (default: all; coop xR follow --instances)")
    parser.add_argument("--plain", action="store_true", help="plain progress lines instead of a live display")
    parser.add_argument("--output-dir", type=Path, default=results.RESULTS)
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; known: {', '.join(BENCHMARKS)}")
    # the others take options the defaults do not cover, or the benchmark lock themselves
    elsewhere = [BENCHMARKS[n].command for n in args.names if not (BENCHMARKS[n].comparison or BENCHMARKS[n].with_all)]
    if elsewhere:
        parser.error(f"run with its own command: {'; '.join(elsewhere)}")
    if args.quick:
        args.rounds, args.consume_mb, args.produce_mb, args.latency_seconds = 1, 32, 16, 3
        args.warmup, args.window, args.delivery_mb = 1.0, 2.0, 8
        args.live_records, args.live_seconds = 3000, 4.0
        args.eos_window = 10.0
        args.coop_delivery_records, args.coop_seconds = 60_000, 3.0
    if args.rounds < 1 or min(args.workers) < 1 or min(args.instances) < 1:
        parser.error("--rounds and every --workers and --instances count must be at least 1")
    if args.coop_delivery_records < 1000 or args.coop_seconds <= 0 or args.coop_batch_bytes < 1024:
        parser.error("--coop-delivery-records and --coop-batch-bytes must be at least 1000 and 1024, "
                     "--coop-seconds > 0")
    if args.partitions < 1 or args.shares < 2 or args.eos_delay_us < 1 or args.eos_window <= 0:
        parser.error("--partitions and --eos-delay-us must be at least 1, --shares at least 2, --eos-window > 0")
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    if args.list:
        for bench in BENCHMARKS.values():
            if bench.comparison:
                print(f"{bench.name:20} {bench.title}{'' if bench.default else ' (by name only)'}")
            else:
                print(f"{bench.name:20} {bench.title} (own command: {bench.command}"
                      f"{'; runs with --all' if bench.with_all else ''})")
        return 0
    names = args.names or DEFAULT + (WITH_ALL if args.all else [])
    failed = []
    with _display(args.plain or not sys.stdout.isatty()) as display:
        say = print if display is None else display.console.log
        for name in names:
            bench = BENCHMARKS[name]
            with bench_lock(say):
                began = time.monotonic()
                try:
                    if bench.comparison:
                        _run_one(bench, args, display, say)
                    else:
                        _run_command(bench, say)
                except Exception:  # one benchmark failing must not lose the others' results
                    failed.append(name)
                    say(f"{name} FAILED:\n{traceback.format_exc()}")
                say(f"{name}: {time.monotonic() - began:.0f} s")
    readme = tables.regenerate(args.output_dir)
    print(f"results table: {readme}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _run_command(bench: Benchmark, say) -> None:
    """A benchmark with its own command line, with its defaults."""
    assert bench.main is not None
    say(f"{bench.name}: {bench.command}")
    try:
        code = bench.main([])
    except SystemExit as exit_:  # its argument parser refused the defaults
        code = exit_.code
    if code:
        raise RuntimeError(f"exited with {code}")


def _options(argv: list[str]) -> list[str]:
    """The options of a command line as a result records them: without the benchmark names
    before the first option (a value such as ``--coop-contenders coop`` stays) nor ``--plain``."""
    first = next((i for i, arg in enumerate(argv) if arg.startswith("-")), len(argv))
    return [arg for i, arg in enumerate(argv) if not (i < first and arg in BENCHMARKS) and arg != "--plain"]


def _run_one(bench: Benchmark, args: argparse.Namespace, display, say) -> None:
    command = " ".join(["python -m benchmarks", bench.name, *_options(args.argv)])
    assert bench.run is not None and bench.steps is not None
    report = results.new_report(bench.name, bench.title, command, bench.method, {})
    task = None if display is None else display.add_task("", total=bench.steps(args), bench=bench.name)
    if display is None:
        say(f"{bench.name}: {bench.title}")
    bench.run(report, _Progress(display, task), args)
    if display is not None:
        display.update(task, completed=bench.steps(args), description="done")
    path = results.finish(report, args.output_dir)
    tables.regenerate(args.output_dir)
    for goal in report["goals"]:
        say(f"  {'met   ' if goal['met'] else 'MISSED'} {goal['goal']}: {goal['measured']}")
    say(f"wrote {path}")
    if report.get("failures"):  # runs that must not pass silently (an inexact exactly-once output)
        raise RuntimeError("; ".join(report["failures"]))


if __name__ == "__main__":
    sys.exit(main())
