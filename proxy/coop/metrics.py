"""Cooperative fetch's metrics (docs/cooperative-fetch.md#metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class CooperativeFetchMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.leased = Counter("kafka_proxy_coop_chunks_leased", "Chunks handed out by cooperative fetch.", registry=r)
        self.leased_offsets = Counter("kafka_proxy_coop_offsets_leased", "Offsets in the chunks handed out.",
                                      registry=r)
        self.expired = Counter("kafka_proxy_coop_leases_expired",
                               "Leases not committed within cooperative.fetch.lease.ms.", registry=r)
        self.redelivered = Counter("kafka_proxy_coop_chunks_redelivered",
                                   "Chunks of offsets handed out again (expired leases, gaps after a restart).",
                                   registry=r)
        self.moved = Counter("kafka_proxy_coop_chunks_moved",
                             "Chunks the grants log placed above the start of their read: chunks of other asks "
                             "took those offsets first.", registry=r)
        self.read_bytes = Counter("kafka_proxy_coop_read_bytes",
                                  "Record bytes the broker returned to cooperative fetches: the chunk handed out and "
                                  "what was read ahead around it.", registry=r)
        self.chunk_bytes = Counter("kafka_proxy_coop_chunk_bytes", "Record bytes in the chunks handed out.",
                                   registry=r)
        self.retried = Counter("kafka_proxy_coop_chunks_retried",
                               "Fetches that read a chunk their member holds: a retry got it again, or the rest "
                               "of a chunk whose read came back short.", registry=r)
        self.asks = Counter("kafka_proxy_coop_asks",
                            "Asks appended to the grants log, by when: before the read (offsets past the member's "
                            "position known to exist) or after it (at the log end, offsets handed out again, "
                            "resets).", ["read"], registry=r)
        self.ask_seconds = Histogram("kafka_proxy_coop_ask_seconds",
                                     "From an ask joining its grants log partition's queue to its chunk: the "
                                     "append (acks=all) and the read back, what a fetch that asks waits for.",
                                     buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5), registry=r)
        self.refused = Counter("kafka_proxy_coop_fetches_refused",
                               "Cooperative partitions answered without a chunk, by reason.", ["reason"], registry=r)
        self.marker_lag = Gauge("kafka_proxy_coop_marker_lag",
                                "High watermark minus the marker: offsets nobody has been handed yet.",
                                ["group", "topic", "partition"], registry=r)
        # read when scraped: the feature sets their functions
        self.partitions = Gauge("kafka_proxy_coop_partitions", "Partitions fetched cooperatively, by group.",
                                registry=r)
        self.leases = Gauge("kafka_proxy_coop_leases", "Chunks leased and not yet committed.", registry=r)
