"""Records written while consumers read, the way production writes them.

A consumer test that writes everything before its consumers start only ever reads a
finished log: every read of an offset returns the same bytes, and the log end is reached
once. Loss at the live tail hides there. ``LiveProducer`` writes on its own thread while
the consumers run: small bursts, pauses shorter than a fetch's wait, and idle gaps longer
than it (so consumers reach the log end, wait there, and leave it again), each record
acknowledged (acks=all, idempotent) and recorded in a ``History`` with its offset.

The burst and pause schedule comes from a seed, so a failing run can be replayed.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from harness.history import History
from harness.raw_client import records_of
from harness.threads import in_threads
from proxy.ranges import contains
from proxy.records.keyhash import key_hash


@dataclass(frozen=True, slots=True)
class Burst:
    records: int
    pause: float  # seconds to wait after the burst


def schedule(seed: int, records: int, seconds: float, *, idle_gap: float = 0.8) -> list[Burst]:
    """Bursts of 1-40 records adding up to ``records``, paced to last about ``seconds``.

    Most pauses are short (a few ms to a few tens of ms, so batches stay small); about every
    four seconds a burst is followed by an idle gap of ``idle_gap`` to twice that, longer
    than a consumer's fetch wait, so the consumers go idle at the log end and then see it
    move."""
    rng = random.Random(seed)
    sizes = []
    left = records
    while left > 0:
        size = min(left, rng.choice((1, 1, 2, 3, 5, 8, 13, 20, 40)))
        sizes.append(size)
        left -= size
    gaps = set(rng.sample(range(len(sizes)), min(len(sizes), max(1, round(seconds / 4)))))
    idle = sum(rng.uniform(idle_gap, 2 * idle_gap) for _ in gaps)
    short = max(0.0, seconds - idle) / max(1, len(sizes) - len(gaps))
    out = []
    for i, size in enumerate(sizes):
        pause = rng.uniform(idle_gap, 2 * idle_gap) if i in gaps else rng.uniform(0, 2 * short)
        out.append(Burst(size, pause))
    return out


def default_key(seq: int, rng: random.Random, keys: int) -> bytes:
    return f"user-{rng.randrange(keys)}".encode()


class LiveProducer:
    """Writes ``records`` keyed records to ``topic`` on a thread, following ``schedule``.

    ``history.acks`` receives every acknowledged record; ``failed`` counts the records the
    producer gave up on (they were never acknowledged, so they may be missing). Values are
    ``b"<seq>"``, so a record names its place in the stream.
    """

    def __init__(self, bootstrap: str, topic: str, history: History, *, records: int, seconds: float,
                 seed: int = 1, keys: int = 200, partition: int | None = None,
                 key_of: Callable[[int, random.Random, int], bytes] = default_key,
                 config: dict | None = None) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.history = history
        self.records = records
        self.seconds = seconds
        self.seed = seed
        self.keys = keys
        self.partition = partition
        self.key_of = key_of
        self.config = config or {}
        self.failed = 0
        self.errors: list[str] = []
        self.sent = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> LiveProducer:
        self._thread = threading.Thread(target=self._run, name=f"live-producer-{self.topic}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop writing after the current burst (what was sent is still flushed)."""
        self._stop.set()

    def join(self, timeout: float = 120.0) -> None:
        """Wait for the producer to finish and flush; raise what broke it."""
        assert self._thread is not None, "start() first"
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"live producer of {self.topic} still running after {timeout:g} s")
        if self._error is not None:
            raise self._error

    @property
    def done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def _run(self) -> None:
        from confluent_kafka import Producer

        try:
            producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all",
                                 "linger.ms": 5, "message.timeout.ms": 60_000, **self.config})
            rng = random.Random(self.seed * 7919 + 1)
            seq = 0
            for burst in schedule(self.seed, self.records, self.seconds):
                if self._stop.is_set():
                    break
                for _ in range(burst.records):
                    key = self.key_of(seq, rng, self.keys)
                    value = str(seq).encode()
                    if self.partition is None:
                        producer.produce(self.topic, key=key, value=value, on_delivery=self._delivered)
                    else:
                        producer.produce(self.topic, key=key, value=value, partition=self.partition,
                                         on_delivery=self._delivered)
                    seq += 1
                self.sent = seq
                producer.poll(0)
                self._stop.wait(burst.pause)
            left = producer.flush(60)
            self.failed += left
        except BaseException as exc:  # noqa: BLE001 - raised again by join()
            self._error = exc

    def _delivered(self, err, msg) -> None:
        if err is not None:
            self.failed += 1
            if len(self.errors) < 20:
                self.errors.append(str(err))
            return
        self.history.ack(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value())


def wait_delivered(history: History, producer: LiveProducer, timeout: float) -> None:
    """Wait until the producer has finished and every acknowledged record was handed out,
    or ``timeout`` seconds from now; the caller's check then reports what is missing."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if producer.done and history.missing() == 0:
            return
        time.sleep(0.2)


def read_while_written(consume: Callable[[int], None], count: int, live: LiveProducer,
                       timeout: float = 120.0) -> None:
    """``consume(0)`` ... ``consume(count - 1)`` on threads of their own, started before
    ``live`` starts writing; waits for the producer, then up to ``timeout`` seconds for each
    consumer, and raises the first exception the producer or a consumer raised."""
    def write() -> None:
        live.start()
        live.join()

    in_threads(consume, count, timeout, meanwhile=write)


def deliver_range(client, topic: str, ranges: list, member: str, history: History, live: LiveProducer,
                  deadline: float, *, max_bytes: int, on_answer: Callable[[bytes], None] | None = None) -> None:
    """Read partition 0 of ``topic`` for ``ranges`` with a ``harness.raw_client.RawClient``
    from offset 0 until ``live`` is done and every acknowledged offset is behind it (or
    ``deadline``, a ``time.monotonic()``), recording each record handed out in ``history``
    as ``member``'s; each answer's records go to ``on_answer`` first. Every record must
    belong to ``ranges``."""
    topic_id = client.topic_id(topic)
    position = 0
    while time.monotonic() < deadline:
        if live.done and history.acks and position > max(a.offset for a in history.acks):
            return
        entry = client.range_fetch(topic_id, 0, position, ranges, max_bytes=max_bytes, max_wait_ms=200)
        assert entry.error_code == 0, entry.error_code
        blob = entry.records or b""
        if on_answer is not None:
            on_answer(blob)
        records, next_offset = records_of(blob)
        for record in records:
            if record.offset >= position:
                assert contains(ranges, key_hash(record.key, record.offset))
                history.deliver(member, topic, 0, record.offset, record.key)
        if next_offset is not None:
            position = max(position, next_offset)
