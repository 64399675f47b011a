"""ClusterClient remembers each group's coordinator: a commit corrected after another
instance's write, or a read of committed offsets, goes straight to it, and the address is
dropped as soon as the coordinator fails or says it moved (the next request asks again)."""

from __future__ import annotations

import trio

from proxy.commits.cluster import ClusterClient, CommitLogError
from proxy.net.broker_connection import BrokerConnectionError
from proxy.pipeline.cluster import ClusterView
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.constants import ErrorCode

_COMMIT = messages.body_class(ApiKey.OFFSET_COMMIT, "response")
_FIND = messages.body_class(ApiKey.FIND_COORDINATOR, "response")


class _Pool:
    """Answers FindCoordinator with ``coordinator`` and OffsetCommit with ``commit_code``
    (or fails it with ``fail``), counting the FindCoordinator requests."""

    def __init__(self) -> None:
        self.coordinator = ("127.0.0.1", 9001)
        self.finds = 0
        self.commit_code = 0
        self.fail = False
        self.commits_at: list[tuple[str, int]] = []

    async def request_any(self, api_key, version, body, *, timeout=None):
        assert api_key == ApiKey.FIND_COORDINATOR
        self.finds += 1
        host, port = self.coordinator
        return _FIND(coordinators=[_FIND.Coordinator(key=body.coordinator_keys[0], node_id=1, host=host, port=port,
                                                     error_code=0)])

    async def request(self, address, api_key, version, body, *, timeout=None):
        assert api_key == ApiKey.OFFSET_COMMIT
        self.commits_at.append(address)
        if self.fail:
            raise BrokerConnectionError("connection reset")
        return _COMMIT(topics=[_COMMIT.OffsetCommitResponseTopic(name="t", partitions=[
            _COMMIT.OffsetCommitResponsePartition(partition_index=0, error_code=self.commit_code)])])


def _commit(client: ClusterClient) -> dict:
    return trio.run(client.commit_offsets, "g", 1, "m", None, {("t", 0): 5})


def test_the_coordinator_is_asked_once_while_it_answers():
    pool = _Pool()
    client = ClusterClient(pool, ClusterView())  # type: ignore[arg-type]
    assert _commit(client) == {("t", 0): 0}
    assert _commit(client) == {("t", 0): 0}
    assert pool.finds == 1
    assert pool.commits_at == [("127.0.0.1", 9001)] * 2


def test_a_coordinator_that_moved_is_asked_for_again():
    pool = _Pool()
    client = ClusterClient(pool, ClusterView())  # type: ignore[arg-type]
    _commit(client)
    pool.commit_code = ErrorCode.NOT_COORDINATOR
    pool.coordinator = ("127.0.0.1", 9002)
    assert _commit(client) == {("t", 0): ErrorCode.NOT_COORDINATOR}  # the caller's retry finds the new one
    pool.commit_code = 0
    assert _commit(client) == {("t", 0): 0}
    assert pool.finds == 2
    assert pool.commits_at[-1] == ("127.0.0.1", 9002)


def test_a_coordinator_that_fails_is_asked_for_again():
    pool = _Pool()
    client = ClusterClient(pool, ClusterView())  # type: ignore[arg-type]
    _commit(client)
    pool.fail = True
    try:
        _commit(client)
    except CommitLogError as exc:
        assert "connection reset" in str(exc)
    else:
        raise AssertionError("a failed OffsetCommit must raise")
    pool.fail = False
    _commit(client)
    assert pool.finds == 2


def test_other_errors_keep_the_coordinator():
    pool = _Pool()
    client = ClusterClient(pool, ClusterView())  # type: ignore[arg-type]
    pool.commit_code = ErrorCode.ILLEGAL_GENERATION
    _commit(client)
    _commit(client)
    assert pool.finds == 1
