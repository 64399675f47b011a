"""Consumer groups with key ranges: processing-bound scaling with ``subscribe``.

    flock /tmp/keyrange-bench.lock .venv/bin/python -m benchmarks.bench_groups

One partition; each record costs 1 ms of awaited work, sequential per member; M members
(M = 1, 2, 4, 8, 16) subscribe as one group (a fresh group per run, so each starts at
offset 0), the keyrange assignor gives each 1/M of the partition's hash space, and each
marks what it processed and commits after every poll. Once the group has settled (every
member stable, nothing being revoked) and after a warm-up, the records finished in a
window give the group's rate. Rounds alternate the order of M; each round's rate for M is
compared with M x that round's rate of one member (goal: >= 0.9).

``run(report, progress, ...)`` is what the comparison runner can call; ``main`` runs it
standalone and writes ``benchmarks/results/groups.json`` and ``groups.png``.

Not measured here yet: the rebalance cost of a join into a running group of four beside
Java consumers with cooperative-sticky.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import trio

from benchmarks import results
from benchmarks.rounds import Row, goal, rotation
from proxy.client import Consumer, RetriableError

TOPIC = "bench-groups"


async def measure(bootstrap: str, group: str, members: int, *, work_ms: float, warmup: float,
                  window: float) -> dict[str, Any]:
    """The group's records/s over ``window`` once ``members`` members have settled."""
    consumers: list[Consumer] = []
    finished = [0]
    stop = trio.Event()

    async def member(i: int) -> None:
        async with Consumer(bootstrap, group_id=group, client_id=f"bench-{i}", allow_individual_commit=True,
                            auto_offset_reset="earliest", heartbeat_interval_ms=500, session_timeout_ms=10_000,
                            max_poll_records=50) as consumer:
            consumer.subscribe([TOPIC])
            consumers.append(consumer)
            while not stop.is_set():
                for record in await consumer.poll(0.2):
                    await trio.sleep(work_ms / 1000)
                    consumer.mark_processed(record)
                    finished[0] += 1
                try:
                    await consumer.commit()
                except RetriableError:
                    pass

    def settled() -> bool:
        if len(consumers) != members:
            return False
        metas = [c.group_metadata() for c in consumers]
        return (all(m["phase"] == "stable" for m in metas) and len({m["generation"] for m in metas}) == 1
                and all(c.assignment() and not c.to_be_revoked() for c in consumers))

    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        for i in range(members):
            nursery.start_soon(member, i)
        with trio.fail_after(120):
            while not settled():
                await trio.sleep(0.05)
        formed = trio.current_time() - started
        await trio.sleep(warmup)
        before, t0 = finished[0], trio.current_time()
        await trio.sleep(window)
        count, elapsed = finished[0] - before, trio.current_time() - t0
        stable = settled()
        stop.set()
    return {"members": members, "records_per_s": count / elapsed, "formed_s": round(formed, 2),
            "stable_through_window": stable}


def run(report: dict, progress: Any, *, bootstrap: str, counts: list[int], rounds: int, work_ms: float,
        warmup: float, window: float) -> None:
    rates: dict[int, list[float]] = {m: [] for m in counts}
    for r in range(rounds):
        for m in rotation(counts, r):
            result = trio.run(lambda: measure(bootstrap, f"bench-groups-{r}-{m}", m, work_ms=work_ms,
                                              warmup=warmup, window=window))
            rates[m].append(result["records_per_s"])
            report.setdefault("runs", []).append({"round": r, **result})
            if progress is not None:
                progress(f"round {r} M={m}: {result['records_per_s']:.0f} records/s")
    for m in counts:
        row = Row("scaling", f"M={m}", "records/s", rates[m], baseline="M x one member",
                  baseline_values=[m * one for one in rates[1]])
        report["rows"].append(row.as_dict())
        report["goals"].append(goal(f"M={m} members reach >= 0.9 x M x one member", row.ratio, 0.9))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work-ms", type=float, default=1.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--window", type=float, default=5.0)
    args = parser.parse_args(argv)
    if 1 not in args.members:
        parser.error("--members must include 1 (the baseline)")
    from benchmarks.bench_consumer import _produce
    from proxy.testing.kafka_cluster import KafkaCluster
    from proxy.testing.proxy_process import ProxyProcess
    from proxy.testing.scratch import scratch_dir
    from tests.conftest import create_topic

    command = " ".join(["flock /tmp/keyrange-bench.lock .venv/bin/python -m benchmarks.bench_groups",
                        *(argv if argv is not None else sys.argv[1:])])
    records = int(max(args.members) * 1000 / args.work_ms * (args.warmup + args.window + 4) * 1.2)
    report = results.new_report(
        "groups", "Consumer groups: processing-bound scaling with subscribe (ratio to M x one member)", command,
        f"one partition of {records} records; {args.work_ms} ms awaited work per record; a fresh group per run; "
        f"rate over {args.window} s after the group settled and {args.warmup} s of warm-up; all members in one "
        f"process; rounds alternate the order of M", {"records": records, "members": args.members,
                                                       "rounds": args.rounds})
    workdir = scratch_dir("bench-groups-")
    with KafkaCluster.start(1, workdir=workdir / "kafka") as cluster:
        create_topic(cluster, TOPIC, partitions=1)
        _produce(cluster.bootstrap_servers, TOPIC, records, 10_000)
        proxy = ProxyProcess.start(cluster.bootstrap_servers, workdir=workdir / "proxy")
        try:
            run(report, lambda text: print(text, flush=True), bootstrap=proxy.bootstrap_servers, counts=args.members,
                rounds=args.rounds, work_ms=args.work_ms, warmup=args.warmup, window=args.window)
        finally:
            proxy.stop()
    print(results.finish(report))
    for g in report["goals"]:
        print(g)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
