"""Consumer groups with key ranges: processing-bound scaling with ``subscribe``, and what a
join into a running group costs, beside standard Java consumers on cooperative-sticky.

    flock /tmp/keyrange-bench.lock .venv/bin/python -m benchmarks.bench_groups

Every member is a process of its own (``harness/group_member.py``; the Java one is
``benchmarks/GroupMember.java``), so M members are limited by the machine, not by one
Python process. Each record costs 1 ms of awaited work, sequential per member (deadlines
chained from the poll's return), and each member logs every poll's first and last finish
time on ``time.monotonic()``, the one clock every process (Java's ``System.nanoTime``
included) shares on Linux; all figures are computed from those logs afterwards.

Scaling: one partition, M = 1, 2, 4, 8, 16 members subscribe as a fresh group (from offset
0). Once every member is stable in one generation with a share and nothing being revoked
(the join is excluded), and after a warm-up, the records finished in a window give the
group's rate, compared with M x the one-member rate of the same round (goal >= 0.9).

Rebalance: four members run on the topic, then a fifth joins. Ours: one partition, the
keyrange assignor (each of the four gives up part of its range; the new one gets 1/5).
Java: kafka-clients consumers with cooperative-sticky on four partitions, reading the
broker directly (the fifth gets nothing: there is no fifth partition). From the fifth's
subscribe until the group has settled again plus one second, each original member's
longest gap between two finished records is its stop time (before the join the longest gap
is a poll's overhead, a few ms); the group's records/s in 0.5 s bins over the same stretch
against the rate before the join is the dip. Rounds alternate the order of the contenders.

``main`` writes ``benchmarks/results/groups.json`` and ``groups.png``; it takes no lock
itself: run it under ``flock`` as above (``python -m benchmarks bench_groups`` holds the
same lock while it runs it).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from benchmarks import results
from benchmarks.benchmark import Benchmark
from benchmarks.rounds import Row, goal, rotation

TOPIC = "bench-groups"
JAVA_TOPIC = "bench-groups-java"
ROOT = Path(__file__).resolve().parents[1]
JAVA_SOURCE = Path(__file__).with_name("GroupMember.java")
STOP_MS = 100.0  # a gap between two finished records longer than this is a stop
BIN = 0.5  # seconds per bin of the records/s timeline


# -- the members' logs, read back (pure) ----------------------------------------------------
@dataclass
class MemberLog:
    """One member's event lines: see ``harness/group_member.py``."""

    joined: float | None = None
    batches: list[tuple[float, float, int]] = field(default_factory=list)  # first, last finish, count
    states: list[tuple[float, int, str, bool, str]] = field(default_factory=list)  # t, generation, phase, ...
    changes: list[tuple[str, float, str]] = field(default_factory=list)  # A/R/L, t, assignment

    @property
    def last_change(self) -> float:
        return max([t for _, t, _ in self.changes] + [s[0] for s in self.states], default=0.0)


def parse(text: str) -> MemberLog:
    log = MemberLog()
    for line in text.splitlines():
        cells = line.split(" ")
        if cells[0] == "J" and len(cells) == 2:
            log.joined = float(cells[1])
        elif cells[0] == "P" and len(cells) == 4:
            log.batches.append((float(cells[1]), float(cells[2]), int(cells[3])))
        elif cells[0] == "S" and len(cells) >= 6:
            log.states.append((float(cells[1]), int(cells[2]), cells[3], cells[4] == "1", " ".join(cells[5:])))
        elif cells[0] in ("A", "R", "L") and len(cells) >= 4:  # kind, member, time, assignment
            log.changes.append((cells[0], float(cells[2]), " ".join(cells[3:])))
    return log


def finished(batches: Iterable[tuple[float, float, int]], t0: float, t1: float) -> float:
    """Records finished in [t0, t1): a batch's finishes taken as evenly spaced between its
    first and last."""
    total = 0.0
    for first, last, count in batches:
        if count == 1 or last <= first:
            total += count if t0 <= last < t1 else 0
            continue
        step = (last - first) / (count - 1)
        lo, hi = max(t0, first), min(t1, last + step)
        if hi > lo:
            total += count * (hi - lo) / (last + step - first)
    return total


