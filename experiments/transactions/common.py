"""Shared helpers of the transactional-commit experiments (docs/individual-commit.md,
"Transactional commits (exactly-once on shared partitions)").

Every experiment starts its own one-node Kafka (the version pinned in kafka-dist/pom.xml),
speaks the Kafka protocol with the raw test client (``harness.raw_client``) and the
codecs built from Kafka's JSON schemas, prints what the broker answered, and stops the
broker. Nothing here goes through the proxy: the point is what a real broker accepts.

Run from the repository root: ``.venv/bin/python experiments/transactions/<name>.py``.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


from harness.kafka_cluster import KafkaCluster  # noqa: E402
from harness.txn_client import Conn, err  # noqa: E402,F401 - the experiments' calls
from proxy.local_kafka import kafka_version  # noqa: E402
from proxy.protocol.groups import group_partition  # noqa: E402

OFFSETS_PARTITIONS = 4  # the harness's offsets.topic.num.partitions


def say(*parts) -> None:
    print(*parts, flush=True)


def check(label: str, ok: bool) -> bool:
    say(f"    [{'as expected' if ok else 'UNEXPECTED'}] {label}")
    return ok


@contextmanager
def kafka(**broker_properties):
    """A one-node Kafka for the duration of the block; stopped (by PID) afterwards."""
    began = time.monotonic()
    props = {"transaction.state.log.num.partitions": "4", "offsets.topic.num.partitions": str(OFFSETS_PARTITIONS)}
    props.update(broker_properties)
    workdir = None
    if os.environ.get("TXN_EXPERIMENTS_KEEP"):  # keep the broker's directory (server.log) for reading
        import tempfile
        from pathlib import Path
        workdir = Path(tempfile.mkdtemp(prefix="txn-experiments-"))
        say(f"# broker directory kept: {workdir}")
    cluster = KafkaCluster.start(1, workdir=workdir, broker_properties=props)
    say(f"# Kafka {kafka_version()} (one node, KRaft) at {cluster.bootstrap_servers}, "
        f"started in {time.monotonic() - began:.1f} s")
    try:
        yield cluster
    finally:
        cluster.close()
        say("# Kafka stopped")


def finalized_features(conn: Conn) -> dict[str, tuple[int, int]]:
    body = conn.api_versions()
    return {f.name: (f.min_version_level, f.max_version_level) for f in body.finalized_features or ()}


def shadow_group(group: str, label: str, partitions: int = OFFSETS_PARTITIONS) -> str:
    """A group named ``<group>`` + ``label`` + a salt, the lowest salt that puts it on the
    same ``__consumer_offsets`` partition (so the same coordinator, the same transaction
    partition) as ``group``."""
    target = group_partition(group, partitions)
    salt = 0
    while group_partition(f"{group}{label}#{salt}", partitions) != target:
        salt += 1
    return f"{group}{label}#{salt}"


def other_partition_group(group: str, label: str, partitions: int = OFFSETS_PARTITIONS) -> str:
    """A group name on another ``__consumer_offsets`` partition than ``group``."""
    target = group_partition(group, partitions)
    salt = 0
    while group_partition(f"{group}{label}#{salt}", partitions) == target:
        salt += 1
    return f"{group}{label}#{salt}"


def wait_stable(conn: Conn, groups: dict[str, list[tuple[str, int]]], timeout: float = 10.0):
    """OffsetFetch with RequireStable until no partition answers UNSTABLE_OFFSET_COMMIT;
    returns (the answer, seconds waited)."""
    began = time.monotonic()
    while True:
        answer = conn.offset_fetch(groups, require_stable=True)
        unstable = [k for g in answer.values() for k, v in g.items() if k is not None and v[2] == 88]
        if not unstable or time.monotonic() - began > timeout:
            return answer, time.monotonic() - began
        time.sleep(0.02)
