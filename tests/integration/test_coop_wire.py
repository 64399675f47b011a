"""Cooperative fetch through the real proxy against a real broker, on the wire
(docs/wire-contract.md#37-cooperative-fetch): members of a group share one partition by
chunks of offsets while a producer writes, commit each chunk by individual commit, die
with chunks leased, and meet a proxy restart."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from harness.commit_client import CommitClient
from harness.history import History, check
from harness.live import LiveProducer, wait_delivered
from harness.raw_client import RawClient, records_of
from proxy.protocol import messages
from proxy.protocol.messages import ApiKey
from proxy.ranges import KeyRange

ILLEGAL_GENERATION = 22
INVALID_GROUP_ID = 24
UNKNOWN_MEMBER_ID = 25
INVALID_REQUEST = 42


def _group() -> str:
    return f"coop-{uuid.uuid4().hex[:10]}"


@dataclass
class Fleet:
    """Members fetching one partition cooperatively, each on its own thread and
    connections, committing every chunk it was handed (unless told to stop committing)."""

    bootstrap: str
    topic: str
    group: str
    history: History
    max_bytes: int = 2048
    chunks: list[tuple[str, int, int]] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, name: str, *, commit: bool = True, chunk_limit: int | None = None,
              bootstrap: str | None = None) -> threading.Thread:
        thread = threading.Thread(target=self._run, args=(name, commit, chunk_limit, bootstrap or self.bootstrap),
                                  name=f"coop-{name}", daemon=True)
        thread.start()
        return thread

    def _run(self, name: str, commit: bool, chunk_limit: int | None, bootstrap: str) -> None:
        try:
            self._member(name, commit, chunk_limit, bootstrap)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(exc)

    def _member(self, name: str, commit: bool, chunk_limit: int | None, bootstrap: str) -> None:
        token, taken = 0, 0
        deadline = time.monotonic() + 120
        with RawClient.connect(bootstrap, timeout=20) as raw, \
                CommitClient(bootstrap, self.group, timeout=20) as commits:
            topic_id = raw.topic_id(self.topic)
            while not self.stop.is_set() and time.monotonic() < deadline:
                entry = raw.coop_fetch(topic_id, 0, token, self.group, name, max_bytes=self.max_bytes,
                                       max_wait_ms=200)
                assert entry.error_code == 0, f"{name}: fetch error {entry.error_code}"
                chunk = entry.cooperative_chunk
                records, _ = records_of(entry.records)
                if chunk is None:
                    assert not records, f"{name}: records without a chunk"
                    continue
                start, end = chunk.chunk_start, chunk.chunk_end
                assert all(start <= r.offset <= end for r in records), (name, start, end)
                for record in records:
                    self.history.deliver(name, self.topic, 0, record.offset, record.key)
                with self.lock:
                    self.chunks.append((name, start, end))
                taken += 1
                if commit:
                    result = commits.commit(self.topic, {0: [(start, end)]})
                    assert result[0][0] == 0, f"{name}: commit error {result}"
                token = end + 1
                if chunk_limit is not None and taken >= chunk_limit:
                    return  # dies with what it holds


def _overlaps(chunks: list[tuple[str, int, int]]) -> list[tuple]:
    ordered = sorted(chunks, key=lambda c: c[1])
    return [(a, b) for a, b in zip(ordered, ordered[1:]) if b[1] <= a[2]]


def _committed(bootstrap: str, group: str, topic: str) -> int:
    with CommitClient(bootstrap, group) as client:
        ((stable, _ranges),) = client.fetch(topic, [0]).values()
    return stable


def _wait_committed(bootstrap: str, group: str, topic: str, end: int, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    stable = -1
    while time.monotonic() < deadline:
        stable = _committed(bootstrap, group, topic)
        if stable >= end:
            break
        time.sleep(0.2)
    return stable


def _join(threads, fleet: Fleet) -> None:
    fleet.stop.set()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive()
    if fleet.errors:
        raise fleet.errors[0]


def test_members_share_a_live_partition_exactly_once(kafka, proxy, topic_factory):
    topic = topic_factory(kafka, partitions=1)
    history = History()
    fleet = Fleet(proxy.bootstrap_servers, topic, _group(), history)
    producer = LiveProducer(kafka.bootstrap_servers, topic, history, records=3000, seconds=12, seed=5).start()
    threads = [fleet.start(name) for name in ("a", "b", "c")]
    wait_delivered(history, producer, timeout=90)
    producer.join()
    end = max(a.offset for a in history.acks) + 1
    stable = _wait_committed(kafka.bootstrap_servers, fleet.group, topic, end)
    _join(threads, fleet)
    verdict = check(history, keyed_order=False)
    assert verdict.ok(), verdict.summary()
    assert producer.failed == 0
    assert not _overlaps(fleet.chunks), _overlaps(fleet.chunks)[:3]
    members = {name for name, _, _ in fleet.chunks}
    assert members == {"a", "b", "c"}, members
    assert stable == end, f"S at the coordinator {stable}, log end {end}"


def test_a_dead_members_chunks_go_to_the_others_after_the_lease(kafka, proxy_factory, topic_factory):
    proxy = proxy_factory(kafka, **{"cooperative.fetch.lease.ms": "1500"})
    topic = topic_factory(kafka, partitions=1)
    history = History()
    fleet = Fleet(proxy.bootstrap_servers, topic, _group(), history, max_bytes=1024)
    producer = LiveProducer(kafka.bootstrap_servers, topic, history, records=2000, seconds=10, seed=9).start()
    dead = fleet.start("dies", commit=False, chunk_limit=4)
    dead.join(60)
    assert not dead.is_alive()
    threads = [fleet.start(name) for name in ("b", "c")]
    wait_delivered(history, producer, timeout=90)
    producer.join()
    end = max(a.offset for a in history.acks) + 1
    stable = _wait_committed(kafka.bootstrap_servers, fleet.group, topic, end)
    _join(threads, fleet)
    verdict = check(history, keyed_order=False)
    assert not verdict.lost and not verdict.strays, verdict.summary()
    held = {o for name, start, end_ in fleet.chunks if name == "dies" for o in range(start, end_ + 1)}
    assert held, "the member died before it was handed anything"
    again = {rid[2] for rid in verdict.duplicates}
    acked = {a.offset for a in history.acks}
    assert held & acked <= again, "the dead member's records are handed out again"
    # the others commit each chunk at once: a chunk of theirs comes back only if a commit
    # took longer than the lease
    assert len(again - held) <= len(acked) // 20, sorted(again - held)[:20]
    assert stable == end


def test_retry_zombie_and_refusals(kafka, proxy, topic_factory):
    topic = topic_factory(kafka, partitions=2)
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all", linger_ms=0)
    for i in range(60):
        producer.send(topic, key=b"k%d" % (i % 7), value=b"v%d" % i, partition=0).get(30)  # one batch each
    producer.close()
    group = _group()
    with RawClient.connect(proxy.bootstrap_servers) as raw:
        topic_id = raw.topic_id(topic)
        first = raw.coop_fetch(topic_id, 0, 0, group, "a", generation=5, max_bytes=300)
        chunk = first.cooperative_chunk
        assert first.error_code == 0 and chunk.chunk_start == 0
        # the answer was lost: the same member at the same FetchOffset gets the same chunk
        again = raw.coop_fetch(topic_id, 0, 0, group, "a", generation=5, max_bytes=300)
        assert (again.cooperative_chunk.chunk_start, again.cooperative_chunk.chunk_end) == \
            (chunk.chunk_start, chunk.chunk_end)
        assert records_of(again.records)[0] == records_of(first.records)[0]
        # a zombie of generation 4 is refused and moves nothing
        zombie = raw.coop_fetch(topic_id, 0, 0, group, "z", generation=4, max_bytes=300)
        assert zombie.error_code == ILLEGAL_GENERATION and zombie.cooperative_chunk is None
        assert not zombie.records
        second = raw.coop_fetch(topic_id, 0, 0, group, "b", generation=5, max_bytes=300)
        assert second.cooperative_chunk.chunk_start == chunk.chunk_end + 1
        # refusals: a fetch session, key ranges beside it, no member id
        assert raw.coop_fetch(topic_id, 0, 0, group, "c", session=(0, 0)).error_code == INVALID_REQUEST
        assert raw.coop_fetch(topic_id, 0, 0, group, "c", ranges=[KeyRange(0, 100)]).error_code == INVALID_REQUEST
        assert raw.coop_fetch(topic_id, 0, 0, group, "").error_code == UNKNOWN_MEMBER_ID
        assert raw.coop_fetch(topic_id, 0, 0, "", "c").error_code == INVALID_GROUP_ID
        # a plain partition beside a cooperative one is fetched as it is
        cls = messages.body_class(ApiKey.FETCH, "request")
        body = messages.new_body(
            ApiKey.FETCH, 17, "request", max_wait_ms=100, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
            session_id=0, session_epoch=-1, topics=[cls.FetchTopic(topic_id=topic_id, partitions=[
                cls.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=300,
                                   cooperative=cls.CooperativeMember(group_id=group, member_id="c",
                                                                     generation_id=5)),
                cls.FetchPartition(partition=1, fetch_offset=0, partition_max_bytes=300)])])
        entries = {p.partition_index: p for p in raw.request(ApiKey.FETCH, 17, body).responses[0].partitions}
        assert entries[0].cooperative_chunk.chunk_start == second.cooperative_chunk.chunk_end + 1
        assert entries[1].error_code == 0 and entries[1].cooperative_chunk is None
    with RawClient.connect(proxy.bootstrap_servers) as plain:
        entry = plain.range_fetch(plain.topic_id(topic), 0, 0, None)
        assert entry.cooperative_chunk is None
        assert records_of(entry.records)[0][0].offset == 0


def test_the_first_fetch_after_a_quiet_spell_of_the_grants_log_gets_its_chunk(kafka, proxy_factory, topic_factory):
    """An ask made from a view of its grants log partition older than the lease is refused
    by the log as stale; the proxy asks again, from the view its refused record gave it, a
    group's first fetch (a claim of the offsets before it) included."""
    proxy = proxy_factory(kafka, **{"cooperative.fetch.lease.ms": "1000"})
    topic = topic_factory(kafka, partitions=1)
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all", linger_ms=0)
    for i in range(10):
        producer.send(topic, key=b"k%d" % i, value=b"v%d" % i, partition=0).get(30)
    producer.close()
    group = _group()
    first, second = group + "Aa", group + "BB"  # one Java hash code: one partition of the grants log
    with RawClient.connect(proxy.bootstrap_servers) as raw:
        topic_id = raw.topic_id(topic)
        assert raw.coop_fetch(topic_id, 0, 0, first, "a", max_bytes=300).cooperative_chunk.chunk_start == 0
        quiet_until = time.monotonic() + 1.3  # the log partition stays quiet for longer than the lease
        while time.monotonic() < quiet_until:
            time.sleep(0.05)
        answer = raw.coop_fetch(topic_id, 0, 0, second, "b", max_bytes=300, max_wait_ms=500)
        assert answer.error_code == 0 and answer.cooperative_chunk is not None, answer
        assert answer.cooperative_chunk.chunk_start == 0 and records_of(answer.records)


