"""Transactional test data: rounds of records, each round one transaction, committed or
aborted, written with librdkafka (confluent-kafka)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

Record = tuple[bytes | None, bytes | None]


def produce_transactions(bootstrap: str, topic: str, rounds: Sequence[tuple[Sequence[Record], bool]], *,
                         timeout: float = 30.0) -> None:
    """Write ``rounds``, each ``(records, commit)``: one transaction per round, flushed
    before it ends (an abort purges records not yet sent), then committed or aborted."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex}",
                         "linger.ms": 5})
    producer.init_transactions(timeout)
    for records, commit in rounds:
        producer.begin_transaction()
        for key, value in records:
            producer.produce(topic, key=key, value=value)
        if producer.flush(timeout) != 0:
            raise RuntimeError(f"transactional records for {topic} left unsent after {timeout} s")
        if commit:
            producer.commit_transaction(timeout)
        else:
            producer.abort_transaction(timeout)
