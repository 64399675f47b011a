"""A raw Kafka connection with the transactional and group calls the transaction tests and
experiments speak (``RawClient`` underneath, Kafka's own codecs): InitProducerId,
AddOffsetsToTxn, AddPartitionsToTxn, TxnOffsetCommit, EndTxn, transactional Produce,
OffsetFetch with RequireStable, OffsetCommit, a classic JoinGroup/SyncGroup, ListGroups,
DescribeGroups, DeleteGroups, ListOffsets. Retriable coordinator errors (loading, moving,
CONCURRENT_TRANSACTIONS while the previous transaction's markers are written) are asked
again a bounded number of times."""

from __future__ import annotations

import time
from typing import Literal

import kafka.errors as kafka_errors

from harness.raw_client import RawClient
from proxy.protocol import messages
from proxy.protocol.messages import ApiKey
from proxy.records.batch import TRANSACTIONAL_BIT
from proxy.records.builder import build_batch, encode_record

# Versions spoken (Kafka 4.3.1 supports all of them).
V_FIND_COORDINATOR = 4
V_INIT_PID = 5
V_ADD_OFFSETS = 4
V_END_TXN_TV2 = 5
V_END_TXN_TV1 = 4
V_OFFSET_FETCH = 9
V_OFFSET_COMMIT = 9
V_CREATE_TOPICS = 7
V_PRODUCE_TV2 = 12
V_PRODUCE_TV1 = 11
V_LIST_OFFSETS = 9
V_ADD_PARTITIONS = 3


def err(code: int) -> str:
    """``88 UNSTABLE_OFFSET_COMMIT``: a broker error code with Kafka's name for it."""
    if code == 0:
        return "0 NONE"
    name = kafka_errors.for_code(code).__name__
    # kafka-python's class names, in Kafka's own spelling
    words, out = name.removesuffix("Error"), ""
    for i, ch in enumerate(words):
        if ch.isupper() and i and not words[i - 1].isupper():
            out += "_"
        out += ch.upper()
    return f"{code} {out}"


