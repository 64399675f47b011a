"""The commit layer's metrics: writes and rebuilds of ``__individual_commit_offsets``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


class CommitLogMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.write_seconds = Histogram("kafka_proxy_individual_commit_log_write_seconds",
                                       "Time to write states to __individual_commit_offsets (acks=all).",
                                       buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10),
                                       registry=r)
        self.state_rebuilds = Counter("kafka_proxy_individual_commit_state_rebuilds",
                                      "Log partitions read from the start to rebuild state.", registry=r)
        self.foreign_writes = Counter("kafka_proxy_individual_commit_foreign_writes",
                                      "Committed partitions whose state another instance wrote since this one "
                                      "read it.", registry=r)
        self.corrections = Counter("kafka_proxy_individual_commit_corrections",
                                   "Committed partitions whose offset this instance committed to the coordinator "
                                   "again, after another instance's write moved it.", registry=r)
