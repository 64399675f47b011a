"""Cooperative fetch settings (docs/cooperative-fetch.md#settings-proxy-properties)."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.settings import Settings, at_least, flag, integer


@dataclass(frozen=True)
class CooperativeFetchSettings(Settings):
    enabled: bool = flag("cooperative.fetch.enabled", True,
                         "Hand out chunks of offsets to Fetch partitions tagged Cooperative "
                         "(docs/cooperative-fetch.md).")
    lease_ms: int = integer("cooperative.fetch.lease.ms", 45000,
                            "How long a member has to commit a chunk before its uncommitted offsets are handed out "
                            "again (Kafka's default session.timeout.ms).", at_least(100))
    max_leases_per_member: int = integer("cooperative.fetch.max.leases.per.member", 1024,
                                         "Uncommitted chunks one member may hold of one partition; beyond it its "
                                         "fetches get no chunk until it commits.", at_least(1))
