"""The consumers a chaos cell runs while a producer writes and a fault strikes.

Every workload runs its members as processes of their own, so a fault may SIGKILL one, and
reports what it handed out as event lines (``harness.group_member``'s format: H
handed out, F finished, A/R/L assignment changes, times on the system's monotonic clock).

A workload says what it promises: ``keyed_order`` (per-key order, checked) and whether its
group's committed offsets must reach the log end (``commits``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from chaos.verdict import Handed, pair_events
from harness.group_member import MemberProcesses


@dataclass
class CellContext:
    """What a workload is given: where to read, and the cell's own scratch directory."""

    bootstrap: str  # the proxy (through the links)
    direct: str  # the brokers
    topic: str
    partitions: int
    group: str
    tmp: Path
    seed: int


@dataclass
class Outcome:
    handed: list[Handed]
    killed: dict[str, float] = field(default_factory=dict)
    lost_members: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class Workload:
    name = ""
    description = ""
    keyed_order = True
    commits = True  # the group's committed offsets must reach the log end
    partitions = 2
    shares: int | None = None  # K when the members read the virtual topic <topic>.krK
    striped = False  # with ``shares``: the striped virtual topic <topic>.coopK instead

    def topic_to_read(self, ctx: CellContext) -> str:
        if self.shares is None:
            return ctx.topic
        return f"{ctx.topic}.coop{self.shares}" if self.striped else f"{ctx.topic}.kr{self.shares}"
    exactly_once = False  # judged by its output (``exact``), not by hand-outs

    def exact(self, acked_keys: Counter[bytes]) -> dict:
        """For an exactly-once workload: its output against the acknowledged records per key,
        with at least ``exact`` (bool), ``under`` and ``over`` (keys counted short or twice)."""
        raise NotImplementedError

    def start(self, ctx: CellContext) -> None:
        raise NotImplementedError

    def members(self) -> list[str]:
        """Members alive now, that a fault may kill."""
        raise NotImplementedError

    def kill_member(self, name: str) -> None:
        """SIGKILL ``name`` and start a replacement (a new member, as an orchestrator would)."""
        raise NotImplementedError

    def handed_count(self) -> int:
        """Distinct records handed out so far (to wait on)."""
        raise NotImplementedError

    def check_running(self) -> None:
        """Raise if a member died that no fault killed."""

    def finish(self, timeout: float) -> Outcome:
        """Stop every member cleanly (last commits) and return what they handed out."""
        raise NotImplementedError

    def close(self) -> None:
        """Kill whatever still runs (after ``finish``, or when the cell failed)."""


class MemberFleet(Workload):
    """Members that are processes of ``module`` (group_member or rdkafka_member), each with
    ``member_options(i)``; a killed member is replaced by a new one with the same options."""

    module = "harness.group_member"
    count = 2

    def __init__(self) -> None:
        self.fleet: MemberProcesses | None = None
        self._options: dict[str, list[str]] = {}
        self._serial = 0
        self._seed = 0

    def common_options(self, ctx: CellContext) -> list[str]:
        return []

    def member_options(self, index: int, ctx: CellContext) -> list[str]:
        return []

    def start(self, ctx: CellContext) -> None:
        self._seed = ctx.seed
        self.fleet = MemberProcesses(ctx.tmp, ctx.bootstrap, ctx.group, self.topic_to_read(ctx),
                                     self.common_options(ctx), module=self.module)
        for i in range(self.count):
            self._launch(f"m{i}", self.member_options(i, ctx))

    def _launch(self, name: str, options: list[str]) -> None:
        assert self.fleet is not None
        self._options[name] = options
        self._serial += 1
        self.fleet.start(name, self._seed * 1000 + self._serial, options)

    def members(self) -> list[str]:
        assert self.fleet is not None
        return [name for name in self.fleet.alive() if name not in self.fleet.killed]

    def kill_member(self, name: str) -> None:
        assert self.fleet is not None
        self.fleet.kill(name)
        self._launch(f"{name.split('-')[0]}-{self._serial}", self._options[name])

    def handed_count(self) -> int:
        assert self.fleet is not None
        return len({(e.partition, e.offset) for e in self.fleet.events() if e.kind == "H"})

    def check_running(self) -> None:
        assert self.fleet is not None
        self.fleet.check_running()

    def finish(self, timeout: float) -> Outcome:
        assert self.fleet is not None
        notes: list[str] = []
        try:
            self.fleet.stop_all(timeout)
        except AssertionError as exc:
            notes.append(f"a member did not stop cleanly: {str(exc)[-500:]}")
        events = self.fleet.events()
        handed = pair_events((e.kind, e.member, e.partition, e.offset, bytes.fromhex(e.key) if e.key else None, e.time)
                             for e in events)
        return Outcome(handed, killed=dict(self.fleet.killed), lost_members=self._lost_members(), notes=notes)

    def _lost_members(self) -> dict[str, float]:
        """Members that wrote an L (partitions lost) line, with its time."""
        assert self.fleet is not None
        lost: dict[str, float] = {}
        for name in self.fleet.procs:
            try:
                lines = Path(self.fleet.events_path(name)).read_text().splitlines()
            except FileNotFoundError:
                continue
            for line in lines:
                cells = line.split()
                if len(cells) >= 3 and cells[0] == "L":
                    lost.setdefault(cells[1], float(cells[2]))
        return lost

    def close(self) -> None:
        if self.fleet is not None:
            self.fleet.close()


