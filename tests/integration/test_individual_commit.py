"""Individual commit through the real proxy against real brokers (docs/wire-contract.md#33-offsetcommit, #4-individual-commit-log)."""

from __future__ import annotations

import threading
import uuid

import pytest

from harness.commit_client import CommitClient
from harness.java_tools import describe_group
from harness.raw_client import RawClient
from harness.threads import in_threads
from proxy.commits.state import CommitState, apply_ranges
from proxy.protocol import messages
from proxy.protocol.messages import ApiKey

INVALID_REQUEST = 42


def _group() -> str:
    return f"ic-{uuid.uuid4().hex[:10]}"


def test_seed_example_through_the_proxy_and_s_reaches_the_coordinator(kafka, proxy, topic_factory):
    topic = topic_factory(kafka, partitions=2)
    group = _group()
    with CommitClient(proxy.bootstrap_servers, group) as client:
        # A plain commit of 40 first: S = 40 (as a standard consumer left it).
        assert client.commit(topic, {0: 40}) == {0: (0, -1)}
        assert client.commit(topic, {0: [(43, 45), (48, 49)]}) == {0: (0, 40)}
        assert client.fetch(topic, [0]) == {0: (40, [(43, 45), (48, 49)])}
        # Gap amending over the fetched [40-50]: the consumer commits what it processed.
        assert client.commit(topic, {0: [(40, 42), (46, 47), (50, 50)]}) == {0: (0, 51)}
        assert client.fetch(topic, [0]) == {0: (51, [])}
        # A second partition in the same request, out of order ranges.
        assert client.commit(topic, {1: [(5, 6), (0, 2)]}) == {1: (0, 3)}
        assert client.fetch(topic, [0, 1]) == {0: (51, []), 1: (3, [(5, 6)])}
        # The v6-v7 topic form carries the same.
        assert client.fetch(topic, [1], version=7) == {1: (3, [(5, 6)])}
    # Directly at the broker: the standard committed offset is S.
    with CommitClient(kafka.bootstrap_servers, group) as direct:
        assert direct.fetch(topic, [0, 1]) == {0: (51, []), 1: (3, [])}
    rows = {int(row["PARTITION"]): row["CURRENT-OFFSET"] for row in describe_group(kafka.bootstrap_servers, group)
            if row.get("TOPIC") == topic}
    assert rows == {0: "51", 1: "3"}


def test_plain_commit_resets_state_and_invalid_range_commits_change_nothing(kafka, proxy, topic_factory):
    topic = topic_factory(kafka, partitions=3)
    group = _group()
    with CommitClient(proxy.bootstrap_servers, group) as client:
        assert client.commit(topic, {0: [(3, 4)], 1: [(0, 0), (2, 2)]}) == {0: (0, 0), 1: (0, 1)}
        before = client.fetch(topic, [0, 1])
        assert before == {0: (0, [(3, 4)]), 1: (1, [(2, 2)])}
        for bad in ([(5, 4)], [(-1, 3)], [(6, 8), (8, 9)], [(i * 3, i * 3) for i in range(1001)]):
            # The invalid partition is refused; a valid one in the same request goes through.
            result = client.commit(topic, {0: bad, 2: [(0, 1)]})
            assert result[0] == (INVALID_REQUEST, -1)
            assert result[2][0] == 0
        body = messages.new_body(ApiKey.OFFSET_COMMIT, 9, "request", group_id=group, topics=[
            messages.body_class(ApiKey.OFFSET_COMMIT, "request").OffsetCommitRequestTopic(name=topic, partitions=[
                messages.body_class(ApiKey.OFFSET_COMMIT, "request").OffsetCommitRequestPartition(
                    partition_index=0, committed_offset=7,
                    offset_ranges=[messages.body_class(ApiKey.OFFSET_COMMIT, "request").OffsetRange(start=9, end=9)])
            ])])
        response = client.client.request(ApiKey.OFFSET_COMMIT, 9, body)
        assert response.topics[0].partitions[0].error_code == INVALID_REQUEST
        assert client.fetch(topic, [0, 1]) == before
        # A plain commit sets S = O and clears R.
        assert client.commit(topic, {1: 10}) == {1: (0, -1)}
        assert client.fetch(topic, [0, 1]) == {0: (0, [(3, 4)]), 1: (10, [])}
        # OffsetDelete through the proxy deletes the state with the offsets.
        with RawClient(*client.client.sock.getpeername()[:2]) as raw:
            cls = messages.body_class(ApiKey.OFFSET_DELETE, "request")
            deleted = raw.call(ApiKey.OFFSET_DELETE, 0, group_id=group, topics=[
                cls.OffsetDeleteRequestTopic(name=topic, partitions=[cls.OffsetDeleteRequestPartition(partition_index=0)])])
            assert deleted.error_code == 0
        assert client.fetch(topic, [0]) == {0: (-1, [])}
        assert client.commit(topic, {0: [(1, 2)]}) == {0: (0, 0)}
        assert client.fetch(topic, [0]) == {0: (0, [(1, 2)])}
    # DeleteGroups through the proxy: the state goes with the group.
    with RawClient.connect(proxy.bootstrap_servers) as raw:
        result = raw.call(ApiKey.DELETE_GROUPS, 2, groups_names=[group])
        assert [r.error_code for r in result.results] == [0]
    with CommitClient(proxy.bootstrap_servers, group) as client:
        assert client.fetch(topic, [0, 1]) == {0: (-1, []), 1: (-1, [])}


