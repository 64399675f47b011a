"""The native relay's reads of a Fetch request, in Python: the reference the C loop
(``proxy/net/_cpump.c``) is held to by the tests and the frames fuzz target.

The loop carries a Fetch only when it can tell from the request's bytes that no feature
would act on it: all of it is in the loop's peek (``peek_span``), it parses to its last
byte with every count within the limits, no tagged-field section of its body holds a field
(the key-range and cooperative extensions are tagged fields, at the top level and on
partitions; Kafka's own tagged fields of a Fetch, ClusterId, ReplicaState and
ReplicaDirectoryId, are a replica's, never a consumer's), and, with virtual topics on
(``GUARDED``), no topic it names, in Topics or ForgottenTopicsData, may be virtual by the
run's guard or is, by id, one the proxy does not know. Written to be read, not to be fast:
the C loop is what runs.
"""

from __future__ import annotations

import struct

from proxy.net.native_table import FLEXIBLE_HEADER, GUARDED, KEYS, TOPIC_ID_BYTES, VERSIONS, NativeClass
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import MAX_ARRAY_ELEMENTS, MAX_TAGGED_FIELDS
from proxy.protocol.errors import ProtocolError
from proxy.protocol.framing import check_request_header_tags
from proxy.protocol.message_versions import FETCH_FIRST_FLEXIBLE, FETCH_FIRST_TOPIC_ID, FETCH_LAST_REPLICA_ID
from proxy.protocol.primitives import read_uvarint

PEEK_MAX = 1024  # the loop's peek at a request
FETCH_PEEK_MAX = 16384  # ... and at a Fetch, which it reads whole
_CLASS_MASK = 0x3F
_FIRST_DIGITS = b"123456789"
_INT16, _INT32 = struct.Struct(">h"), struct.Struct(">i")

PLAIN, EVENT_LOOP, UNREADABLE = 0, 1, -1  # fetch_request_plain's answers


class _Unreadable(Exception):
    """The bytes end first, or do not parse."""


def peek_span(frame: bytes) -> int:
    """How many bytes of a request (from its size prefix) the loop peeks at: a Fetch whole,
    up to FETCH_PEEK_MAX (a larger one is the event loop's anyway); PEEK_MAX of any other."""
    if len(frame) < 12 or _INT16.unpack_from(frame, 4)[0] != ApiKey.FETCH:
        return PEEK_MAX
    whole = _INT32.unpack_from(frame, 0)[0] + 4
    return whole if PEEK_MAX < whole <= FETCH_PEEK_MAX else PEEK_MAX


# -- the guard (native_table.guard_blob, known_blob) --------------------------------------------
def _suffixes(guard: bytes) -> list[bytes] | None:
    """The guard's suffixes; None when it is empty or they do not parse."""
    if not guard:
        return None
    count, pos, suffixes = guard[0], 1, []
    for _ in range(count):
        if pos >= len(guard) or guard[pos] == 0 or len(guard) - pos - 1 < guard[pos]:
            return None
        suffixes.append(guard[pos + 1:pos + 1 + guard[pos]])
        pos += 1 + guard[pos]
    return suffixes


def _id_section(guard: bytes) -> bytes | None:
    """The guard's ids, after as many suffixes as it holds (a length byte and its bytes
    each); None when it is empty or they are not whole ids."""
    if not guard:
        return None
    pos = 1
    for _ in range(guard[0]):
        if pos >= len(guard):
            break
        pos += 1 + guard[pos]
    if pos > len(guard) or (len(guard) - pos) % TOPIC_ID_BYTES:
        return None
    return guard[pos:]


def name_may_be_virtual(name: bytes, guard: bytes) -> bool:
    """A name holding one of the guard's suffixes followed by a digit 1-9; every name, when
    the guard is empty or its suffixes do not parse."""
    suffixes = _suffixes(guard)
    if suffixes is None:
        return True
    for suffix in suffixes:
        at = name.find(suffix)
        while at >= 0:
            after = at + len(suffix)
            if after < len(name) and name[after] in _FIRST_DIGITS:
                return True
            at = name.find(suffix, at + 1)
    return False


def _ids(section: bytes) -> set[bytes]:
    return {section[i:i + TOPIC_ID_BYTES] for i in range(0, len(section), TOPIC_ID_BYTES)}


