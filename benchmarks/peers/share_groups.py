"""Kafka share groups (KIP-932) as a peer.

Share groups are on by default from Kafka 4.2 (feature ``share.version=1``); a one-node
cluster needs the share-state topic at replication factor 1 (:data:`BROKER_PROPERTIES`).
A share group starts at the log end unless its ``share.auto.offset.reset`` is earliest,
a group config set with ConfigCommand before the first member joins
(:func:`start_from_earliest`).

Two drivers: the Java harness (``benchmarks/java/share``, N KafkaShareConsumers doing
paced work and checking per-key order) and Kafka's ShareConsumerPerformance.
"""

from __future__ import annotations

import re

from benchmarks.peers import java_harness
from harness import java_tools

BROKER_PROPERTIES = {
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
}
SHARE_CONSUMER_PERFORMANCE = "org.apache.kafka.tools.ShareConsumerPerformance"
MAIN = "io.keyrange.bench.ShareBench"


def start_from_earliest(bootstrap: str, group: str) -> None:
    java_tools.configs(bootstrap, "--alter", "--entity-type", "groups", "--entity-name", group,
                       "--add-config", "share.auto.offset.reset=earliest")


def key_ordered(bootstrap: str, topic: str, group: str, workers: int, *, mode: str = "share",
                work_ms: float = 1.0, warmup: float = 3.0, window: float = 8.0, records: int = 0,
                timeout: float = 180.0) -> dict:
    """``workers`` consumers of one group doing ``work_ms`` per record; the harness's JSON
    result (records/s over the window, or until ``records`` were processed; order
    violations). ``mode="plain"``: a classic consumer group instead of a share group."""
    if mode == "share":
        start_from_earliest(bootstrap, group)
    args = ["--bootstrap", bootstrap, "--topic", topic, "--group", group, "--workers", workers,
            "--mode", mode, "--work-ms", work_ms, "--warmup", warmup, "--window", window,
            "--records", records, "--timeout", timeout]
    return java_harness.run_json("bench-share", MAIN, args, timeout=timeout + 60)


def consumer_performance(bootstrap: str, topic: str, group: str, records: int, *, threads: int = 1,
                         timeout: float = 600.0) -> dict:
    """ShareConsumerPerformance reading ``records`` with ``threads`` share consumers; its
    CSV line as numbers (``fetch_records_per_s`` excludes the start-up)."""
    start_from_earliest(bootstrap, group)
    result = java_tools.run_java_tool(
        SHARE_CONSUMER_PERFORMANCE,
        ["--bootstrap-server", bootstrap, "--topic", topic, "--group", group, "--num-records", records,
         "--threads", threads, "--timeout", "30000"],
        timeout)
    # start.time, end.time, data.consumed.in.MB, MB.sec, nMsg, nMsg.sec, fetch.time.ms? (varies by version)
    header = [line for line in result.stdout.splitlines() if line.startswith("start.time")]
    rows = [line for line in result.stdout.splitlines() if re.match(r"^\d{4}-", line)]
    if not header or not rows:
        raise java_harness.HarnessError(f"ShareConsumerPerformance printed no result:\n{result.stdout[-2000:]}")
    cells = dict(zip((c.strip() for c in header[-1].split(",")), (c.strip() for c in rows[-1].split(","))))
    out = {"mb": float(cells["data.consumed.in.MB"]), "mb_per_s": float(cells["MB.sec"]),
           "records": int(float(cells["data.consumed.in.nMsg"])), "records_per_s": float(cells["nMsg.sec"])}
    if "fetch.nMsg.sec" in cells:
        out["fetch_records_per_s"] = float(cells["fetch.nMsg.sec"])
    return out
