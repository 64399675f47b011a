"""The positions side of ``proxy.client.Consumer``: ``seek``, ``seek_to_beginning``,
``seek_to_end``, ``position`` and ``current_lag``.

A part of the consumer's public API, kept in a class of its own so that the consumer reads
by concern; ``Consumer`` inherits it. Positions live in the consumer's ``AssignmentState``;
a partition fetched cooperatively has none an application may move (the proxy decides
which offsets each member gets).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from proxy.client.assignment import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from proxy.client.records import TopicPartition

if TYPE_CHECKING:
    from proxy.client.assignment import AssignmentState


class ConsumerPositions:
    """The consumer's position methods (see the module's docstring)."""

    if TYPE_CHECKING:  # the consumer's, which these methods use
        _state: AssignmentState

        def _require_assigned(self, tp: TopicPartition) -> None: ...

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Fetch ``tp`` from ``offset`` on the next poll (buffered records are dropped)."""
        self._require_assigned(tp)
        self._require_not_cooperative([tp], "seek")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be a non-negative int, got {offset!r}")
        self._state.seek(tp, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._reset_later(partitions, EARLIEST_TIMESTAMP, "seek_to_beginning")

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._reset_later(partitions, LATEST_TIMESTAMP, "seek_to_end")

    def _reset_later(self, partitions: Sequence[TopicPartition], timestamp: int, call: str) -> None:
        chosen = list(partitions or self._state.partitions())
        for tp in chosen:
            self._require_assigned(tp)
        self._require_not_cooperative(chosen, call)
        for tp in chosen:
            self._state.reset_later(tp, timestamp)

    def _require_not_cooperative(self, partitions: Iterable[TopicPartition], call: str) -> None:
        shared = sorted(TopicPartition(*tp) for tp in partitions if tp in self._state.cooperative)
        if shared:
            raise ValueError(f"{call}: {', '.join(f'{tp.topic}-{tp.partition}' for tp in shared)} "
                             f"{'is' if len(shared) == 1 else 'are'} fetched cooperatively: the proxy decides which "
                             f"offsets each member gets, so there is no position to move (assign the partition "
                             f"without cooperative=True to read it from an offset of your choice)")

    def position(self, tp: TopicPartition) -> int | None:
        """The offset of the next record ``poll`` will return for ``tp``; None while it
        waits for an offset reset. For a partition fetched cooperatively: the token, the
        offset the next fetch sends (the last chunk's end + 1, at first the starting
        position), which says nothing about the records to come: the proxy hands out the
        next chunk nobody has had, or one handed out again below earlier ones."""
        self._require_assigned(tp)
        return self._state.position(tp)

    def current_lag(self, tp: TopicPartition) -> int | None:
        """End offset (high watermark, or last stable offset under read_committed) from the
        latest fetch response minus the position; None while either is unknown. Answers
        from the local cache only, never the network (KIP-695). For a partition fetched
        cooperatively: the end minus the highest chunk end + 1 this member received (None
        before its first chunk), the records past everything it was handed."""
        self._require_assigned(tp)
        return self._state.lag(tp)
