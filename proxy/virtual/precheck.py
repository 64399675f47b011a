"""Whether a request could name a virtual topic, from its raw bytes, without decoding it.

With virtual topics on, every Metadata, OffsetCommit, Produce... would otherwise be decoded
just to find out that it names none, which doubled the latency of large range commits. A
name is written on the wire as its bytes, so a request naming ``orders.kr4`` holds the bytes
``.kr4``: the suffix followed by a digit from 1 to 9 (K >= 2 has no leading zero). A request
by topic id (Fetch v13+, OffsetCommit v10+, Produce v13+...) holds the 16 bytes of the id,
and a client only knows a virtual topic's id from the proxy (Metadata of the name), so the
ids the proxy derived for names it resolved are the ones to look for.

The test may say yes for a request naming no virtual topic (the bytes can occur in a client
id, a record, a range): that request is decoded as before. It never says no for one that
names a virtual topic by name, nor by an id this proxy handed out.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Collection

from proxy.net.native_table import guard_blob
from proxy.protocol.constants import MAX_ARRAY_ELEMENTS, MAX_TAGGED_FIELDS
from proxy.protocol.message_versions import FETCH_FIRST_TOPIC_ID, FETCH_LAST_REPLICA_ID
from proxy.protocol.walks import Walk

_FIRST_DIGITS = b"123456789"
MAX_IDS = 4096  # virtual topic ids remembered; beyond, the oldest is forgotten


def names_suffix(frame: bytes | bytearray | memoryview, suffix: bytes) -> bool:
    """True when ``suffix`` followed by a digit 1-9 occurs in ``frame``."""
    data = frame if isinstance(frame, (bytes, bytearray)) else bytes(frame)
    at = data.find(suffix)
    end = len(data)
    while at >= 0:
        after = at + len(suffix)
        if after < end and data[after] in _FIRST_DIGITS:
            return True
        at = data.find(suffix, at + 1)
    return False


def names_any_id(frame: bytes | bytearray | memoryview, ids: Collection[bytes]) -> bool:
    """True when one of the 16-byte ``ids`` occurs in ``frame``."""
    if not ids:
        return False
    data = frame if isinstance(frame, (bytes, bytearray)) else bytes(frame)
    return any(topic_id in data for topic_id in ids)


class Precheck:
    """The raw-bytes test of one proxy: its suffixes and the virtual topic ids it handed out."""

    def __init__(self, suffixes: str | tuple[str, ...], max_ids: int = MAX_IDS) -> None:
        if isinstance(suffixes, str):
            suffixes = (suffixes,)
        if not suffixes or not all(suffixes):
            raise ValueError("the virtual topic suffix must not be empty")
        self.suffixes = tuple(suffix.encode() for suffix in suffixes)
        self.max_ids = max_ids
        self._ids: dict[bytes, None] = {}  # insertion order: the oldest is forgotten first
        self._guard: bytes | None = None  # native_guard's, until the ids change

    def remember(self, topic_id: uuid.UUID | None) -> None:
        """A virtual topic id a client may now use."""
        if topic_id is None or topic_id.int == 0:
            return
        key = topic_id.bytes
        if key in self._ids:
            return
        while len(self._ids) >= self.max_ids:
            del self._ids[next(iter(self._ids))]
        self._ids[key] = None
        self._guard = None

    def native_guard(self) -> bytes:
        """The same test for the native relay, on a Produce's topic names only
        (``proxy.net.native_table.guard_blob``): the suffixes, and the ids handed out."""
        if self._guard is None:
            self._guard = guard_blob(self.suffixes, self._ids)
        return self._guard

    def may_name_virtual(self, frame: bytes | bytearray | memoryview) -> bool:
        """False when ``frame`` cannot name a virtual topic: it goes on untouched."""
        return any(names_suffix(frame, suffix) for suffix in self.suffixes) or names_any_id(frame, self._ids)

    def may_match_virtual(self, frame: bytes | bytearray | memoryview) -> bool:
        """Looser, for requests that may carry a regular expression (ConsumerGroupHeartbeat):
        ``.*\\.kr[0-9]+`` holds the suffix with no digit after it."""
        data = frame if isinstance(frame, (bytes, bytearray)) else bytes(frame)
        return any(suffix in data for suffix in self.suffixes) or names_any_id(data, self._ids)


# -- Fetch by topic id: the ids a request names, without decoding it ----------------------------

# What fetch_topic_ids walks (after request header v2): the body's fields up to Topics, and of
# each topic its id and its partitions; ReplicaId moved into a tagged field after v14.
_HEAD = ("MaxWaitMs int32", "MinBytes int32", "MaxBytes int32", "IsolationLevel int8", "SessionId int32",
         "SessionEpoch int32", "Topics compact []FetchTopic")
FETCH_WITH_REPLICA_ID = Walk("FetchRequest", "", FETCH_FIRST_TOPIC_ID, FETCH_LAST_REPLICA_ID,
                             ("ReplicaId int32", *_HEAD), prefix=True)
FETCH = Walk("FetchRequest", "", FETCH_LAST_REPLICA_ID + 1, None, _HEAD, prefix=True)
FETCH_TOPIC = Walk("FetchRequest", "Topics", FETCH_FIRST_TOPIC_ID, None, (
    "TopicId uuid", "Partitions compact []FetchPartition"))
FETCH_PARTITION = Walk("FetchRequest", "Topics.Partitions", FETCH_FIRST_TOPIC_ID, None, (
    "Partition int32", "CurrentLeaderEpoch int32", "FetchOffset int64", "LastFetchedEpoch int32",
    "LogStartOffset int64", "PartitionMaxBytes int32"))
WALKS = (FETCH_WITH_REPLICA_ID, FETCH, FETCH_TOPIC, FETCH_PARTITION)
_REPLICA_ID = FETCH_WITH_REPLICA_ID.size("ReplicaId")
_BEFORE_TOPICS = FETCH.size("MaxWaitMs", "MinBytes", "MaxBytes", "IsolationLevel", "SessionId", "SessionEpoch")
_TOPIC_ID = FETCH_TOPIC.size("TopicId")


def fetch_topic_ids(frame: bytes | bytearray | memoryview, version: int) -> list[bytes] | None:
    """The 16-byte topic ids of a Fetch request's Topics (v13+), walked over the raw frame
    (request header v2, then the body up to the end of Topics); None when the frame does
    not parse as one (the caller then decodes it, and the decoder says what is wrong),
    which includes a count above the limits of ``constants.MAX_ARRAY_ELEMENTS`` and
    ``MAX_TAGGED_FIELDS``: the decoder refuses it.

    Why: a client learns a virtual topic's id from the Metadata answer of whichever proxy
    instance it asked (a sidecar of another broker, or this proxy before a restart); one
    that never handed that id out must still see that a Fetch may name it."""
    if version < FETCH_FIRST_TOPIC_ID:
        return None
    data = frame if isinstance(frame, (bytes, bytearray)) else bytes(frame)
    try:
        pos = 8  # api key, version, correlation id
        (client_len,) = _INT16.unpack_from(data, pos)
        pos += 2 + max(client_len, 0)
        pos = _skip_tags(data, pos)  # the header's tagged fields
        pos += (_REPLICA_ID if version <= FETCH_LAST_REPLICA_ID else 0) + _BEFORE_TOPICS
        topics, pos = _array_length(data, pos)
        ids = []
        for _ in range(topics - 1):
            topic_id = data[pos:pos + _TOPIC_ID]
            if len(topic_id) != _TOPIC_ID:
                return None
            ids.append(bytes(topic_id))
            pos += _TOPIC_ID
            partitions, pos = _array_length(data, pos)
            for _ in range(partitions - 1):
                pos = _skip_tags(data, pos + _FETCH_PARTITION_FIXED)
            pos = _skip_tags(data, pos)
        if pos > len(data):
            return None
        return ids
    except (IndexError, ValueError, struct.error):
        return None


_FETCH_PARTITION_FIXED = FETCH_PARTITION.size()
_INT16 = struct.Struct(">h")
_UVARINT_MAX_BYTES = 5


def _uvarint(data: bytes | bytearray, pos: int) -> tuple[int, int]:
    value = shift = 0
    for i in range(_UVARINT_MAX_BYTES):
        byte = data[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos + i + 1
        shift += 7
    raise ValueError("unsigned varint longer than 5 bytes")


def _array_length(data: bytes | bytearray, pos: int) -> tuple[int, int]:
    """A compact array's length (elements + 1, 0 for null), refused above the limit."""
    length, pos = _uvarint(data, pos)
    if length - 1 > MAX_ARRAY_ELEMENTS:
        raise ValueError(f"array of {length - 1} elements exceeds the limit of {MAX_ARRAY_ELEMENTS}")
    return length, pos


def _skip_tags(data: bytes | bytearray, pos: int) -> int:
    count, pos = _uvarint(data, pos)
    if count > MAX_TAGGED_FIELDS:
        raise ValueError(f"tagged-field section of {count} fields exceeds the limit of {MAX_TAGGED_FIELDS}")
    for _ in range(count):
        _, pos = _uvarint(data, pos)
        size, pos = _uvarint(data, pos)
        pos += size
    if pos > len(data):
        raise ValueError("tagged fields run past the frame")
    return pos
