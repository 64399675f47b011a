"""Workload 2, key-ordered and processing-bound: 1 ms of work per record, one partition,
10,000 keys, N = 1, 4, 16 workers:

- ours: N key-range consumers (``proxy.client.Consumer``, assign mode, equal shares of the
  key-hash space) through the proxy, trio tasks of one process, individual commit after
  every poll in the background; ours_subscribe: the same as members of one group
  (``subscribe``; the group's keyrange assignor cuts the partition);
- share groups: N KafkaShareConsumers of one share group (``benchmarks/java/share``);
- Parallel Consumer: one consumer, KEY ordering, maxConcurrency N;
- a plain consumer group of N KafkaConsumers: on one partition only one member works.
  It is the baseline of every row.

Every worker paces its work the same way (each call ends one work time after the previous
call's deadline, so neither trio's millisecond timer rounding nor the JVM's park overshoot
counts as work; a worker idle for more than two work times restarts from now, so waiting
for records is never made up) and checks each key's sequence numbers: a record
of a key processed after a later record of that key is an order violation (the same
record again is counted as a redelivery). Rates are counted over a window that starts a
warm-up after the first record was processed.
"""

from __future__ import annotations

import statistics
import time
import uuid

import trio

from benchmarks.peers import parallel_consumer, share_groups
from benchmarks.rounds import Row, goal, rotation
from benchmarks.workloads import data
from proxy.testing import java_tools
from proxy.testing.kafka_cluster import KafkaCluster
from proxy.testing.proxy_process import ProxyProcess
from proxy.testing.scratch import scratch_dir

TOPIC = "ko-work"
PEERS = ("ours", "ours_subscribe", "share_group", "parallel_consumer", "plain_group")


def ours(bootstrap: str, topic: str, workers: int, *, work_ms: float = 1.0, warmup: float = 3.0,
         window: float = 8.0, records: int = 0, timeout: float = 180.0, subscribe: bool = False) -> dict:
    """N range consumers through the proxy at ``bootstrap``; the same JSON fields as the Java
    harness (records/s over the window, or until ``records`` were processed). ``subscribe``:
    members of one group that splits the partition by key range (the keyrange assignor)
    instead of assign mode with equal shares; the warm-up then starts once every member
    has processed a record, so the joins are over."""
    return trio.run(_ours, bootstrap, topic, workers, work_ms, warmup, window, records, timeout, subscribe)


async def _ours(bootstrap: str, topic: str, workers: int, work_ms: float, warmup: float, window: float,
                records: int, timeout: float, subscribe: bool) -> dict:
    from proxy.client import Consumer, RetriableError, TopicPartition, equal_shares

    tp = TopicPartition(topic, 0)
    group = f"bench-{uuid.uuid4().hex[:8]}"
    shares = equal_shares(workers)
    work = work_ms / 1000
    processed = 0
    violations = redeliveries = 0
    last: dict[bytes, int] = {}
    first = trio.Event()
    enough = trio.Event()
    working = [trio.Event() for _ in range(workers)]

    async def member(i: int, task_status=trio.TASK_STATUS_IGNORED) -> None:
        nonlocal processed, violations, redeliveries
        async with Consumer(bootstrap, group_id=group, client_id=f"{group}-{i}", auto_offset_reset="earliest",
                            allow_individual_commit=True, max_poll_records=500) as consumer:
            if subscribe:
                consumer.subscribe([topic])
            else:
                consumer.assign({tp: [shares[i]] if workers > 1 else []})
            task_status.started()
            committing = False
            due = trio.current_time()
            async with trio.open_nursery() as background:
                async def commit() -> None:
                    nonlocal committing
                    try:
                        await consumer.commit()
                    except RetriableError:  # a rebalance is completing; the next commit carries them
                        pass
                    finally:
                        committing = False

                while True:
                    batch = await consumer.poll(1.0)
                    for record in batch:
                        if work:
                            now = trio.current_time()
                            if now - due > 2 * work:  # idle (waiting for records): not made up
                                due = now
                            due += work
                            await trio.sleep_until(due)  # the slow service call
                        key, sequence = data.sequence_of(record.value)
                        previous = last.get(key)
                        if previous is not None and sequence <= previous:
                            if sequence == previous:
                                redeliveries += 1
                            else:
                                violations += 1
                        last[key] = sequence
                        consumer.mark_processed(record)
                        processed += 1
                        first.set()
                        working[i].set()
                        if records and processed >= records:
                            enough.set()
                    if not committing:
                        committing = True
                        background.start_soon(commit)

    began = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(workers):
            await nursery.start(member, i)
        with trio.fail_after(timeout):
            await first.wait()
            first_at = time.perf_counter()
            if records:
                await enough.wait()
                counted, seconds = processed, time.perf_counter() - began
            else:
                if subscribe:
                    with trio.move_on_after(60):  # a member left without records is reported, not waited for
                        for event in working:
                            await event.wait()
                await trio.sleep(warmup)
                before, start = processed, time.perf_counter()
                await trio.sleep(window)
                counted, seconds = processed - before, time.perf_counter() - start
        nursery.cancel_scope.cancel()
    return {"peer": "ours_subscribe" if subscribe else "ours", "workers": workers, "records": counted, "seconds": round(seconds, 3),
            "records_per_s": round(counted / seconds, 1), "processed_total": processed,
            "order_violations": violations, "redeliveries": redeliveries, "keys_seen": len(last),
            "first_record_after_s": round(first_at - began, 3),
            "members_working": sum(event.is_set() for event in working)}


