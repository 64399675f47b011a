"""The faults of the chaos matrix: each a seeded schedule, run while the producer writes.

A fault runs on the cell's main thread between ``start`` (after the members' warm-up) and
``until`` (a little before the producer's end), and returns what it did: one ``Action``
per strike with the time it began and the time it healed (the fault undone: a process
started again and answering, a toxic removed). Every choice (which process, how long, how
often) comes from the cell's ``random.Random``, so a seed replays the run.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from chaos.env import REPLICAS, SIDECAR, ChaosEnv
from chaos.workloads import CellContext, Workload


@dataclass
class Action:
    kind: str
    target: str
    began: float  # time.monotonic()
    healed: float
    detail: str = ""

    def as_dict(self, origin: float) -> dict:
        out = asdict(self)
        out["began"] = round(self.began - origin, 2)
        out["healed"] = round(self.healed - origin, 2)
        return out


Fault = Callable[[ChaosEnv, Workload, CellContext, random.Random, float], list[Action]]


def _pause(seconds: float, until: float) -> bool:
    """Wait ``seconds`` of calm (the schedule's own gap, not a synchronisation); False when
    that would pass ``until``."""
    if time.monotonic() + seconds >= until:
        return False
    time.sleep(seconds)
    return True


def none(env: ChaosEnv, workload: Workload, ctx: CellContext, rng: random.Random, until: float) -> list[Action]:
    return []


def _proxy_kill(kind: str, choose: Callable[[ChaosEnv, CellContext, random.Random, int], str], doc: str) -> Fault:
    def fault(env: ChaosEnv, workload: Workload, ctx: CellContext, rng: random.Random,
              until: float) -> list[Action]:
        actions = []
        for strike in range(rng.choice((1, 2))):
            if not _pause(rng.uniform(2.0, 4.0), until):
                break
            name = choose(env, ctx, rng, strike)
            began = time.monotonic()
            env.kill_proxy(name)
            time.sleep(rng.uniform(0.2, 1.5))  # the downtime, part of the fault
            env.restart_proxy(name)
            actions.append(Action(kind, name, began, time.monotonic()))
        return actions

    fault.__doc__ = doc
    return fault


def _proxy_pause(kind: str, doc: str) -> Fault:
    def fault(env: ChaosEnv, workload: Workload, ctx: CellContext, rng: random.Random,
              until: float) -> list[Action]:
        actions = []
        for _ in range(rng.choice((1, 2))):
            if not _pause(rng.uniform(2.0, 3.0), until):
                break
            name = (env.sidecar_name(rng.choice(env.node_ids())) if env.topology == SIDECAR
                    else rng.choice(env.proxy_names()))
            began = time.monotonic()
            env.pause_proxy(name)
            time.sleep(rng.uniform(2.0, 8.0))
            env.resume_proxy(name)
            actions.append(Action(kind, name, began, time.monotonic()))
        return actions

    fault.__doc__ = doc
    return fault


proxy_kill = _proxy_kill(
    "proxy-kill", lambda env, ctx, rng, strike: env.sidecar_name(
        env.leader_of(ctx.topic, 0) if strike == 0 else rng.choice(env.node_ids())),
    "kill -9 of a sidecar (the one in front of partition 0's leader first), down for a moment, started "
    "again on its port; once or twice.")
replica_kill = _proxy_kill(
    "replica-kill", lambda env, ctx, rng, strike: rng.choice(env.proxy_names()),
    "kill -9 of a replica behind the balancer, down for a moment, started again on its address and ports; "
    "once or twice. Its clients' connections close; they reconnect through the balancer, which hands them "
    "to another replica.")
proxy_pause = _proxy_pause(
    "proxy-pause", "SIGSTOP of a sidecar for 2-8 s (past the members' session timeout at the long end), then "
    "SIGCONT: connections stay open and silent, then burst back.")
replica_pause = _proxy_pause(
    "replica-pause", "SIGSTOP of a replica for 2-8 s, then SIGCONT: its connections stay open and silent (then "
    "burst back); the balancer takes it out of its rotation once its /readyz stops answering, so new "
    "connections go to the others.")

DRAIN_DEADLINE = 60.0  # SIGKILL a proxy still draining after this (shutdown.drain.timeout.ms is 30 s)


def rolling_restart(env: ChaosEnv, workload: Workload, ctx: CellContext, rng: random.Random,
                    until: float) -> list[Action]:
    """Every proxy restarted in turn, as an operator rolls out a new version: SIGTERM (the
    proxy closes its listeners, answers what is in flight, exits 0), started again on its
    address and ports, ready (/readyz 200; behind the balancer, back in its rotation), then
    the next. The whole roll, whatever ``until`` says: a roll is not cut short."""
    time.sleep(rng.uniform(2.0, 3.0))  # the schedule's calm before the roll
    actions = []
    for name in env.proxy_names():
        began = time.monotonic()
        code = env.stop_proxy(name, timeout=DRAIN_DEADLINE)
        gone = time.monotonic()
        env.restart_proxy(name)
        ready = env.wait_ready(name)
        actions.append(Action("rolling-restart", name, began, time.monotonic(),
                              f"exit {code}, gone after {gone - began:.1f} s, ready {ready:.1f} s after listening"))
    return actions


def _broker_kill(kind: str, choose: Callable[[ChaosEnv, CellContext, random.Random], int]) -> Fault:
    def fault(env: ChaosEnv, workload: Workload, ctx: CellContext, rng: random.Random,
              until: float) -> list[Action]:
        if not _pause(rng.uniform(2.0, 4.0), until):
            return []
        node = choose(env, ctx, rng)
        began = time.monotonic()
        env.kill_broker(node)
        time.sleep(rng.uniform(3.0, 8.0))  # down, while the others take over
        env.restart_broker(node)
        return [Action(kind, f"broker-{node}", began, time.monotonic())]

    fault.__doc__ = f"kill -9 of a broker ({kind}), down 3-8 s, started again with its data."
    return fault


broker_kill = _broker_kill("broker-kill", lambda env, ctx, rng: rng.choice(env.node_ids()))
leader_kill = _broker_kill("leader-kill", lambda env, ctx, rng: env.leader_of(ctx.topic, 0))
coordinator_kill = _broker_kill("coordinator-kill", lambda env, ctx, rng: env.coordinator_of(ctx.group))


def member_kill(env: ChaosEnv, workload: Workload, ctx: CellContext, rng: random.Random,
                until: float) -> list[Action]:
    """kill -9 of one or two consumer members mid-processing; a replacement starts at once."""
    actions = []
    for _ in range(rng.choice((1, 2))):
        if not _pause(rng.uniform(2.0, 5.0), until):
            break
        alive = workload.members()
        if not alive:
            break
        name = rng.choice(sorted(alive))
        began = time.monotonic()
        workload.kill_member(name)
        actions.append(Action("member-kill", name, began, time.monotonic()))
    return actions


NETWORK = ("latency", "reset", "blackhole", "refusal", "slow")


def network(env: ChaosEnv, workload: Workload, ctx: CellContext, rng: random.Random,
            until: float) -> list[Action]:
    """On every client -> sidecar link, in a seeded order: latency with jitter, connection
    resets, a blackhole longer than a request timeout, a refused port, a slow link."""
    return _toxics(list(env.links.values()), "clients", rng, until)


def network_broker(env: ChaosEnv, workload: Workload, ctx: CellContext, rng: random.Random,
                   until: float) -> list[Action]:
    """The same faults between the sidecars and the brokers (the producer, writing straight
    to the brokers, and replication are not touched)."""
    if not env.broker_links:
        raise RuntimeError("network-broker needs the sidecar -> broker links of a cluster the chaos env started")
    return _toxics(list(env.broker_links.values()), "brokers", rng, until)


def broker_pause(env: ChaosEnv, workload: Workload, ctx: CellContext, rng: random.Random,
                 until: float) -> list[Action]:
    """SIGSTOP of partition 0's leader for 3-9 s (past the broker session timeout of 6 s at
    the long end: the controller fences it and moves leadership), then SIGCONT."""
    if not _pause(rng.uniform(2.0, 4.0), until):
        return []
    node = env.leader_of(ctx.topic, 0)
    began = time.monotonic()
    env.pause_broker(node)
    time.sleep(rng.uniform(3.0, 9.0))
    env.resume_broker(node)
    return [Action("broker-pause", f"broker-{node}", began, time.monotonic())]


def _toxics(links: list, where: str, rng: random.Random, until: float) -> list[Action]:
    actions = []
    kinds = list(NETWORK)
    rng.shuffle(kinds)
    for kind in kinds:
        if not _pause(rng.uniform(0.5, 1.5), until):
            break
        began = time.monotonic()
        detail = ""
        if kind == "refusal":
            for link in links:
                link.disable()
            time.sleep(rng.uniform(1.0, 3.0))
            for link in links:
                link.enable()
        else:
            placed = []
            for link in links:
                if kind == "latency":
                    ms, jitter = rng.choice((50, 150, 400)), rng.choice((10, 50, 100))
                    detail = f"{ms}+-{jitter} ms"
                    placed += link.add_toxic("latency", {"latency": ms, "jitter": jitter}, stream="both")
                elif kind == "reset":
                    placed += link.add_toxic("reset_peer", {"timeout": rng.choice((0, 200))}, stream="downstream",
                                             toxicity=0.5)
                elif kind == "blackhole":
                    placed += link.add_toxic("timeout", {"timeout": 0}, stream="both")
                elif kind == "slow":
                    rate = rng.choice((20, 100))
                    detail = f"{rate} KB/s"
                    placed += link.add_toxic("bandwidth", {"rate": rate}, stream="downstream")
            seconds = {"latency": rng.uniform(3, 5), "reset": rng.uniform(1, 2), "blackhole": rng.uniform(7, 10),
                       "slow": rng.uniform(3, 5)}[kind]
            time.sleep(seconds)  # the fault's duration
            for toxic in placed:
                toxic.remove()
        actions.append(Action(f"network-{kind}", f"links to the {where}", began, time.monotonic(), detail))
    return actions


FAULTS: dict[str, Fault] = {
    "none": none,
    "proxy-kill": proxy_kill,
    "proxy-pause": proxy_pause,
    "replica-kill": replica_kill,
    "replica-pause": replica_pause,
    "rolling-restart": rolling_restart,
    "broker-kill": broker_kill,
    "leader-kill": leader_kill,
    "coordinator-kill": coordinator_kill,
    "broker-pause": broker_pause,
    "member-kill": member_kill,
    "network": network,
    "network-broker": network_broker,
}

# The topologies a fault means something in (a fault not named here: every topology).
ONLY_IN: dict[str, set[str]] = {
    "proxy-kill": {SIDECAR}, "proxy-pause": {SIDECAR}, "network": {SIDECAR},  # the sidecars and their links
    "replica-kill": {REPLICAS}, "replica-pause": {REPLICAS},
}


def applies(fault: str, topology: str) -> bool:
    return topology in ONLY_IN.get(fault, {topology})