def test_a_proxy_restart_resumes_the_leases_and_loses_nothing(kafka, proxy_factory, topic_factory):
    """The grants live in __cooperative_fetch_grants: the instance started after the kill
    resumes the leases from the log, and what was leased and not committed is handed out
    again once its lease ends (not at the restart), by whichever member fetches."""
    lease = {"cooperative.fetch.lease.ms": "4000"}
    first = proxy_factory(kafka, **lease)
    topic = topic_factory(kafka, partitions=1)
    history = History()
    group = _group()
    fleet = Fleet(first.bootstrap_servers, topic, group, history, max_bytes=1024)
    producer = LiveProducer(kafka.bootstrap_servers, topic, history, records=2500, seconds=12, seed=13).start()
    threads = [fleet.start(name, commit=(name != "slow")) for name in ("a", "b", "slow")]
    deadline = time.monotonic() + 60
    while len(fleet.chunks) < 30 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(fleet.chunks) >= 30
    first.kill()
    _join_after_kill(threads, fleet)
    leased_uncommitted = {o for name, s, e in fleet.chunks if name == "slow" for o in range(s, e + 1)}
    second = proxy_factory(kafka, **lease)
    fleet2 = Fleet(second.bootstrap_servers, topic, group, history, max_bytes=1024)
    threads = [fleet2.start(name) for name in ("a", "b")]
    wait_delivered(history, producer, timeout=90)
    producer.join()
    end = max(a.offset for a in history.acks) + 1
    stable = _wait_committed(kafka.bootstrap_servers, group, topic, end)
    _join(threads, fleet2)
    verdict = check(history, keyed_order=False)
    assert not verdict.lost and not verdict.strays, verdict.summary()
    acked = {a.offset for a in history.acks}
    assert leased_uncommitted & acked, "the slow member held nothing when the proxy died"
    again = {rid[2] for rid in verdict.duplicates}
    assert leased_uncommitted & acked <= again, "leased, uncommitted records are handed out again after the lease"
    assert stable == end