# the setting, and its former name (still read)
@pytest.mark.parametrize("setting", ["individual_commit_enabled", "accept_individual_commit"])
def test_disabled_refuses_range_commits_and_does_not_advertise(kafka, proxy_factory, topic_factory, setting):
    disabled = proxy_factory(kafka, **{setting: "false"})
    topic = topic_factory(kafka, partitions=2)
    group = _group()
    with RawClient.connect(disabled.bootstrap_servers) as raw:
        versions = raw.call(ApiKey.API_VERSIONS, 3, client_software_name="t", client_software_version="1")
        assert "individual.commit" not in {f.name for f in versions.supported_features}
    with CommitClient(disabled.bootstrap_servers, group) as client:
        assert client.commit(topic, {0: [(0, 3)], 1: 5}) == {0: (INVALID_REQUEST, -1), 1: (0, -1)}
        assert client.fetch(topic, [0, 1]) == {0: (-1, []), 1: (5, [])}


def test_stale_generation_is_rejected_and_leaves_no_trace(kafka, proxy, topic_factory):
    topic = topic_factory(kafka, partitions=1)
    group = _group()
    with CommitClient(proxy.bootstrap_servers, group) as client:
        member, generation = _join(client.client, group, topic)
        assert client.commit(topic, {0: [(0, 4), (8, 9)]}, generation=generation, member=member) == {0: (0, 5)}
        stale = client.commit(topic, {0: [(5, 6), (12, 12)]}, generation=generation - 1, member=member)
        assert stale[0][0] != 0 and stale[0][1] == -1
        unknown = client.commit(topic, {0: [(5, 6)]}, generation=generation, member="someone-else")
        assert unknown[0][0] != 0
        assert client.fetch(topic, [0]) == {0: (5, [(8, 9)])}
        # The same commit with the current generation is applied in full.
        assert client.commit(topic, {0: [(5, 6), (12, 12)]}, generation=generation, member=member) == {0: (0, 7)}
        assert client.fetch(topic, [0]) == {0: (7, [(8, 9), (12, 12)])}
    assert apply_ranges(CommitState(0), [(0, 4), (8, 9), (5, 6), (12, 12)]) == CommitState(7, ((8, 9), (12, 12)))


