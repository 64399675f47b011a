"""``python -m fuzz``: fuzz one target, all of them in turn, or rebuild the seed corpora.

``run`` imports the target's proxy modules inside ``atheris.instrument_imports``, so that
coverage is that of the product rather than of the harness, and also instruments the
codec functions the proxy generates with ``exec`` at run time, which no import hook sees.
New inputs go to a scratch corpus under ``build/`` (the committed seeds stay small);
crashes go to ``fuzz/crashes/<target>/``, where the corpus test replays them. Crashes
``fuzz/crashes/open.txt`` lists (reported, not fixed yet) are passed over, so that a
campaign goes on to find what else there is.

``all`` runs each target in its own process, one after the other (fuzzing is CPU-bound and
targets must not share instrumentation state), and writes what libFuzzer reported per
target (executions, speed, final coverage, crashes) to ``benchmarks/results/fuzz.json``.
Nothing here imports ``proxy`` before instrumentation starts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fuzz import CORPUS, CRASHES, DICTIONARIES, ROOT, TARGETS, UnknownTarget, load_target, open_crashes

REPO = ROOT.parent
SCRATCH = REPO / "build" / "fuzz"
REPORT = REPO / "benchmarks" / "results" / "fuzz.json"
DEFAULT_RUNS = 1_000_000
MAX_LEN = 64 * 1024  # seeds are below this; so is almost every frame the proxy decodes whole
UNIT_TIMEOUT = 10  # seconds: a parser that takes this long on one input hangs for our purposes
RSS_LIMIT_MB = 2048
ARTIFACT_KINDS = ("crash-", "timeout-", "oom-", "leak-")

_STATUS_LINE = re.compile(r"^#(\d+)\s+(\w+)\s+cov: (\d+) ft: (\d+)(?:.*?exec/s: (\d+))?", re.M)
_STAT = re.compile(r"^stat::(\w+):\s+(\d+)", re.M)
_ARTIFACT = re.compile(r"Test unit written to (\S+)")
_PYTHON_EXCEPTION = "=== Uncaught Python exception: ==="
_FIRST_INPUT = "fuzz: first input at "
_FIRST_INPUT_LINE = re.compile(re.escape(_FIRST_INPUT) + r"([0-9.]+)")


def _target(name: str) -> str:
    if name not in TARGETS:
        raise argparse.ArgumentTypeError(str(UnknownTarget(name)))
    return name


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="fuzz one target under atheris")
    run.add_argument("target", type=_target, help=f"one of: {', '.join(TARGETS)}")
    run.add_argument("inputs", nargs="*", help="replay these files instead of fuzzing (libFuzzer's reproduce mode)")
    run.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="executions, seeds included (-1: no limit)")
    run.add_argument("--seconds", type=int, default=0, help="stop after this long (0: no limit)")
    run.add_argument("--max-len", type=int, default=MAX_LEN)
    run.add_argument("--include-open", action="store_true",
                     help="stop at crashes fuzz/crashes/open.txt already lists (by default they are passed over)")
    every = commands.add_parser("all", help="fuzz every target in turn and write the JSON report")
    every.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="executions per target")
    every.add_argument("--seconds", type=int, default=0, help="time limit per target (0: none)")
    every.add_argument("--report", type=Path, default=REPORT)
    every.add_argument("--only", type=_target, action="append", help="fuzz only these targets (repeatable)")
    commands.add_parser("seed", help="rebuild fuzz/corpus from the golden traffic")
    commands.add_parser("list", help="the targets and what each covers")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "run":
        return _run(args)
    if args.command == "all":
        return _all(args)
    if args.command == "seed":
        from fuzz.seed import write_corpora

        for target, count in write_corpora().items():
            print(f"{target}: {count} seeds in {CORPUS / target}")
        return 0
    for name, what in TARGETS.items():
        print(f"{name:12} {what}")
    return 0


# -- one target, in this process ------------------------------------------------------------

def _run(args: argparse.Namespace) -> int:
    try:
        import atheris
    except ImportError:
        print("python -m fuzz: atheris is not installed; pip install -e '.[fuzz]'", file=sys.stderr)
        return 2
    with atheris.instrument_imports(include=["proxy"]):
        module = load_target(args.target)
    generated = getattr(module, "generated_code", None)
    if generated is not None:
        functions = generated()
        for function in functions:
            atheris.instrument_func(function)
        print(f"instrumented {len(functions)} generated codec functions", file=sys.stderr)
    # The parsers log what they refuse (a skipped log record, say): millions of lines
    # would cost more than the parsing.
    logging.disable(logging.CRITICAL)
    crashes = CRASHES / args.target
    crashes.mkdir(parents=True, exist_ok=True)
    flags = [
        f"-runs={args.runs}",
        f"-max_len={args.max_len}",
        f"-timeout={UNIT_TIMEOUT}",
        f"-rss_limit_mb={RSS_LIMIT_MB}",
        f"-artifact_prefix={crashes}{os.sep}",
        "-print_final_stats=1",
    ]
    if args.seconds:
        flags.append(f"-max_total_time={args.seconds}")
    dictionary = DICTIONARIES / f"{args.target}.dict"
    if dictionary.is_file():
        flags.append(f"-dict={dictionary}")
    if args.inputs:
        corpora = list(args.inputs)
    else:
        work = SCRATCH / "corpus" / args.target
        work.mkdir(parents=True, exist_ok=True)
        seeds = CORPUS / args.target
        corpora = [str(work)] + ([str(seeds)] if seeds.is_dir() else [])
    one_input = module.one_input
    if not args.include_open and not args.inputs:
        one_input = _passing_over(one_input, _open_signatures(args.target, one_input))
    atheris.Setup([sys.argv[0], *flags, *corpora], _announcing_start(one_input))
    atheris.Fuzz()
    return 0  # libFuzzer exits the process itself


def _signature(exc: BaseException) -> tuple[str, str]:
    """A crash's identity: its exception class and the function that raised it."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{Path(frames[-1].filename).name}:{frames[-1].name}:{frames[-1].lineno}" if frames else "?"
    return type(exc).__name__, where


