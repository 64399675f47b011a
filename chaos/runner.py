"""One chaos cell, start to verdict: a topic of its own, live production, a workload, a
fault schedule, then the checker.

The producer (acks=all, idempotent, straight to the brokers) writes small bursts with idle
gaps for ``seconds``; the members start with it; the fault strikes after a warm-up and is
over before the producer is; then every acknowledged record must be handed out within
``catch_up`` seconds, and the group's committed offsets must reach the log end. The cell's
verdict (``chaos.verdict``) and its timeline are returned as one JSON-ready dict.
"""

from __future__ import annotations

import logging
import random
import time
import traceback
from collections import Counter
from pathlib import Path

from chaos.env import ChaosEnv
from chaos.faults import FAULTS
from chaos.verdict import Acked, judge, pauses
from chaos.workloads import WORKLOADS, CellContext, wait_for
from harness.history import History
from harness.live import LiveProducer

log = logging.getLogger("chaos")

WARM_UP_DEADLINE = 30.0  # for the members to hand out their first records
MIN_FAULT_WINDOW = 8.0  # seconds a fault schedule always has after the warm-up
CATCH_UP = 90.0  # after the producer and the fault are done, for every record to be handed out
COMMIT_DEADLINE = 30.0  # then for the committed offsets to reach the log end
STOP_TIMEOUT = 60.0
# Seconds of production a fault needs at least, so that records keep coming for as long as
# it lasts: a rolling restart of every proxy, each drained, started and ready in turn.
MIN_SECONDS = {"rolling-restart": 30.0}


class TimedHistory(History):
    """A ``History`` that also keeps when each acknowledgement arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.ack_times: list[float] = []

    def ack(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None) -> None:
        self.ack_times.append(time.monotonic())
        super().ack(topic, partition, offset, key, value)


def run_cell(env: ChaosEnv, workload_name: str, fault_name: str, seed: int, *, records: int = 2400,
             seconds: float = 16.0, workdir: Path) -> dict:
    workload = WORKLOADS[workload_name]()
    fault = FAULTS[fault_name]
    rng = random.Random(f"{seed}/{workload_name}/{fault_name}")
    began = time.monotonic()
    seconds = max(seconds, MIN_SECONDS.get(fault_name, 0.0))
    result: dict = {"workload": workload_name, "fault": fault_name, "topology": env.label, "seed": seed,
                    "records": records, "seconds": seconds, "description": workload.description}
    env.heal()
    where = "" if env.topology == "sidecar" else f"-{env.label}"
    slug = f"{workload_name}-{fault_name}{where}-{seed}".replace("_", "-")
    topic = env.create_topic(f"chaos-{slug}-{int(time.time() * 1000) % 100000}", workload.partitions)
    cell_dir = workdir / slug
    cell_dir.mkdir(parents=True, exist_ok=True)
    ctx = CellContext(bootstrap=env.proxy_bootstrap, direct=env.direct_bootstrap, topic=topic,
                      partitions=workload.partitions, group=f"chaos-{topic}", tmp=cell_dir, seed=seed)
    history = TimedHistory()
    producer = LiveProducer(env.direct_bootstrap, topic, history, records=records, seconds=seconds, seed=seed)
    actions = []
    balanced = env.balancer_counts()
    try:
        workload.start(ctx)
        producer.start()
        producer_began = time.monotonic()
        # the warm-up: members have joined and hand records out before the fault strikes
        result["warmed_up"] = wait_for(lambda: workload.handed_count() > 0, WARM_UP_DEADLINE,
                                       also=[workload.check_running])
        # The fault strikes while the producer writes; if the members were slow to start (a
        # loaded machine), it still gets a window of its own rather than none.
        actions = fault(env, workload, ctx, rng, max(producer_began + seconds, time.monotonic() + MIN_FAULT_WINDOW))
        env.heal()
        producer.join(seconds + 120)
        faults_over = time.monotonic()

        def caught_up() -> bool:
            return workload.handed_count() >= len({(a.partition, a.offset) for a in history.acks})

        delivered = wait_for(caught_up, CATCH_UP, interval=0.5, also=[workload.check_running])
        result["catch_up_s"] = round(time.monotonic() - faults_over, 2)
        log_end: dict[int, int] = {}
        committed: dict[int, int] | None = None
        if workload.commits:
            log_end = env.log_end(topic, workload.partitions)
            wait_for(lambda: env.committed(ctx.group, topic, workload.partitions) == log_end, COMMIT_DEADLINE,
                     interval=0.5)
        outcome = workload.finish(STOP_TIMEOUT)
        if workload.commits:
            committed = env.committed(ctx.group, topic, workload.partitions)
            log_end = env.log_end(topic, workload.partitions)
        acked = [Acked(a.partition, a.offset, a.key, t) for a, t in zip(history.acks, history.ack_times, strict=True)]
        verdict = judge(acked, outcome.handed, killed=outcome.killed, lost_members=outcome.lost_members,
                        keyed_order=workload.keyed_order, committed=committed,
                        log_end=log_end if workload.commits else None, heals=[a.healed for a in actions])
        if workload.exactly_once:
            # judged by the output: nothing is handed out record by record
            exact = workload.exact(Counter(a.key for a in history.acks if a.key is not None))
            verdict.lost = []
            verdict.recovery = []
            result["exact"] = exact
            if not exact["exact"]:
                outcome.notes.append(f"output not exact: {exact['under']} keys counted short, {exact['over']} "
                                     f"counted twice, e.g. {exact['examples']}")
        result.update(verdict.as_dict())
        if actions and not workload.exactly_once:
            result["pause"] = pauses(outcome.handed, acked, [(a.began, a.healed) for a in actions],
                                     exclude=outcome.killed)
        result["delivered_in_time"] = delivered
        result["producer_failed"] = producer.failed
        result["members_killed"] = sorted(outcome.killed)
        result["members_lost"] = sorted(outcome.lost_members)
        result["notes"] = outcome.notes + ([f"producer gave up on {producer.failed} records: {producer.errors[:3]}"]
                                           if producer.failed else [])
        result["ok"] = verdict.ok and not outcome.notes
    except Exception as exc:  # the harness or a member broke: the cell fails, the matrix goes on
        log.exception("cell %s x %s failed", workload_name, fault_name)
        result["ok"] = False
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-3000:]
    finally:
        producer.stop()
        workload.close()
        result["actions"] = [a.as_dict(began) for a in actions]
        if env.balancer is not None:  # client connections per replica during the cell
            after = env.balancer_counts()
            result["balancer"] = {name: after[name] - balanced.get(name, 0) for name in after}
        result["duration_s"] = round(time.monotonic() - began, 1)
    return result