def id_is_virtual(topic_id: bytes, guard: bytes) -> bool:
    """One of the guard's ids; every id, when the guard is empty or its ids are not whole."""
    section = _id_section(guard)
    return section is None or topic_id in _ids(section)


def id_is_plain(topic_id: bytes, guard: bytes, known: bytes) -> bool:
    """An id a guarded Fetch may name: one of the topics the proxy knows, not a virtual one."""
    if len(known) % TOPIC_ID_BYTES:
        return False
    return topic_id in _ids(known) and not id_is_virtual(topic_id, guard)


# -- a Fetch request -------------------------------------------------------------------------
class _Reader:
    """A cursor over a request's bytes; every read past the end is ``_Unreadable``."""

    def __init__(self, data: bytes, pos: int) -> None:
        self.data = data
        self.pos = pos

    def skip(self, count: int) -> bytes:
        if len(self.data) - self.pos < count:
            raise _Unreadable
        taken = self.data[self.pos:self.pos + count]
        self.pos += count
        return taken

    def int16(self) -> int:
        return _INT16.unpack(self.skip(2))[0]

    def int32(self) -> int:
        return _INT32.unpack(self.skip(4))[0]

    def uvarint(self) -> int:
        try:
            value, self.pos = read_uvarint(self.data, self.pos)
        except ProtocolError:
            raise _Unreadable from None
        return value

    def count(self, flexible: bool) -> int:
        """An array's element count: compact from v12, int32 before; never null."""
        if flexible:
            length = self.uvarint()
            if length == 0 or length - 1 > MAX_ARRAY_ELEMENTS:
                raise _Unreadable
            return length - 1
        count = self.int32()
        if not 0 <= count <= MAX_ARRAY_ELEMENTS:
            raise _Unreadable
        return count

    def string(self, flexible: bool) -> bytes:
        """A string, never null: compact from v12, int16-prefixed before."""
        if flexible:
            length = self.uvarint()
            if length == 0:
                raise _Unreadable
            return self.skip(length - 1)
        length = self.int16()
        if length < 0:
            raise _Unreadable
        return self.skip(length)

    def no_tags(self) -> bool:
        """A tagged-field section: whether it is empty."""
        count = self.uvarint()
        if count > MAX_TAGGED_FIELDS:
            raise _Unreadable
        return count == 0


def fetch_request_plain(frame: bytes, version: int, guarded: bool, guard: bytes = b"", known: bytes = b"") -> int:
    """PLAIN when the loop may carry this Fetch request (``frame``: from its size prefix, as
    much as was peeked), EVENT_LOOP at the first tagged field of its body or (``guarded``)
    the first topic that may be virtual or, by id, is not ``known``; UNREADABLE when the
    bytes end first or do not parse. Read in order: the answer is the first one met."""
    try:
        return _fetch_request_plain(frame, version, guarded, guard, known)
    except _Unreadable:
        return UNREADABLE


def _fetch_request_plain(frame: bytes, version: int, guarded: bool, guard: bytes, known: bytes) -> int:
    flexible = version >= FETCH_FIRST_FLEXIBLE
    if len(frame) < 12:
        raise _Unreadable
    size = _INT32.unpack_from(frame, 0)[0]
    if size < 8 or len(frame) < size + 4:
        raise _Unreadable
    read = _Reader(frame[:size + 4], 12)  # size, api key, version, correlation id
    client_len = read.int16()
    if client_len < -1:
        raise _Unreadable
    read.skip(max(client_len, 0))
    if flexible:  # the header's tagged fields: the features read the body's
        count = read.uvarint()
        if count > MAX_TAGGED_FIELDS:
            raise _Unreadable
        for _ in range(count):
            read.uvarint()
            read.skip(read.uvarint())
    read.skip((4 if version <= FETCH_LAST_REPLICA_ID else 0) + 4 + 4 + (4 if version >= 3 else 0)
              + (1 if version >= 4 else 0) + (8 if version >= 7 else 0))
    partition_bytes = 4 + (4 if version >= 9 else 0) + 8 + (4 if version >= 12 else 0) + (8 if version >= 5 else 0) + 4

    def topic_clears() -> bool:
        if version >= FETCH_FIRST_TOPIC_ID:
            topic_id = read.skip(TOPIC_ID_BYTES)
            return not guarded or id_is_plain(topic_id, guard, known)
        name = read.string(flexible)
        return not guarded or not name_may_be_virtual(name, guard)

    for _ in range(read.count(flexible)):
        if not topic_clears():
            return EVENT_LOOP
        for _ in range(read.count(flexible)):
            read.skip(partition_bytes)
            if flexible and not read.no_tags():
                return EVENT_LOOP
        if flexible and not read.no_tags():
            return EVENT_LOOP
    if version >= 7:  # ForgottenTopicsData
        for _ in range(read.count(flexible)):
            if not topic_clears():
                return EVENT_LOOP
            read.skip(4 * read.count(flexible))
            if flexible and not read.no_tags():
                return EVENT_LOOP
    if version >= 11:  # RackId
        read.string(flexible)
    if flexible and not read.no_tags():
        return EVENT_LOOP
    return PLAIN if read.pos == len(read.data) else UNREADABLE


