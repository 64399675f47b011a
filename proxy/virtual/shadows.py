"""Shadow groups of transactional commits of virtual partitions, without I/O
(docs/individual-commit.md, "Transactional commits (exactly-once on shared partitions)").

Inside a Kafka transaction the share watermarks of a real partition cannot share one key:
of two members' pending writes of a key Kafka keeps the one appended last, whatever order
their transactions commit in. So share i of ``T.krK``, read by group G, keeps its watermark
W(i) as the committed offset of the real (T, p) in a group of its own, the *shadow group*
``<G>.kr<K>/<i>#<salt>``, written only by the share's owner, in the client's transaction.

The salt is the lowest non-negative integer that puts the name on G's own
``__consumer_offsets`` partition: the shadow then has G's coordinator (reached on the
client's own connection), one OffsetFetch asks G and its shadows together, and in the
version 1 transaction protocol the client's own AddOffsetsToTxn(G) covers the shadows too.
The name depends on (G, K, i) and the partition count of ``__consumer_offsets`` only, so
every proxy instance computes the same one. The marker ``.kr`` is fixed, not the
configurable ``virtual.topic.suffix``: instances configured differently must still agree
on the names of groups they all read.

**How far the salt search goes.** Java's hash of ``prefix + "#" + digits`` is
``h(prefix#) * 31**len(digits) + h(digits)`` modulo 2**32, so consecutive salts step the
hash through close values. Measured over random group ids (the unit tests check every
count up to 260 that is not a multiple of 31, and 500, 1000, 1024): the lowest salt is
below 100 for the default 50, a few hundred to a few thousand for most counts, and highest
for counts with a large power of two (about 15 000 at 240, 70 000 at 1024, where the low
digits of the hash move in small steps). A multiple of 31 is the exception: modulo 31 the hash of a
string is its last UTF-16 code unit minus 4 per 2**32 wrap of the exact value (2**32 is 4
modulo 31), and a decimal salt ends in one of ten digits, so for a given number of wraps
only ten of the 31 residues are reachable; the others need a salt long enough to change the
wrap count (a million or more) or are never reached. The search therefore stops at
``SALT_LIMIT`` and raises ``ShadowNameError`` naming the partition count, rather than
spin in the request path; with ``offsets.topic.num.partitions`` a multiple of 31, some
groups cannot commit transactionally on virtual topics.

Shadow commits carry the metadata ``keyrange.txn/1:<epoch>:<sequence>:<client metadata>``:
the reset epoch and sequence order the shadow's watermark against the log record's and the
coordinator metadata's copies (the rules of the non-transactional watermarks), and the
client's own metadata follows unchanged (Kafka Streams keeps its partition time there), so
the client reads it back as it wrote it. Kafka refuses metadata longer than
``offset.metadata.max.bytes`` measured by Java's ``String.length()``: UTF-16 code units,
not bytes (4096 CJK characters, 12288 UTF-8 bytes, are accepted; a character outside the
Basic Multilingual Plane counts 2).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from proxy.protocol.groups import group_partition, java_string_hash
from proxy.virtual.names import MIN_SHARES

__all__ = ["DEFAULT_METADATA_MAX", "MARKER", "METADATA_PREFIX", "SALT_LIMIT", "Shadow", "ShadowMetadata",
           "ShadowMetadataTooLarge", "ShadowNameError", "decode_metadata", "encode_metadata", "java_length",
           "metadata_room", "parse_shadow", "shadow_group", "shadow_salt"]

MARKER = ".kr"
# Salts are searched below this bound (see the module docstring): above the salts of
# realistic partition counts, low enough that a failed search costs about a tenth of a
# second, once per name (searches are cached).
SALT_LIMIT = 100_000
# Kafka's group ids are STRING fields: an int16 length of UTF-8 bytes.
MAX_GROUP_BYTES = 0x7FFF
# offset.metadata.max.bytes, Kafka's default.
DEFAULT_METADATA_MAX = 4096
METADATA_PREFIX = "keyrange.txn/"
_V1 = METADATA_PREFIX + "1:"
_INT64_MAX = (1 << 63) - 1
_MASK = 0xFFFFFFFF


class ShadowNameError(ValueError):
    """No shadow group name for these arguments: a share outside 0..K-1, a K below 2, an
    empty group, a name too long for Kafka, or no salt below ``SALT_LIMIT`` lands on the
    group's partition (a partition count that is a multiple of 31)."""


