"""Individual-commit helpers over RawClient: range commits and fetches, for tests and the
benchmark. Speaks the tag-10000 extensions of docs/wire-contract.md#3-wire-extensions."""

from __future__ import annotations

from harness.raw_client import RawClient
from harness.wait import wait_until
from proxy.protocol import messages
from proxy.protocol.constants import ErrorCode
from proxy.protocol.messages import ApiKey

COMMIT_VERSION = 9
FETCH_VERSION = 9

_C = messages.body_class(ApiKey.OFFSET_COMMIT, "request")
_F = messages.body_class(ApiKey.OFFSET_FETCH, "request")


def coordinator_address(bootstrap: str, group: str, timeout: float = 60.0) -> tuple[str, int]:
    """The group coordinator's address as ``bootstrap`` gives it (retried while the
    coordinator is not available yet, e.g. __consumer_offsets being created or moving)."""

    def find():
        with RawClient.connect(bootstrap) as client:
            response = client.call(ApiKey.FIND_COORDINATOR, 4, key_type=0, coordinator_keys=[group])
        (entry,) = response.coordinators
        if entry.error_code:
            raise AssertionError(f"FindCoordinator error {entry.error_code}")
        return entry.host, entry.port

    return wait_until(find, timeout=timeout, what=f"coordinator of {group}")


def commit_body(group: str, topic: str, partitions: dict, *, generation: int = -1, member: str = ""):
    """``partitions``: partition -> list of (start, end) ranges, or an int for a plain commit."""
    parts = []
    for partition, what in partitions.items():
        if isinstance(what, int):
            parts.append(_C.OffsetCommitRequestPartition(partition_index=partition, committed_offset=what))
        else:
            parts.append(_C.OffsetCommitRequestPartition(
                partition_index=partition, committed_offset=-1,
                offset_ranges=[_C.OffsetRange(start=s, end=e) for s, e in what]))
    return messages.new_body(ApiKey.OFFSET_COMMIT, COMMIT_VERSION, "request", group_id=group,
                             generation_id_or_member_epoch=generation, member_id=member,
                             topics=[_C.OffsetCommitRequestTopic(name=topic, partitions=parts)])


class CommitClient:
    """A connection to a group's coordinator (through whatever ``bootstrap`` is)."""

    def __init__(self, bootstrap: str, group: str, timeout: float = 30.0) -> None:
        host, port = coordinator_address(bootstrap, group)
        self.group = group
        self.client = RawClient(host, port, timeout=timeout)
        # A coordinator still loading its __consumer_offsets partition answers
        # COORDINATOR_LOAD_IN_PROGRESS: wait until it answers this group.
        wait_until(self._ready, timeout=60, what=f"coordinator of {group} loaded")

    def _ready(self) -> bool:
        body = messages.new_body(ApiKey.OFFSET_FETCH, FETCH_VERSION, "request",
                                 groups=[_F.OffsetFetchRequestGroup(group_id=self.group, topics=[])])
        response = self.client.request(ApiKey.OFFSET_FETCH, FETCH_VERSION, body)
        return all(group.error_code == ErrorCode.NONE for group in response.groups)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> CommitClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def commit(self, topic: str, partitions: dict, **kwargs) -> dict[int, tuple[int, int]]:
        """partition -> (error_code, stable_offset)."""
        body = commit_body(self.group, topic, partitions, **kwargs)
        response = self.client.request(ApiKey.OFFSET_COMMIT, COMMIT_VERSION, body)
        return {p.partition_index: (p.error_code, p.stable_offset) for t in response.topics for p in t.partitions}

    def fetch(self, topic: str, partitions, version: int = FETCH_VERSION) -> dict[int, tuple[int, list]]:
        """partition -> (committed offset, committed ranges)."""
        if version >= 8:
            body = messages.new_body(ApiKey.OFFSET_FETCH, version, "request", groups=[_F.OffsetFetchRequestGroup(
                group_id=self.group, topics=[_F.OffsetFetchRequestTopics(name=topic,
                                                                         partition_indexes=list(partitions))])])
            response = self.client.request(ApiKey.OFFSET_FETCH, version, body)
            (group,) = response.groups
            assert group.error_code == ErrorCode.NONE, group.error_code
            topics = group.topics
        else:
            body = messages.new_body(ApiKey.OFFSET_FETCH, version, "request", group_id=self.group, topics=[
                _F.OffsetFetchRequestTopic(name=topic, partition_indexes=list(partitions))])
            response = self.client.request(ApiKey.OFFSET_FETCH, version, body)
            assert response.error_code == ErrorCode.NONE, response.error_code
            topics = response.topics
        out = {}
        for t in topics:
            for p in t.partitions:
                assert p.error_code == ErrorCode.NONE, p.error_code
                out[p.partition_index] = (p.committed_offset,
                                          [(r.start, r.end) for r in p.committed_range_offsets or ()])
        return out