def _join_after_kill(threads, fleet: Fleet) -> None:
    """The members' connections broke with the proxy: they end with an error, expected."""
    fleet.stop.set()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive()
    fleet.errors.clear()


@dataclass
class TransactionalMembers:
    """Exactly-once members of one group sharing partition 0 of ``source`` by chunks: each
    turns its chunk into output records in ``sink`` (the input offset as value) and commits
    the chunk's offsets (OffsetRanges in TxnOffsetCommit) in one transaction; every fourth
    transaction is aborted, its chunk handed out again once the lease ends.

    As docs/cooperative-fetch.md asks of an exactly-once member, a chunk is committed only
    by a transaction over before its lease ends: a member aborts instead when half the lease
    (``lease_ms``, the proxy's ``cooperative.fetch.lease.ms``) has passed since it sent the
    fetch that got the chunk (counted in ``late``)."""

    source: str
    sink: str
    group: str
    lease_ms: int
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[BaseException] = field(default_factory=list)
    aborted: list[tuple[int, int]] = field(default_factory=list)
    committed: dict[str, int] = field(default_factory=dict)  # member -> transactions committed
    late: int = 0  # transactions aborted because half the chunk's lease had passed
    # (member, chunk start, chunk end, wall-clock s when fetched, s when its transaction ended, committed)
    chunks: list[tuple[str, int, int, float, float, bool]] = field(default_factory=list)

    def start(self, name: str, bootstrap: str) -> threading.Thread:
        thread = threading.Thread(target=self._run, args=(name, bootstrap), name=f"txn-{name}", daemon=True)
        thread.start()
        return thread

    def _run(self, name: str, bootstrap: str) -> None:
        try:
            self._member(name, bootstrap)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(exc)

    def _member(self, name: str, bootstrap: str) -> None:
        from harness.txn_client import Conn

        with Conn(bootstrap, name=name) as conn, RawClient.connect(bootstrap) as raw:
            txn = f"{self.group}-{name}"
            body = conn.init_pid(txn)
            assert body.error_code == 0, body
            pid, epoch = body.producer_id, body.producer_epoch
            topic_id = raw.topic_id(self.source)
            token, done = 0, 0
            deadline = time.monotonic() + 120
            while not self.stop.is_set() and time.monotonic() < deadline:
                sent = time.monotonic()  # the chunk's grant, hence its lease, comes after
                entry = raw.coop_fetch(topic_id, 0, token, self.group, name, max_bytes=1024, max_wait_ms=200)
                assert entry.error_code == 0, entry.error_code
                chunk = entry.cooperative_chunk
                if chunk is None:
                    continue
                fetched = time.time()
                token = chunk.chunk_end + 1
                records, _ = records_of(entry.records)
                if records:
                    code = _txn_produce(conn, self.sink, [(r.key, b"%d" % r.offset) for r in records], txn, pid,
                                        epoch)
                    assert code == 0, f"{name}: produce error {code}"
                assert _txn_range_commit(conn, txn, pid, epoch, self.group, self.source,
                                         [(chunk.chunk_start, chunk.chunk_end)]) == 0
                done += 1
                commit = done % 4 != 0
                if commit and time.monotonic() - sent > self.lease_ms / 2000:
                    commit = False
                    self.late += 1
                end = conn.end_txn(txn, pid, epoch, commit)
                assert end.error_code == 0, end
                epoch = end.producer_epoch
                self.chunks.append((name, chunk.chunk_start, chunk.chunk_end, fetched, time.time(), commit))
                if commit:
                    self.committed[name] = self.committed.get(name, 0) + 1
                else:
                    self.aborted.append((chunk.chunk_start, chunk.chunk_end))

    def join(self, threads: list[threading.Thread]) -> None:
        self.stop.set()
        for thread in threads:
            thread.join(60)
            assert not thread.is_alive()
        if self.errors:
            raise self.errors[0]


