"""Transactional commits of virtual partitions, on the wire, through the proxy to a real
broker (docs/individual-commit.md, "Transactional commits"; DESIGN section 11).

Raw Kafka requests (``harness.txn_client.Conn``) stand for two members of one group
that read shares 0 and 1 of ``T.kr2``: each commits its share inside its own transaction
without waiting for the other; RequireStable answers UNSTABLE_OFFSET_COMMIT while a
share's transaction is open; an abort leaves nothing, a commit makes W(i) visible and,
once both shares have a watermark, S reaches the coordinator; zombies are refused.
Both transaction protocols: version 2 (TxnOffsetCommit v5 alone, as the Java client) and
version 1 (AddOffsetsToTxn, then TxnOffsetCommit v3, as librdkafka).
"""

from __future__ import annotations

import uuid

import pytest

from harness.txn_client import V_END_TXN_TV1, Conn
from harness.wait import wait_until
from proxy.commits.watermarks import per_share
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import ErrorCode
from tests.integration.test_virtual_commit_log import _log_states

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]

UNSTABLE = int(ErrorCode.UNSTABLE_OFFSET_COMMIT)
NONE = int(ErrorCode.NONE)


class Member:
    """One transactional producer on its own connection through the proxy, committing as
    the group's (only) member of the given generation."""

    def __init__(self, bootstrap: str, group: str, generation: int, member_id: str, *, version: int) -> None:
        self.conn = Conn(bootstrap, name=f"member-{uuid.uuid4().hex[:6]}")
        self.group, self.generation, self.member_id, self.version = group, generation, member_id, version
        self.txn = f"txn-{uuid.uuid4().hex[:8]}"
        body = self.conn.init_pid(self.txn)
        assert body.error_code == NONE, body
        self.pid, self.epoch = body.producer_id, body.producer_epoch

    def commit_offsets(self, offsets: dict[tuple[str, int], int], metadata: str = "") -> dict[tuple[str, int], int]:
        if self.version < 5:  # version 1 protocol: the client adds the group first
            assert self.conn.add_offsets(self.txn, self.pid, self.epoch, self.group) == NONE
        return self.conn.txn_offset_commit(self.txn, self.pid, self.epoch, self.group, offsets, version=self.version,
                                           generation=self.generation, member=self.member_id, metadata=metadata)

    def end(self, commit: bool) -> int:
        body = self.conn.end_txn(self.txn, self.pid, self.epoch, commit,
                                 **({} if self.version >= 5 else {"version": V_END_TXN_TV1}))
        if self.version >= 5 and body.error_code == NONE:
            self.epoch = body.producer_epoch  # version 2 bumps the epoch at every transaction end
        return body.error_code

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def setup(kafka, proxy, topic_factory):
    topic = topic_factory(kafka, partitions=1)
    group = f"txn-wire-{uuid.uuid4().hex[:8]}"
    admin = Conn(proxy.bootstrap_servers, name="admin")
    generation, member_id = admin.join_classic(group, f"{topic}.kr2")
    yield topic, group, generation, member_id, admin
    admin.close()


def _fetch(conn: Conn, group: str, topic: str, partitions: list[int], *, stable: bool):
    answer = conn.offset_fetch({group: [(f"{topic}.kr2", p) for p in partitions]}, require_stable=stable)
    return {p: answer[group][(f"{topic}.kr2", p)] for p in partitions}


def _settled(conn: Conn, group: str, topic: str, partitions: list[int]):
    """OffsetFetch with RequireStable, asked until no share answers UNSTABLE_OFFSET_COMMIT."""
    found = {}

    def stable() -> bool:
        found.update(_fetch(conn, group, topic, partitions, stable=True))
        return all(v[2] != UNSTABLE for v in found.values())

    wait_until(stable, timeout=15, what=lambda: f"shares still unstable: {found}")
    return found


