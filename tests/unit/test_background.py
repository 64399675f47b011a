"""Follow-ups that outlive a client's connection (proxy.pipeline.background): bounded,
failures contained, cancelled with their nursery."""

from __future__ import annotations

import trio
import trio.testing

from proxy.pipeline.background import Background


async def test_follow_ups_run_until_done_and_beyond_the_limit_are_refused():
    background = Background(limit=2)
    release = trio.Event()
    finished = []

    async def follow_up(name: str) -> None:
        await release.wait()
        finished.append(name)

    async with trio.open_nursery() as nursery:
        await nursery.start(background.run)
        assert background.start(follow_up, "a") and background.start(follow_up, "b")
        assert not background.start(follow_up, "c")  # two run already
        assert (background.running, background.refused) == (2, 1)
        release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(finished) == ["a", "b"] and background.running == 0
        assert background.start(follow_up, "d")  # room again
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert sorted(finished) == ["a", "b", "d"]


async def test_a_failing_follow_up_is_logged_and_harms_nothing_else(caplog):
    background = Background()
    done = trio.Event()

    async def fails() -> None:
        raise RuntimeError("boom")

    async def works() -> None:
        done.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(background.run)
        background.start(fails)
        background.start_soon(works)  # a helper: started whatever the count
        await done.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert background.running == 0
        nursery.cancel_scope.cancel()
    assert "a follow-up task failed" in caplog.text


def test_nothing_starts_before_the_nursery_runs():
    background = Background()

    async def never() -> None:
        raise AssertionError("started")

    assert not background.start(never)
    assert background.refused == 1
