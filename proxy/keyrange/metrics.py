"""Key-range fetch's metrics (docs/proxy.md#metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class KeyRangeMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.prefetch_sent = Counter("kafka_proxy_keyrange_prefetch_sent",
                                     "Key-range prefetch: broker reads of shared partitions the proxy made ahead of "
                                     "their consumers.", registry=r)
        self.prefetch_wide = Counter("kafka_proxy_keyrange_prefetch_wide",
                                     "Partitions read ahead wide: more than their consumer's limit, about a limit for "
                                     "each range set sharing the partition (key.range.prefetch.max.bytes).",
                                     registry=r)
        self.prefetch_chained = Counter("kafka_proxy_keyrange_prefetch_chained",
                                        "Reads ahead sent when the read before them arrived, before its split (at "
                                        "most two ahead of the foremost consumer); counted in prefetch_sent too.",
                                        registry=r)
        self.wider_splits = Counter("kafka_proxy_keyrange_wider_splits",
                                    "Shares split out of the rest of a read kept while a partition's range sets "
                                    "join, for a set that joined after the read.", registry=r)
        self.shares_cut = Counter("kafka_proxy_keyrange_shares_cut",
                                    "Cached shares served in parts: larger than the limit of the consumer fetching "
                                    "them (keys unevenly spread over the ranges).", registry=r)
        self.prefetch_shares = Counter("kafka_proxy_keyrange_prefetch_shares",
                                       "Shares the key-range prefetches cached for consumers.", registry=r)
        self.cache_hits = Counter("kafka_proxy_keyrange_cache_hits", "Shares served from the cache.", registry=r)
        self.native_answers = Counter("kafka_proxy_keyrange_native_answers",
                                      "Shares served from the cache by the native relay (counted in cache_hits "
                                      "too).", registry=r)
        self.cache_misses = Counter("kafka_proxy_keyrange_cache_misses", "Cache lookups that found nothing.",
                                    registry=r)
        self.cache_evictions = Counter("kafka_proxy_keyrange_cache_evictions",
                                       "Shares evicted by max.bytes.key.range.results.", registry=r)
        self.cache_bytes = Gauge("kafka_proxy_keyrange_cache_bytes", "Bytes held by the key-range cache.", registry=r)
        self.records_kept = Counter("kafka_proxy_keyrange_records_kept", "Records that passed the key filter.",
                                    registry=r)
        self.records_dropped = Counter("kafka_proxy_keyrange_records_dropped", "Records removed by the key filter.",
                                       registry=r)
        self.broker_bytes = Counter("kafka_proxy_keyrange_broker_bytes",
                                    "Record bytes read from brokers for range-filtered partitions.",
                                    ["topic", "partition"], registry=r)
        self.splits_offloaded = Counter("kafka_proxy_keyrange_splits_offloaded",
                                        "Broker reads split on a worker thread rather than the event loop.",
                                        registry=r)
        self.split_offloaded_bytes = Counter("kafka_proxy_keyrange_split_offloaded_bytes",
                                             "Record bytes of the broker reads split on a worker thread.", registry=r)