def _join(raw: RawClient, group: str, topic: str) -> tuple[str, int]:
    """Join ``group`` as its only member (JoinGroup, then SyncGroup); (member id, generation)."""
    join_class = messages.body_class(ApiKey.JOIN_GROUP, "request")
    protocols = [join_class.JoinGroupRequestProtocol(name="range", metadata=b"\x00\x00\x00\x00\x00\x00\x00\x00")]
    member = ""
    for _ in range(3):
        joined = raw.call(ApiKey.JOIN_GROUP, 7, group_id=group, session_timeout_ms=30000,
                          rebalance_timeout_ms=30000, member_id=member, protocol_type="consumer",
                          protocols=protocols)
        if joined.error_code == 79:  # MEMBER_ID_REQUIRED: join again with the id given
            member = joined.member_id
            continue
        assert joined.error_code == 0, joined.error_code
        break
    sync_class = messages.body_class(ApiKey.SYNC_GROUP, "request")
    synced = raw.call(ApiKey.SYNC_GROUP, 5, group_id=group, generation_id=joined.generation_id,
                      member_id=joined.member_id, protocol_type="consumer", protocol_name="range",
                      assignments=[sync_class.SyncGroupRequestAssignment(member_id=joined.member_id,
                                                                         assignment=b"")])
    assert synced.error_code == 0, synced.error_code
    return joined.member_id, joined.generation_id


# -- three nodes ---------------------------------------------------------------------------------

def _model(commits) -> CommitState:
    state = CommitState(0)
    for ranges in commits:
        state = apply_ranges(state, ranges)
    return state


def _random_commit(rng, span: int) -> list[tuple[int, int]]:
    ranges, start = [], rng.randrange(0, 8)
    while start < span and len(ranges) < rng.randrange(1, 5):
        end = start + rng.randrange(0, 4)
        ranges.append((start, end))
        start = end + 2 + rng.randrange(0, 15)
    return ranges


def test_interleaved_range_commits_from_several_connections(kafka_cluster, cluster_proxy, topic_factory):
    import random

    topic = topic_factory(kafka_cluster, partitions=2, replication_factor=3)
    group = _group()
    rng = random.Random(20261122)
    # Every offset of [0, 400) of both partitions is committed once, in shuffled chunks.
    chunks = {}
    for p in (0, 1):
        bounds = [0, *sorted(rng.sample(range(1, 400), 79)), 400]
        chunks[p] = [(a, b - 1) for a, b in zip(bounds, bounds[1:])]
    work = [(p, chunk) for p, items in chunks.items() for chunk in items]
    rng.shuffle(work)
    clients = [CommitClient(cluster_proxy.bootstrap_servers, group) for _ in range(4)]
    applied: dict[int, list] = {0: [], 1: []}
    lock = threading.Lock()

    started: dict[int, list] = {0: [], 1: []}

    def worker(index: int) -> None:
        for number, (partition, chunk) in enumerate(work[index::4]):
            pieces = [chunk]
            with lock:
                started[partition].append(pieces)
            result = clients[index].commit(topic, {partition: pieces})
            assert result[partition][0] == 0, result
            with lock:
                applied[partition].append(pieces)
            if number % 5 == 0:
                # Exactly the merged state: at least every commit acknowledged before
                # the fetch, at most every commit started before it answered.
                with lock:
                    before = {p: _model(list(applied[p])) for p in (0, 1)}
                state = clients[index].fetch(topic, [0, 1])
                with lock:
                    after = {p: _model(list(started[p])) for p in (0, 1)}
                for p, (stable, ranges) in state.items():
                    got = CommitState(stable, tuple(ranges))
                    for offset in range(401):
                        assert not before[p].processed(offset) or got.processed(offset), (p, offset, got)
                        assert not got.processed(offset) or after[p].processed(offset), (p, offset, got)

    in_threads(worker, 4)
    with lock:
        expected = {p: _model(applied[p]) for p in (0, 1)}
    assert expected == {0: CommitState(400), 1: CommitState(400)}
    for client in clients:
        assert client.fetch(topic, [0, 1]) == {0: (400, []), 1: (400, [])}
        client.close()
    # Some random gaps on top, checked exactly against the model.
    with CommitClient(cluster_proxy.bootstrap_servers, group) as client:
        history = []
        for _ in range(20):
            ranges = [(400 + s, 400 + e) for s, e in _random_commit(rng, 200)]
            history.append(ranges)
            assert client.commit(topic, {1: ranges})[1][0] == 0
            model = _model([[(0, 399)], *history])
            assert client.fetch(topic, [1]) == {1: (model.stable, list(model.ranges))}
    with CommitClient(kafka_cluster.bootstrap_servers, group) as direct:
        assert direct.fetch(topic, [0, 1]) == {0: (400, []), 1: (model.stable, [])}


