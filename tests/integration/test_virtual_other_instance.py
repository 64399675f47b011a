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

from proxy.protocol.constants import ErrorCode
from proxy.ranges import equal_shares
from proxy.records.keyhash import key_hash
from proxy.testing.raw_client import RawClient, records_of

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