def check_exactly_once(kafka, proxy_bootstrap: str, members: TransactionalMembers, history: History,
                       threads: list[threading.Thread], explain: Callable[[int], str] | None = None) -> None:
    """Once the group committed the log end (or a member failed): every member stopped, some
    transactions aborted, and the committed output holds each acknowledged input once.
    ``explain(offset)``: more to say about an offset processed twice."""
    from harness.streams_app import read_to_end

    end = max(a.offset for a in history.acks) + 1
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not members.errors:
        if _committed(proxy_bootstrap, members.group, members.source) >= end:
            break
        time.sleep(0.3)
    members.join(threads)
    assert members.aborted, "no transaction was aborted"
    assert _committed(proxy_bootstrap, members.group, members.source) == end
    output = read_to_end(kafka.bootstrap_servers, members.sink)
    counts: dict[int, int] = {}
    for _partition, _offset, _key, value in output:
        assert value is not None, "an output record without the input offset"
        counts[int(value)] = counts.get(int(value), 0) + 1
    acked = {a.offset for a in history.acks}
    assert set(counts) == acked, f"missing {sorted(acked - set(counts))[:10]}, strays {sorted(set(counts) - acked)[:10]}"
    twice = {offset: n for offset, n in counts.items() if n != 1}
    if twice:
        first = min(twice)
        seen = [(name, start, end, round(fetched % 1000, 3), round(ended - fetched, 3), commit)
                for name, start, end, fetched, ended, commit in members.chunks if start <= first <= end]
        pytest.fail(f"processed more than once: {list(twice.items())[:10]} ({len(twice)} offsets); the chunks "
                    f"holding {first} (member, start, end, fetched at s, transaction ended after s, committed): "
                    f"{seen}{'; ' + explain(first) if explain is not None else ''}", pytrace=False)


