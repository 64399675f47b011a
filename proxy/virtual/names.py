"""Virtual topic names and how their partitions map onto real ones, without I/O.

``orders.kr4`` is ``orders`` cut into 4 equal hash shares: virtual partition v is share
``v mod K`` of real partition ``v div K``. ``orders.coop4`` is cut the same way into 4
stripes of whole batches (``proxy.records.stripes``): for consumers that need no per-key
order, balanced whatever the keys. Topic ids are derived from the real topic's id, the
kind and K with a name-based UUID, so every proxy instance, before and after a restart,
gives a client the same id for the same virtual topic (a client that fetches by id after
a reconnect must find its topic again).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from proxy.commits.state import MIN_SHARES
from proxy.ranges import KeyRange, equal_shares
from proxy.records.stripes import STRIPED_MARKS, Stripe

__all__ = ["MIN_SHARES", "VirtualNames", "VirtualTopic", "share_ranges", "virtual_topic_id"]

# Fixed forever: changing it changes every virtual topic id clients hold.
_ID_NAMESPACE = uuid.UUID("6b657972-616e-6765-2d76-697274756131")


@dataclass(frozen=True, slots=True)
class VirtualTopic:
    """One virtual topic: the real topic it reads, its share count K, and whether its
    shares are key ranges (``.kr``) or stripes of batches (``striped``, ``.coop``)."""

    name: str
    real: str
    shares: int
    striped: bool = False

    def real_partition(self, virtual_partition: int) -> int:
        return virtual_partition // self.shares

    def share(self, virtual_partition: int) -> int:
        return virtual_partition % self.shares

    def virtual_partition(self, real_partition: int, share: int) -> int:
        return real_partition * self.shares + share

    def share_range(self, virtual_partition: int) -> KeyRange:
        return share_ranges(self.shares)[self.share(virtual_partition)]

    def share_of(self, virtual_partition: int) -> tuple[KeyRange] | Stripe:
        """What a fetch of the virtual partition reads: its key range, or its stripe."""
        if self.striped:
            return Stripe(self.shares, self.share(virtual_partition))
        return (self.share_range(virtual_partition),)

    @property
    def mark_k(self) -> int:
        """The K its share watermarks are kept under: stripes apart from key shares, so a
        group moving from ``orders.kr4`` to ``orders.coop4`` does not read one's
        watermarks as the other's (proxy.records.stripes.STRIPED_MARKS)."""
        return self.shares + STRIPED_MARKS if self.striped else self.shares

    def topic_id(self, real_id: uuid.UUID) -> uuid.UUID:
        return virtual_topic_id(real_id, self.shares, self.striped)


_SHARES_CACHE: dict[int, list[KeyRange]] = {}


def share_ranges(shares: int) -> list[KeyRange]:
    """The K equal shares of the hash space (docs/wire-contract.md section 2), cached."""
    ranges = _SHARES_CACHE.get(shares)
    if ranges is None:
        ranges = _SHARES_CACHE[shares] = equal_shares(shares)
    return ranges


def virtual_topic_id(real_id: uuid.UUID, shares: int, striped: bool = False) -> uuid.UUID:
    """The id of the K-share virtual topic of the real topic ``real_id``."""
    return uuid.uuid5(_ID_NAMESPACE, f"{real_id}/coop/{shares}" if striped else f"{real_id}/{shares}")


class VirtualNames:
    """Parses names by the proxy's settings (``virtual.topic.suffix``,
    ``virtual.coop.suffix``, ``virtual.topic.max.shares``). Whether a parsed name is
    really virtual also depends on the cluster (a real topic of the same name wins);
    ``parse`` only reads the name."""

    def __init__(self, suffix: str = ".kr", max_shares: int = 64, coop_suffix: str = ".coop") -> None:
        if not suffix or not coop_suffix:
            raise ValueError("the virtual topic suffixes must not be empty")
        if suffix == coop_suffix:
            raise ValueError(f"virtual.topic.suffix and virtual.coop.suffix must differ (both {suffix!r})")
        self.suffix = suffix
        self.coop_suffix = coop_suffix
        self.max_shares = max_shares

    @property
    def suffixes(self) -> tuple[str, str]:
        return self.suffix, self.coop_suffix

    def split(self, name: str) -> tuple[str, int, bool] | None:
        """(real topic, K, striped) when ``name`` has a virtual form, whatever K is; None
        otherwise. Of two forms, the one whose suffix comes last in the name wins."""
        if not name:
            return None
        best: tuple[str, int, bool] | None = None
        best_cut = -1
        for suffix, striped in ((self.suffix, False), (self.coop_suffix, True)):
            cut = name.rfind(suffix)
            if cut <= 0 or cut <= best_cut:
                continue
            digits = name[cut + len(suffix):]
            if not digits.isascii() or not digits.isdigit() or (len(digits) > 1 and digits[0] == "0"):
                continue
            best, best_cut = (name[:cut], int(digits), striped), cut
        return best

    def out_of_bounds(self, name: str) -> str | None:
        """Why a name of a virtual form has a K the proxy does not serve; None if fine
        or not of a virtual form."""
        parts = self.split(name)
        if parts is None:
            return None
        real, shares, striped = parts
        if shares < MIN_SHARES or shares > self.max_shares:
            what = "stripes" if striped else "shares"
            return (f"virtual topic {name} of {real}: {shares} {what} is outside "
                    f"{MIN_SHARES}..{self.max_shares} (virtual.topic.max.shares)")
        return None

    def parse(self, name: str) -> VirtualTopic | None:
        parts = self.split(name)
        if parts is None:
            return None
        real, shares, striped = parts
        if shares < MIN_SHARES or shares > self.max_shares:
            return None
        return VirtualTopic(name, real, shares, striped)

    def name(self, real: str, shares: int, striped: bool = False) -> str:
        return f"{real}{self.coop_suffix if striped else self.suffix}{shares}"

    def name_of_marks(self, real: str, mark_k: int) -> str:
        """The virtual topic whose watermarks are kept under ``mark_k`` (``VirtualTopic.mark_k``)."""
        if mark_k > STRIPED_MARKS:
            return self.name(real, mark_k - STRIPED_MARKS, True)
        return self.name(real, mark_k)
