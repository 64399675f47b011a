"""Fetch prediction's metrics (docs/fetch-prediction.md#metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class FetchPredictionMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.sent = Counter("kafka_proxy_fetch_prediction_sent", "Early fetches: predicted Fetches the proxy sent "
                            "ahead of its clients.", registry=r)
        self.hits = Counter("kafka_proxy_fetch_prediction_hits", "Client fetches answered from an early fetch.",
                            registry=r)
        self.wasted = Counter("kafka_proxy_fetch_prediction_wasted",
                              "Early fetches dropped because the client asked for something else.", registry=r)
        self.held_bytes = Gauge("kafka_proxy_fetch_prediction_bytes", "Bytes reserved or held by early fetches.",
                                registry=r)