def test_kill_proxy_mid_commits_keeps_every_acknowledged_range(kafka_cluster, proxy_factory, topic_factory):

    from harness.wait import wait_until

    topic = topic_factory(kafka_cluster, partitions=1, replication_factor=3)
    group = _group()
    first = proxy_factory(kafka_cluster)
    acked: list[list] = []
    unacked: list[list] = []
    lock = threading.Lock()
    clients = [CommitClient(first.bootstrap_servers, group, timeout=20) for _ in range(3)]

    def worker(index: int) -> None:
        for k in range(400):  # bounded: the proxy is killed long before
            base = 10 * (3 * k + index)
            ranges = [(base, base + 1), (base + 4, base + 5)]
            try:
                result = clients[index].commit(topic, {0: ranges})
            except OSError:
                with lock:
                    unacked.append(ranges)
                return
            with lock:
                (acked if result[0][0] == 0 else unacked).append(ranges)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    wait_until(lambda: len(acked) >= 30, timeout=60, interval=0.01, what="30 acknowledged commits")
    first.kill()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive()
    for client in clients:
        client.close()
    second = proxy_factory(kafka_cluster)
    with CommitClient(second.bootstrap_servers, group) as client:
        ((stable, ranges),) = client.fetch(topic, [0]).values()
    state = CommitState(stable, tuple(ranges))
    for commit in acked:
        assert all(state.processed(o) for s, e in commit for o in range(s, e + 1)), commit
    for commit in unacked:
        seen = [state.processed(o) for s, e in commit for o in range(s, e + 1) if o >= stable]
        assert all(seen) or not any(seen), f"unacknowledged commit {commit} half-applied in {state}"
    # Nothing that no one committed reads as processed.
    attempted = {o for commit in acked + unacked for s, e in commit for o in range(s, e + 1)}
    assert all(o in attempted for o in range(stable))
    assert all(o in attempted for s, e in ranges for o in range(s, e + 1))


def test_sidecar_commits_go_on_when_the_coordinator_stops(kafka_cluster, proxy_factory, topic_factory):
    from harness.commit_client import coordinator_address
    from harness.wait import wait_until

    from .conftest import free_ports

    nodes = sorted(kafka_cluster.nodes, key=lambda node: node.node_id)
    ports = free_ports(len(nodes))
    mapping = ",".join(f"{node.node_id}@127.0.0.1:{port}" for node, port in zip(nodes, ports))
    sidecars = {
        node.node_id: proxy_factory(kafka_cluster, bootstrap=f"127.0.0.1:{node.port}", listen_port=port,
                                    topology="sidecar", sidecar_node_addresses=mapping)
        for node, port in zip(nodes, ports)
    }
    topic = topic_factory(kafka_cluster, partitions=1, replication_factor=3)
    group = _group()
    _, real_port = coordinator_address(kafka_cluster.bootstrap_servers, group)
    coordinator = next(node.node_id for node in nodes if node.port == real_port)
    others = [node_id for node_id in sidecars if node_id != coordinator]
    with CommitClient(sidecars[others[0]].bootstrap_servers, group) as client:
        assert client.client.sock.getpeername()[1] == sidecars[coordinator].port
        assert client.commit(topic, {0: [(0, 9), (20, 29)]}) == {0: (0, 10)}
        assert client.commit(topic, {0: [(40, 49)]}) == {0: (0, 10)}
    kafka_cluster.stop_node(coordinator)

    def commit_elsewhere():
        with CommitClient(sidecars[others[1]].bootstrap_servers, group, timeout=10) as client:
            result = client.commit(topic, {0: [(10, 14), (60, 69)]})
            assert result[0][0] == 0, result
            return result[0][1]

    assert wait_until(commit_elsewhere, timeout=60, interval=0.5, what="a commit after the coordinator stopped") == 15
    with CommitClient(sidecars[others[0]].bootstrap_servers, group) as client:
        assert client.client.sock.getpeername()[1] != sidecars[coordinator].port
        assert client.fetch(topic, [0]) == {0: (15, [(20, 29), (40, 49), (60, 69)])}


