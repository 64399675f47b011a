"""Cooperative members as the tests run them: a hot key, and a member that hands out each
record it is given, works on it a moment, marks it processed and commits what it marked."""

from __future__ import annotations

import random

import trio

from harness.history import History
from proxy.client import Consumer, TopicPartition


def hot_key(seq: int, rng: random.Random, keys: int) -> bytes:
    """Half the records have one key."""
    return b"hot" if rng.random() < 0.5 else f"user-{rng.randrange(keys)}".encode()


async def cooperative_member(bootstrap: str, group: str, tp: TopicPartition, name: str, history: History,
                             handed: dict[str, int], stop: trio.Event, *, work: float = 0.0002) -> None:
    """Read ``tp`` cooperatively until ``stop``: each record handed out (``history``,
    ``handed`` per member), ``work`` seconds on it, then marked processed; the marks
    committed after each poll."""
    async with Consumer(bootstrap, group_id=group, client_id=name, auto_offset_reset="earliest",
                        allow_individual_commit=True, max_partition_fetch_bytes=2048) as consumer:
        consumer.assign([tp], cooperative=True)
        while not stop.is_set():
            for record in await consumer.poll(0.3):
                history.deliver(name, record.topic, record.partition, record.offset, record.key)
                handed[name] = handed.get(name, 0) + 1
                await trio.sleep(work)
                consumer.mark_processed(record)
            await consumer.commit_processed()
