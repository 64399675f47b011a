"""Virtual topics' metrics, one set for the package's features (docs/virtual-topics.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class VirtualTopicsMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        # VirtualFetchFeature
        self.records = Counter("kafka_proxy_virtual_records", "Records served to virtual partitions.", ["topic"],
                               registry=r)
        self.broker_reads = Counter("kafka_proxy_virtual_broker_reads",
                                    "Real partitions read from brokers for virtual partitions.", ["topic"], registry=r)
        self.broker_bytes = Counter("kafka_proxy_virtual_broker_bytes",
                                    "Record bytes read from brokers for virtual partitions.", ["topic"], registry=r)
        self.cache_hits = Counter("kafka_proxy_virtual_cache_hits",
                                  "Virtual partitions answered from the result cache.", ["topic"], registry=r)
        self.control_batches = Counter("kafka_proxy_virtual_control_batches",
                                       "Control batches that moved a virtual partition's position past records of "
                                       "other shares.", ["topic"], registry=r)
        # VirtualCommitFeature
        self.commits = Counter("kafka_proxy_virtual_commits", "Virtual partitions committed.", ["topic"], registry=r)
        self.txn_commits = Counter("kafka_proxy_virtual_txn_commits",
                                   "Virtual partitions committed inside transactions.", ["topic"], registry=r)
        self.lifts = Counter("kafka_proxy_virtual_lifts",
                             "Real partitions whose share watermarks the proxy lifted by itself over offsets holding "
                             "none of their shares' records, once their commits went quiet (docs/virtual-topics.md#lag).",
                             ["topic"], registry=r)
        self.txn_settles = Counter("kafka_proxy_virtual_txn_settles",
                                   "Committed transactions whose share watermarks were folded into the log and S "
                                   "moved.", registry=r)
        # VirtualRefusalFeature
        self.refused = Counter("kafka_proxy_virtual_refused", "Requests refused for naming a virtual topic.", ["api"],
                               registry=r)