def _open_signatures(target: str, one_input: Callable[[bytes], None]) -> set[tuple[str, str]]:
    """The signatures of this target's open crashes, found by replaying their files."""
    found = set()
    for listed in open_crashes():
        if listed.partition("/")[0] != target or not (CRASHES / listed).is_file():
            continue
        try:
            one_input((CRASHES / listed).read_bytes())
        except Exception as exc:  # noqa: BLE001 - any crash it reproduces
            found.add(_signature(exc))
    if found:
        print(f"passing over {len(found)} open crash(es): {sorted(found)}", file=sys.stderr)
    return found


def _passing_over(one_input: Callable[[bytes], None], known: set[tuple[str, str]]) -> Callable[[bytes], None]:
    """``one_input`` that lets crashes already reported go, so that one open bug found in
    the first second does not end every later campaign before it reaches anything else."""
    if not known:
        return one_input

    def guarded(data: bytes) -> None:
        try:
            one_input(data)
        except Exception as exc:
            if _signature(exc) not in known:
                raise

    return guarded


def _announcing_start(one_input: Callable[[bytes], None]) -> Callable[[bytes], None]:
    """``one_input`` that prints when the first input arrives: start-up (instrumenting,
    compiling codecs) takes seconds, and libFuzzer's own speed counts it in whole seconds."""
    started = False

    def announcing(data: bytes) -> None:
        nonlocal started
        if not started:
            started = True
            print(f"{_FIRST_INPUT}{time.time():.3f}", file=sys.stderr, flush=True)
        one_input(data)

    return announcing


# -- every target, each in a child process ----------------------------------------------------

def _artifacts(target: str) -> set[str]:
    folder = CRASHES / target
    if not folder.is_dir():
        return set()
    return {path.name for path in folder.iterdir() if path.name.startswith(ARTIFACT_KINDS)}


def _python_exception(log: str) -> dict[str, Any] | None:
    """The uncaught exception atheris printed: its last line and the frames in proxy/."""
    start = log.find(_PYTHON_EXCEPTION)
    if start < 0:
        return None
    lines = log[start + len(_PYTHON_EXCEPTION):].strip("\n").splitlines()
    block: list[str] = []
    for line in lines:
        if line.startswith("==") or line.startswith("MS:"):
            break
        block.append(line)
    frames = [line.strip() for line in block if line.strip().startswith("File ")]
    exception = next((line for line in reversed(block) if line and not line.startswith(" ")), "")
    return {"exception": exception, "frames": frames[-8:]}