@pytest.mark.parametrize("version", [5, 3], ids=["txn-v2", "txn-v1"])
def test_two_members_commit_their_shares_in_open_transactions_without_waiting(setup, proxy, kafka, version):
    topic, group, generation, member_id, admin = setup
    a = Member(proxy.bootstrap_servers, group, generation, member_id, version=version)
    b = Member(proxy.bootstrap_servers, group, generation, member_id, version=version)
    try:
        # Both transactions open at once, one share each: neither waits for the other.
        assert a.commit_offsets({(f"{topic}.kr2", 0): 10}, metadata="a-meta") == {(f"{topic}.kr2", 0): NONE}
        assert b.commit_offsets({(f"{topic}.kr2", 1): 7}) == {(f"{topic}.kr2", 1): NONE}
        # Pending: RequireStable says so per share; without it, the last committed state.
        pending = _fetch(admin, group, topic, [0, 1], stable=True)
        assert [pending[p][2] for p in (0, 1)] == [UNSTABLE, UNSTABLE]
        before = _fetch(admin, group, topic, [0, 1], stable=False)
        assert [(before[p][0], before[p][2]) for p in (0, 1)] == [(-1, NONE), (-1, NONE)]

        # A commits, B aborts: only share 0 moves, and share 0 gets its metadata back.
        assert a.end(True) == NONE
        assert b.end(False) == NONE
        after = _settled(admin, group, topic, [0, 1])
        assert after[0] == (10, "a-meta", NONE)
        assert after[1][0] == -1 and after[1][2] == NONE

        # B commits share 1 in a new transaction: both shares have a watermark, so
        # S = min(10, 12) = 10 reaches the coordinator of the real partition.
        assert b.commit_offsets({(f"{topic}.kr2", 1): 12}) == {(f"{topic}.kr2", 1): NONE}
        assert b.end(True) == NONE
        after = _settled(admin, group, topic, [0, 1])
        assert [after[p][0] for p in (0, 1)] == [10, 12]
        with Conn(kafka.bootstrap_servers, name="direct") as direct:
            wait_until(lambda: direct.offset_fetch({group: [(topic, 0)]}, require_stable=True)[group][(topic, 0)][0]
                       == 10, timeout=15, what="S of the real partition reaching the coordinator")
        # ... and the committed watermarks are folded into the log's record (which,
        # compacted, outlives the shadow groups' offsets).
        state = _log_states(kafka.bootstrap_servers, group)[(topic, 0)]
        assert state.stable == 10 and per_share(state.marks) == {2: [10, 12]}
    finally:
        a.close()
        b.close()


def test_a_fenced_producer_and_a_stale_generation_change_nothing(setup, proxy):
    topic, group, generation, member_id, admin = setup
    a = Member(proxy.bootstrap_servers, group, generation, member_id, version=5)
    try:
        assert a.commit_offsets({(f"{topic}.kr2", 0): 5}) == {(f"{topic}.kr2", 0): NONE}
        assert a.end(True) == NONE
        assert _settled(admin, group, topic, [0])[0][0] == 5

        # A new instance with the same transactional id fences the old one: its late
        # commit is refused by the broker and nothing moves.
        zombie_epoch = a.epoch
        fresh = a.conn.init_pid(a.txn)
        assert fresh.error_code == NONE and fresh.producer_epoch > zombie_epoch
        refused = a.conn.txn_offset_commit(a.txn, a.pid, zombie_epoch, group, {(f"{topic}.kr2", 0): 50}, version=5,
                                           generation=generation, member=member_id)
        assert refused[(f"{topic}.kr2", 0)] in (int(ErrorCode.INVALID_PRODUCER_EPOCH),
                                                int(ErrorCode.PRODUCER_FENCED)), refused
        # A member of an old generation: the carrier is refused (KIP-447), the client aborts.
        a.epoch = fresh.producer_epoch
        stale = a.conn.txn_offset_commit(a.txn, a.pid, a.epoch, group, {(f"{topic}.kr2", 0): 60}, version=5,
                                         generation=generation - 1, member=member_id)
        assert stale[(f"{topic}.kr2", 0)] == int(ErrorCode.ILLEGAL_GENERATION), stale
        assert a.end(False) == NONE
        assert _settled(admin, group, topic, [0])[0][0] == 5
    finally:
        a.close()


def test_shadow_groups_are_hidden_from_listings_and_deleted_with_their_group(setup, proxy, kafka):
    topic, group, generation, member_id, admin = setup
    a = Member(proxy.bootstrap_servers, group, generation, member_id, version=5)
    try:
        assert a.commit_offsets({(f"{topic}.kr2", 0): 4, (f"{topic}.kr2", 1): 6}) == \
            {(f"{topic}.kr2", 0): NONE, (f"{topic}.kr2", 1): NONE}
        assert a.end(True) == NONE
        assert [v[0] for v in _settled(admin, group, topic, [0, 1]).values()] == [4, 6]
    finally:
        a.close()
    with Conn(kafka.bootstrap_servers, name="direct") as direct:
        # the transaction's follow-up has moved S (min of the shares' 4 and 6)
        wait_until(lambda: direct.offset_fetch({group: [(topic, 0)]}, require_stable=True)[group][(topic, 0)][0]
                   == 4, timeout=15, what="S reaching the coordinator")
        shadows = [g[0] for g in direct.list_groups() if g[0].startswith(f"{group}.kr2/")]
    assert len(shadows) == 2  # the broker has them ...
    listed = [g[0] for g in admin.list_groups()]
    assert group in listed and not any(name in listed for name in shadows)  # ... the proxy's clients do not see them
    assert admin.leave_group(group, member_id) == NONE
    assert admin.delete_groups([group]) == {group: NONE}
    with Conn(kafka.bootstrap_servers, name="direct") as direct:
        assert not [g[0] for g in direct.list_groups() if g[0].startswith(f"{group}.kr2/")]
    # A group created again under the name starts from nothing.
    assert [v[0] for v in _fetch(admin, group, topic, [0, 1], stable=True).values()] == [-1, -1]