def longest_gap(batches: list[tuple[float, float, int]], t0: float, t1: float) -> float:
    """The longest time in [t0, t1] between two finished records (or from the last one to
    t1): gaps inside a batch are its spacing, gaps between batches are poll and commit time
    or a stop. Only gaps that overlap [t0, t1] count, whole."""
    longest = 0.0
    ordered = sorted(batches)
    for (_, last, _), (first, _, _) in zip(ordered, ordered[1:]):
        if first > t0 and last < t1:
            longest = max(longest, first - last)
    inside = [b for b in ordered if b[0] <= t1]
    if inside and inside[-1][1] < t1:
        longest = max(longest, t1 - max(inside[-1][1], t0))
    for first, last, count in ordered:
        if count > 1 and last > t0 and first < t1:
            longest = max(longest, (last - first) / (count - 1))
    return longest


def timeline(log: MemberLog, t0: float, t1: float, origin: float, gap: float = 0.03) -> list[str]:
    """One member around a join, times in ms from ``origin``: its group state changes and
    listener calls, and every gap longer than ``gap`` between two finished records (from
    the last finish before to the first after), in time order; where the time goes."""
    events = [(t, f"{kind} {what}") for kind, t, what in log.changes]
    events += [(t, f"S gen {generation} {phase}{' revoking' if revoking else ''} {what}")
               for t, generation, phase, revoking, what in log.states]
    ordered = sorted(log.batches)
    events += [(last, f"stop {1000 * (first - last):.0f} ms")
               for (_, last, _), (first, _, _) in zip(ordered, ordered[1:]) if first - last > gap]
    return [f"{1000 * (t - origin):+.0f} {what}" for t, what in sorted(events) if t0 <= t <= t1]


def rates(logs: Iterable[MemberLog], t0: float, t1: float, width: float = BIN) -> list[float]:
    """The group's records/s in consecutive bins of ``width`` from t0 (the last bin may be
    shorter, not shorter than half a bin)."""
    batches = [b for log in logs for b in log.batches]
    out = []
    start = t0
    while t1 - start >= width / 2:
        end = min(start + width, t1)
        out.append(finished(batches, start, end) / (end - start))
        start = end
    return out


def keyrange_settled(logs: list[MemberLog], members: int) -> bool:
    """Every member stable in one generation, with a share, nothing being revoked."""
    latest = [log.states[-1] for log in logs if log.states]
    return (len(logs) == members and len(latest) == members and len({s[1] for s in latest}) == 1
            and all(s[2] == "stable" and not s[3] and s[4] != "nothing" for s in latest))


def java_settled(logs: list[MemberLog], members: int, partitions: int, now: float, quiet: float = 1.0) -> bool:
    """Every member assigned, the partitions all owned, and no listener call for ``quiet`` s."""
    assigned = [log.changes[-1] for log in logs if log.changes]
    owned = {p for kind, _, text in assigned if kind == "A" and text != "nothing" for p in text.split(",")}
    return (len(logs) == members and len(assigned) == members and all(a[0] == "A" for a in assigned)
            and len(owned) == partitions and all(now - a[1] >= quiet for a in assigned))


