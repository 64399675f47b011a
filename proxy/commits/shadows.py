"""Shadow groups: where a commit made inside a Kafka transaction waits for it to end,
without I/O (docs/individual-commit.md, "Transactional commits (exactly-once on shared
partitions)" and "Offset ranges of extension clients").

Inside a transaction, what a commit of a shared partition writes cannot go to the
partition's one key (its committed offset in G, or its log record): of two members'
pending writes of a key Kafka keeps the one appended last, whatever order their
transactions commit in, and nobody may wait for another member's transaction. So each
writer commits, in the client's own transaction, to a *shadow group* of its own beside G,
on G's own ``__consumer_offsets`` partition: the shadow then has G's coordinator (reached
on the client's own connection), one OffsetFetch asks G and its shadows together, and in
the version 1 transaction protocol the client's own AddOffsetsToTxn(G) covers the shadows
too. Beside them the client's request itself goes on as the *carrier*: G with the
client's generation and member (the broker's KIP-447 fencing) and the real partition at
S_c, the S this instance computes with the shadow's commit applied. Once the transaction
is committed the shadows are folded into the log (``proxy.commits.transactions``); an
aborted one leaves nothing to fold. Two kinds:

- A **share shadow** ``<G>.kr<K>/<i>#<salt>`` holds share i's watermark W(i) of a virtual
  topic ``T.krK`` read by G: the committed offset of the real (T, p), metadata
  ``keyrange.txn/1:<epoch>:<sequence>:<client metadata>``. Written only by the share's
  owner.
- A **range shadow** ``<G>.keyrange/<transactional id>#<salt>`` holds the offset ranges a
  transactional producer committed for G: the committed offset of the real (T, p) is
  S_c, its metadata ``keyrange.txnranges/1:<epoch>:<s>.<l>,<g>.<l>,...``, and the
  carrier's metadata the marker ``keyrange.txnstage/1``. One writer, whose transactions
  follow one another.

The names depend on G, the kind's own part and the partition count of
``__consumer_offsets`` only, so every proxy instance computes the same one. The marker
``.kr`` is fixed, not the configurable ``virtual.topic.suffix``: instances configured
differently must still agree on the names of groups they all read.

**Salts.** A salt is a string of one to three characters from the 64 consecutive code
points ``0`` (U+0030) through ``o`` (U+006F), the first in order (length 1, then 2, then
3; code-point order within a length, the first character major) that puts the name on G's
own ``__consumer_offsets`` partition (``proxy.protocol.groups``). The alphabet holds
neither ``#`` nor ``/``, so a name reads back unambiguously from the right.

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

**Share shadow metadata.** The reset epoch and sequence order the shadow's watermark
against the log record's and the coordinator metadata's copies (the rules of the
non-transactional watermarks), and the client's own metadata follows unchanged (Kafka
Streams keeps its partition time there), so the client reads it back as it wrote it.
Kafka refuses metadata longer than ``offset.metadata.max.bytes`` measured by Java's
``String.length()``: UTF-16 code units, not bytes (4096 CJK characters, 12288 UTF-8 bytes,
are accepted; a character outside the Basic Multilingual Plane counts 2).

**Range shadow metadata.** ``epoch`` is the key's reset epoch when the shadow was
written; the ranges are sorted and disjoint, written as the first start ``s``, then for
each range its length less one ``l`` and the gap ``g`` before the next one (start less the
previous end less one), all in base 36. A later write of the shadow replaces it whole, so
each write holds the union of the shadow's committed ranges and the new ones, less what
the log already covers (``next_ranges``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from proxy.commits.state import MIN_SHARES, CommitState, OffsetRange, apply_ranges, normalise
from proxy.protocol.groups import (
    MAX_SALT_LENGTH,
    SALT_ALPHABET,
    group_partition,
    is_salt,
    parse_salted,
    salt_for,
    salted_group,
)
from proxy.records.stripes import STRIPED_MARKS, share_count

__all__ = ["CARRIER_MARKER", "DEFAULT_METADATA_MAX", "MAX_SALT_LENGTH", "RANGES_PREFIX", "SALT_ALPHABET",
           "SHARE_MARKER", "SHARE_METADATA_PREFIX", "RangesTooLarge", "ShadowMark", "ShadowMetadataTooLarge",
           "ShadowNameError", "ShareMetadata", "ShareShadow", "carrier_offset", "decode_ranges",
           "decode_share_metadata", "encode_ranges", "encode_share_metadata", "is_range_shadow", "java_length",
           "metadata_room", "next_ranges", "parse_share_shadow", "range_shadow", "range_shadow_prefix",
           "shadow_mark", "share_shadow", "share_shadow_salt", "shares_of", "uncovered"]

SHARE_MARKER = ".kr"
# Kafka's group ids are STRING fields: an int16 length of UTF-8 bytes.
MAX_GROUP_BYTES = 0x7FFF
# offset.metadata.max.bytes, Kafka's default.
DEFAULT_METADATA_MAX = 4096
SHARE_METADATA_PREFIX = "keyrange.txn/"
_SHARE_V1 = SHARE_METADATA_PREFIX + "1:"
RANGES_PREFIX = "keyrange.txnranges/"
_RANGES_V1 = RANGES_PREFIX + "1:"
# The carrier of a transactional range commit marks the real partition's committed offset:
# a range shadow may hold ranges the log does not have yet.
CARRIER_MARKER = "keyrange.txnstage/1"
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
_INT64_MAX = (1 << 63) - 1

# A share shadow's committed watermark: (K, share, W, reset epoch, sequence).
ShadowMark = tuple[int, int, int, int, int]


class ShadowNameError(ValueError):
    """No shadow group name for these arguments: a share outside 0..K-1, a K below 2, an
    empty group, a name too long for Kafka, no salt of at most ``MAX_SALT_LENGTH``
    characters lands on the group's partition (only possible above 31 280 partitions), or
    the partition count of ``__consumer_offsets`` is unknown."""


def shares_of(mark_k: int) -> int:
    """The share count of a watermark K: a key-range topic's, or a striped one's kept apart
    (``STRIPED_MARKS``); any K below that is read as it is, as before striped topics."""
    return share_count(mark_k, STRIPED_MARKS - 1)


# -- share shadows: names ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShareShadow:
    """A parsed share shadow name: share ``share`` of ``shares`` of group ``group``."""

    group: str
    shares: int
    share: int
    salt: str

    @property
    def name(self) -> str:
        return f"{_share_prefix(self.group, self.shares, self.share)}#{self.salt}"


def _share_prefix(group: str, shares: int, share: int) -> str:
    return f"{group}{SHARE_MARKER}{shares}/{share}"


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


def share_shadow_salt(group: str, shares: int, share: int, partitions: int) -> str:
    """The first salt (shortest first, then in code-point order) that puts
    ``<group>.kr<shares>/<share>#<salt>`` on ``group``'s partition of a
    ``__consumer_offsets`` of ``partitions`` partitions."""
    _check(group, shares, share, partitions)
    salt = salt_for(_share_prefix(group, shares, share), group_partition(group, partitions), partitions)
    if salt is None:
        raise ShadowNameError(f"no salt of at most {MAX_SALT_LENGTH} characters puts a shadow of group "
                              f"{group!r} (K={shares}, share {share}) on its __consumer_offsets partition "
                              f"of {partitions}")
    return salt


def share_shadow(group: str, shares: int, share: int, partitions: int) -> str:
    """The share shadow of share ``share`` of ``shares`` (a virtual topic's K) of ``group``,
    with ``partitions`` the partition count of ``__consumer_offsets``."""
    name = f"{_share_prefix(group, shares, share)}#{share_shadow_salt(group, shares, share, partitions)}"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_GROUP_BYTES:
        raise ShadowNameError(f"the shadow group of a group id of {len(group)} characters exceeds "
                              f"Kafka's {MAX_GROUP_BYTES} bytes")
    return name


def parse_share_shadow(name: str, partitions: int | None = None) -> ShareShadow | None:
    """The share shadow ``name`` is, or None when it is not one (ListGroups answers drop
    share shadows; DeleteGroups of G also deletes the share shadows whose ``group`` is G).

    Read from the right, so the group part may itself contain ``.kr``, ``/`` or ``#``.
    K and the share must be canonical decimals (no sign, no leading zero), K at least 2 and
    the share below K, the salt one to ``MAX_SALT_LENGTH`` characters of ``SALT_ALPHABET``:
    exactly what ``share_shadow`` writes.
    Given ``partitions``, the salt must also be the one ``share_shadow`` picks, so an
    application's own group that merely looks like a shadow is, unless it also has the
    right salt for that count (about one name in ``partitions``), left alone."""
    head, hash_mark, salt_text = name.rpartition("#")
    if not hash_mark:
        return None
    head, slash, share_text = head.rpartition("/")
    if not slash:
        return None
    cut = head.rfind(SHARE_MARKER)
    if cut <= 0:
        return None
    group, shares_text = head[:cut], head[cut + len(SHARE_MARKER):]
    if not is_salt(salt_text):
        return None
    share, shares = _decimal(share_text), _decimal(shares_text)
    if share is None or shares is None:
        return None
    if shares_of(shares) < MIN_SHARES or share >= shares_of(shares):
        return None
    if partitions is not None:
        try:
            if share_shadow_salt(group, shares, share, partitions) != salt_text:
                return None
        except ShadowNameError:
            return None
    return ShareShadow(group, shares, share, salt_text)


def _decimal(text: str, highest: int = _INT64_MAX) -> int | None:
    """A canonical non-negative decimal (``0``, or digits without a leading zero) up to
    ``highest``; None for anything else, ``+1``, `` 1``, ``1_0`` and ``01`` included."""
    if not text or not text.isascii() or not text.isdigit() or (len(text) > 1 and text[0] == "0"):
        return None
    if len(text) > len(str(highest)):
        return None
    value = int(text)
    return value if value <= highest else None


# -- share shadows: metadata ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShareMetadata:
    """What a share shadow commit's metadata holds: the reset epoch and sequence of the
    share's watermark, and the client's own metadata (None in a request reads back as
    ``""``, as Kafka stores it)."""

    epoch: int
    sequence: int
    client: str


class ShadowMetadataTooLarge(ValueError):
    """The share shadow commit's metadata would exceed ``offset.metadata.max.bytes``: the
    client's own metadata fits Kafka's limit only without our prefix. The caller answers
    the partition OFFSET_METADATA_TOO_LARGE, as the broker would have for a longer string."""

    def __init__(self, length: int, limit: int, room: int) -> None:
        super().__init__(f"shadow commit metadata of {length} UTF-16 code units exceeds "
                         f"offset.metadata.max.bytes={limit}: the client's metadata may hold "
                         f"at most {room} of them")
        self.length = length
        self.limit = limit
        self.room = room


def java_length(text: str) -> int:
    """Java's ``String.length()``: UTF-16 code units, what Kafka compares with
    ``offset.metadata.max.bytes``."""
    return len(text) + sum(1 for char in text if ord(char) > 0xFFFF)


def _share_header(epoch: int, sequence: int) -> str:
    if not 0 <= epoch <= _INT64_MAX or not 0 <= sequence <= _INT64_MAX:
        raise ValueError(f"epoch {epoch} and sequence {sequence} must be in 0..{_INT64_MAX}")
    return f"{_SHARE_V1}{epoch}:{sequence}:"


def metadata_room(epoch: int, sequence: int, limit: int = DEFAULT_METADATA_MAX) -> int:
    """How many UTF-16 code units of client metadata a share shadow commit with this epoch
    and sequence can carry under ``offset.metadata.max.bytes`` = ``limit`` (0 when none)."""
    return max(0, limit - len(_share_header(epoch, sequence)))


def encode_share_metadata(epoch: int, sequence: int, client: str | None, limit: int = DEFAULT_METADATA_MAX) -> str:
    """``keyrange.txn/1:<epoch>:<sequence>:<client metadata>``; ``ShadowMetadataTooLarge``
    when that is longer than ``limit`` UTF-16 code units, as the broker would refuse it."""
    text = _share_header(epoch, sequence) + (client or "")
    length = java_length(text)
    if length > limit:
        raise ShadowMetadataTooLarge(length, limit, metadata_room(epoch, sequence, limit))
    return text


def decode_share_metadata(metadata: str | None) -> ShareMetadata | None:
    """The share shadow commit's epoch, sequence and client metadata; None when
    ``metadata`` is not what ``encode_share_metadata`` writes. Anyone may commit to a group
    by name, straight at the broker, so a malformed value must not fail the reader: it
    reads as no watermark of ours, and the log's copy counts."""
    if not metadata or not metadata.startswith(_SHARE_V1):
        return None
    epoch_text, colon, rest = metadata[len(_SHARE_V1):].partition(":")
    if not colon:
        return None
    sequence_text, colon, client = rest.partition(":")
    if not colon:
        return None
    epoch, sequence = _decimal(epoch_text), _decimal(sequence_text)
    if epoch is None or sequence is None:
        return None
    return ShareMetadata(epoch, sequence, client)


def shadow_mark(shares: int, share: int, offset: int, metadata: str | None) -> ShadowMark | None:
    """A share shadow's committed offset as a watermark (K, share, W, reset epoch,
    sequence), or None when its metadata is not a proxy's (anyone may commit to a group)."""
    decoded = decode_share_metadata(metadata)
    if decoded is None or offset < 0:
        return None
    return shares, share, offset, decoded.epoch, decoded.sequence


# -- range shadows: names ---------------------------------------------------------------------


def range_shadow_prefix(group: str, transactional_id: str) -> str:
    """The name, before its salt, of the range shadow that holds the offset ranges the
    producer ``transactional_id`` commits for ``group`` inside its transactions."""
    return f"{group}.keyrange/{transactional_id}"


def range_shadow(group: str, transactional_id: str, partitions: int) -> str:
    """The range shadow of ``transactional_id`` for ``group``, with ``partitions`` the
    partition count of ``__consumer_offsets``."""
    try:
        return salted_group(range_shadow_prefix(group, transactional_id), group, partitions)
    except ValueError as exc:
        raise ShadowNameError(str(exc)) from None


def is_range_shadow(name: str, group: str, partitions: int) -> bool:
    """Whether ``name`` is a range shadow of ``group`` (exactly what ``range_shadow``
    writes for some transactional id)."""
    return name.startswith(range_shadow_prefix(group, "")) and parse_salted(name, group, partitions) is not None


# -- range shadows: metadata ------------------------------------------------------------------


class RangesTooLarge(ValueError):
    """The range shadow's metadata would exceed ``offset.metadata.max.bytes``: the commit is
    refused (INVALID_REQUEST), as a commit of more than ``max.individual.commit.ranges``."""


def _b36(value: int) -> str:
    if value < 0:
        raise ValueError(f"{value} is negative")
    if value == 0:
        return "0"
    out = []
    while value:
        value, digit = divmod(value, 36)
        out.append(_DIGITS[digit])
    return "".join(reversed(out))


def _number(text: str) -> int:
    if not text or len(text) > 13 or any(c not in _DIGITS for c in text) or (len(text) > 1 and text[0] == "0"):
        raise ValueError(f"{text!r} is not a base-36 number")
    value = int(text, 36)
    if value > _INT64_MAX:
        raise ValueError(f"{text!r} is beyond int64")
    return value


def encode_ranges(epoch: int, ranges: Sequence[OffsetRange], limit: int = DEFAULT_METADATA_MAX) -> str:
    """The metadata of a range shadow holding ``ranges`` (any order, overlaps allowed)."""
    ordered = normalise(ranges)
    parts = []
    previous_end = None
    for start, end in ordered:
        if start < 0 or end < start:
            raise ValueError(f"range {start}-{end} is not a range of offsets")
        head = _b36(start) if previous_end is None else _b36(start - previous_end - 1)
        parts.append(f"{head}.{_b36(end - start)}")
        previous_end = end
    text = f"{_RANGES_V1}{epoch}:{','.join(parts)}"
    if len(text) > limit:
        raise RangesTooLarge(f"a range shadow of {len(ordered)} ranges takes {len(text)} characters of "
                             f"metadata; offset.metadata.max.bytes is {limit}")
    return text


def decode_ranges(metadata: str | None) -> tuple[int, list[OffsetRange]] | None:
    """(epoch, ranges) of a range shadow's metadata; None when it is not one a proxy wrote
    (anyone may commit to any group by name: a malformed one reads as none)."""
    if not metadata or not metadata.startswith(_RANGES_V1):
        return None
    epoch_text, colon, body = metadata[len(_RANGES_V1):].partition(":")
    if not colon or not epoch_text.isdigit():
        return None
    ranges: list[OffsetRange] = []
    try:
        previous_end = None
        for item in filter(None, body.split(",")):
            head, dot, length = item.partition(".")
            if not dot:
                return None
            start = _number(head) if previous_end is None else previous_end + 1 + _number(head)
            end = start + _number(length)
            if end > _INT64_MAX:
                return None
            ranges.append((start, end))
            previous_end = end
    except ValueError:
        return None
    return int(epoch_text), ranges


def uncovered(state: CommitState, ranges: Iterable[OffsetRange]) -> list[OffsetRange]:
    """The parts of ``ranges`` that ``state`` does not hold processed (below S or in R)."""
    held = [(-1, state.stable - 1), *state.ranges] if state.stable > 0 else list(state.ranges)
    out: list[OffsetRange] = []
    for start, end in normalise(ranges):
        cursor = start
        for low, high in held:
            if high < cursor or low > end:
                continue
            if low > cursor:
                out.append((cursor, low - 1))
            cursor = max(cursor, high + 1)
            if cursor > end:
                break
        if cursor <= end:
            out.append((cursor, end))
    return out


def next_ranges(state: CommitState, committed: tuple[int, list[OffsetRange]] | None, commit: Sequence[OffsetRange]
                ) -> list[OffsetRange]:
    """The ranges a range shadow's next write holds: its committed ranges (of the state's
    epoch; ranges of an older one were reset since) joined with this commit's, less what
    the log already covers."""
    held = list(commit)
    if committed is not None and committed[0] == state.epoch:
        held += committed[1]
    return uncovered(state, held)


def carrier_offset(state: CommitState, ranges: Sequence[OffsetRange]) -> int:
    """S once the shadow's ranges are processed: what the carrier commits for the real
    partition (a lower bound: other members' ranges not folded yet may move S further)."""
    return apply_ranges(state, ranges).stable if ranges else state.stable