def test_a_second_instance_writing_between_two_commits_is_detected_and_merged(kafka, proxy, proxy_factory,
                                                                                topic_factory):
    """Instance A computes from what it read; B writes the same keys in between. A's next
    commit must answer exactly the merged state (both acknowledged commits present), and
    the coordinator must hold that S, also when A's stale state would have claimed more.
    Having met B's writes, A reads the log's end before it plans the group's commits: a
    write of B in between is then counted before A's OffsetCommit, which needs no second
    one to correct it."""
    from harness.wait import wait_until

    other = proxy_factory(kafka)
    topic = topic_factory(kafka, partitions=4)
    group = _group()

    def foreign_writes() -> float:
        return proxy.metric("kafka_proxy_individual_commit_foreign_writes_total")

    def corrections() -> float:
        return proxy.metric("kafka_proxy_individual_commit_corrections_total")

    with CommitClient(proxy.bootstrap_servers, group) as a, CommitClient(other.bootstrap_servers, group) as b:
        assert a.commit(topic, {0: [(0, 4)], 1: [(0, 0)], 2: [(0, 4), (8, 9)], 3: [(0, 4)]}) == \
            {0: (0, 5), 1: (0, 1), 2: (0, 5), 3: (0, 5)}
        # The same state through A again: A's memory is current, no foreign write seen.
        assert a.fetch(topic, [0, 1, 2]) == {0: (5, []), 1: (1, []), 2: (5, [(8, 9)])}
        seen = foreign_writes()
        # B writes all four: S moves on (0), a range is added above S (1), a plain commit
        # resets S below what A holds (2), the offsets are deleted (3).
        assert b.commit(topic, {0: [(5, 9)], 1: [(10, 10)]}) == {0: (0, 10), 1: (0, 1)}
        assert b.commit(topic, {2: 2}) == {2: (0, -1)}
        with RawClient(*b.client.sock.getpeername()[:2]) as raw:
            cls = messages.body_class(ApiKey.OFFSET_DELETE, "request")
            deleted = raw.call(ApiKey.OFFSET_DELETE, 0, group_id=group, topics=[cls.OffsetDeleteRequestTopic(
                name=topic, partitions=[cls.OffsetDeleteRequestPartition(partition_index=3)])])
            assert deleted.error_code == 0
        assert b.fetch(topic, [0, 1, 2, 3]) == {0: (10, []), 1: (1, [(10, 10)]), 2: (2, []), 3: (-1, [])}
        # A's stale memory would give S 5 (0), lose [10-10] (1), claim S 10 (2) and S 5 (3).
        assert a.commit(topic, {0: [(20, 29)], 1: [(20, 20)], 2: [(5, 7)], 3: [(10, 12)]}) == \
            {0: (0, 10), 1: (0, 1), 2: (0, 2), 3: (0, 0)}
        expected = {0: (10, [(20, 29)]), 1: (1, [(10, 10), (20, 20)]), 2: (2, [(5, 7)]), 3: (0, [(10, 12)])}
        assert a.fetch(topic, [0, 1, 2, 3]) == expected
        assert b.fetch(topic, [0, 1, 2, 3]) == expected
        assert foreign_writes() - seen == 4
        corrected = corrections()
        assert corrected >= 1  # S of partition 0 moved from A's stale 5 to 10 by B's write
        # Back to normal: A's memory is current again.
        assert a.commit(topic, {0: [(10, 19)]}) == {0: (0, 30)}
        assert foreign_writes() - seen == 4
        # B moves S of partition 0 again; A's commit reads it first: S 50, no correction.
        assert b.commit(topic, {0: [(30, 39)]}) == {0: (0, 40)}
        assert a.commit(topic, {0: [(40, 49)]}) == {0: (0, 50)}
        assert foreign_writes() - seen == 4
        assert corrections() == corrected
    with CommitClient(kafka.bootstrap_servers, group) as direct:
        assert direct.fetch(topic, [0, 1, 2, 3]) == {0: (50, []), 1: (1, []), 2: (2, []), 3: (0, [])}
    # A third instance that starts now rebuilds exactly the same from the log.
    third = proxy_factory(kafka)
    with CommitClient(third.bootstrap_servers, group) as c:
        assert wait_until(lambda: c.fetch(topic, [0, 1, 2, 3]), timeout=30, what="state from a fresh instance") == \
            {0: (50, []), 1: (1, [(10, 10), (20, 20)]), 2: (2, [(5, 7)]), 3: (0, [(10, 12)])}


