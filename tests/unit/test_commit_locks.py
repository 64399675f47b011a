"""Per-key serialisation of commits (proxy.commits.service.KeyLocks)."""

from __future__ import annotations

import trio
import trio.testing

from proxy.commits.service import KeyLocks as _KeyLocks


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