# -- member processes ----------------------------------------------------------------------
class Fleet:
    """The member processes of one run; ``stop`` ends them (a stop file, then SIGKILL for
    any that has not left after a deadline)."""

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.stop_file = workdir / "stop"
        self.members: dict[str, subprocess.Popen[bytes]] = {}

    def _spawn(self, name: str, command: list[str]) -> None:
        from harness.processes import spawn

        with open(self.workdir / f"{name}.err", "wb") as err:
            self.members[name] = spawn(command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=err)

    def python(self, name: str, bootstrap: str, group: str, topic: str, work_ms: float,
               profile: Path | None = None) -> None:
        self._spawn(name, [sys.executable, "-m", "harness.group_member", "--bootstrap", bootstrap,
                           "--group", group, "--topic", topic, "--name", name, "--events", str(self.events(name)),
                           "--stop", str(self.stop_file), "--work-ms", str(work_ms), "--delay-max-ms", "0",
                           "--events-per", "poll", "--commit-in-background", "--max-poll-records", "50",
                           "--session-timeout-ms", "10000", "--max-poll-interval-ms", "300000",
                           *(["--profile", str(profile)] if profile else [])])

    def java(self, classes: Path, name: str, bootstrap: str, group: str, topic: str, work_ms: float) -> None:
        self._spawn(name, [*java_command(classes), "GroupMember", bootstrap, group, topic, name,
                           str(self.events(name)), str(self.stop_file), str(work_ms)])

    def events(self, name: str) -> Path:
        return self.workdir / f"{name}.events"

    def logs(self) -> dict[str, MemberLog]:
        for name, process in self.members.items():
            if process.poll() is not None:
                err = (self.workdir / f"{name}.err").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"member {name} exited with {process.returncode}:\n{err}")
        out = {}
        for name in self.members:
            try:
                out[name] = parse(self.events(name).read_text())
            except FileNotFoundError:
                out[name] = MemberLog()
        return out

    def stop(self, timeout: float = 30.0) -> None:
        self.stop_file.touch()
        deadline = time.monotonic() + timeout
        for process in self.members.values():
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def java_command(classes: Path | None = None) -> list[str]:
    """``java`` with the harness's Kafka jars (and ``classes``) on the class path."""
    from harness.java_tools import java_command as tools_command

    command = tools_command(("-Xms32m", "-Xmx192m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"))
    if classes is not None:
        command[-1] += os.pathsep + str(classes)
    return command


