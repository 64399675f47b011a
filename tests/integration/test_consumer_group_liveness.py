"""KIP-62 liveness of group members through the real proxy: heartbeats run in the
background whatever the application does; only a missed ``max_poll_interval_ms`` removes a
member, and its next poll tells it (``on_lost``, ``lost()``, ``CommitFailedError``) and
rejoins."""

from __future__ import annotations

import time

import trio

from proxy.client import CommitFailedError, Consumer, RetriableError, TopicPartition

from .test_consumer_group import DEADLINE, Recorder, _commit, _produce


async def test_member_that_misses_the_poll_interval_is_removed_and_rejoins(kafka, proxy, topic_factory):
    topic = topic_factory(kafka, partitions=1)
    group = f"g-{topic}"
    total = 3000
    _produce(kafka.bootstrap_servers, topic, 1, total, keys=30)
    finished: dict[int, list[tuple[float, str]]] = {}
    stuck_listener = Recorder()
    block = {"start": 0.0, "end": 0.0}
    commit_failed: list[CommitFailedError] = []
    lost_seen: list[set[TopicPartition]] = []
    rejoined = trio.Event()
    done = trio.Event()

    async def member(name: str, *, stuck: bool, started: trio.Event) -> None:
        listener = stuck_listener if stuck else Recorder()
        async with Consumer(proxy.bootstrap_servers, group_id=group, client_id=name, allow_individual_commit=True,
                            auto_offset_reset="earliest", heartbeat_interval_ms=300, session_timeout_ms=6000,
                            max_poll_interval_ms=3000 if stuck else 30_000, max_poll_records=10) as consumer:
            consumer.subscribe([topic], listener)
            blocked = False
            while not done.is_set():
                records = await consumer.poll(0.2)
                if stuck and consumer.lost():
                    lost_seen.append(consumer.lost())
                if stuck and blocked and stuck_listener.lost and len(stuck_listener.assigned) >= 2:
                    rejoined.set()
                for record in records:
                    if stuck and not blocked and len(finished) >= total // 10:
                        blocked = True
                        block["start"] = trio.current_time()
                        # blocking work off the event loop: heartbeats go on, polls do not
                        await trio.to_thread.run_sync(time.sleep, 6.0)
                        block["end"] = trio.current_time()
                    await trio.sleep(0.003)
                    finished.setdefault(record.offset, []).append((trio.current_time(), name))
                    consumer.mark_processed(record)
                    started.set()
                try:
                    await _commit(consumer)
                except CommitFailedError as exc:
                    assert stuck, exc
                    commit_failed.append(exc)
            assert listener.lost == [] or stuck

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            started = [trio.Event() for _ in range(3)]
            nursery.start_soon(lambda: member("stuck", stuck=True, started=started[0]))
            for i in (1, 2):
                nursery.start_soon(lambda i=i: member(f"steady-{i}", stuck=False, started=started[i]))
            while len(finished) < total or not rejoined.is_set():
                await trio.sleep(0.1)
            done.set()

    assert sorted(finished) == list(range(total)), "a record was lost"
    # removed: the application was told three ways
    assert len(stuck_listener.lost) == 1, stuck_listener.lost
    assert lost_seen == [{TopicPartition(topic, 0)}]
    assert len(commit_failed) == 1, "the commit right after the block must fail"
    # the others kept going while it was blocked (after its poll interval ran out)
    during = [o for o, outs in finished.items()
              if any(block["start"] + 3.5 <= t <= block["end"] and who != "stuck" for t, who in outs)]
    assert during, "the other members stopped while one was blocked"
    # and it rejoined: assigned again after the loss
    assert len(stuck_listener.assigned) >= 2


async def test_slow_member_that_polls_in_time_keeps_its_membership(kafka, proxy, topic_factory):
    """Each poll is followed by 8 s of blocking work, longer than the 6 s session timeout:
    only the background heartbeats keep the member in, and they do."""
    topic = topic_factory(kafka, partitions=2)
    group = f"g-{topic}"
    _produce(kafka.bootstrap_servers, topic, 2, 40, keys=10)
    listener = Recorder()
    with trio.fail_after(DEADLINE):
        async with Consumer(proxy.bootstrap_servers, group_id=group, client_id="slow", allow_individual_commit=True,
                            auto_offset_reset="earliest", heartbeat_interval_ms=500, session_timeout_ms=6000,
                            max_poll_interval_ms=20_000, max_poll_records=2) as slow, \
                Consumer(proxy.bootstrap_servers, group_id=group, client_id="fast", allow_individual_commit=True,
                         auto_offset_reset="earliest", heartbeat_interval_ms=500, session_timeout_ms=6000,
                         max_poll_records=5) as fast:
            slow.subscribe([topic], listener)
            fast.subscribe([topic])
            while not (slow.assignment() and fast.assignment() and slow.group_metadata()["phase"] == "stable"
                       and fast.group_metadata()["phase"] == "stable"
                       and len(slow.assignment()) == 1 and len(fast.assignment()) == 1):
                for consumer in (slow, fast):  # a revocation completes once its records are processed
                    for record in await consumer.poll(0.1):
                        consumer.mark_processed(record)
                    await _commit(consumer)
            before = slow.group_metadata()
            # the slow member may have joined alone and handed a partition over on the way
            # to stable: only what happens from here on counts
            revoked_before, lost_before = len(listener.revoked), len(listener.lost)
            processed = 0
            stretches = 0

            async def keep_fast_polling() -> None:
                while True:
                    for record in await fast.poll(0.2):
                        fast.mark_processed(record)
                    await _commit(fast)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(keep_fast_polling)
                while stretches < 2:
                    records = await slow.poll(1.0)
                    if records:
                        await trio.to_thread.run_sync(time.sleep, 8.0)  # heartbeats only, for 8 s
                        stretches += 1
                    for record in records:
                        slow.mark_processed(record)
                        processed += 1
                    try:
                        await slow.commit()
                    except RetriableError:
                        pass
                nursery.cancel_scope.cancel()
            after = slow.group_metadata()

    assert processed > 0
    assert listener.lost[lost_before:] == [] and listener.revoked[revoked_before:] == []
    assert (after["member_id"], after["generation"]) == (before["member_id"], before["generation"])
