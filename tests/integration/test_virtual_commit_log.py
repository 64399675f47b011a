"""Share watermarks of virtual topics in ``__individual_commit_offsets``
(docs/wire-contract.md#9-virtual-range-topics): the record read back from the log itself,
and two proxy instances committing shares of one partition at once."""

from __future__ import annotations

import threading
import uuid

import pytest

from harness.wait import wait_until
from proxy.commits.codec import decode_key, decode_value
from proxy.commits.watermarks import per_share

pytestmark = pytest.mark.kafka

SHARES = 4
LOG_TOPIC = "__individual_commit_offsets"


def _client(bootstrap: str, group: str):
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                     "auto.offset.reset": "earliest"})


def _commit(consumer, topic: str, offsets: dict[int, int]) -> None:
    from confluent_kafka import TopicPartition

    result = consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    assert all(tp.error is None for tp in result), result


def _committed(consumer, topic: str, partitions) -> dict[int, int]:
    from confluent_kafka import TopicPartition

    return {tp.partition: tp.offset for tp in consumer.committed([TopicPartition(topic, p) for p in partitions],
                                                                 timeout=30)}


def _log_states(bootstrap: str, group: str):
    """Every (topic, partition) -> newest state of ``group`` in the log, read from the broker."""
    from confluent_kafka import Consumer, TopicPartition

    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"log-reader-{uuid.uuid4().hex[:6]}",
                       "enable.auto.commit": False})
    try:
        partitions = reader.list_topics(LOG_TOPIC, timeout=30).topics[LOG_TOPIC].partitions
        ends = {}
        for index in partitions:
            _, high = reader.get_watermark_offsets(TopicPartition(LOG_TOPIC, index), timeout=30)
            ends[index] = high
        reader.assign([TopicPartition(LOG_TOPIC, index, 0) for index in partitions if ends[index] > 0])
        seen = {index: 0 for index in ends}
        states = {}

        def read() -> bool:
            for message in reader.consume(200, timeout=0.5):
                if message.error():
                    continue
                seen[message.partition()] = message.offset() + 1
                owner, topic, partition = decode_key(message.key())
                if owner == group:
                    value = message.value()
                    states[(topic, partition)] = None if value is None else decode_value(value)
            return all(seen[index] >= ends[index] for index in ends)

        wait_until(read, timeout=60, what="the log read to its end")
        return states
    finally:
        reader.close()


def test_share_watermarks_are_in_the_log_record(kafka, proxy, topic_factory):
    topic = topic_factory(kafka, partitions=2)
    group = f"vl-{uuid.uuid4().hex[:8]}"
    virtual = f"{topic}.kr{SHARES}"
    client = _client(proxy.bootstrap_servers, group)
    try:
        _commit(client, virtual, {0: 10, 1: 14})  # shares 0 and 1 of partition 0
        _commit(client, virtual, {2: 12, 3: 11, 5: 7})  # the rest of partition 0; share 1 of partition 1
        _commit(client, virtual, {1: 16})
        assert _committed(client, virtual, range(2 * SHARES)) == {0: 10, 1: 16, 2: 12, 3: 11, 4: -1001, 5: 7,
                                                                 6: -1001, 7: -1001}
        assert _committed(client, topic, [0]) == {0: 10}  # S: the lowest watermark of partition 0
    finally:
        client.close()
    states = _log_states(kafka.bootstrap_servers, group)
    first, second = states[(topic, 0)], states[(topic, 1)]
    assert per_share(first.marks) == {SHARES: [10, 16, 12, 11]} and first.stable == 10
    assert per_share(second.marks) == {SHARES: [-1, 7, -1, -1]}
    sequences = {share: sequence for _, share, _, sequence in first.marks}
    assert sequences[1] > sequences[0]  # the later commit of share 1 carries a higher sequence


def test_two_proxies_committing_shares_of_one_partition(kafka, proxy_factory, topic_factory):
    topic = topic_factory(kafka, partitions=1)
    group = f"vl-{uuid.uuid4().hex[:8]}"
    virtual = f"{topic}.kr2"
    proxies = [proxy_factory(kafka), proxy_factory(kafka)]
    clients = [_client(p.bootstrap_servers, group) for p in proxies]
    rounds = 40
    errors: list[BaseException] = []

    def commit_share(share: int) -> None:
        try:
            for step in range(1, rounds + 1):
                _commit(clients[share], virtual, {share: step * 10 + share})
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=commit_share, args=(share,)) for share in (0, 1)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads)
        assert not errors, errors
        expected = {0: rounds * 10, 1: rounds * 10 + 1}
        for client in clients:  # every instance answers both shares' last commits
            assert _committed(client, virtual, [0, 1]) == expected
        assert _committed(clients[0], topic, [0]) == {0: rounds * 10}  # S at the coordinator
    finally:
        for client in clients:
            client.close()
    state = _log_states(kafka.bootstrap_servers, group)[(topic, 0)]
    assert per_share(state.marks) == {2: [rounds * 10, rounds * 10 + 1]} and state.stable == rounds * 10
