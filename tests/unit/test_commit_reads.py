"""What a group has committed, read while transactions commit and their ranges are folded
into the log (proxy.commits.reads): a range moved from a member's shadow into the log while
the committed state is read is seen, whichever read it lands between."""

from __future__ import annotations

import trio

from proxy.commits.reads import CommittedReads
from proxy.commits.shadows import encode_ranges, range_shadow
from proxy.commits.state import CommitState
from proxy.protocol.constants import ErrorCode

GROUP = "g"
KEY = ("t", 0)
PARTITIONS = 4
SHADOW = range_shadow(GROUP, "member-d", PARTITIONS)


class World:
    """The log and the member's range shadow. Before the first read of either: offset 5
    committed in a transaction and still in the shadow. Right after it: 5 folded into the
    log and the member's next transaction (offset 6) rewrote its shadow without 5."""

    def __init__(self) -> None:
        self.reads: list[str] = []

    @property
    def folded(self) -> bool:
        return bool(self.reads)

    def read(self, what: str) -> None:
        self.reads.append(what)

    def log_state(self) -> CommitState:
        return CommitState(0, [(5, 5)]) if self.folded else CommitState(0)

    def shadow(self) -> list[tuple[int, int]]:
        return [(6, 6)] if self.folded else [(5, 5)]


class FakeCluster:
    def __init__(self, world: World) -> None:
        self.world = world

    async def offsets_partitions(self) -> int:
        return PARTITIONS

    async def groups_beside(self, group: str) -> list[str]:
        return [SHADOW]

    async def committed_groups(self, group: str, asked: dict, *, require_stable: bool) -> dict:
        answer = {name: {key: (7, encode_ranges(0, self.world.shadow()), int(ErrorCode.NONE)) for key in keys}
                  for name, keys in asked.items()}
        self.world.read("shadows")
        return answer

    async def committed_offsets(self, group: str, keys: list) -> dict:
        return {key: -1 for key in keys}


class FakeLog:
    """What an instance has read of the log: memory as of its last catch-up."""

    partitions = PARTITIONS

    def __init__(self, world: World) -> None:
        self.world = world
        self.cluster = FakeCluster(world)
        self.memory: dict = {}

    async def catch_up(self, group: str) -> None:
        self.memory = {KEY: (10, self.world.log_state())}
        self.world.read("log")

    def records(self, group: str) -> dict:
        return dict(self.memory)


def _committed_state() -> tuple[tuple[int, tuple], list[str]]:
    world = World()
    log = FakeLog(world)
    reads = CommittedReads(log, log.cluster)  # type: ignore[arg-type]  # duck-typed fakes

    async def main() -> tuple[int, tuple]:
        return await reads.committed_state(GROUP, KEY, with_shadows=True)

    return trio.run(main), world.reads


def test_a_range_folded_into_the_log_while_the_state_is_read_is_still_committed():
    (stable, ranges), order = _committed_state()
    assert (5, 5) in ranges, f"offset 5, committed in a transaction and folded meanwhile, is missing: {stable} {ranges}"
    assert order[0] == "shadows"


def test_what_the_shadows_hold_beyond_the_log_is_against_the_log_read_after_them():
    world = World()
    log = FakeLog(world)
    reads = CommittedReads(log, log.cluster)  # type: ignore[arg-type]  # duck-typed fakes

    async def main():
        return await reads.shadowed_ranges(GROUP, [SHADOW], [KEY], require_stable=False)

    extra, pending = trio.run(main)
    assert world.reads == ["shadows", "log"]
    assert not pending
    assert extra == {}  # the shadow's 5 is in the log read after it
    assert log.records(GROUP)[KEY][1] == CommitState(0, [(5, 5)])
