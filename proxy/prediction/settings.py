"""Fetch prediction settings (docs/fetch-prediction.md#limits)."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.settings import Settings, at_least, flag, integer


@dataclass(frozen=True)
class FetchPredictionSettings(Settings):
    enabled: bool = flag("fetch.prediction.enabled", False,
                         "Predict a consumer's next Fetch, send it to the broker while the consumer still processes "
                         "the last one, and answer the consumer from it when it asks (plain consumer fetches only; "
                         "see docs/fetch-prediction.md).", aliases=("fetch.readahead.enabled",),
                         cost="proxy CPU, about a third more per MB consumed (0.95 ms against 0.7 ms, "
                              "benchmarks/results/hop.json): each early fetch's response is read into memory and "
                              "written out again, where a relayed one is spliced through; memory within "
                              "fetch.prediction.buffer.bytes.")
    max_bytes: int = integer("fetch.prediction.max.bytes", 8388608,
                             "Largest response one early fetch asks for (its max_bytes, if the client's is larger).",
                             at_least(1024), aliases=("fetch.readahead.max.bytes",))
    max_partitions: int = integer("fetch.prediction.max.partitions", 100,
                                  "Fetches naming more partitions than this keep their fetch session and are not "
                                  "predicted.", at_least(1), aliases=("fetch.readahead.max.partitions",))
    buffer_bytes: int = integer("fetch.prediction.buffer.bytes", 268435456,
                                "Bytes all early fetches together may reserve or hold; beyond it the proxy stops "
                                "sending them.", at_least(0), aliases=("fetch.readahead.buffer.bytes",),
                                cost="memory, up to this much while fetch prediction is on.")
