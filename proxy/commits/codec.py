"""The individual-commit log's record format (docs/wire-contract.md#4-individual-commit-log), without I/O.

A record's key is ``IndividualCommitKey`` and its value ``IndividualCommitValue``
(``protocol_schemas/``), each an int16 version then the structure. The schema codec is
the reference; the hot path (one value per committed partition) writes the same bytes
from slices, and unit tests check the two agree. A record lives in the group's partition
of ``__consumer_offsets``, so a group's individual commits sit next to its offsets.
"""

from __future__ import annotations

import struct

from proxy.commits.packed import RANGE_SIZE, from_deltas, to_deltas
from proxy.commits.state import CommitState, checked_marks
from proxy.protocol import messages
from proxy.protocol.constants import MAX_ARRAY_ELEMENTS
from proxy.protocol.errors import ProtocolError
from proxy.protocol.message_types import IndividualCommitKey, IndividualCommitValue
from proxy.protocol.primitives import read_uvarint, uvarint_bytes
from proxy.protocol.walks import Walk

__all__ = ["decode_key", "decode_value", "encode_key", "encode_key_generic", "encode_value",
           "encode_value_generic"]


# What the hand-written encoders and decoders below read and write, after the int16 version:
# the key (v0), the value as this proxy writes it (v1) and as earlier releases did (v0).
KEY_V0 = Walk("IndividualCommitKey", "", 0, 0, ("Group string", "Topic string", "Partition int32"))
VALUE_V1 = Walk("IndividualCommitValue", "", 1, 1, ("StableOffset int64", "RangeDeltas compact bytes",
                                                     "ResetEpoch int64"))
VALUE_V0 = Walk("IndividualCommitValue", "", 0, 0, ("StableOffset int64", "Ranges compact []OffsetRange"))
VALUE_V0_RANGE = Walk("IndividualCommitValue", "Ranges", 0, 0, ("Start int64", "End int64"))
WALKS = (KEY_V0, VALUE_V1, VALUE_V0, VALUE_V0_RANGE)
assert RANGE_SIZE == VALUE_V0_RANGE.size() + 1  # a packed range is an OffsetRange with no tagged fields


def encode_key_generic(group: str, topic: str, partition: int) -> bytes:
    """IndividualCommitKey through the schema codec (the reference for ``encode_key``)."""
    return messages.encode_data("IndividualCommitKey", IndividualCommitKey(group=group, topic=topic,
                                                                           partition=partition))


_KEY_STRING = struct.Struct(">h")
_KEY_TAIL = struct.Struct(">i")


def encode_key(group: str, topic: str, partition: int) -> bytes:
    """IndividualCommitKey v0 (int16 version, then non-flexible strings and the partition),
    byte for byte what the schema codec writes (a unit test checks it)."""
    group_bytes = group.encode()
    topic_bytes = topic.encode()
    if len(group_bytes) > 0x7FFF or len(topic_bytes) > 0x7FFF:
        return encode_key_generic(group, topic, partition)  # let the codec refuse it
    return b"".join((b"\x00\x00", _KEY_STRING.pack(len(group_bytes)), group_bytes, _KEY_STRING.pack(len(topic_bytes)),
                     topic_bytes, _KEY_TAIL.pack(partition)))


def decode_key(data) -> tuple[str, str, int]:
    key = messages.decode_data_as(IndividualCommitKey, bytes(data))
    return key.group, key.topic, key.partition


def encode_value_generic(state: CommitState, version: int | None = None) -> bytes:
    """IndividualCommitValue through the schema codec (the reference for ``encode_value``,
    and the writer of version 2, which a state with share watermarks needs). ``version``
    None: the one the proxy writes (2 with watermarks, else 1)."""
    if version is None:
        version = 2 if state.marks else 1
    if state.marks and version < 2:
        raise ValueError(f"IndividualCommitValue v{version} cannot hold share watermarks")
    value_class = IndividualCommitValue
    if version == 0:
        value = value_class(stable_offset=state.stable,
                            ranges=[value_class.OffsetRange(start=start, end=end) for start, end in state.ranges])
    else:
        value = value_class(stable_offset=state.stable, range_deltas=to_deltas(state.stable, state.packed),
                            reset_epoch=state.epoch,
                            watermarks=[value_class.ShareWatermark(shares=shares, share=share, offset=offset,
                                                                   sequence=sequence)
                                        for shares, share, offset, sequence in state.marks])
    return messages.encode_data("IndividualCommitValue", value, version)


_VALUE_HEAD = struct.Struct(">hq")
_EPOCH = struct.Struct(">q")


def encode_value(state: CommitState) -> bytes:
    """IndividualCommitValue v1, byte for byte what the schema codec writes (a unit test
    checks it), without building message objects: commits write one per partition. A
    state with share watermarks is written as version 2, through the schema codec."""
    if state.marks:
        return encode_value_generic(state, 2)
    deltas = to_deltas(state.stable, state.packed)
    return b"".join((_VALUE_HEAD.pack(1, state.stable), uvarint_bytes(len(deltas) + 1), deltas,
                     _EPOCH.pack(state.epoch), b"\x00"))


def decode_value(data) -> CommitState:
    """A value as this proxy writes it (version 1, or 0 of earlier releases) is read from
    slices; anything else (tagged fields a newer writer added) through the schema codec.

    Share watermarks no proxy writes (a K beyond ``MAX_SHARES``, a share outside its K or
    listed twice; ``checked_marks``) make the whole value unreadable: ValueError, as any
    malformed value, which the log's reader skips with a warning. Not repaired by dropping
    what is wrong: which of a share's two watermarks is meant, or whether the rest of a
    record claiming a billion shares is, cannot be told, and a guess would join into the
    key's state like a proxy's record. A skipped record can only make this instance hold
    less than was processed (records re-delivered), never more (S past unprocessed ones).
    A W below -1 is read as -1: both mean the share has none (earlier releases kept what a
    client committed), so nothing needs guessing there."""
    data = bytes(data)
    if len(data) >= 12 and data[-1] == 0:
        version, stable = _VALUE_HEAD.unpack_from(data, 0)
        try:
            length, pos = read_uvarint(data, 10, len(data))
        except ProtocolError:
            length, pos = 0, 0
        if version == 1 and length and pos + length + 8 == len(data):
            (epoch,) = _EPOCH.unpack_from(data, pos + length - 1)
            return CommitState.from_packed(stable, from_deltas(stable, data[pos:pos + length - 1]), epoch)
        if version == 0 and 0 < length <= MAX_ARRAY_ELEMENTS + 1 and pos + (length - 1) * RANGE_SIZE + 1 == len(data):
            ranges = data[pos:-1]
            if ranges[16::RANGE_SIZE].count(0) == length - 1:
                return CommitState.from_packed(stable, ranges)
    value = messages.decode_data_as(IndividualCommitValue, data)
    version = messages.data_version(data)
    if version >= 1:
        marks = checked_marks((mark.shares, mark.share, max(mark.offset, -1), mark.sequence)
                              for mark in value.watermarks or ()) if version >= 2 else ()
        return CommitState.from_packed(value.stable_offset, from_deltas(value.stable_offset, value.range_deltas or b""),
                                       value.reset_epoch, marks)
    return CommitState(value.stable_offset, tuple((r.start, r.end) for r in value.ranges))