def run(report: dict, progress, *, workers: list[int], rounds: int, work_ms: float, keys: int,
        warmup: float, window: float) -> None:
    ideal = max(workers) * 1000 / work_ms
    records = int(ideal * (warmup + window + 6) * 1.3)
    report["sizes"] = {"records": records, "keys": keys, "value bytes": 100, "work per record": f"{work_ms:g} ms",
                       "workers": workers, "rounds": rounds, "warm-up": f"{warmup:g} s", "window": f"{window:g} s"}
    workdir = scratch_dir("bench-key-ordered-")
    progress.step("starting Kafka and the proxy")
    with KafkaCluster.start(1, workdir=workdir / "kafka", broker_properties=share_groups.BROKER_PROPERTIES) as cluster:
        proxy = ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / "proxy")
        try:
            progress.step(f"writing {records:,} records of {keys:,} keys")
            java_tools.create_topic(cluster.bootstrap_servers, TOPIC, partitions=1)
            data.produce_keyed(cluster.bootstrap_servers, TOPIC, records, keys=keys, value_size=100)

            def measure(peer: str, n: int) -> dict:
                group = f"ko-{peer}-{n}-{uuid.uuid4().hex[:6]}"
                options = {"work_ms": work_ms, "warmup": warmup, "window": window}
                if peer in ("ours", "ours_subscribe"):
                    return ours(proxy.bootstrap_servers, TOPIC, n, subscribe=peer == "ours_subscribe", **options)
                if peer == "share_group":
                    return share_groups.key_ordered(cluster.bootstrap_servers, TOPIC, group, n, **options)
                if peer == "parallel_consumer":
                    return parallel_consumer.key_ordered(cluster.bootstrap_servers, TOPIC, group, n, **options)
                return share_groups.key_ordered(cluster.bootstrap_servers, TOPIC, group, n, mode="plain", **options)

            runs: dict[tuple[str, int], list[dict]] = {(p, n): [] for p in PEERS for n in workers}
            for number in range(rounds):
                for n in workers:
                    for peer in rotation(PEERS, number + n):
                        progress.step(f"round {number + 1}/{rounds}: {peer}, N={n}")
                        runs[(peer, n)].append(measure(peer, n))
        finally:
            proxy.stop()

    def rates(peer: str, n: int) -> list[float]:
        return [r["records_per_s"] for r in runs[(peer, n)]]

    rows = []
    for n in workers:
        for peer in PEERS[:-1]:
            violations = [r["order_violations"] for r in runs[(peer, n)]]
            rows.append(Row(f"N={n} records/s", peer, "records/s", rates(peer, n), "plain_group",
                            rates("plain_group", n),
                            note=f"order violations per round: {violations}; redeliveries: "
                                 f"{[r['redeliveries'] for r in runs[(peer, n)]]}"))
        for peer in ("ours", "ours_subscribe"):
            rows.append(Row(f"N={n} records/s", peer, "records/s", rates(peer, n), "parallel_consumer",
                            rates("parallel_consumer", n)))
    report["rows"] = [row.as_dict() for row in rows]
    goals = []
    for mine in ("ours", "ours_subscribe"):
        one = rates(mine, 1) if 1 in workers else None
        for n in workers:
            if one and n > 1:
                scaling = statistics.median(r / (n * o) for r, o in zip(rates(mine, n), one))
                goals.append(goal(f"{mine} at N={n} >= 0.9 x N x {mine} at N=1", scaling, 0.9))
            versus_pc = statistics.median(o / p for o, p in zip(rates(mine, n), rates("parallel_consumer", n)))
            goals.append(goal(f"{mine} >= Parallel Consumer at N={n}", versus_pc, 1.0))
        total_violations = sum(r["order_violations"] for n in workers for r in runs[(mine, n)])
        goals.append(goal(f"{mine}: per-key order violations", total_violations, 0, at_least=False))
    report["goals"] = goals
    report["order_violations"] = {f"{peer} N={n}": [r["order_violations"] for r in runs[(peer, n)]]
                                  for peer in PEERS for n in workers}
    report["runs"] = {f"{peer} N={n}": runs[(peer, n)] for peer in PEERS for n in workers}
    report["notes"].append("ours: assign mode, equal key-hash shares; ours_subscribe: members of one group "
                           "(subscribe, the keyrange assignor), measured once every member has processed a record.")
