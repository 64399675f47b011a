"""Mechanism B: the proxy writes the __individual_commit_offsets record inside the client's
transaction, with the client's producer id and epoch, from its own connection.

A topic ``ic-log`` (one partition, compacted) stands in for a partition of
__individual_commit_offsets. The client holds the transactional producer; the proxy
produces transactional batches with the client's transactional id, producer id and epoch
and its own sequence numbers (the client never writes to this partition).

Observed:
  1. TV2 (Produce v12): the first transactional write joins the transaction by itself,
     sequence 0. A proxy that lost count (restarted, or another instance) and writes a
     different record with the same sequence gets NONE and the *first* record's offset:
     the broker took it for a retry and dropped it. A sequence gap is OUT_OF_ORDER.
  2. While the transaction is open the partition's last stable offset stays at its first
     record: read_committed readers (every proxy instance reading the log to its end)
     cannot see anything written after it, including the proxy's own non-transactional
     writes for other groups, until the transaction ends (up to transaction.timeout.ms).
  3. EndTxn v5 bumps the epoch; the next transaction's first write must use sequence 0.
  4. TV1 (AddPartitionsToTxn by the proxy, Produce v11): the epoch stays, so sequences
     continue across transactions; a proxy that starts again at 0 is dropped as a
     duplicate, and then even the right next sequence is refused (OUT_OF_ORDER: the
     partition's transaction-verification entry keeps the lowest sequence it saw).
     DescribeProducers shows the last sequence (a restarted proxy could ask).

    .venv/bin/python experiments/transactions/06_ic_log_in_txn.py
"""

from common import Conn, check, err, kafka, say

from proxy.protocol.messages import ApiKey

LOG = "ic-log"


def describe_producers(conn: Conn, topic: str, partition: int) -> list:
    c = conn.cls(61)
    body = conn.call(61, 0, topics=[c.TopicRequest(name=topic, partition_indexes=[partition])])
    part = body.topics[0].partitions[0]
    return [(p.producer_id, p.producer_epoch, p.last_sequence, p.current_txn_start_offset) for p in part.active_producers]


def offsets(conn: Conn) -> str:
    return f"high watermark {conn.list_offsets(LOG, 0, 0)}, last stable offset {conn.list_offsets(LOG, 0, 1)}"


