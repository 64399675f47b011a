"""The states this instance has read from the individual-commit log, in memory, sans I/O.

Per group, per (topic, partition): the log offset of the newest record applied and the
state it holds. Records are applied in whatever order they are read (a catch-up, a window
read after a write, this instance's own write): records of one reset epoch join, a higher
epoch replaces, and a tombstone deletes what came before it. So a record written from an
older read (another instance's, concurrent with a newer one) adds what it holds and drops
nothing.
"""

from __future__ import annotations

import logging

from proxy.commits.codec import decode_key, decode_value
from proxy.commits.state import CommitState, join
from proxy.protocol.errors import ProtocolError

log = logging.getLogger("proxy.commits.table")

TopicPartitionKey = tuple[str, int]
AppliedState = tuple[int, CommitState]  # (log offset of the newest record applied, the state)


class StateTable:
    def __init__(self) -> None:
        self.groups: dict[str, dict[TopicPartitionKey, AppliedState]] = {}
        self.held = 0  # ranges above S over every state held (a gauge)

    def records(self, group: str) -> dict[TopicPartitionKey, AppliedState]:
        """What is held of the group: key -> (log offset of the record, state). The live
        mapping (later reads update it); empty when nothing is held."""
        return self.groups.get(group, {})

    def states(self, group: str) -> dict[TopicPartitionKey, CommitState]:
        """A snapshot of the group's states."""
        return {key: state for key, (_, state) in self.groups.get(group, {}).items()}

    def holds_any(self, group: str, keys) -> bool:
        entries = self.groups.get(group)
        return entries is not None and any(key in entries for key in keys)

    def apply(self, offset: int, key, value) -> tuple[str, TopicPartitionKey, CommitState | None] | None:
        """A record read from the log: (group, key, state), or None if unreadable (skipped
        with a warning: one bad record must not stop the partition being read)."""
        try:
            group, topic, partition = decode_key(key)
            state = None if value is None else decode_value(value)
        except (ProtocolError, ValueError) as exc:
            log.warning("skipping unreadable individual-commit record offset=%s reason=%r", offset, str(exc))
            return None
        self.set(group, (topic, partition), offset, state)
        return group, (topic, partition), state

    def set(self, group: str, key: TopicPartitionKey, offset: int, state: CommitState | None) -> None:
        """Apply the record of ``key`` at log ``offset`` (``state`` None: a tombstone)."""
        entries = self.groups.get(group)
        current = entries.get(key) if entries else None
        if state is not None and current is not None:
            # Records of a key join, in whatever order they are read: one written from an
            # older read (another instance's, concurrent with this one's) adds what it
            # holds and drops nothing; a reset (a higher epoch) replaces what came before.
            state = join(current[1], state)
            offset = max(offset, current[0])
        elif current is not None and current[0] > offset:
            return  # a tombstone older than the record held
        self.held += (state.held() if state is not None else 0) - (current[1].held() if current is not None else 0)
        if state is None:
            if entries is not None:
                entries.pop(key, None)
                if not entries:
                    del self.groups[group]
            return
        self.groups.setdefault(group, {})[key] = (offset, state)