def test_an_offset_served_from_the_coordinator_is_never_committed_back_below(kafka, proxy, proxy_factory,
                                                                            topic_factory):
    """An instance killed between the broker's acceptance of a range commit and its log
    write leaves the coordinator at S' and the log at the state before. The member starts
    again through another instance, whose OffsetFetch serves S' (the larger of the two), so
    it resumes there and never commits the offsets below S' again. The next range commit,
    planned from the log, must not move the coordinator back below S': nobody would close
    that gap any more, and S would stay below it for good (before the OffsetFetch wrote S'
    into the log, a group of key-range members was seen stuck so for a whole run)."""
    other = proxy_factory(kafka)
    topic = topic_factory(kafka, partitions=1)
    group = _group()
    with CommitClient(proxy.bootstrap_servers, group) as a:
        assert a.commit(topic, {0: [(0, 4), (10, 14)]}) == {0: (0, 5)}
    # What instance A's forward of a commit of [5, 9] and [15, 19] left before A died: S' = 20
    # at the coordinator, nothing in the log.
    with CommitClient(kafka.bootstrap_servers, group) as direct:
        assert direct.commit(topic, {0: 20}) == {0: (0, -1)}
    with CommitClient(other.bootstrap_servers, group) as b:
        assert b.fetch(topic, [0]) == {0: (20, [])}  # where the member starting again resumes
        assert b.commit(topic, {0: [(22, 24)]}) == {0: (0, 20)}  # another member, from the log
        with CommitClient(kafka.bootstrap_servers, group) as direct:
            assert direct.fetch(topic, [0]) == {0: (20, [])}
        assert b.commit(topic, {0: [(20, 21)]}) == {0: (0, 25)}
    for instance in (proxy, other, proxy_factory(kafka)):  # a fresh instance rebuilds the same from the log
        with CommitClient(instance.bootstrap_servers, group) as client:
            assert client.fetch(topic, [0]) == {0: (25, [])}
    with CommitClient(kafka.bootstrap_servers, group) as direct:
        assert direct.fetch(topic, [0]) == {0: (25, [])}


def test_two_instances_committing_one_partition_at_once_lose_no_acknowledged_range(kafka, proxy, proxy_factory,
                                                                                    topic_factory):
    """Commits to the same partition through two instances at the same time: whatever the
    interleaving of their log writes, every acknowledged commit is in the final state and
    nothing that no one committed is. The per-key lock serialises one instance only: a
    write by the other between one's read of the log and its own write is shadowed by it,
    and must be merged again before the commit is acknowledged (before that was done,
    about a third of these 300 commits were lost)."""
    other = proxy_factory(kafka)
    topic = topic_factory(kafka, partitions=1)
    group = _group()
    per_client = 150
    acked: dict[int, list[int]] = {0: [], 1: []}
    clients = [CommitClient(proxy.bootstrap_servers, group), CommitClient(other.bootstrap_servers, group)]

    def worker(index: int) -> None:
        for k in range(per_client):
            offset = 1 + 2 * k + index  # never 0: S stays 0 and every range is kept
            result = clients[index].commit(topic, {0: [(offset, offset)]})
            if result[0][0] == 0:
                acked[index].append(offset)

    in_threads(worker, 2)
    for client in clients:
        client.close()
    assert len(acked[0]) + len(acked[1]) > per_client  # most commits were acknowledged
    third = proxy_factory(kafka)
    with CommitClient(third.bootstrap_servers, group) as client:
        ((stable, ranges),) = client.fetch(topic, [0]).values()
    state = CommitState(stable, tuple(ranges))
    missing = [o for o in acked[0] + acked[1] if not state.processed(o)]
    assert not missing, f"acknowledged but lost: {missing[:20]} ({len(missing)})"
    assert stable == 0 and all(1 <= start and end <= 2 * per_client for start, end in ranges)