# -- offset ranges inside transactions (extension clients, individual.commit version 2) ----------


def _range_commit(conn: Conn, member: Member, topic: str, ranges: list[tuple[int, int]]) -> int:
    c = conn.cls(ApiKey.TXN_OFFSET_COMMIT)
    if member.version < 5:
        assert conn.add_offsets(member.txn, member.pid, member.epoch, member.group) == NONE
    body = conn.call(ApiKey.TXN_OFFSET_COMMIT, member.version, transactional_id=member.txn, group_id=member.group,
                     producer_id=member.pid, producer_epoch=member.epoch, generation_id=member.generation,
                     member_id=member.member_id, group_instance_id=None, topics=[c.TxnOffsetCommitRequestTopic(
                         name=topic, partitions=[c.TxnOffsetCommitRequestPartition(
                             partition_index=0, committed_offset=-1, committed_leader_epoch=-1,
                             committed_metadata="", offset_ranges=[c.OffsetRange(start=s, end=e) for s, e in ranges])])])
    (answer,) = [p.error_code for t in body.topics for p in t.partitions]
    return answer


def _committed_ranges(conn: Conn, group: str, topic: str, *, stable: bool):
    c = conn.cls(ApiKey.OFFSET_FETCH)
    body = conn.call(ApiKey.OFFSET_FETCH, 9, require_stable=stable, groups=[c.OffsetFetchRequestGroup(
        group_id=group, member_id=None, member_epoch=-1,
        topics=[c.OffsetFetchRequestTopics(name=topic, partition_indexes=[0])])])
    (part,) = body.groups[0].topics[0].partitions
    return part.error_code, part.committed_offset, [(r.start, r.end) for r in part.committed_range_offsets or ()]


@pytest.mark.parametrize("version", [5, 3], ids=["txn-v2", "txn-v1"])
def test_members_commit_interleaved_offset_ranges_in_their_own_transactions(kafka, proxy, topic_factory, version):
    """Two members of one partition, interleaved offsets (as key ranges make them): each
    commits inside its own open transaction without waiting; an abort leaves nothing; the
    committed ranges are folded into the log and S moves as the gaps close."""
    topic = topic_factory(kafka, partitions=1)
    group = f"txn-ranges-{uuid.uuid4().hex[:8]}"
    admin = Conn(proxy.bootstrap_servers, name="admin")
    generation, member_id = admin.join_classic(group, topic)
    a = Member(proxy.bootstrap_servers, group, generation, member_id, version=version)
    b = Member(proxy.bootstrap_servers, group, generation, member_id, version=version)
    try:
        assert _range_commit(a.conn, a, topic, [(0, 0), (2, 2), (4, 4)]) == NONE
        assert _range_commit(b.conn, b, topic, [(1, 1), (3, 3)]) == NONE
        assert _committed_ranges(admin, group, topic, stable=True)[0] == UNSTABLE
        assert b.end(False) == NONE  # B's work is to be redone
        assert a.end(True) == NONE

        def answered(expected):
            found = []

            def check() -> bool:
                found[:] = [_committed_ranges(admin, group, topic, stable=True)]
                return found[0] == expected
            wait_until(check, timeout=15, what=lambda: f"committed ranges {found} (expected {expected})")

        answered((NONE, 1, [(2, 2), (4, 4)]))  # A's ranges only: S is 1, since offset 1 is B's
        # B redoes its work in a new transaction; both members' ranges close every gap.
        assert _range_commit(b.conn, b, topic, [(1, 1), (3, 3)]) == NONE
        assert b.end(True) == NONE
        answered((NONE, 5, []))
        with Conn(kafka.bootstrap_servers, name="direct") as direct:
            wait_until(lambda: direct.offset_fetch({group: [(topic, 0)]}, require_stable=True)[group][(topic, 0)][0]
                       == 5, timeout=15, what="S reaching the coordinator")
    finally:
        a.close()
        b.close()
        admin.close()
