"""The commit layer's settings: its log, ``__individual_commit_offsets``."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.settings import Settings, at_least, integer


@dataclass(frozen=True)
class CommitLogSettings(Settings):
    segment_bytes: int = integer("individual.commit.log.segment.bytes", 10485760,
                                 "segment.bytes of __individual_commit_offsets.", at_least(14))