def compile_java(out: Path) -> Path:
    """GroupMember.java compiled once into ``out`` (one javac instead of one per JVM)."""
    out.mkdir(parents=True, exist_ok=True)
    classpath = java_command()[-1]
    javac = str(Path(java_command()[0]).with_name("javac"))
    subprocess.run([javac, "-nowarn", "-cp", classpath, "-d", str(out), str(JAVA_SOURCE)], check=True,
                   capture_output=True, timeout=300)
    return out


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """When ``condition`` first held (checked every 0.1 s); a member that died raises at once."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.1)
    return time.monotonic()


# -- the runs ------------------------------------------------------------------------------
def _cpu_seconds(pids: Iterable[int]) -> float:
    """The members' CPU: a process each (the proxy's, its workers too, is ``harness.processes.cpu_seconds``)."""
    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


def scaling_run(workdir: Path, bootstrap: str, group: str, members: int, *, work_ms: float, warmup: float,
                window: float, profile: Path | None = None, proxy_pid: int | None = None) -> dict[str, Any]:
    """The group's records/s over ``window``, once ``members`` members have settled
    (``profile``: a pyinstrument profile of the first member written there)."""
    from harness.processes import cpu_seconds  # the proxy's: its workers too

    fleet = Fleet(workdir)
    try:
        began = time.monotonic()
        for i in range(members):
            fleet.python(f"m{i}", bootstrap, group, TOPIC, work_ms, profile if i == 0 else None)
        formed = _wait(lambda: keyrange_settled(list(fleet.logs().values()), members), 180,
                       f"{members} members settled") - began
        time.sleep(warmup)  # the measured window starts after the warm-up, not a synchronisation
        pids = [p.pid for p in fleet.members.values()]
        cpu0 = (_cpu_seconds(pids), cpu_seconds([proxy_pid] if proxy_pid else []), psutil.cpu_times())
        t0 = time.monotonic()
        time.sleep(window)
        t1 = time.monotonic()
        cpu1 = (_cpu_seconds(pids), cpu_seconds([proxy_pid] if proxy_pid else []), psutil.cpu_times())
        _wait(lambda: all(log.batches and log.batches[-1][1] >= t1 for log in fleet.logs().values()), 30,
              "every member logged past the window")
        logs = list(fleet.logs().values())
    finally:
        fleet.stop()
    count = sum(finished(log.batches, t0, t1) for log in logs)
    moved = [s[0] for log in logs for s in log.states if t0 <= s[0] < t1]
    per_member = [finished(log.batches, t0, t1) / (t1 - t0) for log in logs]
    idle = (cpu1[2].idle - cpu0[2].idle) / (t1 - t0)
    cores = {"members": round((cpu1[0] - cpu0[0]) / (t1 - t0), 2), "proxy": round((cpu1[1] - cpu0[1]) / (t1 - t0), 2),
             "machine_busy": round((psutil.cpu_count() or 1) - idle, 2)}
    return {"members": members, "records_per_s": count / (t1 - t0), "formed_s": round(formed, 2), "cores_used": cores,
            "stable_through_window": not moved and keyrange_settled(logs, members),
            "per_member_records_per_s": [round(r, 1) for r in per_member]}


def rebalance_run(kind: str, workdir: Path, *, start: Callable[[Fleet, str], None], partitions: int,
                  before: float, after: float, original: int = 4) -> dict[str, Any]:
    """``original`` members (four), then one more joins: each original member's longest stop
    and the group's records/s around the join (times from the members' logs)."""
    fleet = Fleet(workdir)

    def settled(members: int) -> bool:
        logs = list(fleet.logs().values())
        if kind == "keyrange":
            ok = keyrange_settled(logs, members)
        else:
            ok = java_settled(logs, members, partitions, time.monotonic())
        return ok and all(log.batches for log in logs[:original])

    newcomer = f"m{original}"
    try:
        for i in range(original):
            start(fleet, f"m{i}")
        _wait(lambda: settled(original), 180, f"{original} members settled")
        time.sleep(before)  # a stretch of steady running before the join, not a synchronisation
        start(fleet, newcomer)
        done = _wait(lambda: settled(original + 1) and fleet.logs()[newcomer].joined is not None, 180,
                     f"{original + 1} members settled")
        time.sleep(after)
        end = time.monotonic()
        _wait(lambda: all(log.batches[-1][1] >= end for log in list(fleet.logs().values())[:original]), 30,
              "the original members logged past the end")
        logs = fleet.logs()
    finally:
        fleet.stop()
    joined = logs[newcomer].joined
    assert joined is not None
    changed = max(log.last_change for log in logs.values())
    until = max(changed, joined) + 1.0
    steady = rates(logs.values(), joined - before, joined)
    during = rates(logs.values(), joined, until)
    return {
        "kind": kind, "join_to_settled_s": round(changed - joined, 3), "detected_settled_s": round(done - joined, 3),
        "stop_ms": {name: round(1000 * longest_gap(logs[name].batches, joined, until), 1)
                    for name in sorted(logs)[:original]},
        "gap_before_join_ms": {name: round(1000 * longest_gap(logs[name].batches, joined - before, joined), 1)
                               for name in sorted(logs)[:original]},
        "records_per_s_before": statistics.mean(steady), "records_per_s_during": statistics.mean(during),
        "records_per_s_lowest_bin": min(during),
        "records_per_s_after": statistics.mean(rates(logs.values(), min(until, end - 1.0), end)),
        "timeline": {"t0": round(joined - before, 3), "bin_s": BIN,
                     "records_per_s": [round(r) for r in rates(logs.values(), joined - before, end)]},
        "assignments": {name: (log.states[-1][4] if log.states else log.changes[-1][2] if log.changes else "")
                        for name, log in sorted(logs.items())},
        "timelines_ms_from_join": {name: timeline(logs[name], joined - 0.5, until, joined) for name in sorted(logs)},
    }


# -- the benchmark -------------------------------------------------------------------------
def scaling(report: dict, progress: Callable[[str], None], workdir: Path, *, bootstrap: str, counts: list[int],
            proxy_pid: int | None, rounds: int, work_ms: float, warmup: float, window: float) -> None:
    values: dict[int, list[float]] = {m: [] for m in counts}
    for r in range(rounds):
        for m in map(int, rotation([str(c) for c in counts], r)):
            result = scaling_run(workdir / f"scaling-{r}-{m}", bootstrap, f"bench-groups-{os.getpid()}-{r}-{m}", m,
                                 work_ms=work_ms, warmup=warmup, window=window, proxy_pid=proxy_pid)
            values[m].append(result["records_per_s"])
            report.setdefault("runs", []).append({"round": r, **result})
            progress(f"round {r} M={m}: {result['records_per_s']:.0f} records/s (formed in {result['formed_s']} s, "
                     f"stable: {result['stable_through_window']}, cores used {result['cores_used']})")
    for m in counts:
        row = Row("scaling", f"M={m}", "records/s", values[m], baseline="M x one member",
                  baseline_values=[m * one for one in values[1]])
        report["rows"].append(row.as_dict())
        report["goals"].append(goal(f"scaling: M={m} members reach >= 0.9 x M x one member", row.ratio, 0.9))


def _start_python(fleet: Fleet, name: str, *, bootstrap: str, group: str, work_ms: float) -> None:
    fleet.python(name, bootstrap, group, TOPIC, work_ms)


def _start_java(fleet: Fleet, name: str, *, classes: Path, bootstrap: str, group: str, work_ms: float) -> None:
    fleet.java(classes, name, bootstrap, group, JAVA_TOPIC, work_ms)


def rebalance(report: dict, progress: Callable[[str], None], workdir: Path, *, proxy: str, broker: str,
              classes: Path, rounds: int, work_ms: float, before: float, after: float) -> None:
    labels = {"keyrange": "keyrange 1 partition", "java": "Java coop-sticky 4 partitions"}
    found: dict[str, list[dict[str, Any]]] = {kind: [] for kind in labels}
    for r in range(rounds):
        for kind in rotation(list(labels), r):
            group = f"bench-groups-join-{os.getpid()}-{r}-{kind}"
            start = (functools.partial(_start_python, bootstrap=proxy, group=group, work_ms=work_ms)
                     if kind == "keyrange" else
                     functools.partial(_start_java, classes=classes, bootstrap=broker, group=group, work_ms=work_ms))
            try:
                result = rebalance_run(kind, workdir / f"join-{r}-{kind}", start=start,
                                       partitions=1 if kind == "keyrange" else 4, before=before, after=after)
            except Exception as error:  # one failed run must not lose the others' figures
                report["notes"].append(f"round {r} join {kind} failed: {error!r}")
                progress(f"round {r} join {kind} FAILED: {error!r}")
                continue
            found[kind].append(result)
            report.setdefault("runs", []).append({"round": r, **result})
            progress(f"round {r} join {kind}: stops {result['stop_ms']} ms, records/s "
                     f"{result['records_per_s_before']:.0f} before, lowest {result['records_per_s_lowest_bin']:.0f}, "
                     f"{result['records_per_s_after']:.0f} after; settled {result['join_to_settled_s']} s after "
                     "the join")
    for kind, label in labels.items():
        runs = found[kind]
        if not runs:
            continue
        before_rates = [x["records_per_s_before"] for x in runs]
        report["rows"] += [
            Row("rebalance", f"{label}: longest stop of an original member", "ms",
                [max(x["stop_ms"].values()) for x in runs],
                note="longest gap between two finished records, fifth member's subscribe to settled + 1 s").as_dict(),
            Row("rebalance", f"{label}: longest gap before the join", "ms",
                [max(x["gap_before_join_ms"].values()) for x in runs]).as_dict(),
            Row("rebalance", f"{label}: join to settled", "s", [x["join_to_settled_s"] for x in runs]).as_dict(),
            Row("rebalance", f"{label}: lowest {BIN} s of the join", "records/s",
                [x["records_per_s_lowest_bin"] for x in runs], baseline="before the join",
                baseline_values=before_rates).as_dict(),
            Row("rebalance", f"{label}: mean over the join", "records/s", [x["records_per_s_during"] for x in runs],
                baseline="before the join", baseline_values=before_rates).as_dict(),
            Row("rebalance", f"{label}: after the join", "records/s", [x["records_per_s_after"] for x in runs],
                baseline="before the join", baseline_values=before_rates).as_dict(),
        ]
    worst = max((max(x["stop_ms"].values()) for x in found["keyrange"]), default=None)
    report["goals"].append(goal(f"rebalance: no original keyrange member stops when a fifth joins (longest gap "
                                f"<= {STOP_MS:.0f} ms, worst round)", worst, STOP_MS, at_least=False, unit="ms"))


def produce(bootstrap: str, topic: str, records: int, partitions: int, keys: int = 10_000) -> None:
    """``records`` 100-byte records, keys ``key-<i mod keys>``, spread round-robin."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                         "compression.type": "none", "acks": "all"})
    value = b"v" * 100
    for i in range(records):
        while True:
            try:
                producer.produce(topic, key=b"key-%d" % (i % keys), value=value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120) != 0:
        raise RuntimeError("records left unsent")