# -- the workloads --------------------------------------------------------------------------

# Up to 10 ms of work per record (5 on average): members are busy part of the time, so a
# kill finds records handed out and not yet committed.
_WORK = ["--delay-max-ms", "10"]
_MEMBER_TIMING = [*_WORK, "--heartbeat-interval-ms", "500", "--session-timeout-ms", "6000",
                  "--max-poll-interval-ms", "30000"]


class GroupRanges(MemberFleet):
    name = "group-ranges"
    description = "4 proxy.client members in a group on 2 partitions: partitions split into key ranges, IC"
    count = 4

    def common_options(self, ctx: CellContext) -> list[str]:
        return _MEMBER_TIMING


class GroupCoop(MemberFleet):
    name = "group-coop"
    description = ("4 proxy.client members in a group on 2 partitions shared cooperatively (chunks of offsets "
                   "granted by the proxy, no per-key order), IC")
    count = 4
    keyed_order = False

    def common_options(self, ctx: CellContext) -> list[str]:
        return [*_MEMBER_TIMING, "--partition-sharing", "cooperative"]


class GroupWhole(MemberFleet):
    name = "group-whole"
    description = "2 proxy.client members in a group on 4 partitions: whole partitions, IC"
    count = 2
    partitions = 4

    def common_options(self, ctx: CellContext) -> list[str]:
        return _MEMBER_TIMING


class AssignRanges(MemberFleet):
    name = "assign-ranges"
    description = "2 proxy.client members in assign mode, each one key range of both partitions, IC"
    count = 2

    def member_options(self, index: int, ctx: CellContext) -> list[str]:
        return [*_WORK, "--assign", f"{index}/{self.count}", "--partitions", str(ctx.partitions)]


class AssignWhole(MemberFleet):
    name = "assign-whole"
    description = "1 proxy.client member in assign mode, whole partitions, standard commits (no IC)"
    count = 1

    def member_options(self, index: int, ctx: CellContext) -> list[str]:
        return [*_WORK, "--assign", "whole", "--partitions", str(ctx.partitions), "--standard-commits"]


class VirtualRdkafka(MemberFleet):
    name = "virtual-rdkafka"
    description = "3 librdkafka (confluent-kafka) members in a group on T.kr4 of 2 partitions (8 virtual)"
    module = "harness.rdkafka_member"
    count = 3
    shares = 4

    def common_options(self, ctx: CellContext) -> list[str]:
        return [*_WORK, "--shares", str(self.shares), "--heartbeat-interval-ms", "1000", "--session-timeout-ms", "10000"]


class StripedRdkafka(VirtualRdkafka):
    name = "striped-rdkafka"
    description = ("3 librdkafka members in a group on T.coop4 of 2 partitions (8 virtual): stripes of "
                   "batches, no per-key order")
    striped = True
    keyed_order = False


WORKLOADS: dict[str, Callable[[], Workload]] = {
    w.name: w for w in (GroupRanges, GroupCoop, GroupWhole, AssignRanges, AssignWhole, VirtualRdkafka, StripedRdkafka)
}


def register(factory: Callable[[], Workload], name: str) -> None:
    """Workloads that need optional parts (Java, Spark) register themselves by name."""
    WORKLOADS[name] = factory


def wait_for(condition: Callable[[], bool], timeout: float, interval: float = 0.2,
             also: Sequence[Callable[[], None]] = ()) -> bool:
    """True once ``condition`` holds, False at ``timeout``; ``also`` run each round (checks
    that raise, e.g. a member that died unasked)."""
    deadline = time.monotonic() + timeout
    while True:
        for check in also:
            check()
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
