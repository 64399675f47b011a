"""What every virtual-topic feature asks of one shared object: which names and ids are
virtual topics, and which requests may name one at all.

One ``VirtualResolver`` per proxy, built by the server and handed to each feature of the
package (naming, refusals, Fetch, commits): the features stay apart by concern, the
knowledge of which topics are virtual stays in one place. So does what Fetch learns of
which offsets hold no record of a share, which commits lift over (``gaps``,
``proxy.virtual.lag``). A real topic of a virtual topic's name always wins, so before a
name is taken for a virtual one the view must have seen every real topic (``know``).
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable, Iterable

import trio

from proxy.pipeline import ClusterView, ConnectionContext, Request, RequestStage, Route
from proxy.virtual.lag import ShareGaps
from proxy.virtual.names import VirtualNames, VirtualTopic
from proxy.virtual.precheck import Precheck
from proxy.virtual.settings import VirtualTopicsSettings

log = logging.getLogger("proxy.virtual")

_REFRESH_INTERVAL = 5.0  # seconds between full metadata reads to tell real names from virtual ones
_LOAD_TIMEOUT = 10.0


class VirtualResolver:
    def __init__(self, settings: VirtualTopicsSettings, cluster: ClusterView,
                 range_fetch_enabled: Callable[[str], bool] = lambda topic: True) -> None:
        """``range_fetch_enabled``: whether a real topic serves key-range fetches
        (``key.range.fetch.enabled``); one that does not has no virtual topics."""
        self.cluster = cluster
        self.range_fetch_enabled = range_fetch_enabled
        self.names = VirtualNames(settings.suffix, settings.max_shares, settings.coop_suffix)
        self.precheck = Precheck(self.names.suffixes)  # which requests are decoded at all
        self.gaps = ShareGaps()  # learnt by Fetch, read by the commits
        self._ids: dict[uuid.UUID, VirtualTopic] = {}
        self._ids_for: set[uuid.UUID] = set()
        self._last_refresh = -float("inf")

    # -- names and ids (``proxy.virtual.rewrite.Resolver``) --------------------------------------
    def virtual(self, name: str) -> VirtualTopic | None:
        """The virtual topic ``name`` stands for, None for a real or unknown name."""
        if not name or name in self.cluster.topics:
            return None  # a real topic of that name always wins
        vt = self.names.parse(name)
        if vt is None or not self.range_fetch_enabled(vt.real):
            return None
        return vt

    def refusal(self, name: str) -> str | None:
        """Why ``name`` has the virtual form but is not served; None otherwise."""
        if not name or name in self.cluster.topics or self.names.split(name) is None:
            return None
        reason = self.names.out_of_bounds(name)
        if reason is not None:
            return reason
        vt = self.names.parse(name)
        if vt is not None and not self.range_fetch_enabled(vt.real):
            return (f"virtual topic {name}: topic {vt.real} does not accept range fetches "
                    "(key.range.fetch.enabled=false)")
        return None

    def by_id(self, topic_id: uuid.UUID) -> VirtualTopic | None:
        """The virtual topic of a derived id, None for any other id."""
        vt = self._ids.get(topic_id)
        if vt is None:
            self._index()
            vt = self._ids.get(topic_id)
        if vt is not None and self.virtual(vt.name) is None:
            return None
        return vt

    def _index(self) -> None:
        for view in list(self.cluster.topics.values()):
            if view.topic_id is None or view.topic_id in self._ids_for:
                continue
            self._ids_for.add(view.topic_id)
            for shares in range(2, self.names.max_shares + 1):
                for striped in (False, True):
                    vt = VirtualTopic(self.names.name(view.name, shares, striped), view.name, shares, striped)
                    self._ids[vt.topic_id(view.topic_id)] = vt

    def real_id(self, real: str) -> uuid.UUID | None:
        return self.cluster.id_of(real)

    def handed_out(self, topics) -> None:
        """Clients may now name these virtual topics by id: the pre-check looks for them."""
        for topic in topics or ():
            if topic.name and self.names.split(topic.name):
                self.precheck.remember(getattr(topic, "topic_id", None))

    # -- the cluster view -------------------------------------------------------------------------
    async def know(self, names: Iterable[str | None]) -> None:
        """Make sure the view has seen every real topic a name could be, so a real topic
        named like a virtual one is never taken for one (read at most every few seconds)."""
        unknown = [name for name in names if name and name not in self.cluster.topics and self.names.split(name)]
        if unknown:
            await self.refresh_all()

    async def refresh_all(self) -> None:
        """Read every topic's metadata into the view, at most every few seconds."""
        now = trio.current_time()
        if now - self._last_refresh < _REFRESH_INTERVAL:
            return
        self._last_refresh = now
        with trio.move_on_after(_LOAD_TIMEOUT):
            try:
                await self.cluster.refresh(None)
            except Exception as exc:  # noqa: BLE001 - the view stays as it is
                log.warning("metadata refresh failed reason=%r", str(exc))

    # -- which requests are decoded ---------------------------------------------------------------
    def guarded(self, stage: RequestStage, *, pattern: bool = False) -> RequestStage:
        """``stage``, run only on requests whose bytes may name a virtual topic (the others
        go on undecoded); ``pattern``: the request carries a regular expression, which may
        hold a suffix with no digit after it."""
        may_name: Callable[[bytes | bytearray], bool] = (self.precheck.may_match_virtual if pattern
                                                         else self.precheck.may_name_virtual)

        @functools.wraps(stage)
        async def guarded(ctx: ConnectionContext, request: Request) -> Route | None:
            if not may_name(request.frame):
                return None
            return await stage(ctx, request)

        return guarded