def test_two_instances_moving_s_together_leave_s_at_the_coordinator(kafka, proxy, proxy_factory, topic_factory):
    """Through two instances at once, one client commits the even offsets and the other
    the odd ones, so S moves only as both progress and every merge of the other's writes
    changes S: the state must end at S = every offset, with no range left, and the
    coordinator (corrected whenever a merge moved S) must hold the same S."""
    other = proxy_factory(kafka)
    topic = topic_factory(kafka, partitions=1)
    group = _group()
    per_client = 100
    refused: list = []
    clients = [CommitClient(proxy.bootstrap_servers, group), CommitClient(other.bootstrap_servers, group)]

    def worker(index: int) -> None:
        for k in range(per_client):
            offset = 2 * k + index
            for _ in range(20):  # a retriable refusal is committed again, as a client would
                error, _ = clients[index].commit(topic, {0: [(offset, offset)]})[0]
                if error == 0:
                    break
                refused.append(error)
            else:
                raise AssertionError(f"offset {offset} refused 20 times: {refused[-20:]}")

    in_threads(worker, 2)
    assert set(refused) <= {15}, refused  # COORDINATOR_NOT_AVAILABLE only (retriable)
    for client in clients:
        client.close()
    third = proxy_factory(kafka)
    with CommitClient(third.bootstrap_servers, group) as client:
        assert client.fetch(topic, [0]) == {0: (2 * per_client, [])}
    with CommitClient(kafka.bootstrap_servers, group) as direct:
        assert direct.fetch(topic, [0]) == {0: (2 * per_client, [])}


def test_a_plain_commit_through_another_instance_resets_the_state(kafka, proxy, proxy_factory, topic_factory):
    """The second instance already uses the log (for another group on another log
    partition) but has never read this group's: its plain commit still resets the state
    the first instance wrote."""
    from harness.commit_client import commit_body, coordinator_address
    from proxy.protocol.groups import group_partition

    topic = topic_factory(kafka)
    group = _group()
    other = next(g for g in (_group() for _ in range(1000)) if group_partition(g, 4) != group_partition(group, 4))  # the test brokers have 4
    second = proxy_factory(kafka)
    with CommitClient(proxy.bootstrap_servers, group) as first_client:
        assert first_client.commit(topic, {0: [(0, 4), (8, 9)]}) == {0: (0, 5)}
    with CommitClient(second.bootstrap_servers, other) as other_client:
        assert other_client.commit(topic, {0: [(0, 0)]}) == {0: (0, 1)}
    # a bare commit, with no OffsetFetch before it (which would read the log partition)
    with RawClient(*coordinator_address(second.bootstrap_servers, group)) as raw:
        response = raw.request(ApiKey.OFFSET_COMMIT, 9, commit_body(group, topic, {0: 2}))  # a rewind
        assert [p.error_code for t in response.topics for p in t.partitions] == [0]
    with CommitClient(second.bootstrap_servers, group) as second_client:
        assert second_client.fetch(topic, [0]) == {0: (2, [])}
    with CommitClient(proxy.bootstrap_servers, group) as first_client:
        assert first_client.fetch(topic, [0]) == {0: (2, [])}


# -- the bound on a partition's state (max.individual.commit.ranges.held) ---------------------------
INVALID_COMMIT_OFFSET_SIZE = 28


def _refused_for_the_bound(process) -> float:
    return process.metric("kafka_proxy_individual_commit_refused_total", reason="ranges_held")