def main() -> None:
    with kafka() as cluster:
        admin = Conn(cluster.bootstrap_servers, "admin")
        c = admin.cls(ApiKey.CREATE_TOPICS)
        admin.call(ApiKey.CREATE_TOPICS, 7, topics=[c.CreatableTopic(
            name=LOG, num_partitions=1, replication_factor=1, assignments=[],
            configs=[c.CreatableTopicConfig(name="cleanup.policy", value="compact")])],
            timeout_ms=30000, validate_only=False)
        leader = cluster.bootstrap_servers  # one node: the leader
        proxy = Conn(leader, "proxy")
        own = Conn(leader, "proxy-own-producer")
        own_pid = own.init_pid(None).producer_id

        say("\n## 1-3. transaction version 2 (Produce v12)")
        _, txn_coord = admin.find_coordinator("app-b", 1)
        client = Conn(txn_coord, "client")
        init = client.init_pid("app-b", timeout_ms=20000)
        pid, epoch = init.producer_id, init.producer_epoch
        say(f"  client producer: id {pid}, epoch {epoch}; {offsets(admin)}")
        code, first = proxy.produce(LOG, 0, [(b"G/T/0", b"state-1")], txn="app-b", pid=pid, epoch=epoch, sequence=0)
        say(f"  proxy: Produce v12 in app-b's transaction, sequence 0: {err(code)} at offset {first}")
        check("the proxy's connection joins the client's transaction by producing (TV2)", code == 0)
        code, again = proxy.produce(LOG, 0, [(b"G/T/0", b"state-2")], txn="app-b", pid=pid, epoch=epoch, sequence=0)
        say(f"  proxy that lost count: another record, sequence 0 again: {err(code)} at offset {again}; {offsets(admin)}")
        check("taken for a duplicate: answered with the first record's offset, not written", again == first)
        code, _ = proxy.produce(LOG, 0, [(b"G/T/0", b"state-3")], txn="app-b", pid=pid, epoch=epoch, sequence=5)
        say(f"  sequence 5 (a gap): {err(code)}")
        code, at = proxy.produce(LOG, 0, [(b"G/T/0", b"state-3")], txn="app-b", pid=pid, epoch=epoch, sequence=1)
        say(f"  sequence 1: {err(code)} at offset {at}")
        code, at = own.produce(LOG, 0, [(b"H/U/0", b"other group")], txn=None, pid=own_pid, epoch=0, sequence=0)
        say(f"  the proxy's own idempotent producer, another group's record: {err(code)} at offset {at}")
        say(f"  while app-b's transaction is open: {offsets(admin)}")
        check("the last stable offset is held at the open transaction's first record",
              admin.list_offsets(LOG, 0, 1) == first)
        say(f"  DescribeProducers({LOG}-0): {describe_producers(admin, LOG, 0)}  (id, epoch, last sequence, txn start)")
        end = client.end_txn("app-b", pid, epoch, True)
        say(f"  client: EndTxn v5 commit: {err(end.error_code)}, epoch now {end.producer_epoch}; {offsets(admin)}")
        epoch = end.producer_epoch
        code, _ = proxy.produce(LOG, 0, [(b"G/T/0", b"state-4")], txn="app-b", pid=pid, epoch=epoch, sequence=2)
        say(f"  next transaction (epoch {epoch}), first write with sequence 2: {err(code)}")
        code, at = proxy.produce(LOG, 0, [(b"G/T/0", b"state-4")], txn="app-b", pid=pid, epoch=epoch, sequence=0)
        say(f"  ... with sequence 0: {err(code)} at offset {at}")
        end = client.end_txn("app-b", pid, epoch, False)
        say(f"  client: EndTxn abort: {err(end.error_code)}")

        say("\n## 4. transaction version 1 (AddPartitionsToTxn + Produce v11)")
        _, txn_coord = admin.find_coordinator("app-b1", 1)
        client1 = Conn(txn_coord, "client-v1")
        proxy_txn = Conn(txn_coord, "proxy-to-txn-coordinator")
        init = client1.init_pid("app-b1")
        pid, epoch = init.producer_id, init.producer_epoch
        codes = proxy_txn.add_partitions("app-b1", pid, epoch, LOG, [0])
        say(f"  proxy: AddPartitionsToTxn v3 (app-b1, {LOG}-0) from its own connection: {[err(c) for c in codes]}")
        code, first = proxy.produce(LOG, 0, [(b"G/T/1", b"v1-state-1")], txn="app-b1", pid=pid, epoch=epoch, sequence=0,
                                    version=11)
        say(f"  proxy: Produce v11, sequence 0: {err(code)} at offset {first}")
        end = client1.end_txn("app-b1", pid, epoch, True, version=4)
        say(f"  client: EndTxn v4 commit: {err(end.error_code)} (epoch stays {epoch})")
        say(f"  DescribeProducers({LOG}-0): {describe_producers(admin, LOG, 0)}")
        codes = proxy_txn.add_partitions("app-b1", pid, epoch, LOG, [0])
        say(f"  next transaction: AddPartitionsToTxn: {[err(c) for c in codes]}")
        code, at = proxy.produce(LOG, 0, [(b"G/T/1", b"v1-state-2")], txn="app-b1", pid=pid, epoch=epoch, sequence=0,
                                 version=11)
        say(f"  a restarted proxy starting at sequence 0: {err(code)} at offset {at} (first was {first})")
        check("dropped as a duplicate of the previous transaction's record", at == first)
        code, at = proxy.produce(LOG, 0, [(b"G/T/1", b"v1-state-2")], txn="app-b1", pid=pid, epoch=epoch, sequence=1,
                                 version=11)
        say(f"  with the sequence DescribeProducers implies (1): {err(code)} at offset {at}")
        end = client1.end_txn("app-b1", pid, epoch, True, version=4)
        say(f"  EndTxn v4 commit: {err(end.error_code)}; {offsets(admin)}")
        for conn in (admin, proxy, own, client, client1, proxy_txn):
            conn.close()


if __name__ == "__main__":
    main()
