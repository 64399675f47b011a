"""Virtual topic settings (docs/virtual-topics.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

from proxy.commits.state import MAX_SHARES
from proxy.settings import ConfigError, Settings, flag, integer, not_empty, text, within


@dataclass(frozen=True)
class VirtualTopicsSettings(Settings):
    enabled: bool = flag(
        "virtual.topics.enabled", False,
        "Serve virtual range topics <topic><suffix><K> to standard clients (docs/virtual-topics.md). Off by default: "
        "with it on, a name of that form that is no real topic means a virtual topic, and OffsetCommit and "
        "OffsetFetch are offered up to v9.",
        cost="every Metadata, Fetch and OffsetCommit is checked for a virtual name and decoded only when it may "
             "hold one (OffsetFetch always); Produce and a plain Fetch stay on the native relay, their names checked "
             "in C. Measured "
             "against the same proxy with it off, same rounds: produce 0.96 x (0.81-1.15) at the same CPU per MB, "
             "consume 0.94 x (0.85-0.97) and +0.04 ms CPU per MB (benchmarks/results/proxy_virtual.json).")
    suffix: str = text("virtual.topic.suffix", ".kr", "What separates a topic from its share count K.", not_empty)
    coop_suffix: str = text("virtual.coop.suffix", ".coop",
                            "What separates a topic from its stripe count K in a striped virtual topic "
                            "(<topic>.coop<K>: stripes of whole batches, no per-key order; docs/cooperative-fetch.md).",
                            not_empty)
    # Why the ceiling is fixed, and 64: proxy.commits.state.MAX_SHARES.
    max_shares: int = integer("virtual.topic.max.shares", 64,
                              f"Largest K of a virtual range topic, at most {MAX_SHARES} (the watermarks of every "
                              "share of a partition must fit the coordinator's offset metadata).",
                              within(2, MAX_SHARES))

    def checked(self) -> Self:
        if self.coop_suffix == self.suffix:
            raise ConfigError(f"virtual.coop.suffix: must differ from virtual.topic.suffix (both {self.suffix!r})")
        return self