class ShadowMetadataTooLarge(ValueError):
    """The shadow commit's metadata would exceed ``offset.metadata.max.bytes``: the client's
    own metadata fits Kafka's limit only without our prefix. The caller answers the
    partition OFFSET_METADATA_TOO_LARGE, as the broker would have for a longer string."""

    def __init__(self, length: int, limit: int, room: int) -> None:
        super().__init__(f"shadow commit metadata of {length} UTF-16 code units exceeds "
                         f"offset.metadata.max.bytes={limit}: the client's metadata may hold "
                         f"at most {room} of them")
        self.length = length
        self.limit = limit
        self.room = room


@dataclass(frozen=True, slots=True)
class Shadow:
    """A parsed shadow group name: share ``share`` of ``shares`` of group ``group``."""

    group: str
    shares: int
    share: int
    salt: int

    @property
    def name(self) -> str:
        return f"{_prefix(self.group, self.shares, self.share)}#{self.salt}"


def _prefix(group: str, shares: int, share: int) -> str:
    return f"{group}{MARKER}{shares}/{share}"


def _check(group: str, shares: int, share: int, partitions: int) -> None:
    if not group:
        raise ShadowNameError("a shadow group needs a non-empty group id")
    if shares < MIN_SHARES:
        raise ShadowNameError(f"{shares} shares: a virtual topic has at least {MIN_SHARES}")
    if not 0 <= share < shares:
        raise ShadowNameError(f"share {share} is outside 0..{shares - 1}")
    if partitions < 1:
        raise ShadowNameError(f"{partitions} partitions of __consumer_offsets: at least 1 is needed")


def shadow_salt(group: str, shares: int, share: int, partitions: int) -> int:
    """The lowest salt that puts ``<group>.kr<shares>/<share>#<salt>`` on ``group``'s
    partition of a ``__consumer_offsets`` of ``partitions`` partitions."""
    _check(group, shares, share, partitions)
    salt = _search(_prefix(group, shares, share), group_partition(group, partitions), partitions)
    if salt is None:
        hint = (" (a multiple of 31: Java's String.hashCode reaches few residues modulo 31 "
                "through decimal salts)" if partitions % 31 == 0 else "")
        raise ShadowNameError(f"no salt below {SALT_LIMIT} puts a shadow of group {group!r} "
                              f"(K={shares}, share {share}) on its __consumer_offsets partition "
                              f"of {partitions}{hint}")
    return salt


@functools.lru_cache(maxsize=4096)
def _search(prefix: str, target: int, partitions: int) -> int | None:
    # h(prefix + "#" + digits) = h(prefix + "#") * 31**len(digits) + h(digits), mod 2**32:
    # the prefix is hashed once, each salt costs the hash of its digits only.
    base = java_string_hash(prefix + "#") & _MASK
    width, scale = 0, 1
    for salt in range(SALT_LIMIT):
        digits = str(salt)
        if len(digits) != width:
            width, scale = len(digits), pow(31, len(digits), 1 << 32)
        value = (base * scale + java_string_hash(digits)) & _MASK
        if value >= 1 << 31:
            value = (1 << 32) - value  # abs of the signed value; MIN_VALUE stays 2**31
        if value % (1 << 31) % partitions == target:  # Utils.abs(MIN_VALUE) is 0
            return salt
    return None


def shadow_group(group: str, shares: int, share: int, partitions: int) -> str:
    """The shadow group of share ``share`` of ``shares`` (a virtual topic's K) of ``group``,
    with ``partitions`` the partition count of ``__consumer_offsets``."""
    name = f"{_prefix(group, shares, share)}#{shadow_salt(group, shares, share, partitions)}"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_GROUP_BYTES:
        raise ShadowNameError(f"the shadow group of a group id of {len(group)} characters exceeds "
                              f"Kafka's {MAX_GROUP_BYTES} bytes")
    return name