def parse_log(log: str) -> dict[str, Any]:
    """What libFuzzer reported: the last status line, the final stats, artifacts written."""
    result: dict[str, Any] = {}
    statuses = _STATUS_LINE.findall(log)
    if statuses:
        executions, _event, cov, ft, exec_per_sec = statuses[-1]
        result.update(executions=int(executions), cov=int(cov), ft=int(ft))
        if exec_per_sec:
            result["exec_per_sec"] = int(exec_per_sec)
    stats = dict(_STAT.findall(log))
    if "number_of_executed_units" in stats:
        result["executions"] = int(stats["number_of_executed_units"])
    if "average_exec_per_sec" in stats:
        result["exec_per_sec"] = int(stats["average_exec_per_sec"])
    if "peak_rss_mb" in stats:
        result["peak_rss_mb"] = int(stats["peak_rss_mb"])
    result["artifacts"] = _ARTIFACT.findall(log)
    exception = _python_exception(log)
    if exception is not None:
        result["python_exception"] = exception
    return result


def _fuzz_one(target: str, runs: int, seconds: int) -> dict[str, Any]:
    before = _artifacts(target)
    command = [sys.executable, "-m", "fuzz", "run", target, "--runs", str(runs)]
    if seconds:
        command += ["--seconds", str(seconds)]
    started = time.monotonic()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, errors="replace")
    elapsed = time.monotonic() - started
    finished = time.time()
    logs = SCRATCH / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / f"{target}.log").write_text(done.stdout + done.stderr)
    result = parse_log(done.stderr)
    result.pop("artifacts")
    result["seconds"] = round(elapsed, 1)
    first = _FIRST_INPUT_LINE.search(done.stderr)
    if first is not None:
        fuzzing = max(finished - float(first.group(1)), 1e-3)
        result["fuzzing_seconds"] = round(fuzzing, 1)
        if result.get("executions"):
            result["exec_per_sec"] = round(result["executions"] / fuzzing)
    result["exit_code"] = done.returncode
    result["seeds"] = len(list((CORPUS / target).glob("*"))) if (CORPUS / target).is_dir() else 0
    new = sorted(_artifacts(target) - before)
    result["crashes"] = [str((CRASHES / target / name).relative_to(REPO)) for name in new]
    # Reported earlier and passed over in this run (see fuzz/crashes/open.txt).
    result["open_crashes"] = sorted(str((CRASHES / listed).relative_to(REPO)) for listed in open_crashes()
                                    if listed.partition("/")[0] == target)
    if done.returncode == 0:
        result["status"] = "ok"
    elif new or result.get("python_exception"):
        result["status"] = "crash"
    else:
        result["status"] = "error"
        result["stderr_tail"] = done.stderr.strip().splitlines()[-5:]
    return result


def _git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip()


def _all(args: argparse.Namespace) -> int:
    try:
        from importlib.metadata import version

        atheris_version = version("atheris")
    except Exception:  # noqa: BLE001 - not installed: the children will say so
        atheris_version = None
    targets = args.only or list(TARGETS)
    command = f"python -m fuzz all --runs {args.runs}" + (f" --seconds {args.seconds}" if args.seconds else "")
    report: dict[str, Any] = {
        "command": command,
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git_commit": _git_commit(),
        "python": platform.python_version(),
        "atheris": atheris_version,
        "cpus": os.cpu_count(),
        "runs_per_target": args.runs,
        "targets": {},
    }
    failed = False
    for target in targets:
        print(f"fuzzing {target} ({args.runs} runs)...", flush=True)
        result = _fuzz_one(target, args.runs, args.seconds)
        report["targets"][target] = result
        failed |= result["status"] != "ok"
        print(f"  {result['status']}: {result.get('executions', 0)} executions, "
              f"{result.get('exec_per_sec', 0)}/s, cov {result.get('cov', 0)}, ft {result.get('ft', 0)}"
              + (f", crashes {result['crashes']}" if result["crashes"] else ""), flush=True)
    report["finished"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=2) + "\n")
    print(f"report: {args.report}")
    return 1 if failed else 0