def test_commits_past_the_state_bound_are_refused_and_closing_the_gaps_goes_through(kafka, proxy_factory,
                                                                                    topic_factory):
    """With max.individual.commit.ranges.held=3 a partition's state holds at most three
    ranges: a commit that would leave a fourth gets INVALID_COMMIT_OFFSET_SIZE and changes
    nothing (other partitions of the request go through); commits that close gaps pass, and
    the committed offset the broker holds moves with them."""
    bounded = proxy_factory(kafka, max_individual_commit_ranges_held="3", metrics_port="0")
    topic = topic_factory(kafka, partitions=2)
    group = _group()
    with CommitClient(bounded.bootstrap_servers, group) as client:
        assert client.commit(topic, {0: [(2, 2), (4, 4), (6, 6)]}) == {0: (0, 0)}  # at the bound
        assert client.commit(topic, {0: [(8, 8)], 1: [(0, 0), (2, 2)]}) == \
            {0: (INVALID_COMMIT_OFFSET_SIZE, -1), 1: (0, 1)}
        assert client.fetch(topic, [0, 1]) == {0: (0, [(2, 2), (4, 4), (6, 6)]), 1: (1, [(2, 2)])}
        # Closing a gap makes room: [2-4], [6], [8].
        assert client.commit(topic, {0: [(3, 3), (8, 8)]}) == {0: (0, 0)}
        assert client.commit(topic, {0: [(10, 10), (12, 12)]}) == {0: (INVALID_COMMIT_OFFSET_SIZE, -1)}
        assert client.fetch(topic, [0]) == {0: (0, [(2, 4), (6, 6), (8, 8)])}
        assert _refused_for_the_bound(bounded) == 2
        # The lagging share catches up: every gap closes, S moves past them all.
        assert client.commit(topic, {0: [(0, 1), (5, 5), (7, 7), (9, 10)]}) == {0: (0, 11)}
        assert client.fetch(topic, [0]) == {0: (11, [])}
    with CommitClient(kafka.bootstrap_servers, group) as direct:
        assert direct.fetch(topic, [0, 1]) == {0: (11, []), 1: (1, [])}
    log = bounded.log_text()
    assert f"group={group} topic={topic} partition=0" in log and "max.individual.commit.ranges.held" in log
    assert "4 ranges held after the commit (now 3); at most 3" in log


def test_a_transactional_commit_past_the_state_bound_is_refused(kafka, proxy_factory, topic_factory):
    """TxnOffsetCommit with offset ranges: the same bound, the same error, nothing of the
    refused partition enters the transaction; a commit closing the gaps is accepted and,
    once committed, S reaches the coordinator."""
    from harness.txn_client import Conn
    from harness.wait import wait_until
    from tests.integration.test_txn_virtual_wire import NONE, Member, _committed_ranges, _range_commit

    bounded = proxy_factory(kafka, max_individual_commit_ranges_held="3", metrics_port="0")
    topic = topic_factory(kafka, partitions=1)
    group = _group()
    admin = Conn(bounded.bootstrap_servers, name="admin")
    generation, member_id = admin.join_classic(group, topic)
    member = Member(bounded.bootstrap_servers, group, generation, member_id, version=5)
    try:
        assert _range_commit(member.conn, member, topic, [(2, 2), (4, 4), (6, 6)]) == NONE
        assert member.end(True) == NONE
        wait_until(lambda: _committed_ranges(admin, group, topic, stable=True) == (NONE, 0, [(2, 2), (4, 4), (6, 6)]),
                   timeout=15, what="the first transaction's ranges")
        assert _range_commit(member.conn, member, topic, [(8, 8)]) == INVALID_COMMIT_OFFSET_SIZE
        assert _refused_for_the_bound(bounded) == 1
        # In the same transaction, the gaps close: everything below 9 is processed.
        assert _range_commit(member.conn, member, topic, [(0, 1), (3, 3), (5, 5), (7, 8)]) == NONE
        assert member.end(True) == NONE
        wait_until(lambda: _committed_ranges(admin, group, topic, stable=True) == (NONE, 9, []), timeout=15,
                   what="the gaps closed")
        with Conn(kafka.bootstrap_servers, name="direct") as direct:
            wait_until(lambda: direct.offset_fetch({group: [(topic, 0)]}, require_stable=True)[group][(topic, 0)][0]
                       == 9, timeout=15, what="S reaching the coordinator")
    finally:
        member.close()
        admin.close()
