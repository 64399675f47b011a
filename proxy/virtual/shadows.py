"""Shadow groups of transactional commits of virtual partitions, without I/O
(docs/individual-commit.md, "Transactional commits (exactly-once on shared partitions)").

Inside a Kafka transaction the share watermarks of a real partition cannot share one key:
of two members' pending writes of a key Kafka keeps the one appended last, whatever order
their transactions commit in. So share i of ``T.krK``, read by group G, keeps its watermark
W(i) as the committed offset of the real (T, p) in a group of its own, the *shadow group*
``<G>.kr<K>/<i>#<salt>``, written only by the share's owner, in the client's transaction.

The salt is a string of one to three characters from the 64 consecutive code points ``0``
(U+0030) through ``o`` (U+006F), the first in order (length 1, then 2, then 3; code-point
order within a length, the first character major) that puts the name on G's own
``__consumer_offsets`` partition: the shadow then has G's coordinator (reached on the
client's own connection), one OffsetFetch asks G and its shadows together, and in the
version 1 transaction protocol the client's own AddOffsetsToTxn(G) covers the shadows too.
The name depends on (G, K, i) and the partition count of ``__consumer_offsets`` only, so
every proxy instance computes the same one. The marker ``.kr`` is fixed, not the
configurable ``virtual.topic.suffix``: instances configured differently must still agree
on the names of groups they all read. The alphabet holds neither ``#`` nor ``/``, so a name
reads back unambiguously from the right.

**How far the salt search goes.** Java's hash of ``prefix + "#" + salt`` is
``h(prefix#) * 31**len(salt) + h(salt)`` modulo 2**32. The one-character salts have 64
consecutive hashes, and since 64 code points are more than 31, the hashes ``c1*31 + c2`` of
the two-character ones are the 2017 consecutive integers 1536..3552 and those of the
three-character ones the 62 560 consecutive integers 47 664..110 223. Unless a run of
hashes straddles a sign change of the int32 (0 or MIN_VALUE), their ``Utils.abs`` are
consecutive too and reach every residue of a count up to the run's length; across a sign
change at least half the run remains consecutive. So every count up to 32 always has a
one-character salt (up to 64 but for a straddle), every count up to 1008 one of at most two
characters (up to 2017 but for a straddle, a chance of about one in a million per name),
and every count up to 31 280 one of at most three; only above that can ``ShadowNameError``
say none was found. Multiples of 31 are nothing special (the decimal salts used before
reached only a few residues modulo 31). Measured (the unit tests check it): for 20 varied
group ids (CJK, astral, U+FFFF and a 200-character one among them) and every count from 1
to 1100, the worst salt has two characters (about a fifth of the names need only one); at
the default count of 50 every name measured needs one; at 5000 most need three. Salts
that differ in their last character only are consecutive in order and in hash, so the
search takes a block of 64 in one modular step (one at a time only across a sign change):
at most 4161 blocks, about 15 microseconds for an uncached name at counts up to 1100
(median; about 0.5 ms at 5000), and names are cached.

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

from dataclasses import dataclass

from proxy.protocol.groups import MAX_SALT_LENGTH, SALT_ALPHABET, group_partition, is_salt, salt_for
from proxy.records.stripes import STRIPED_MARKS, share_count
from proxy.virtual.names import MIN_SHARES


def shares_of(mark_k: int) -> int:
    """The share count of a watermark K: a key-range topic's, or a striped one's kept apart
    (``STRIPED_MARKS``); any K below that is read as it is, as before striped topics."""
    return share_count(mark_k, STRIPED_MARKS - 1)

__all__ = ["DEFAULT_METADATA_MAX", "MARKER", "MAX_SALT_LENGTH", "METADATA_PREFIX", "SALT_ALPHABET", "Shadow",
           "ShadowMetadata", "ShadowMetadataTooLarge", "ShadowNameError", "decode_metadata", "encode_metadata",
           "java_length", "metadata_room", "parse_shadow", "shadow_group", "shadow_salt"]

MARKER = ".kr"
# Kafka's group ids are STRING fields: an int16 length of UTF-8 bytes.
MAX_GROUP_BYTES = 0x7FFF
# offset.metadata.max.bytes, Kafka's default.
DEFAULT_METADATA_MAX = 4096
METADATA_PREFIX = "keyrange.txn/"
_V1 = METADATA_PREFIX + "1:"
_INT64_MAX = (1 << 63) - 1


class ShadowNameError(ValueError):
    """No shadow group name for these arguments: a share outside 0..K-1, a K below 2, an
    empty group, a name too long for Kafka, or no salt of at most ``MAX_SALT_LENGTH``
    characters lands on the group's partition (only possible above 31 280 partitions)."""


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
    salt: str

    @property
    def name(self) -> str:
        return f"{_prefix(self.group, self.shares, self.share)}#{self.salt}"


def _prefix(group: str, shares: int, share: int) -> str:
    return f"{group}{MARKER}{shares}/{share}"


def _check(group: str, shares: int, share: int, partitions: int) -> None:
    if not group:
        raise ShadowNameError("a shadow group needs a non-empty group id")
    width = shares_of(shares)
    if width < MIN_SHARES:
        raise ShadowNameError(f"{shares} shares: a virtual topic has at least {MIN_SHARES}")
    if not 0 <= share < width:
        raise ShadowNameError(f"share {share} is outside 0..{width - 1}")
    if partitions < 1:
        raise ShadowNameError(f"{partitions} partitions of __consumer_offsets: at least 1 is needed")


def shadow_salt(group: str, shares: int, share: int, partitions: int) -> str:
    """The first salt (shortest first, then in code-point order) that puts
    ``<group>.kr<shares>/<share>#<salt>`` on ``group``'s partition of a
    ``__consumer_offsets`` of ``partitions`` partitions."""
    _check(group, shares, share, partitions)
    salt = salt_for(_prefix(group, shares, share), group_partition(group, partitions), partitions)
    if salt is None:
        raise ShadowNameError(f"no salt of at most {MAX_SALT_LENGTH} characters puts a shadow of group "
                              f"{group!r} (K={shares}, share {share}) on its __consumer_offsets partition "
                              f"of {partitions}")
    return salt


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
    K and the share must be canonical decimals (no sign, no leading zero), K at least 2 and
    the share below K, the salt one to ``MAX_SALT_LENGTH`` characters of ``SALT_ALPHABET``:
    exactly what ``shadow_group`` writes.
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
    if not is_salt(salt_text):
        return None
    share, shares = _decimal(share_text), _decimal(shares_text)
    if share is None or shares is None:
        return None
    if shares_of(shares) < MIN_SHARES or share >= shares_of(shares):
        return None
    if partitions is not None:
        try:
            if shadow_salt(group, shares, share, partitions) != salt_text:
                return None
        except ShadowNameError:
            return None
    return Shadow(group, shares, share, salt_text)


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
