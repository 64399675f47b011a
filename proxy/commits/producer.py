"""The individual-commit log's idempotent producer: InitProducerId once, then Produce with
acks=-1 and a sequence number per log partition.

A failed or ambiguous send is sent again by the caller with the same sequence, so the
broker drops it if it had it already (DUPLICATE_SEQUENCE_NUMBER: written, where unknown);
errors that invalidate the producer id renew it, which starts every sequence at 0.
"""

from __future__ import annotations

import time

import trio

from proxy.commits.cluster import CommitLogError, LogTopic
from proxy.protocol.constants import ErrorCode
from proxy.protocol.message_types import InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse
from proxy.protocol.messages import ApiKey
from proxy.records.builder import build_batch, encode_record
from proxy.records.varint import encode_varint

PRODUCE_VERSION = 9
INIT_PRODUCER_ID_VERSION = 4

# Errors after which the same batch is sent again (same sequence: the broker dedups).
_RETRY_SAME = frozenset({
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NETWORK_EXCEPTION, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR, ErrorCode.NOT_ENOUGH_REPLICAS,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
})
# Errors after which the producer id is renewed before sending again.
_RENEW_PRODUCER = frozenset({
    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.UNKNOWN_PRODUCER_ID,
    ErrorCode.PRODUCER_FENCED,
})

# Zigzag varints of small non-negative numbers, the lengths and offset deltas of log records.
_SMALL_VARINTS = [encode_varint(number) for number in range(1 << 13)]
_NULL_VARINT = b"\x01"  # zigzag(-1)


def encode_records(records: list[tuple[bytes, bytes | None]]) -> list[bytes]:
    """v2 records (attributes 0, timestamp delta 0, offset delta = position, no headers),
    byte for byte what ``encode_record`` writes (a unit test checks it), for the small keys
    and values of this log; anything larger goes through ``encode_record``."""
    small = _SMALL_VARINTS
    limit = len(small)
    out = []
    for delta, (key, value) in enumerate(records):
        value_size = -1 if value is None else len(value)
        if delta >= limit or len(key) >= limit or value_size >= limit:
            out.append(encode_record(offset_delta=delta, key=key, value=value))
            continue
        body = b"".join((b"\x00\x00", small[delta], small[len(key)], key,
                         _NULL_VARINT if value is None else small[value_size], value or b"", b"\x00"))
        size = len(body)
        out.append((small[size] if size < limit else encode_varint(size)) + body)
    return out


class IdempotentProducer:
    def __init__(self, topic: LogTopic) -> None:
        self.topic = topic
        self._producer: tuple[int, int] | None = None  # (producer id, epoch)
        self._lock = trio.Lock()
        self._sequences: dict[int, int] = {}  # log partition -> next sequence number

    async def _producer_id(self, renew: bool = False) -> tuple[int, int]:
        async with self._lock:
            if self._producer is None or renew:
                body = InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=2147483647)
                response: InitProducerIdResponse = await self.topic.cluster.request_any(
                    ApiKey.INIT_PRODUCER_ID, INIT_PRODUCER_ID_VERSION, body)
                if response.error_code != ErrorCode.NONE:
                    raise CommitLogError(f"InitProducerId error {ErrorCode.name_of(response.error_code)}")
                self._producer = (response.producer_id, response.producer_epoch)
                self._sequences.clear()
            return self._producer

    async def send(self, index: int, records: list[tuple[bytes, bytes | None]], refresh: bool) -> int:
        """One attempt to write ``records`` (key, value; value None: a tombstone) to log
        partition ``index`` with acks=all. Returns the offset of the first, or -1 when the
        broker had them already (an earlier attempt landed). Raises CommitLogError on a
        failure the caller may retry (``refresh``: ask for the leader again)."""
        producer_id, epoch = await self._producer_id()
        address = await self.topic.leader(index, refresh)
        sequence = self._sequences.get(index, 0)
        now = int(time.time() * 1000)
        raw = encode_records(records)
        blob = build_batch(base_offset=0, last_offset_delta=len(raw) - 1, records=raw, record_count=len(raw),
                           base_timestamp=now, max_timestamp=now, producer_id=producer_id, producer_epoch=epoch,
                           base_sequence=sequence)
        cls = ProduceRequest
        body = cls(
            transactional_id=None, acks=-1, timeout_ms=15000,
            topic_data=[cls.TopicProduceData(name=self.topic.name, partition_data=[
                cls.PartitionProduceData(index=index, records=blob)])],
        )
        response: ProduceResponse = await self.topic.cluster.request(address, ApiKey.PRODUCE, PRODUCE_VERSION, body,
                                                                     timeout=20)
        result = response.responses[0].partition_responses[0]
        error = result.error_code
        if error in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER):
            self._sequences[index] = (sequence + len(raw)) & 0x7FFFFFFF
            return result.base_offset if error == ErrorCode.NONE else -1
        name = ErrorCode.name_of(error)
        if error in _RENEW_PRODUCER:
            await self._producer_id(renew=True)
            raise CommitLogError(f"Produce {self.topic.name}-{index} error {name}; new producer id")
        if error in _RETRY_SAME:
            raise CommitLogError(f"Produce {self.topic.name}-{index} error {name}")
        raise CommitLogError(f"Produce {self.topic.name}-{index} failed with error {name}")
