"""Virtual topic names and how their partitions map onto real ones, without I/O.

``orders.kr4`` is ``orders`` cut into 4 equal hash shares: virtual partition v is share
``v mod K`` of real partition ``v div K``. Topic ids are derived from the real topic's
id and K with a name-based UUID, so every proxy instance, before and after a restart,
gives a client the same id for the same virtual topic (a client that fetches by id after
a reconnect must find its topic again).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from proxy.ranges import KeyRange, equal_shares

MIN_SHARES = 2
# Fixed forever: changing it changes every virtual topic id clients hold.
_ID_NAMESPACE = uuid.UUID("6b657972-616e-6765-2d76-697274756131")


@dataclass(frozen=True, slots=True)
class VirtualTopic:
    """One virtual topic: the real topic it reads and its share count K."""

    name: str
    real: str
    shares: int

    def real_partition(self, virtual_partition: int) -> int:
        return virtual_partition // self.shares

    def share(self, virtual_partition: int) -> int:
        return virtual_partition % self.shares

    def virtual_partition(self, real_partition: int, share: int) -> int:
        return real_partition * self.shares + share

    def share_range(self, virtual_partition: int) -> KeyRange:
        return share_ranges(self.shares)[self.share(virtual_partition)]

    def topic_id(self, real_id: uuid.UUID) -> uuid.UUID:
        return virtual_topic_id(real_id, self.shares)


_SHARES_CACHE: dict[int, list[KeyRange]] = {}


def share_ranges(shares: int) -> list[KeyRange]:
    """The K equal shares of the hash space (docs/wire-contract.md section 2), cached."""
    ranges = _SHARES_CACHE.get(shares)
    if ranges is None:
        ranges = _SHARES_CACHE[shares] = equal_shares(shares)
    return ranges


def virtual_topic_id(real_id: uuid.UUID, shares: int) -> uuid.UUID:
    """The id of the K-share virtual topic of the real topic ``real_id``."""
    return uuid.uuid5(_ID_NAMESPACE, f"{real_id}/{shares}")


class VirtualNames:
    """Parses names by the proxy's settings (``virtual.topic.suffix``,
    ``virtual.topic.max.shares``). Whether a parsed name is really virtual also depends
    on the cluster (a real topic of the same name wins); ``parse`` only reads the name."""

    def __init__(self, suffix: str = ".kr", max_shares: int = 64) -> None:
        if not suffix:
            raise ValueError("the virtual topic suffix must not be empty")
        self.suffix = suffix
        self.max_shares = max_shares

    def split(self, name: str) -> tuple[str, int] | None:
        """(real topic, K) when ``name`` has the virtual form, whatever K is; None otherwise."""
        if not name:
            return None
        cut = name.rfind(self.suffix)
        if cut <= 0:
            return None
        digits = name[cut + len(self.suffix):]
        if not digits.isascii() or not digits.isdigit() or (len(digits) > 1 and digits[0] == "0"):
            return None
        return name[:cut], int(digits)

    def out_of_bounds(self, name: str) -> str | None:
        """Why a name of the virtual form has a K the proxy does not serve; None if fine
        or not of the virtual form."""
        parts = self.split(name)
        if parts is None:
            return None
        real, shares = parts
        if shares < MIN_SHARES or shares > self.max_shares:
            return (f"virtual topic {name} of {real}: {shares} shares is outside "
                    f"{MIN_SHARES}..{self.max_shares} (virtual.topic.max.shares)")
        return None

    def parse(self, name: str) -> VirtualTopic | None:
        parts = self.split(name)
        if parts is None:
            return None
        real, shares = parts
        if shares < MIN_SHARES or shares > self.max_shares:
            return None
        return VirtualTopic(name, real, shares)

    def name(self, real: str, shares: int) -> str:
        return f"{real}{self.suffix}{shares}"
