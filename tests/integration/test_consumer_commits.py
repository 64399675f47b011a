"""Individual commit in the trio consumer, through the real proxy against real brokers:
members sharing a partition commit what they processed, in any order; a restarted member
resumes from the group's state without re-receiving what is committed; the group's stable
offset reaches the coordinator; the contiguous fallback where the proxy refuses ranges."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
import trio

from harness.commit_client import CommitClient
from harness.transactions import produce_transactions
from proxy.client import Consumer, IllegalStateError, TopicPartition, equal_shares
from proxy.ranges import contains
from proxy.records.keyhash import key_hash
from tests.integration.test_consumer import DEADLINE, _produce


def _coordinator_offset(bootstrap: str, group: str, topic: str) -> int | None:
    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition as KafkaTopicPartition

    standard = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return standard.committed(KafkaTopicPartition(topic, 0))
    finally:
        standard.close()


async def _run_member(bootstrap: str, group: str, tp: TopicPartition, share, *, seed: int,
                      stop_after: int | None = None) -> dict:
    """Poll, 'process' each batch in a shuffled order, mark and commit. With ``stop_after``
    the member crashes once it has handed out that many records, with only the later half
    of its last batch processed and committed. Returns what it saw and what it committed."""
    rnd = random.Random(seed)
    seen, committed = [], []
    async with Consumer(bootstrap, group_id=group, client_id=f"member-{seed}", auto_offset_reset="earliest",
                        allow_individual_commit=True, max_poll_records=40,
                        max_partition_fetch_bytes=8192) as consumer:
        assert consumer.individual_commit_supported
        consumer.assign({tp: [share]})
        with trio.fail_after(DEADLINE):
            while True:
                batch = list(await consumer.poll(0.5))
                seen.extend(batch)
                rnd.shuffle(batch)
                if stop_after is not None and len(seen) >= stop_after:
                    # the later half of the batch is done and committed, the earlier half
                    # never will be: the group holds a gap in this share, then ranges above it
                    batch.sort(key=lambda r: r.offset)
                    consumer.mark_processed(*batch[len(batch) // 2:])
                    committed.extend(o for s, e in consumer.pending_commit(tp) for o in range(s, e + 1))
                    await consumer.commit()
                    return {"seen": seen, "committed": committed, "crashed": True}
                consumer.mark_processed(*batch)
                pending = {o for s, e in consumer.pending_commit(tp) for o in range(s, e + 1)}
                await consumer.commit()
                committed.extend(pending)
                end = consumer.current_lag(tp)
                if end == 0 and not consumer.pending_commit(tp) and not batch:
                    return {"seen": seen, "committed": committed, "crashed": False,
                            "metrics": consumer.metrics()}


async def test_four_members_commit_individually_and_a_restarted_one_resumes(kafka, proxy, topic_factory):
    topic = topic_factory(kafka)
    total = 1200
    sent = _produce(kafka.bootstrap_servers, topic, {0: total})[0]
    tp = TopicPartition(topic, 0)
    group = f"{topic}-group"
    shares = equal_shares(4)
    runs: dict[str, dict] = {}

    async def member(i: int) -> None:
        if i == 2:
            runs["2-first"] = await _run_member(proxy.bootstrap_servers, group, tp, shares[i], seed=20,
                                                stop_after=120)
            runs["2-second"] = await _run_member(proxy.bootstrap_servers, group, tp, shares[i], seed=21)
        else:
            runs[str(i)] = await _run_member(proxy.bootstrap_servers, group, tp, shares[i], seed=i)

    async with trio.open_nursery() as nursery:
        for i in range(4):
            nursery.start_soon(member, i)

    assert runs["2-first"]["crashed"]
    processed = set()
    for name, run in runs.items():
        share = shares[int(name[0])]
        offsets = [r.offset for r in run["seen"]]
        assert offsets == sorted(offsets) and len(offsets) == len(set(offsets)), name
        for record in run["seen"]:
            assert contains([share], key_hash(record.key, record.offset)), name
            assert (record.key, record.value) == sent[record.offset]
        # per-key order within each member instance
        by_key = defaultdict(list)
        for record in run["seen"]:
            if record.key is not None:
                by_key[record.key].append(int(record.value.split(b":")[2]))
        for sequence in by_key.values():
            assert sequence == sorted(sequence), name
        processed |= set(offsets)
    assert processed == set(range(total)), "a record was never handed out"
    # the restarted member never re-received what its first instance had committed ...
    second = {r.offset for r in runs["2-second"]["seen"]}
    assert not second & set(runs["2-first"]["committed"])
    # ... and re-received exactly the share's records the first one had not committed
    share_offsets = {o for o in range(total) if contains([shares[2]], key_hash(sent[o][0], o))}
    assert second == share_offsets - set(runs["2-first"]["committed"])
    assert runs["2-second"]["metrics"]["records_already_committed"] > 0
    # the group's state: everything processed, S at the end, at the proxy and the coordinator
    async with Consumer(proxy.bootstrap_servers, group_id=group) as reader:
        assert await reader.committed_ranges([tp]) == {tp: (total, [])}
    assert _coordinator_offset(kafka.bootstrap_servers, group, topic) == total


async def test_the_seed_example_through_the_consumer(kafka, proxy, topic_factory):
    """Stable 40, IC [43-45], [48-49]: a consumer starting on this state is handed 40-42,
    46-47 and 50 onwards; committing 41-42, 46-47 and 50 leaves S at 40 with one range
    41-50; committing 40 then moves S to 51."""
    topic = topic_factory(kafka)
    _produce(kafka.bootstrap_servers, topic, {0: 60})
    tp = TopicPartition(topic, 0)
    group = f"{topic}-group"
    with CommitClient(proxy.bootstrap_servers, group) as client:
        assert client.commit(topic, {0: 40}) == {0: (0, -1)}
        assert client.commit(topic, {0: [(43, 45), (48, 49)]}) == {0: (0, 40)}
    async with Consumer(proxy.bootstrap_servers, group_id=group, allow_individual_commit=True,
                        max_poll_records=11) as consumer:
        consumer.assign([tp])
        with trio.fail_after(DEADLINE):
            batch = list(await consumer.poll(5))
            while not batch:
                batch = list(await consumer.poll(5))
        assert [r.offset for r in batch] == [40, 41, 42, 46, 47, 50, 51, 52, 53, 54, 55]
        assert consumer.metrics()["records_already_committed"] == 5
        consumer.mark_processed(*[r for r in batch if r.offset in (41, 42, 46, 47, 50)])
        assert consumer.pending_commit(tp) == [(41, 42), (46, 47), (50, 50)]
        await consumer.commit()
        assert await consumer.committed_ranges([tp]) == {tp: (40, [(41, 50)])}
        consumer.mark_processed(batch[0])
        await consumer.commit()
        assert await consumer.committed_ranges([tp]) == {tp: (51, [])}
        assert consumer.pending_commit(tp) == []
    assert _coordinator_offset(kafka.bootstrap_servers, group, topic) == 51


async def test_without_the_feature_whole_partitions_commit_the_contiguous_prefix(kafka, proxy_factory,
                                                                                 topic_factory):
    topic = topic_factory(kafka)
    _produce(kafka.bootstrap_servers, topic, {0: 30})
    tp = TopicPartition(topic, 0)
    group = f"{topic}-group"
    refusing = proxy_factory(kafka, individual_commit_enabled="false")
    async with Consumer(refusing.bootstrap_servers, group_id=group, allow_individual_commit=True,
                        auto_offset_reset="earliest", max_poll_records=30) as consumer:
        assert not consumer.individual_commit_supported
        consumer.assign([tp])
        with trio.fail_after(DEADLINE):
            got = []
            while len(got) < 30:
                got.extend(await consumer.poll(1))
        consumer.mark_processed(*[r for r in got if r.offset not in (12, 20)])
        await consumer.commit()
        assert await consumer.committed([tp]) == {tp: 12}  # the first unprocessed offset
        consumer.mark_processed(got[12])
        await consumer.commit()
        assert await consumer.committed([tp]) == {tp: 20}
        assert consumer.metrics()["plain_commits"] == 2
        consumer.assign({tp: [equal_shares(2)[0]]})
        consumer.seek(tp, 20)  # the keys are fixed, so some of 20-29 fall in this share
        with trio.fail_after(DEADLINE):
            got = []
            while not got:
                got.extend(await consumer.poll(1))
        consumer.mark_processed(*got)
        with pytest.raises(IllegalStateError, match="does not advertise individual.commit"):
            await consumer.commit()


async def test_control_records_are_amended_so_s_passes_transaction_markers(kafka, proxy, topic_factory):
    """A transactional topic: every commit marker takes an offset no member processes;
    the members amend them, so S still reaches the end."""
    topic = topic_factory(kafka)
    records = [(f"k{i}".encode(), b"v") for i in range(25)]
    produce_transactions(kafka.bootstrap_servers, topic, [(records, round_number != 1) for round_number in range(4)])
    end = 104  # 100 records and 4 markers
    tp = TopicPartition(topic, 0)
    group = f"{topic}-group"

    async def member(share) -> None:
        async with Consumer(proxy.bootstrap_servers, group_id=group, allow_individual_commit=True,
                            auto_offset_reset="earliest", isolation_level="read_committed") as consumer:
            consumer.assign({tp: [share]})
            with trio.fail_after(DEADLINE):
                while (consumer.position(tp) or 0) < end or consumer.pending_commit(tp):
                    consumer.mark_processed(*await consumer.poll(0.5))
                    await consumer.commit()

    async with trio.open_nursery() as nursery:
        for share in equal_shares(2):
            nursery.start_soon(member, share)
    async with Consumer(proxy.bootstrap_servers, group_id=group) as reader:
        assert await reader.committed_ranges([tp]) == {tp: (end, [])}


async def _process_all(consumer: Consumer, partitions: list[TopicPartition], total: int, *,
                       midway=None, timeout: float = 120) -> list:
    """Poll, mark and commit until every partition's position reaches its end and nothing
    is pending; ``midway`` (awaited once, after a third of ``total`` records) disrupts."""
    seen = []
    disrupted = midway is None
    with trio.fail_after(timeout):
        while True:
            batch = list(await consumer.poll(0.5))
            seen.extend(batch)
            consumer.mark_processed(*batch)
            await consumer.commit()
            if not disrupted and len(seen) >= total // 3:
                disrupted = True
                await midway()
            if (len({r.offset for r in seen if r.partition == 0}) and not batch
                    and all(consumer.current_lag(tp) == 0 and not consumer.pending_commit(tp) for tp in partitions)):
                return seen


async def test_a_proxy_restart_mid_stream_loses_nothing(kafka, proxy_factory, topic_factory):
    from .conftest import free_ports

    topic = topic_factory(kafka, partitions=3)
    sent = _produce(kafka.bootstrap_servers, topic, {0: 300, 1: 300, 2: 300})
    partitions = [TopicPartition(topic, p) for p in range(3)]
    group = f"{topic}-group"
    listen, node_base = free_ports(2)
    ports = {"listen_port": listen, "node_port_base": str(node_base - kafka.nodes[0].node_id)}
    proxies = [proxy_factory(kafka, **ports)]

    async def restart() -> None:
        await trio.to_thread.run_sync(proxies[-1].stop)
        proxies.append(await trio.to_thread.run_sync(lambda: proxy_factory(kafka, **ports)))

    async with Consumer(proxies[0].bootstrap_servers, group_id=group, allow_individual_commit=True,
                        auto_offset_reset="earliest", max_poll_records=50, retry_backoff_ms=50) as consumer:
        consumer.assign(partitions)
        seen = await _process_all(consumer, partitions, 900, midway=restart)
        assert len(proxies) == 2
        assert consumer.metrics()["reconnects"] >= 1
    by_partition = defaultdict(set)
    for record in seen:
        by_partition[record.partition].add(record.offset)
        assert (record.key, record.value) == sent[record.partition][record.offset]
    assert {p: len(o) for p, o in by_partition.items()} == {0: 300, 1: 300, 2: 300}
    async with Consumer(proxies[-1].bootstrap_servers, group_id=group) as reader:
        assert await reader.committed_ranges(partitions) == {tp: (300, []) for tp in partitions}


async def test_leader_stops_mid_stream_and_the_members_carry_on(kafka_cluster, cluster_proxy, topic_factory):
    from .test_proxy_failover import _leader

    topic = topic_factory(kafka_cluster, replication_factor=3, configs={"min.insync.replicas": "2"})
    sent = _produce(kafka_cluster.bootstrap_servers, topic, {0: 600})[0]
    tp = TopicPartition(topic, 0)
    group = f"{topic}-group"
    stopped = []

    async def stop_leader() -> None:
        if not stopped:
            stopped.append(_leader(kafka_cluster, topic))
            await trio.to_thread.run_sync(kafka_cluster.stop_node, stopped[0])

    seen: dict[int, list] = {}

    async def member(i: int, share) -> None:
        async with Consumer(cluster_proxy.bootstrap_servers, group_id=group, allow_individual_commit=True,
                            auto_offset_reset="earliest", max_poll_records=40, retry_backoff_ms=50) as consumer:
            consumer.assign({tp: [share]})
            seen[i] = await _process_all(consumer, [tp], 300, midway=stop_leader)

    async with trio.open_nursery() as nursery:
        for i, share in enumerate(equal_shares(2)):
            nursery.start_soon(member, i, share)
    assert _leader(kafka_cluster, topic) != stopped[0]
    offsets = sorted(r.offset for records in seen.values() for r in records)
    assert offsets == list(range(600))  # each record once: nothing lost, nothing doubled
    assert all((r.key, r.value) == sent[r.offset] for records in seen.values() for r in records)
    async with Consumer(cluster_proxy.bootstrap_servers, group_id=group) as reader:
        assert await reader.committed_ranges([tp]) == {tp: (600, [])}
