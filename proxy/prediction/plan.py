"""Fetch prediction, the pure part: which Fetch a consumer sends next, and when to ask early.

A consumer that is behind the log end fetches, consumes what came back, and only then
fetches again from where that response ended. Every round trip to the broker is time the
consumer waits. The proxy knows, once a response has arrived, which request comes next
(the same partitions, each from the offset after the last whole batch it returned) and
can ask the broker for it while the consumer is still busy with the records it has.

Nothing here guesses loosely: the prediction is a whole request body, and a held response
answers a client's request only when the client's body equals it field for field
(``predicted == body``), so a seek, a changed partition set, a new leader epoch or any
other difference makes it a miss and the request goes to the broker as usual.
"""

from __future__ import annotations

import dataclasses
import struct
import uuid

from proxy.protocol.constants import (
    FETCH_SESSION_FINAL_EPOCH,
    FETCH_SESSION_INITIAL_EPOCH,
    FETCH_SESSIONLESS_ID,
    ErrorCode,
)
from proxy.protocol.message_types import FetchRequest, FetchResponse
from proxy.protocol.message_versions import FETCH_FIRST_SESSION_ID

# Bytes of a record batch (any magic) up to the fields read here: base offset, length,
# partition leader epoch (v2; CRC in v0/v1), magic.
_BATCH_START = struct.Struct(">qiib")
_LOG_OVERHEAD = 12  # base offset and length, not counted by the length field
_V2_LAST_OFFSET_DELTA = struct.Struct(">i")
_V2_LAST_OFFSET_DELTA_AT = 23
_V2_HEADER_SIZE = 61
NO_EPOCH = -1
NO_SESSION = FETCH_SESSIONLESS_ID
SESSIONLESS_EPOCH = FETCH_SESSION_FINAL_EPOCH  # with session 0: a full fetch that opens no session
INITIAL_EPOCH = FETCH_SESSION_INITIAL_EPOCH
READ_COMMITTED = 1


def resume_point(records: bytes | bytearray | memoryview | None, last_epoch: int = NO_EPOCH) -> tuple[int, int] | None:
    """``(next offset, last fetched epoch)`` after the last whole batch of a Records blob.

    The next offset is where a consumer resumes once it has consumed the blob: one past
    the last offset of the last *whole* batch (a broker may cut the final batch short).
    The epoch is that of the last v2 batch carrying one, as a consumer reports it in
    ``last_fetched_epoch``; ``last_epoch`` is kept when no batch carries one. None when
    the blob holds no whole batch.
    """
    if records is None:
        return None
    size = len(records)
    pos = 0
    resume = None
    while size - pos >= _BATCH_START.size:
        base_offset, length, epoch_or_crc, magic = _BATCH_START.unpack_from(records, pos)
        end = pos + _LOG_OVERHEAD + length
        if length < 0 or end > size:
            break
        if magic >= 2:
            if length + _LOG_OVERHEAD < _V2_HEADER_SIZE:
                break
            (delta,) = _V2_LAST_OFFSET_DELTA.unpack_from(records, pos + _V2_LAST_OFFSET_DELTA_AT)
            resume = base_offset + delta + 1
            if epoch_or_crc >= 0:
                last_epoch = epoch_or_crc
        else:  # v0/v1: the offset field holds the (wrapper's) last offset
            resume = base_offset + 1
        pos = end
    return None if resume is None else (resume, last_epoch)


def is_plain_consumer_fetch(body: FetchRequest, version: int) -> bool:
    """A consumer's full, sessionless Fetch (after ``without_session``): the only kind the
    proxy reads ahead for. Followers, incremental session fetches and key-range fetches
    are not."""
    if body.replica_id >= 0 or (body.replica_state is not None and body.replica_state.replica_id >= 0):
        return False
    if version >= FETCH_FIRST_SESSION_ID and (body.session_id != NO_SESSION or body.session_epoch != SESSIONLESS_EPOCH):
        return False
    if body.forgotten_topics_data or body.key_ranges:
        return False
    return bool(body.topics)


def without_session(body: FetchRequest, version: int) -> FetchRequest | None:
    """The request with a session opening (session 0, epoch 0) turned into a sessionless
    full fetch (epoch -1), or None when the request is part of a session already.

    The broker then answers without creating a session, as it does when its session cache
    is full; the client keeps sending full requests, each of which the proxy can compare
    with its prediction. Below v7 there are no sessions: the body is returned as it is.
    """
    if version < FETCH_FIRST_SESSION_ID:
        return body
    if body.session_id == NO_SESSION and body.session_epoch == SESSIONLESS_EPOCH:
        return body
    if body.session_id == NO_SESSION and body.session_epoch == INITIAL_EPOCH:
        return dataclasses.replace(body, session_epoch=SESSIONLESS_EPOCH)
    return None


def next_request(request: FetchRequest, response: FetchResponse) -> FetchRequest | None:
    """The Fetch the consumer sends after consuming ``response`` to ``request``, or None
    when reading ahead would not help: an error anywhere, a redirect to another replica,
    a partition missing from the response, or no partition with data beyond what came
    back (a consumer at the log end waits for new records; asking early gains nothing).
    """
    if response.error_code != ErrorCode.NONE:
        return None
    returned: dict[tuple[str, uuid.UUID, int], FetchResponse.PartitionData] = {}
    for answered in response.responses:
        for partition in answered.partitions:
            returned[(answered.topic, answered.topic_id, partition.partition_index)] = partition
    more_beyond = False
    topics: list[FetchRequest.FetchTopic] = []
    for topic in request.topics:
        partitions = []
        for wanted in topic.partitions:
            got = returned.get((topic.topic, topic.topic_id, wanted.partition))
            if got is None or got.error_code != ErrorCode.NONE or got.preferred_read_replica >= 0:
                return None
            if got.diverging_epoch is not None and got.diverging_epoch.epoch >= 0:
                return None
            point = resume_point(got.records, wanted.last_fetched_epoch)
            if point is None:
                partitions.append(wanted)
                continue
            offset, epoch = point
            if offset < wanted.fetch_offset:
                return None
            if wanted.last_fetched_epoch < 0:
                # A consumer that does not report epochs (or not yet) keeps not reporting.
                epoch = wanted.last_fetched_epoch
            end = got.last_stable_offset if request.isolation_level == READ_COMMITTED else got.high_watermark
            if offset < end:
                more_beyond = True
            partitions.append(dataclasses.replace(wanted, fetch_offset=offset, last_fetched_epoch=epoch))
        topics.append(dataclasses.replace(topic, partitions=partitions))
    if not more_beyond:
        return None
    return dataclasses.replace(request, topics=topics)


def early_request(predicted: FetchRequest, max_bytes: int) -> FetchRequest:
    """What the proxy sends upstream for a prediction: the predicted request itself, so
    the broker's answer is one it gives that very request (its min_bytes and max_wait_ms
    included), with at most ``max_bytes`` (a broker may always return less than a client
    allows; this bounds what the proxy holds)."""
    if predicted.max_bytes <= max_bytes:
        return predicted
    return dataclasses.replace(predicted, max_bytes=max_bytes)
