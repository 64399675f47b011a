"""How a benchmark worker process ends: when its work returns, or on SIGTERM / SIGINT
from the parent, which cancels the work (its ``finally`` blocks still run)."""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable

import trio


async def until_signalled(work: Callable[[], Awaitable[None]]) -> None:
    async with trio.open_nursery() as nursery:
        async def stop_on_signal() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    return

        nursery.start_soon(stop_on_signal)
        await work()
        nursery.cancel_scope.cancel()


def stop_processes(processes: list, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
    """From the parent: ``sig`` to every worker still running, then wait for each, killing
    one that has not ended within ``timeout`` seconds."""
    import subprocess

    for process in processes:
        if process.poll() is None:
            process.send_signal(sig)
    for process in processes:
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