def classify_fetch(frame: bytes, classes: bytes, max_frame: int, guard: bytes = b"", known: bytes = b"") -> int:
    """The class ``_cpump.classify`` gives a Fetch request frame (from its size prefix): its
    table entry's class when the loop may carry it, else PYTHON (0)."""
    peeked = frame[:peek_span(frame)]
    if len(peeked) < 12:
        return NativeClass.PYTHON
    size = _INT32.unpack_from(peeked, 0)[0]
    api_key, version = _INT16.unpack_from(peeked, 4)[0], _INT16.unpack_from(peeked, 6)[0]
    if api_key != ApiKey.FETCH:
        raise ValueError("a Fetch request frame is wanted")
    if not (8 <= size <= max_frame and 0 <= version < VERSIONS) or len(classes) != KEYS * VERSIONS:
        return NativeClass.PYTHON
    entry = classes[api_key * VERSIONS + version]
    cls = entry & _CLASS_MASK
    if cls == NativeClass.PYTHON:
        return NativeClass.PYTHON
    head = peeked[4:size + 4]
    if entry & FLEXIBLE_HEADER:
        try:
            if check_request_header_tags(head, True) is None:
                return NativeClass.PYTHON
        except ProtocolError:
            return NativeClass.PYTHON
    if cls == NativeClass.FETCH and version < FETCH_FIRST_FLEXIBLE:  # its walk reads flexible responses only
        return NativeClass.PYTHON
    if fetch_request_plain(peeked, version, bool(entry & GUARDED), guard, known) != PLAIN:
        return NativeClass.PYTHON
    return cls


# -- a key-range Fetch the loop answers (proxy/keyrange/native.py) ---------------------------------
ANSWER_TAG = 10000  # KeyRanges
ANSWER_VERSIONS = range(13, 18)
ANSWER_MAX_PARTITIONS = 32
ANSWER_MAX_RANGES = 16
_SERVED_BYTES = TOPIC_ID_BYTES + 4
_NULL = object()  # a KeyRanges field holding null


class _Refused(Exception):
    """Not a shape the loop answers: the event loop's."""


def answer_keys(frame: bytes, guarded: bool, served: bytes, guard: bytes = b"", known: bytes = b"") -> list[bytes] | int:
    """What ``_cpump.answer_keys`` says of a Fetch request frame (from its size prefix): the
    table keys of its partitions (``proxy.keyrange.native.answer_key``), in order, when the
    loop may answer it from the table; EVENT_LOOP (1) when its shape is not one the loop
    answers (not sessionless v13-v17 by topic id; a topic or partition named twice; more than
    ANSWER_MAX_PARTITIONS; forgotten topics; a tagged field but KeyRanges; a partition whose
    effective ranges are none, empty or more than ANSWER_MAX_RANGES, or one ``served`` does
    not list; with ``guarded``, a topic a plain Fetch could not name); UNREADABLE (-1) when
    the bytes end first or do not parse. Read in order: the answer is the first one met."""
    try:
        return _answer_keys(frame, guarded, served, guard, known)
    except _Unreadable:
        return UNREADABLE
    except _Refused:
        return EVENT_LOOP


def _canonical(read: _Reader) -> int:
    start = read.pos
    value = read.uvarint()
    if read.pos - start > 1 and read.data[read.pos - 1] == 0:
        raise _Unreadable
    return value


