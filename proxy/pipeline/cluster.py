"""The proxy's one view of the cluster: brokers, topics (names, ids, partitions, leaders),
and the partition count of ``__consumer_offsets``.

Every feature reads this view; none keeps a map of its own. It is fed by the Metadata
responses passing through to clients (``learn_metadata``, from the ``ClusterFeed``
feature) and by the proxy's own reads (``refresh``), which the server does at start-up
and which features ask for when they meet a topic id the view does not know (a client
reconnecting after a proxy restart fetches by id without asking for metadata first).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import trio

from proxy.protocol.constants import ErrorCode
from proxy.protocol.message_types import MetadataResponse

log = logging.getLogger("proxy.cluster")

Address = tuple[str, int]
CONSUMER_OFFSETS = "__consumer_offsets"
_NO_TOPIC_ID = uuid.UUID(int=0)

# async (topic names, or None for every topic) -> a decoded Metadata response body
MetadataReader = Callable[[list[str] | None], Awaitable[MetadataResponse]]


@dataclass(slots=True)
class TopicView:
    name: str
    topic_id: uuid.UUID | None = None
    leaders: dict[int, int] = field(default_factory=dict)  # partition -> leader node (-1: none)

    @property
    def partitions(self) -> int:
        return len(self.leaders)


class ClusterView:
    def __init__(self, *, lookup_interval: float = 5.0, lookup_timeout: float = 5.0) -> None:
        self.nodes: dict[int, Address] = {}
        self.topics: dict[str, TopicView] = {}
        self._names_by_id: dict[uuid.UUID, str] = {}
        self.ids_generation = 0  # moves whenever the topic ids known change
        self.reader: MetadataReader | None = None  # set by the server once it can read
        self.answered = trio.Event()  # set once any broker has answered a Metadata request
        self._lookup_interval = lookup_interval
        self._lookup_timeout = lookup_timeout
        self._last_lookup = -float("inf")
        self._lookup: trio.Event | None = None  # set once the lookup on its way is over

    # -- learning ----------------------------------------------------------------------------
    def learn_node(self, node_id: int, host: str, port: int) -> None:
        if node_id < 0:
            return
        previous = self.nodes.get(node_id)
        if previous != (host, port):
            self.nodes[node_id] = (host, port)
            if previous is not None:
                log.info("node address changed node_id=%s old=%s:%s new=%s:%s", node_id, *previous, host, port)

    def learn_metadata(self, body: MetadataResponse) -> None:
        """Take in a Metadata response body (any version), from a client's or our own request."""
        for broker in body.brokers or ():
            self.learn_node(broker.node_id, broker.host, broker.port)
        for topic in body.topics or ():
            name = topic.name
            if not name or topic.error_code != ErrorCode.NONE:
                continue
            view = self.topics.get(name)
            if view is None:
                view = self.topics[name] = TopicView(name)
            topic_id = topic.topic_id  # the zero id before v10, or for a topic the broker gives none
            if topic_id != _NO_TOPIC_ID:
                if view.topic_id is not None and view.topic_id != topic_id:
                    self._names_by_id.pop(view.topic_id, None)  # deleted and created again
                view.topic_id = topic_id
                if self._names_by_id.get(topic_id) != name:
                    self._names_by_id[topic_id] = name
                    self.ids_generation += 1
            view.leaders = {part.partition_index: part.leader_id for part in topic.partitions or ()}
        self.answered.set()

    # -- reading -------------------------------------------------------------------------------
    def name_of(self, topic_id: uuid.UUID) -> str | None:
        return self._names_by_id.get(topic_id)

    def known_ids(self) -> Iterable[uuid.UUID]:
        """The topic ids the view can name (``ids_generation`` moves when they change)."""
        return self._names_by_id.keys()

    def id_of(self, name: str) -> uuid.UUID | None:
        view = self.topics.get(name)
        return view.topic_id if view is not None else None

    def partitions(self, name: str) -> int | None:
        view = self.topics.get(name)
        return view.partitions if view is not None and view.leaders else None

    def leader(self, name: str, partition: int) -> int | None:
        view = self.topics.get(name)
        if view is None:
            return None
        leader = view.leaders.get(partition, -1)
        return leader if leader >= 0 else None

    @property
    def consumer_offsets_partitions(self) -> int | None:
        return self.partitions(CONSUMER_OFFSETS)

    def addresses(self) -> list[Address]:
        return list(self.nodes.values())

    # -- the proxy's own reads -----------------------------------------------------------------
    async def refresh(self, topics: list[str] | None = None) -> None:
        """Read metadata of ``topics`` (None: every topic) from the cluster now. Raises
        whatever the reader raises when no broker answers."""
        if self.reader is None:
            raise LookupError("the proxy cannot read cluster metadata yet")
        self.learn_metadata(await self.reader(topics))

    async def offsets_partitions(self) -> int | None:
        """The partition count of ``__consumer_offsets`` (where Kafka places each group),
        read from the cluster the first time; None when it cannot be read."""
        count = self.consumer_offsets_partitions
        if count is None:
            await self.refresh([CONSUMER_OFFSETS])
            count = self.consumer_offsets_partitions
        return count

    async def look_up_ids(self, topic_ids: Iterable[uuid.UUID]) -> None:
        """Learn the names of ``topic_ids`` the view does not know, reading every topic's
        metadata at most once per lookup interval; failures are logged, not raised (the
        caller treats a topic it cannot name as unknown). A caller that comes while a
        lookup is on its way waits for it (clients reconnecting to a proxy that just
        started all come at once, and the first one's lookup answers them all)."""
        unknown = [topic_id for topic_id in topic_ids if topic_id != _NO_TOPIC_ID and topic_id not in self._names_by_id]
        if not unknown or self.reader is None:
            return
        if self._lookup is not None:
            with trio.move_on_after(self._lookup_timeout):
                await self._lookup.wait()
            return
        now = trio.current_time()
        if now - self._last_lookup < self._lookup_interval:
            return
        self._last_lookup, self._lookup = now, trio.Event()
        try:
            with trio.move_on_after(self._lookup_timeout):
                try:
                    await self.refresh(None)
                except Exception as exc:  # noqa: BLE001 - logged; unknown ids stay unknown
                    log.warning("topic id lookup failed reason=%r", str(exc))
        finally:
            self._lookup.set()
            self._lookup = None
