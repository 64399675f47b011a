"""A minimal blocking Kafka client speaking our codec, for wire-level tests.

It sends exactly the request bodies a test builds (including tag-10000 extensions) and
returns decoded responses, so tests can check the proxy field by field.
"""

from __future__ import annotations

import socket
import ssl
import struct
from dataclasses import dataclass

from proxy.protocol import messages
from proxy.protocol.messages import ApiKey
from proxy.ranges import KeyRange
from proxy.records.batch import PartialBatch, RecordBatch, iter_batches


class RawClient:
    def __init__(self, host: str, port: int, client_id: str = "raw", timeout: float = 30.0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ssl_context is not None:  # a TLS listener
            self.sock = ssl_context.wrap_socket(self.sock, server_hostname=host)
        self.client_id = client_id
        self.correlation = 0

    @classmethod
    def connect(cls, bootstrap: str, **kwargs) -> RawClient:
        host, _, port = bootstrap.split(",")[0].rpartition(":")
        return cls(host, int(port), **kwargs)

    @classmethod
    def to_leader(cls, bootstrap: str, topic: str, partition: int = 0, **kwargs) -> RawClient:
        """A connection to the address the metadata gives for ``topic``/``partition``'s
        leader, as a real client fetches: through a proxy of several workers, every
        consumer of one partition reaches the same worker only there (a bootstrap
        connection lands on any)."""
        with cls.connect(bootstrap, **kwargs) as first:
            body = first.metadata(topic)
        (entry,) = body.topics
        leaders = [p.leader_id for p in entry.partitions if p.partition_index == partition]
        if entry.error_code or not leaders:
            raise AssertionError(f"no leader for {topic}-{partition} (error {entry.error_code})")
        (broker,) = [b for b in body.brokers if b.node_id == leaders[0]]
        return cls(broker.host, broker.port, **kwargs)

    def send(self, api_key: int, version: int, body) -> int:
        self.correlation += 1
        header = messages.new_request_header(api_key, version, correlation_id=self.correlation,
                                             client_id=self.client_id)
        frame = messages.encode_request(header, body)
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        return self.correlation

    def receive(self) -> bytes:
        (size,) = struct.unpack(">i", self._exact(4))
        return self._exact(size)

    def request(self, api_key: int, version: int, body):
        correlation = self.send(api_key, version, body)
        header, response = messages.decode_response(api_key, version, self.receive())
        if header.correlation_id != correlation:
            raise AssertionError(f"correlation id {header.correlation_id}, expected {correlation}")
        return response

    def call(self, api_key: int, version: int, **fields):
        return self.request(api_key, version, messages.new_body(api_key, version, "request", **fields))

    def _exact(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = self.sock.recv(min(n, 1 << 20))
            if not chunk:
                raise ConnectionError("connection closed by peer")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- helpers for fetch tests ----------------------------------------------------------------
    def metadata(self, topic: str):
        """The Metadata response (v12) for ``topic`` alone."""
        request_class = messages.body_class(ApiKey.METADATA, "request")
        return self.call(ApiKey.METADATA, 12, topics=[request_class.MetadataRequestTopic(name=topic)],
                         allow_auto_topic_creation=False)

    def topic_id(self, topic: str):
        (entry,) = self.metadata(topic).topics
        if entry.error_code:
            raise AssertionError(f"metadata error {entry.error_code} for {topic}")
        return entry.topic_id

    def range_fetch(
        self,
        topic_id,
        partition: int,
        offset: int,
        ranges: list[KeyRange] | None,
        *,
        version: int = 17,
        max_bytes: int = 1 << 20,
        max_wait_ms: int = 100,
        isolation_level: int = 0,
        top_level: bool = False,
    ):
        """One sessionless Fetch of one partition with key ranges (per partition, or at
        the top level); returns the response's partition entry."""
        cls = messages.body_class(ApiKey.FETCH, "request")
        wire = None if ranges is None else [cls.KeyRange(start=r.start, end=r.end) for r in ranges]
        part = cls.FetchPartition(partition=partition, fetch_offset=offset, partition_max_bytes=max_bytes,
                                  key_ranges=None if top_level else wire)
        body = messages.new_body(
            ApiKey.FETCH, version, "request", max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=max_bytes,
            isolation_level=isolation_level, session_id=0, session_epoch=-1,
            topics=[cls.FetchTopic(topic_id=topic_id, partitions=[part])],
            key_ranges=wire if top_level else None,
        )
        response = self.request(ApiKey.FETCH, version, body)
        (topic_entry,) = response.responses
        (partition_entry,) = topic_entry.partitions
        return partition_entry


    def coop_fetch(
        self,
        topic_id,
        partition: int,
        token: int,
        group: str,
        member: str,
        *,
        generation: int = -1,
        version: int = 17,
        max_bytes: int = 1 << 20,
        max_wait_ms: int = 100,
        session: tuple[int, int] = (0, -1),
        ranges: list[KeyRange] | None = None,
    ):
        """One cooperative Fetch of one partition (docs/wire-contract.md#37-cooperative-fetch):
        FetchOffset ``token``; returns the response's partition entry."""
        cls = messages.body_class(ApiKey.FETCH, "request")
        part = cls.FetchPartition(
            partition=partition, fetch_offset=token, partition_max_bytes=max_bytes,
            cooperative=cls.CooperativeMember(group_id=group, member_id=member, generation_id=generation),
            key_ranges=None if ranges is None else [cls.KeyRange(start=r.start, end=r.end) for r in ranges])
        body = messages.new_body(
            ApiKey.FETCH, version, "request", max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=max_bytes,
            isolation_level=0, session_id=session[0], session_epoch=session[1],
            topics=[cls.FetchTopic(topic_id=topic_id, partitions=[part])],
        )
        response = self.request(ApiKey.FETCH, version, body)
        (topic_entry,) = response.responses
        (partition_entry,) = topic_entry.partitions
        return partition_entry


@dataclass(frozen=True)
class FetchedRecord:
    offset: int
    key: bytes | None
    value: bytes | None


def records_of(blob) -> tuple[list[FetchedRecord], int | None]:
    """Data records of a Records blob and the offset after its last complete batch."""
    out: list[FetchedRecord] = []
    next_offset = None
    if not blob:
        return out, None
    for entry in iter_batches(blob):
        if isinstance(entry, PartialBatch):
            break
        if isinstance(entry, RecordBatch):
            next_offset = entry.header.next_offset
            if entry.header.is_control:
                continue
            for record in entry.records():
                out.append(FetchedRecord(
                    record.offset,
                    None if record.key is None else bytes(record.key),
                    None if record.value is None else bytes(record.value),
                ))
        else:
            next_offset = getattr(entry, "next_offset", next_offset)
    return out, next_offset


def partition_bytes(bootstrap: str, topic: str, end: int, *, partition: int = 0) -> int:
    """The record bytes of offsets [0, ``end``) of one partition, read whole from
    ``bootstrap`` (the broker itself, to measure what a proxy read against it)."""
    size = position = 0
    with RawClient.connect(bootstrap) as client:
        topic_id = client.topic_id(topic)
        while position < end:
            entry = client.range_fetch(topic_id, partition, position, None, max_bytes=4 << 20)
            for batch in iter_batches(entry.records or b""):
                if isinstance(batch, RecordBatch):
                    size += batch.header.size
                    position = batch.header.next_offset
    return size