def parse_shadow(name: str, partitions: int | None = None) -> Shadow | None:
    """The shadow group ``name`` is, or None when it is not one (ListGroups answers drop
    shadows; DeleteGroups of G also deletes the shadows whose ``group`` is G).

    Read from the right, so the group part may itself contain ``.kr``, ``/`` or ``#``.
    Numbers must be canonical decimals (no sign, no leading zero), K at least 2 and the
    share below K, the salt below ``SALT_LIMIT``: exactly what ``shadow_group`` writes.
    Given ``partitions``, the salt must also be the one ``shadow_group`` picks, so an
    application's own group that merely looks like a shadow is, unless it also has the
    right salt for that count (about one name in ``partitions``), left alone."""
    head, hash_mark, salt_text = name.rpartition("#")
    if not hash_mark:
        return None
    head, slash, share_text = head.rpartition("/")
    if not slash:
        return None
    cut = head.rfind(MARKER)
    if cut <= 0:
        return None
    group, shares_text = head[:cut], head[cut + len(MARKER):]
    salt, share, shares = _decimal(salt_text), _decimal(share_text), _decimal(shares_text)
    if salt is None or share is None or shares is None:
        return None
    if shares < MIN_SHARES or share >= shares or salt >= SALT_LIMIT:
        return None
    if partitions is not None:
        try:
            if shadow_salt(group, shares, share, partitions) != salt:
                return None
        except ShadowNameError:
            return None
    return Shadow(group, shares, share, salt)


def _decimal(text: str, highest: int = _INT64_MAX) -> int | None:
    """A canonical non-negative decimal (``0``, or digits without a leading zero) up to
    ``highest``; None for anything else, ``+1``, `` 1``, ``1_0`` and ``01`` included."""
    if not text or not text.isascii() or not text.isdigit() or (len(text) > 1 and text[0] == "0"):
        return None
    if len(text) > len(str(highest)):
        return None
    value = int(text)
    return value if value <= highest else None


# -- metadata of shadow commits -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShadowMetadata:
    """What a shadow commit's metadata holds: the reset epoch and sequence of the share's
    watermark, and the client's own metadata (None in a request reads back as ``""``, as
    Kafka stores it)."""

    epoch: int
    sequence: int
    client: str


def java_length(text: str) -> int:
    """Java's ``String.length()``: UTF-16 code units, what Kafka compares with
    ``offset.metadata.max.bytes``."""
    return len(text) + sum(1 for char in text if ord(char) > 0xFFFF)


def _header(epoch: int, sequence: int) -> str:
    if not 0 <= epoch <= _INT64_MAX or not 0 <= sequence <= _INT64_MAX:
        raise ValueError(f"epoch {epoch} and sequence {sequence} must be in 0..{_INT64_MAX}")
    return f"{_V1}{epoch}:{sequence}:"


def metadata_room(epoch: int, sequence: int, limit: int = DEFAULT_METADATA_MAX) -> int:
    """How many UTF-16 code units of client metadata a shadow commit with this epoch and
    sequence can carry under ``offset.metadata.max.bytes`` = ``limit`` (0 when none)."""
    return max(0, limit - len(_header(epoch, sequence)))


def encode_metadata(epoch: int, sequence: int, client: str | None, limit: int = DEFAULT_METADATA_MAX) -> str:
    """``keyrange.txn/1:<epoch>:<sequence>:<client metadata>``; ``ShadowMetadataTooLarge``
    when that is longer than ``limit`` UTF-16 code units, as the broker would refuse it."""
    text = _header(epoch, sequence) + (client or "")
    length = java_length(text)
    if length > limit:
        raise ShadowMetadataTooLarge(length, limit, metadata_room(epoch, sequence, limit))
    return text


def decode_metadata(metadata: str | None) -> ShadowMetadata | None:
    """The shadow commit's epoch, sequence and client metadata; None when ``metadata`` is
    not what ``encode_metadata`` writes. Anyone may commit to a group by name, straight at
    the broker, so a malformed value must not fail the reader: it reads as no watermark
    of ours, and the log's copy counts."""
    if not metadata or not metadata.startswith(_V1):
        return None
    epoch_text, colon, rest = metadata[len(_V1):].partition(":")
    if not colon:
        return None
    sequence_text, colon, client = rest.partition(":")
    if not colon:
        return None
    epoch, sequence = _decimal(epoch_text), _decimal(sequence_text)
    if epoch is None or sequence is None:
        return None
    return ShadowMetadata(epoch, sequence, client)
