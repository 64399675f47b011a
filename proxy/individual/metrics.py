"""Individual commit's metrics (docs/individual-commit.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class IndividualCommitMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.range_commits = Counter("kafka_proxy_individual_commit_range_commits",
                                     "Partitions committed with offset ranges and acknowledged.", registry=r)
        self.refused = Counter("kafka_proxy_individual_commit_refused",
                               "Partitions of range commits refused, by reason.", ["reason"], registry=r)
        self.ranges_held = Gauge("kafka_proxy_individual_commit_ranges_held",
                                 "Ranges above the stable offset held in the state this instance has read.",
                                 registry=r)