def _say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work-ms", type=float, default=1.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--before", type=float, default=4.0, help="rebalance: steady seconds before the join")
    parser.add_argument("--after", type=float, default=3.0, help="rebalance: seconds after the group settled")
    parser.add_argument("--output-dir", type=Path, default=results.RESULTS)
    parser.add_argument("--skip", choices=("scaling", "rebalance"), help="leave one part out")
    parser.add_argument("--profile", type=int, metavar="M",
                        help="then one unrecorded scaling run of M members, the first under pyinstrument "
                             "(benchmarks/results/groups_profile.txt)")
    args = parser.parse_args(argv)
    if args.after < 2:
        parser.error("--after must be at least 2 (seconds after the group settled)")
    if 1 not in args.members:
        parser.error("--members must include 1 (the baseline)")
    from harness.kafka_cluster import KafkaCluster
    from proxy.local_kafka import ProxyProcess, scratch_dir
    from tests.conftest import create_topic

    command = " ".join(["flock /tmp/keyrange-bench.lock .venv/bin/python -m benchmarks.bench_groups",
                        *(argv if argv is not None else sys.argv[1:])])
    per_second = 1000 / args.work_ms
    records = int(max(max(args.members), 5) * per_second * (args.warmup + args.window + 25))
    java_records = int(4 * per_second * (args.before + args.after + 60))
    report = results.new_report(
        "groups", "Consumer groups: scaling with subscribe; a fifth member joining four",
        command,
        f"members as processes of their own; {args.work_ms} ms awaited work per record (deadlines chained within a "
        f"poll), commit after every poll. Scaling: one partition of {records} records, a fresh group per run, rate "
        f"over {args.window} s after every member was stable and {args.warmup} s of warm-up. Rebalance: four "
        f"members, {args.before} s steady, a fifth subscribes; stop = an original member's longest gap between two "
        f"finished records from that subscribe until settled + 1 s; records/s in {BIN} s bins against the rate "
        f"before the join; Java: kafka-clients consumers on cooperative-sticky, 4 partitions of {java_records // 4} "
        f"records, direct to the broker. Rounds alternate the order of the contenders.",
        {"records": records, "java_records": java_records, "members": args.members, "rounds": args.rounds})
    workdir = scratch_dir("bench-groups-")
    with KafkaCluster.start(1, workdir=workdir / "kafka") as cluster:
        create_topic(cluster, TOPIC, partitions=1)
        produce(cluster.bootstrap_servers, TOPIC, records, 1)
        if args.skip != "rebalance":
            create_topic(cluster, JAVA_TOPIC, partitions=4)
            produce(cluster.bootstrap_servers, JAVA_TOPIC, java_records, 4)
            classes = compile_java(workdir / "classes")
        proxy = ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / "proxy")
        try:
            if args.skip != "scaling":
                scaling(report, _say, workdir, bootstrap=proxy.bootstrap_servers, counts=args.members,
                        proxy_pid=proxy.process.pid, rounds=args.rounds, work_ms=args.work_ms, warmup=args.warmup, window=args.window)
            if args.skip != "rebalance":
                rebalance(report, _say, workdir, proxy=proxy.bootstrap_servers, broker=cluster.bootstrap_servers,
                          classes=classes, rounds=args.rounds, work_ms=args.work_ms, before=args.before,
                          after=args.after)
            if args.profile:
                path = args.output_dir / "groups_profile.txt"
                run = scaling_run(workdir / "profile", proxy.bootstrap_servers, f"bench-groups-{os.getpid()}-profile",
                                  args.profile, work_ms=args.work_ms, warmup=args.warmup, window=args.window,
                                  profile=path, proxy_pid=proxy.process.pid)
                report["notes"].append(f"profile run (not in the rows): {run}; first member's profile in {path.name}")
        finally:
            proxy.stop()
    print(results.finish(report, args.output_dir))
    for g in report["goals"]:
        print(g)
    return 0


BENCHMARK = Benchmark(
    "bench_groups", "Consumer groups with key ranges: scaling with subscribe, a fifth member joining four",
    main=main, with_all=True)


if __name__ == "__main__":
    raise SystemExit(main())
