"""What the tests of several proxy instances share (docs/high-availability.md): R replicas of
a port-per-broker proxy behind a TCP balancer with sticky sessions (``harness.sticky_balancer``), the members of one
group spread over them by their client ids, and the ledger that bounds what a killed
instance may cause to be handed out twice.

The replicas listen on one bootstrap port and one port per broker node at loopback
addresses of their own (127.0.0.2, 127.0.0.3, ...) and advertise 127.0.0.1, where the
balancer listens on the same ports: every address a client learns leads back to the
balancer, which relays member ``m<i>`` to replica ``i mod R`` and, once that replica is
killed, to the next one that accepts the connection. The clients themselves are unmodified:
they reconnect as they would to a broker that went away.

What a kill -9 of an instance may cost: the members it served lose their connections, so a
commit in flight may be lost, and what they had been handed and not committed may be
handed out again (to them or to whoever takes their partitions over). Nothing else: the
records the other members were handed, and those the dead instance's members got committed
before it died, are handed out once. ``Ledger`` records, per member, what it was handed and
when its commits covered it; ``assert_kill_bound`` holds a run's duplicates to that.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.history import RecordId, Verdict
from harness.sticky_balancer import StickyBalancer
from proxy.local_kafka import ProxyProcess, metadata_brokers
from tests.integration.conftest import free_ports

BALANCER_HOST = "127.0.0.1"


def member_names(members: int) -> list[str]:
    return [f"m{i}" for i in range(members)]


def spread(names: Sequence[str], instances: int) -> dict[str, int]:
    """Member ``m<i>`` to replica ``i mod instances``."""
    return {name: i % instances for i, name in enumerate(names)}


@dataclass
class Replicas:
    """The replicas and the balancer in front of them; ``bootstrap`` is the balancer's."""

    proxies: list[ProxyProcess]
    balancer: StickyBalancer
    routes: dict[str, int]
    bootstrap: str
    killed: dict[int, float] = field(default_factory=dict)  # replica -> time.monotonic() once dead
    kill_sent: dict[int, float] = field(default_factory=dict)  # replica -> time.monotonic() before the signal

    def kill(self, replica: int) -> float:
        """kill -9 replica ``replica``; the moment it was dead (time.monotonic())."""
        self.kill_sent[replica] = time.monotonic()
        self.proxies[replica].kill()
        self.killed[replica] = time.monotonic()
        return self.killed[replica]

    def members_of(self, replica: int) -> list[str]:
        return [name for name, index in self.routes.items() if index == replica]

    def check_spread(self) -> None:
        """Every member's connections went to its own replica (before any kill)."""
        first_kill = min(self.kill_sent.values(), default=None)
        wrong = {name: sorted(self.balancer.replicas_of(name, before=first_kill))
                 for name, index in self.routes.items()
                 if self.balancer.replicas_of(name, before=first_kill) != {index}}
        assert not wrong, f"members relayed to other replicas than planned {self.routes}: {wrong}"

    def check_reconnected(self, replica: int) -> None:
        """The members of killed ``replica`` reconnected, each to a replica that lived (their
        clients may do so as soon as its connections close, before its death is reaped)."""
        elsewhere = {name: self.balancer.replicas_of(name, after=self.kill_sent[replica]) - {replica}
                     for name in self.members_of(replica)}
        assert all(elsewhere.values()), f"the members of replica {replica} after its kill were relayed to {elsewhere}"

    def close(self) -> None:
        self.balancer.stop()
        for index, proxy in enumerate(self.proxies):
            if index in self.killed:
                proxy.kill()
            else:
                proxy.stop(timeout=10)


def start_replicas(kafka, proxy_factory, workdir: Path, instances: int, routes: dict[str, int],
                   **settings: str) -> Replicas:
    """``instances`` proxies in front of ``kafka`` behind one balancer relaying by ``routes``."""
    port, node_port = free_ports(2)
    node_ids = sorted(node.node_id for node in kafka.nodes)
    base = node_port - node_ids[0]
    ports = [port, *(base + node_id for node_id in node_ids)]
    hosts = [f"127.0.0.{2 + i}" for i in range(instances)]
    proxies: list[ProxyProcess] = []
    try:
        for host in hosts:
            proxies.append(proxy_factory(kafka, listen_port=port, listen_host=host, advertised_host=BALANCER_HOST,
                                         node_port_base=str(base), **settings))
            # Metadata through the replica itself opens its node listeners (a replica opens a
            # node's port the first time it names the node) and shows what it advertises.
            brokers, _ = metadata_brokers(host, port, timeout=10)
            assert brokers == {node_id: (BALANCER_HOST, base + node_id) for node_id in node_ids}, (
                f"replica {host} advertises {brokers}: clients would bypass the balancer")
        balancer = StickyBalancer.start(host=BALANCER_HOST, ports=ports, replicas=hosts, routes=routes,
                                  workdir=workdir / "balancer")
    except BaseException:
        for proxy in proxies:
            proxy.stop(timeout=10)
        raise
    return Replicas(proxies, balancer, dict(routes), f"{BALANCER_HOST}:{port}")


class Ledger:
    """Per member, in the order it happened: the records handed out (with the time) and
    the commits that covered them (the time the commit was known done, and how many of the
    member's records, from its first, it covers)."""

    def __init__(self) -> None:
        self.handed: dict[str, list[tuple[float, RecordId]]] = defaultdict(list)
        self.commits: dict[str, list[tuple[float, int]]] = defaultdict(list)

    def hand(self, member: str, record: RecordId, at: float | None = None) -> None:
        self.handed[member].append((time.monotonic() if at is None else at, record))

    def count(self, member: str) -> int:
        return len(self.handed[member])

    def committed(self, member: str, covered: int, at: float | None = None) -> None:
        """A commit of ``member`` covering its first ``covered`` records was done at ``at``."""
        self.commits[member].append((time.monotonic() if at is None else at, covered))

    def uncommitted_at(self, member: str, moment: float) -> set[RecordId]:
        """The records ``member`` had been handed by ``moment`` that no commit done by then covered."""
        covered = max((n for at, n in self.commits[member] if at <= moment), default=0)
        return {record for at, record in self.handed[member][covered:] if at <= moment}

    def handed_after(self, member: str, moment: float) -> int:
        return sum(at > moment for at, _ in self.handed[member])


def assert_kill_bound(verdict: Verdict, ledger: Ledger, held_at: Mapping[str, float], message: str) -> int:
    """What was handed out twice is only what the members of a killed instance had been
    handed and had not got committed: ``held_at`` maps each of them to the moment that
    counts (its instance's death; for a member that started again, the end of its old
    session). Returns the size of that allowance."""
    allowed: set[RecordId] = set()
    for member, at in held_at.items():
        allowed |= ledger.uncommitted_at(member, at)
    beyond = sorted(set(verdict.duplicates) - allowed)
    assert not beyond, (f"{len(beyond)} records handed out twice that no member of the killed instance held "
                        f"uncommitted, e.g. {beyond[:10]}; allowed {len(allowed)}; {message}")
    return len(allowed)


def assert_order_explained(verdict: Verdict, message: str) -> None:
    """Per-key order violations only where re-delivery explains them: a record of the pair
    was handed out twice."""
    unexplained = [(key, earlier, later) for key, earlier, later in verdict.order_violations
                   if not {earlier.record, later.record} & verdict.duplicates.keys()]
    assert not unexplained, (f"{len(unexplained)} order violations not due to re-delivery, e.g. "
                             f"{[(k, e.offset, e.member, x.offset, x.member) for k, e, x in unexplained[:5]]}; "
                             f"{message}")