def test_transactional_members_process_every_record_exactly_once(kafka, proxy_factory, topic_factory):
    """Exactly-once on a shared partition (``TransactionalMembers``): the committed output
    holds every input record exactly once."""
    proxy = proxy_factory(kafka, **{"cooperative.fetch.lease.ms": "1500"})
    members = TransactionalMembers(topic_factory(kafka, partitions=1), topic_factory(kafka, partitions=1), _group(),
                                   lease_ms=1500)
    history = History()
    producer = LiveProducer(kafka.bootstrap_servers, members.source, history, records=1200, seconds=10,
                            seed=21).start()
    threads = [members.start(name, proxy.bootstrap_servers) for name in ("a", "b")]
    producer.join()
    check_exactly_once(kafka, proxy.bootstrap_servers, members, history, threads)


def _txn_produce(conn, topic: str, records: list[tuple[bytes | None, bytes]], txn: str, pid: int, epoch: int) -> int:
    """The first Produce of a transaction (transactions v2: it adds the partition), retried
    while the broker answers CONCURRENT_TRANSACTIONS (the previous transaction's markers
    still being written), as Kafka's producer retries it."""
    for _ in range(40):
        code, _ = conn.produce(topic, 0, records, txn=txn, pid=pid, epoch=epoch, sequence=0)
        if code != 51:
            return code
        time.sleep(0.1)
    return code


def _txn_range_commit(conn, txn: str, pid: int, epoch: int, group: str, topic: str,
                      ranges: list[tuple[int, int]]) -> int:
    c = conn.cls(ApiKey.TXN_OFFSET_COMMIT)
    for _ in range(40):
        body = conn.call(ApiKey.TXN_OFFSET_COMMIT, 5, transactional_id=txn, group_id=group, producer_id=pid,
                         producer_epoch=epoch, generation_id=-1, member_id="", group_instance_id=None,
                         topics=[c.TxnOffsetCommitRequestTopic(name=topic, partitions=[
                             c.TxnOffsetCommitRequestPartition(
                                 partition_index=0, committed_offset=-1, committed_leader_epoch=-1,
                                 committed_metadata="",
                                 offset_ranges=[c.OffsetRange(start=s, end=e) for s, e in ranges])])])
        (code,) = [p.error_code for t in body.topics for p in t.partitions]
        if code != 51:  # CONCURRENT_TRANSACTIONS: the previous transaction still completing
            return code
        time.sleep(0.1)
    return code
