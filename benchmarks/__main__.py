"""``python -m benchmarks``: the comparison benchmarks, one after another, with a progress
display; each writes ``benchmarks/results/<name>.json`` and ``<name>.png``, and the results
table ``benchmarks/results/README.md`` is regenerated from every JSON file after each.

    python -m benchmarks                     # passthrough, key_ordered, keyrange_delivery, virtual, live_tail
    python -m benchmarks key_ordered         # only those named
    python -m benchmarks --quick             # small sizes: checks the harness, not the figures
    python -m benchmarks --list
    python -m benchmarks eos                 # by name only (not in the default set): about 12-15 minutes
    python -m benchmarks coop                # by name only: cooperative fetch against share groups, ~15-20 minutes

Each benchmark holds ``/tmp/keyrange-bench.lock`` (flock) while it runs, so benchmarks
started by different people on one machine never overlap (a second one waits).
The older single-purpose benchmarks keep their own commands and JSON layout
(``python -m benchmarks.bench_codecs`` ...); ``python -m benchmarks --all`` runs them after
the comparison with their defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks import report as tables
from benchmarks import results

LOCK = Path("/tmp/keyrange-bench.lock")
OLDER = ("bench_proxy", "bench_hop", "bench_keyrange", "bench_consumer", "bench_commits", "bench_codecs",
         "bench_split", "bench_groups")


@dataclass(frozen=True)
class Benchmark:
    name: str
    title: str
    method: str
    steps: Callable[[argparse.Namespace], int]
    run: Callable[[dict, object, argparse.Namespace], None]
    default: bool = True  # False: runs only when named


def _passthrough(report: dict, progress, args: argparse.Namespace) -> None:
    from benchmarks.workloads import passthrough

    passthrough.run(report, progress, consume_mb=args.consume_mb, produce_mb=args.produce_mb,
                    rounds=args.rounds, latency_seconds=args.latency_seconds)


def _key_ordered(report: dict, progress, args: argparse.Namespace) -> None:
    from benchmarks.workloads import key_ordered

    key_ordered.run(report, progress, workers=args.workers, rounds=args.rounds, work_ms=1.0, keys=10_000,
                    warmup=args.warmup, window=args.window)


def _keyrange_delivery(report: dict, progress, args: argparse.Namespace) -> None:
    from benchmarks.workloads import keyrange_delivery

    keyrange_delivery.run(report, progress, mb=args.delivery_mb, value_size=100, consumers=args.workers,
                          rounds=args.rounds, share_records=args.share_records)


def _live_tail(report: dict, progress, args: argparse.Namespace) -> None:
    from benchmarks.workloads import live_tail

    live_tail.run(report, progress, rounds=args.rounds, records=args.live_records, seconds=args.live_seconds)


BENCHMARKS = {b.name: b for b in (
    Benchmark("passthrough", "Passthrough: direct, bare relay, Kroxylicious, our proxy",
              "Kafka's ConsumerPerformance and ProducerPerformance, 1 KB records, one partition; per round every "
              "path once, order rotating; one unrecorded consume per path first. CPU = user + system seconds of "
              "the hop's process per MB moved.",
              lambda a: 6 + a.rounds * 12, _passthrough),
    Benchmark("key_ordered", "Key-ordered, processing-bound: 1 ms of work per record, one partition, 10,000 keys",
              "Each worker paces 1 ms per record (deadlines chained within a poll) and checks every key's sequence "
              "numbers; records/s over a window after a warm-up; the baseline is a plain consumer group on the "
              "same partition in the same round (one member works).",
              lambda a: 2 + a.rounds * len(a.workers) * 5, _key_ordered),
    Benchmark("keyrange_delivery", "Key-range delivery: N range consumers on one partition against one direct reader",
              "No work per record. Same-kind pairs: N trio Consumers through the proxy against one trio Consumer "
              "direct; N raw header-counting clients against one direct; N share consumers "
              "(ShareConsumerPerformance) against Kafka's ConsumerPerformance. A fresh proxy per range run.",
              lambda a: 3 + a.rounds * (4 + 4 * len(a.workers)), _keyrange_delivery),
    Benchmark("virtual", *importlib.import_module("benchmarks.bench_virtual").REGISTRATION),
    Benchmark("live_tail", "Live tail: key-range, group and virtual-topic consumers read while records are written",
              "A fresh one-partition topic per run, written at a steady rate in small bursts with idle gaps "
              "(acks=all, idempotent, one seeded schedule per round) while the contender reads it: one direct "
              "librdkafka consumer (baseline), 4 range consumers in assign mode, 4 group members splitting the "
              "partition, 4 librdkafka consumers of T.kr4. Every acknowledged record is accounted for; latency is "
              "hand-out time minus CreateTime.",
              lambda a: 1 + a.rounds * 4, _live_tail),
    Benchmark("eos", *importlib.import_module("benchmarks.bench_eos").REGISTRATION),
    Benchmark("coop", *importlib.import_module("benchmarks.bench_coop").REGISTRATION),
)}
DEFAULT = [name for name, bench in BENCHMARKS.items() if bench.default]


@contextlib.contextmanager
def _bench_lock(say: Callable[[str], None]) -> Iterator[None]:
    with open(LOCK, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for {LOCK} (another benchmark is running)")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help=f"benchmarks to run (default: {', '.join(DEFAULT)})")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--all", action="store_true", help="also run the older single-purpose benchmarks")
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
    parser.add_argument("--plain", action="store_true", help="plain progress lines instead of a live display")
    parser.add_argument("--output-dir", type=Path, default=results.RESULTS)
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS and n not in OLDER]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; known: {', '.join([*BENCHMARKS, *OLDER])}")
    if args.quick:
        args.rounds, args.consume_mb, args.produce_mb, args.latency_seconds = 1, 32, 16, 3
        args.warmup, args.window, args.delivery_mb = 1.0, 2.0, 8
        args.live_records, args.live_seconds = 3000, 4.0
        args.eos_window = 10.0
        args.coop_delivery_records, args.coop_seconds = 60_000, 3.0
    if args.rounds < 1 or min(args.workers) < 1:
        parser.error("--rounds and every --workers count must be at least 1")
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
            print(f"{bench.name:18} {bench.title}{'' if bench.default else ' (by name only)'}")
        for name in OLDER:
            print(f"{name:18} (older) python -m benchmarks.{name}")
        return 0
    names = args.names or DEFAULT + (list(OLDER) if args.all else [])
    failed = []
    with _display(args.plain or not sys.stdout.isatty()) as display:
        say = print if display is None else display.console.log
        for name in names:
            with _bench_lock(say):
                began = time.monotonic()
                try:
                    if name in OLDER:
                        say(f"{name}: python -m benchmarks.{name}")
                        code = importlib.import_module(f"benchmarks.{name}").main([])
                        if code:
                            raise RuntimeError(f"exited with {code}")
                    else:
                        _run_one(BENCHMARKS[name], args, display, say)
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


def _run_one(bench: Benchmark, args: argparse.Namespace, display, say) -> None:
    command = " ".join(["python -m benchmarks", bench.name,
                        *[a for a in args.argv if a not in BENCHMARKS and a not in ("--plain",)]])
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
