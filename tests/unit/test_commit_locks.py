"""Per-key serialisation of commits (proxy.commits.writes.KeyLocks), and deletions waiting
for the commits under way (CommitWrites.deleting)."""

from __future__ import annotations

import trio
import trio.testing

from proxy.commits.service import CommitService
from proxy.commits.settings import CommitLogSettings
from proxy.commits.writes import KeyLocks as _KeyLocks


async def test_holders_of_a_key_take_turns_in_order_and_other_keys_do_not_wait():
    locks = _KeyLocks()
    order = []
    await locks.acquire([("g", "t", 0), ("g", "t", 1)])

    async def waiter(name, keys):
        await locks.acquire(keys)
        order.append(name)
        locks.release(keys)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter, "a", [("g", "t", 1)])
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(waiter, "b", [("g", "t", 1), ("g", "t", 2)])
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(waiter, "free", [("g", "t", 3)])
        await trio.testing.wait_all_tasks_blocked()
        assert order == ["free"]
        locks.release([("g", "t", 0), ("g", "t", 1)])
    assert order == ["free", "a", "b"]
    assert locks._held == {}


async def test_a_cancelled_waiter_leaves_the_key_to_the_next_one():
    locks = _KeyLocks()
    key = ("g", "t", 0)
    await locks.acquire([key])
    got = []
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def cancelled():
            with scope:
                await locks.acquire([("g", "t", -1), key])  # takes -1, then waits for key
            got.append("cancelled")

        async def patient():
            await locks.acquire([key])
            got.append("patient")
            locks.release([key])

        nursery.start_soon(cancelled)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(patient)
        await trio.testing.wait_all_tasks_blocked()
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert ("g", "t", -1) not in locks._held  # released on cancellation
        locks.release([key])
    assert got == ["cancelled", "patient"]
    assert locks._held == {}


async def test_drain_waits_for_the_holders_of_a_group_at_the_call_and_holds_nothing():
    locks = _KeyLocks()
    await locks.acquire([("g", "t", 0), ("g", "t", 1), ("other", "t", 0)])
    drained = []

    async def drain(keys):
        await locks.drain("g", keys)
        drained.append(keys)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain, None)
        nursery.start_soon(drain, {("t", 1)})
        await trio.testing.wait_all_tasks_blocked()
        await locks.drain("g", {("t", 2)})  # nobody holds it: at once
        await locks.drain("none")
        locks.release([("g", "t", 0)])
        await trio.testing.wait_all_tasks_blocked()
        assert drained == []  # ("g", "t", 1) is still held
        assert ("g", "t", 0) not in locks._held  # a drain waiting for one key holds no other
        locks.release([("g", "t", 1)])
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(drained, key=str) == sorted([None, {("t", 1)}], key=str)  # ("other", ...) is not waited for
    locks.release([("other", "t", 0)])
    assert locks._held == {}


async def test_a_deletion_waits_for_a_follow_up_that_checked_before_it_began():
    """A transaction's settle takes its key's locks, finds the group not deleted, then
    writes the key's first log record (slow: the log topic may be being created). A
    deletion of the group beginning meanwhile must not read the log for what to tombstone
    before that write is done; a follow-up beginning after it writes nothing."""
    writes = CommitService(CommitLogSettings(segment_bytes=1 << 20), None, pool=None).writes
    since = trio.current_time()
    key = ("g", "t", 0)
    await writes.locks.acquire([key])  # the settle's plan
    assert not writes.deleted_since("g", since)
    steps = []

    async def delete():
        await writes.deleting("g")
        steps.append("tombstones read")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(delete)
        await trio.testing.wait_all_tasks_blocked()
        assert steps == []
        await writes.deleting("g", {("t", 1)})  # offsets of another partition: not held, no wait
        steps.append("settle written")
        writes.locks.release([key])
    assert steps == ["settle written", "tombstones read"]
    assert writes.deleted_since("g", since)  # a follow-up that began before it writes nothing
    assert writes.locks._held == {}