def _ranges_field(value: bytes) -> object:
    """A KeyRanges field's value: the ranges' bytes (16 each), or _NULL."""
    read = _Reader(value, 0)
    length = _canonical(read)
    if length == 0:
        if read.pos != len(value):
            raise _Refused
        return _NULL
    if length - 1 > ANSWER_MAX_RANGES:
        raise _Refused
    out = []
    for _ in range(length - 1):
        out.append(read.skip(16))
        if read.pos >= len(value):
            raise _Unreadable
        if value[read.pos] != 0:  # a range's tagged fields: none
            raise _Refused
        read.pos += 1
    if read.pos != len(value):
        raise _Refused
    return b"".join(out)


def _answer_tags(read: _Reader) -> object | None:
    """A tagged-field section that may hold KeyRanges alone: its value, or None when absent."""
    fields = _canonical(read)
    if fields > MAX_TAGGED_FIELDS:
        raise _Unreadable
    if fields > 1:
        raise _Refused
    if fields == 0:
        return None
    tag = _canonical(read)
    size = _canonical(read)
    value = read.skip(size)
    if tag != ANSWER_TAG:
        raise _Refused
    return _ranges_field(value)


def _answer_keys(frame: bytes, guarded: bool, served: bytes, guard: bytes, known: bytes) -> list[bytes]:
    if len(frame) < 12:
        raise _Unreadable
    size = _INT32.unpack_from(frame, 0)[0]
    if size < 8 or len(frame) < size + 4:
        raise _Unreadable
    api_key, version = _INT16.unpack_from(frame, 4)[0], _INT16.unpack_from(frame, 6)[0]
    if api_key != ApiKey.FETCH or version not in ANSWER_VERSIONS:
        raise _Refused
    read = _Reader(frame[:size + 4], 12)
    client_len = read.int16()
    if client_len < -1:
        raise _Unreadable
    read.skip(max(client_len, 0))
    count = _canonical(read)
    if count > MAX_TAGGED_FIELDS:
        raise _Unreadable
    for _ in range(count):
        _canonical(read)
        read.skip(_canonical(read))
    read.skip((4 if version <= FETCH_LAST_REPLICA_ID else 0) + 12)
    if len(read.data) - read.pos < 9:
        raise _Unreadable
    level = read.data[read.pos]
    session_id, epoch = struct.unpack_from(">ii", read.data, read.pos + 1)
    read.pos += 9
    if session_id != 0 or epoch != -1 or level > 1:
        raise _Refused
    topics = _count(read)
    if topics == 0 or topics > ANSWER_MAX_PARTITIONS:
        raise _Refused
    partitions: list[tuple[bytes, bytes, bytes, object | None]] = []  # id, partition, offset, own ranges
    ids: list[bytes] = []
    for _ in range(topics):
        topic_id = read.skip(TOPIC_ID_BYTES)
        if topic_id in ids or (guarded and not id_is_plain(topic_id, guard, known)):
            raise _Refused
        ids.append(topic_id)
        count = _count(read)
        if count == 0 or count > ANSWER_MAX_PARTITIONS - len(partitions):
            raise _Refused
        mine: list[bytes] = []
        for _ in range(count):
            fixed = read.skip(32)
            if fixed[:4] in mine:
                raise _Refused
            mine.append(fixed[:4])
            partitions.append((topic_id, fixed[:4], fixed[8:16], _answer_tags(read)))
        if _canonical(read) != 0:
            raise _Refused
    if _count(read) != 0:  # ForgottenTopicsData
        raise _Refused
    read.string(True)  # RackId
    top = _answer_tags(read)
    if read.pos != len(read.data):
        raise _Unreadable
    served_entries = {served[i:i + _SERVED_BYTES] for i in range(0, len(served) - _SERVED_BYTES + 1, _SERVED_BYTES)}
    keys = []
    for topic_id, partition, offset, own in partitions:
        chosen = top if own is None or own is _NULL else own
        if chosen is None or chosen is _NULL or not chosen:
            raise _Refused
        if topic_id + partition not in served_entries:
            raise _Refused
        keys.append(topic_id + partition + bytes([level]) + offset + chosen)  # type: ignore[operator]
    return keys


def _count(read: _Reader) -> int:
    """A compact array's element count, never null, within MAX_ARRAY_ELEMENTS."""
    length = _canonical(read)
    if length == 0 or length - 1 > MAX_ARRAY_ELEMENTS:
        raise _Unreadable
    return length - 1


__all__ = ["EVENT_LOOP", "PLAIN", "UNREADABLE", "answer_keys", "classify_fetch", "fetch_request_plain", "id_is_plain",
           "id_is_virtual", "name_may_be_virtual", "peek_span"]