class Conn:
    """One TCP connection to a broker (``RawClient``) with the calls the experiments use."""

    def __init__(self, bootstrap: str, name: str = "conn") -> None:
        self.bootstrap = bootstrap
        self.raw = RawClient.connect(bootstrap, client_id=name, timeout=60)
        self.name = name

    def close(self) -> None:
        self.raw.close()

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def call(self, api: int, version: int, **fields):
        return self.raw.call(api, version, **fields)

    def cls(self, api: int, kind: Literal["request", "response"] = "request"):
        return messages.body_class(api, kind)

    # -- cluster ----------------------------------------------------------------------------
    def api_versions(self):
        return self.call(ApiKey.API_VERSIONS, 3, client_software_name="txn-experiments",
                         client_software_version="1")

    def create_topic(self, name: str, partitions: int) -> int:
        c = self.cls(ApiKey.CREATE_TOPICS)
        body = self.call(ApiKey.CREATE_TOPICS, V_CREATE_TOPICS, topics=[c.CreatableTopic(
            name=name, num_partitions=partitions, replication_factor=1, assignments=[], configs=[])],
            timeout_ms=30000, validate_only=False)
        return body.topics[0].error_code

    def find_coordinator(self, key: str, key_type: int) -> tuple[int, str]:
        """(error, 'host:port') of the group (0) or transaction (1) coordinator; retried
        while the coordinator is loading."""
        for _ in range(60):
            body = self.call(ApiKey.FIND_COORDINATOR, V_FIND_COORDINATOR, key_type=key_type, coordinator_keys=[key])
            c = body.coordinators[0]
            if c.error_code == 0:
                return 0, f"{c.host}:{c.port}"
            time.sleep(0.5)
        return c.error_code, ""

    # -- transactions ----------------------------------------------------------------------
    def init_pid(self, transactional_id: str | None, timeout_ms: int = 60000,
                 producer_id: int = -1, epoch: int = -1):
        if transactional_id is not None:
            self.find_coordinator(transactional_id, 1)  # as clients do: creates __transaction_state on first use
        for _ in range(60):
            body = self.call(ApiKey.INIT_PRODUCER_ID, V_INIT_PID, transactional_id=transactional_id,
                             transaction_timeout_ms=timeout_ms, producer_id=producer_id, producer_epoch=epoch)
            if body.error_code not in (14, 15, 16, 51):  # loading, not available, not coordinator, concurrent
                return body
            time.sleep(0.5)
        return body

    def add_offsets(self, txn: str, pid: int, epoch: int, group: str, version: int = V_ADD_OFFSETS) -> int:
        for _ in range(40):
            body = self.call(ApiKey.ADD_OFFSETS_TO_TXN, version, transactional_id=txn, producer_id=pid,
                             producer_epoch=epoch, group_id=group)
            if body.error_code != 51:  # CONCURRENT_TRANSACTIONS: the previous one still completing
                return body.error_code
            time.sleep(0.2)
        return body.error_code

    def add_partitions(self, txn: str, pid: int, epoch: int, topic: str, partitions: list[int]):
        c = self.cls(ApiKey.ADD_PARTITIONS_TO_TXN)
        for _ in range(40):
            body = self.call(ApiKey.ADD_PARTITIONS_TO_TXN, V_ADD_PARTITIONS, v3_and_below_transactional_id=txn,
                             v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
                             v3_and_below_topics=[c.AddPartitionsToTxnTopic(name=topic, partitions=partitions)])
            codes = [p.partition_error_code for t in body.results_by_topic_v3_and_below for p in t.results_by_partition]
            if 51 not in codes:
                return codes
            time.sleep(0.2)
        return codes

    def txn_offset_commit(self, txn: str, pid: int, epoch: int, group: str, offsets: dict[tuple[str, int], int],
                          *, version: int = 5, generation: int = -1, member: str = "",
                          instance: str | None = None, metadata: str = "") -> dict[tuple[str, int], int]:
        """(topic, partition) -> error code of one TxnOffsetCommit. CONCURRENT_TRANSACTIONS
        (the previous transaction's markers still being written) is retried."""
        c = self.cls(ApiKey.TXN_OFFSET_COMMIT)
        topics: dict[str, list] = {}
        for (topic, partition), offset in offsets.items():
            topics.setdefault(topic, []).append(c.TxnOffsetCommitRequestPartition(
                partition_index=partition, committed_offset=offset, committed_leader_epoch=-1,
                committed_metadata=metadata))
        for _ in range(40):
            body = self.call(ApiKey.TXN_OFFSET_COMMIT, version, transactional_id=txn, group_id=group, producer_id=pid,
                             producer_epoch=epoch, generation_id=generation, member_id=member,
                             group_instance_id=instance,
                             topics=[c.TxnOffsetCommitRequestTopic(name=n, partitions=p) for n, p in topics.items()])
            out = {(t.name, p.partition_index): p.error_code for t in body.topics for p in t.partitions}
            if 51 not in out.values():
                return out
            time.sleep(0.2)
        return out

    def end_txn(self, txn: str, pid: int, epoch: int, commit: bool, version: int = V_END_TXN_TV2):
        for _ in range(40):
            body = self.call(ApiKey.END_TXN, version, transactional_id=txn, producer_id=pid, producer_epoch=epoch,
                             committed=commit)
            if body.error_code != 51:
                return body
            time.sleep(0.2)
        return body

    def produce(self, topic: str, partition: int, records: list[tuple[bytes | None, bytes | None]], *,
                txn: str | None, pid: int, epoch: int, sequence: int, version: int = V_PRODUCE_TV2) -> tuple[int, int]:
        """(error, base offset) of one Produce (acks=-1) of a v2 batch from ``pid``/``epoch``,
        transactional when ``txn`` is given."""
        now = int(time.time() * 1000)
        raw = [encode_record(offset_delta=i, key=k, value=v) for i, (k, v) in enumerate(records)]
        blob = build_batch(base_offset=0, last_offset_delta=len(raw) - 1, records=raw, record_count=len(raw),
                           base_timestamp=now, max_timestamp=now, attributes=TRANSACTIONAL_BIT if txn else 0,
                           producer_id=pid, producer_epoch=epoch, base_sequence=sequence)
        c = self.cls(ApiKey.PRODUCE)
        body = self.call(ApiKey.PRODUCE, version, transactional_id=txn, acks=-1, timeout_ms=15000,
                         topic_data=[c.TopicProduceData(name=topic, partition_data=[
                             c.PartitionProduceData(index=partition, records=blob)])])
        part = body.responses[0].partition_responses[0]
        return part.error_code, part.base_offset

    # -- groups ----------------------------------------------------------------------------
    def offset_fetch(self, groups: dict[str, list[tuple[str, int]]], *, require_stable: bool):
        """{group: {(topic, partition): (offset, metadata, error)}} plus group errors
        under the key (group, None)."""
        c = self.cls(ApiKey.OFFSET_FETCH)
        req = []
        for group, parts in groups.items():
            topics: dict[str, list[int]] = {}
            for topic, partition in parts:
                topics.setdefault(topic, []).append(partition)
            req.append(c.OffsetFetchRequestGroup(group_id=group, member_id=None, member_epoch=-1, topics=[
                c.OffsetFetchRequestTopics(name=n, partition_indexes=p) for n, p in topics.items()]))
        body = self.call(ApiKey.OFFSET_FETCH, V_OFFSET_FETCH, groups=req, require_stable=require_stable)
        out: dict = {}
        for g in body.groups:
            entry = out.setdefault(g.group_id, {})
            entry[None] = g.error_code
            for t in g.topics:
                for p in t.partitions:
                    entry[(t.name, p.partition_index)] = (p.committed_offset, p.metadata, p.error_code)
        return out

    def offset_commit(self, group: str, offsets: dict[tuple[str, int], int], *, generation: int = -1,
                      member: str = "", instance: str | None = None, metadata: str = "") -> dict:
        c = self.cls(ApiKey.OFFSET_COMMIT)
        topics: dict[str, list] = {}
        for (topic, partition), offset in offsets.items():
            topics.setdefault(topic, []).append(c.OffsetCommitRequestPartition(
                partition_index=partition, committed_offset=offset, committed_leader_epoch=-1,
                committed_metadata=metadata))
        body = self.call(ApiKey.OFFSET_COMMIT, V_OFFSET_COMMIT, group_id=group, generation_id_or_member_epoch=generation,
                         member_id=member, group_instance_id=instance,
                         topics=[c.OffsetCommitRequestTopic(name=n, partitions=p) for n, p in topics.items()])
        return {(t.name, p.partition_index): p.error_code for t in body.topics for p in t.partitions}

    def join_classic(self, group: str, topic: str | list[str], session_ms: int = 30000) -> tuple[int, str]:
        """Join ``group`` (classic protocol, type consumer, subscribed to ``topic``) as its
        only member and complete the rebalance; returns (generation, member id)."""
        c = self.cls(ApiKey.JOIN_GROUP)
        meta = _subscription([topic] if isinstance(topic, str) else topic)
        member = ""
        generation = -1
        self.find_coordinator(group, 0)  # as clients do: the broker creates __consumer_offsets on first use
        for _ in range(40):
            body = self.call(ApiKey.JOIN_GROUP, 9, group_id=group, session_timeout_ms=session_ms,
                             rebalance_timeout_ms=session_ms, member_id=member, group_instance_id=None,
                             protocol_type="consumer",
                             protocols=[c.JoinGroupRequestProtocol(name="range", metadata=meta)], reason=None)
            if body.error_code == 79:  # MEMBER_ID_REQUIRED
                member = body.member_id
                continue
            if body.error_code in (14, 15, 16):  # the coordinator still loading or moving
                time.sleep(0.5)
                continue
            if body.error_code:
                raise RuntimeError(f"JoinGroup {group}: {err(body.error_code)}")
            member, generation = body.member_id, body.generation_id
            break
        else:
            raise RuntimeError(f"JoinGroup {group}: still {err(body.error_code)} after 40 tries")
        s = self.cls(ApiKey.SYNC_GROUP)
        body = self.call(ApiKey.SYNC_GROUP, 5, group_id=group, generation_id=generation, member_id=member,
                         group_instance_id=None, protocol_type="consumer", protocol_name="range",
                         assignments=[s.SyncGroupRequestAssignment(member_id=member, assignment=b"")])
        if body.error_code:
            raise RuntimeError(f"SyncGroup {group}: {err(body.error_code)}")
        return generation, member

    def heartbeat(self, group: str, generation: int, member: str) -> int:
        return self.call(ApiKey.HEARTBEAT, 4, group_id=group, generation_id=generation, member_id=member,
                         group_instance_id=None).error_code

    def leave_group(self, group: str, member: str) -> int:
        c = self.cls(ApiKey.LEAVE_GROUP)
        body = self.call(ApiKey.LEAVE_GROUP, 4, group_id=group, members=[c.MemberIdentity(member_id=member)])
        return body.error_code

    def list_groups(self):
        body = self.call(ApiKey.LIST_GROUPS, 5, states_filter=[], types_filter=[])
        return [(g.group_id, g.protocol_type, g.group_state, g.group_type) for g in body.groups]

    def describe_groups(self, groups: list[str]):
        body = self.call(ApiKey.DESCRIBE_GROUPS, 5, groups=groups, include_authorized_operations=False)
        return [(g.group_id, g.error_code, g.group_state, g.protocol_type, len(g.members)) for g in body.groups]

    def delete_groups(self, groups: list[str]):
        body = self.call(ApiKey.DELETE_GROUPS, 2, groups_names=groups)
        return {r.group_id: r.error_code for r in body.results}

    def list_offsets(self, topic: str, partition: int, isolation: int) -> int:
        """The latest offset: the high watermark (isolation 0) or the last stable offset (1)."""
        c = self.cls(ApiKey.LIST_OFFSETS)
        body = self.call(ApiKey.LIST_OFFSETS, V_LIST_OFFSETS, replica_id=-1, isolation_level=isolation,
                         topics=[c.ListOffsetsTopic(name=topic, partitions=[c.ListOffsetsPartition(
                             partition_index=partition, current_leader_epoch=-1, timestamp=-1)])])
        return body.topics[0].partitions[0].offset


def _subscription(topics: list[str]) -> bytes:
    """ConsumerProtocol Subscription v0: version, topics, user data (null)."""
    import struct
    out = struct.pack(">hi", 0, len(topics))
    for topic in topics:
        name = topic.encode()
        out += struct.pack(">h", len(name)) + name
    return out + struct.pack(">i", -1)
