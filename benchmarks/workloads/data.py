"""Test data every key-ordered peer can check: record ``i`` has key ``key-<i mod keys>``
and a value starting ``<i mod keys>:<i div keys>:``, the second number being the record's
sequence within its key, padded to ``value_size`` bytes."""

from __future__ import annotations

from collections.abc import Callable


def value_of(i: int, keys: int, value_size: int) -> bytes:
    head = b"%d:%d:" % (i % keys, i // keys)
    return head + b"v" * max(0, value_size - len(head))


def key_of(i: int, keys: int) -> bytes:
    return b"key-%d" % (i % keys)


def sequence_of(value: bytes) -> tuple[bytes, int]:
    """(key number, sequence) from a value made by :func:`value_of`."""
    key, sequence, _ = value.split(b":", 2)
    return key, int(sequence)


def produce_keyed(bootstrap: str, topic: str, records: int, *, keys: int, value_size: int = 100,
                  partition: int | None = 0, batch_bytes: int = 262_144,
                  record_of: Callable[[int], tuple[bytes, bytes]] | None = None) -> None:
    """Write ``records`` records to one partition, in order (librdkafka, idempotent); with
    ``partition`` None, each to its key's partition (librdkafka's default partitioner).
    ``record_of(i)``: the key and value of record ``i``, if not :func:`key_of` and
    :func:`value_of`'s.

    Batches of 256 KB by default: well under a consumer's 1 MiB fetch, so a fetch rarely
    ends in a truncated batch that the next fetch reads again (with 1 MB batches that
    re-reading alone made the proxy's broker reads 1.12 x the partition for a single
    consumer)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": batch_bytes,
                         "compression.type": "none", "enable.idempotence": True,
                         "queue.buffering.max.messages": 500_000})
    for i in range(records):
        key, value = (key_of(i, keys), value_of(i, keys, value_size)) if record_of is None else record_of(i)
        while True:
            try:
                producer.produce(topic, key=key, value=value,
                                 **({} if partition is None else {"partition": partition}))
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(300) != 0:
        raise RuntimeError(f"records left unsent to {topic}")
