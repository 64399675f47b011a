"""A virtual topic id handed out by one proxy instance, used at another.

In the sidecar topology every broker has its own proxy, and a client asks whichever it
likes for Metadata but fetches from the partition leader's sidecar; after a restart a proxy
has handed out nothing yet while its clients go on fetching by the ids they hold. A Fetch
by a virtual topic's id must therefore be served by an instance that never handed that id
out: the id is derived from the real topic's, and the instance looks it up. Forwarded as it
came, the broker answers UNKNOWN_TOPIC_ID, and a Java consumer whose Metadata requests go
to another instance retries that forever.
"""

from __future__ import annotations

from harness.raw_client import RawClient, records_of
from proxy.protocol.constants import ErrorCode
from proxy.ranges import equal_shares
from proxy.records.keyhash import key_hash

from .virtual_checks import produce


def test_a_fetch_by_a_virtual_topic_id_another_instance_handed_out_is_served(kafka, proxy, proxy_factory,
                                                                             topic_factory):
    topic = topic_factory(kafka, partitions=1)
    produce(kafka.bootstrap_servers, topic, 60)
    with RawClient.connect(proxy.bootstrap_servers) as first:
        virtual_id = first.topic_id(f"{topic}.kr2")  # handed out by the first instance
    other = proxy_factory(kafka)  # a second instance: it has handed nothing out
    share = equal_shares(2)[1]
    with RawClient.connect(other.bootstrap_servers) as client:
        answer = client.range_fetch(virtual_id, 1, 0, None)  # virtual partition 1: share 1 of partition 0
    assert answer.error_code == ErrorCode.NONE, f"error {ErrorCode.name_of(answer.error_code)}"
    records, _ = records_of(answer.records)
    assert records, "the share's records"
    assert all(share.start <= key_hash(r.key, r.offset) <= share.end for r in records)


def test_a_fetch_session_is_never_opened_on_a_topic_id_the_proxy_cannot_name(kafka, proxy, topic_factory):
    """Opened at the broker, such a session would keep the id for good: the client's
    incremental fetches no longer name it, so the proxy could never take the partition
    over once it learns the id is a virtual topic's, and the broker would answer
    UNKNOWN_TOPIC_ID to every fetch (a Java consumer of a striped topic stalled so after a
    sidecar restart, and Java consumers of T.kr4 and T.coop4 after a rolling restart of the
    sidecars: their full fetch named the session they had). The fetch goes sessionless; a
    known topic's still opens a session."""
    import uuid

    from proxy.protocol import messages
    from proxy.protocol.api_keys import ApiKey

    topic = topic_factory(kafka, partitions=1)
    cls = messages.body_class(ApiKey.FETCH, "request")
    with RawClient.connect(proxy.bootstrap_servers) as client:
        known = client.topic_id(topic)

        def open_session(topic_id, closing=0):
            body = messages.new_body(
                ApiKey.FETCH, 17, "request", max_wait_ms=10, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                session_id=closing, session_epoch=0,
                topics=[cls.FetchTopic(topic_id=topic_id, partitions=[
                    cls.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])])
            return client.request(ApiKey.FETCH, 17, body)

        unknown = open_session(uuid.uuid4())
        assert unknown.session_id == 0
        assert unknown.responses[0].partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_ID
        session = open_session(known).session_id
        assert session != 0
        # closing the session it had and opening another, as a Java consumer does after its
        # connection closed (its proxy restarting): sessionless too, and the broker agrees
        again = open_session(uuid.uuid4(), closing=session)
        assert again.error_code == ErrorCode.NONE and again.session_id == 0
        assert again.responses[0].partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_ID
