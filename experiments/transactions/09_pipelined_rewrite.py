"""The chosen rewrite, end to end, and its failure cases.

A Java 4.x client (transaction version 2) in group G commits, in its transaction,
TxnOffsetCommit v5 of orders.kr4 partitions 1 (share 1 of partition 0) and 6 (share 2 of
partition 1). The proxy turns that one request into, on the client's own connection to
G's coordinator, pipelined in one write:

  TxnOffsetCommit v5 shadow group G.kr4/1#s  {orders-0: 50}   generation -1, member ""
  TxnOffsetCommit v5 shadow group G.kr4/2#s  {orders-1: 70}   generation -1, member ""
  TxnOffsetCommit v5 G (the client's frame)   {orders-0: S0, orders-1: S1}
                                              the client's generation, member, instance

and answers the client from the three responses. After the transaction commits, a settle
step reads the shadows and writes S plainly to G with the member's generation.

Observed:
  1. The three pipelined requests come back in order in about one round trip; all accepted.
  2. Commit: shadows visible, S settled; abort: nothing visible.
  3. Zombie member (stale generation): the carrier is refused (ILLEGAL_GENERATION) while
     the shadows were accepted pending; the client must abort, and then nothing is visible.
  4. Proxy killed after sending only the shadow commits (connection closed): the client's
     retry on a new connection writes everything again; after commit each key holds the
     retried value once.
  5. Transaction timeout: a client that never ends its transaction (transaction.timeout.ms
     2 s) is aborted by the broker; nothing is visible, its epoch is fenced, and
     RequireStable stops answering 88 once the abort markers are written.

    .venv/bin/python experiments/transactions/09_pipelined_rewrite.py
"""

import time

from common import Conn, check, err, kafka, say, shadow_group, wait_stable

from proxy.protocol import messages
from proxy.protocol.messages import ApiKey

T = "orders"
G = "billing"
K = 4


def txn_commit_body(txn, pid, epoch, group, offsets, generation=-1, member="", metadata=""):
    c = messages.body_class(ApiKey.TXN_OFFSET_COMMIT, "request")
    topics: dict = {}
    for (topic, partition), offset in offsets.items():
        topics.setdefault(topic, []).append(c.TxnOffsetCommitRequestPartition(
            partition_index=partition, committed_offset=offset, committed_leader_epoch=-1, committed_metadata=metadata))
    return messages.new_body(ApiKey.TXN_OFFSET_COMMIT, 5, "request", transactional_id=txn, group_id=group,
                             producer_id=pid, producer_epoch=epoch, generation_id=generation, member_id=member,
                             group_instance_id=None,
                             topics=[c.TxnOffsetCommitRequestTopic(name=n, partitions=p) for n, p in topics.items()])


def rewrite(txn, pid, epoch, generation, member, virtual: dict[int, int], stable: dict[int, int], seq: int):
    """The proxy's requests for a client's TxnOffsetCommit of ``virtual`` (virtual partition
    -> offset): one shadow commit per share, then the carrier (G's own, S per real
    partition), in this order."""
    per_share: dict[int, dict] = {}
    for v, offset in virtual.items():
        per_share.setdefault(v % K, {})[(T, v // K)] = offset
    out = [(shadow_group(G, f".kr{K}/{i}"), txn_commit_body(txn, pid, epoch, shadow_group(G, f".kr{K}/{i}"), offs,
                                                            metadata=f"keyrange.txn/1:0:{seq}"))
           for i, offs in sorted(per_share.items())]
    carrier = {(T, p): s for p, s in stable.items()}
    out.append((G, txn_commit_body(txn, pid, epoch, G, carrier, generation, member)))
    return out


def pipelined(conn: Conn, requests) -> tuple[list, float]:
    """Send every request in one go, then read the responses in order."""
    began = time.monotonic()
    ids = [conn.raw.send(ApiKey.TXN_OFFSET_COMMIT, 5, body) for _, body in requests]
    answers = []
    for (group, _), correlation in zip(requests, ids):
        header, body = messages.decode_response(ApiKey.TXN_OFFSET_COMMIT, 5, conn.raw.receive())
        assert header.correlation_id == correlation
        answers.append((group, {(t.name, p.partition_index): p.error_code for t in body.topics for p in t.partitions}))
    return answers, (time.monotonic() - began) * 1000


def show(answers, took):
    for group, res in answers:
        say(f"    {group}: " + ", ".join(f"{t}-{p} {err(c)}" for (t, p), c in res.items()))
    say(f"    (three requests pipelined, {took:.1f} ms for all)")


def fetch_all(conn: Conn):
    shadows = {shadow_group(G, f".kr{K}/{i}"): [(T, 0), (T, 1)] for i in (1, 2)}
    a, _ = wait_stable(conn, {G: [(T, 0), (T, 1)], **shadows})
    return {g: {k: v[0] for k, v in parts.items() if k is not None} for g, parts in a.items()}


def main() -> None:
    with kafka(**{"transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"}) as cluster:
        admin = Conn(cluster.bootstrap_servers, "admin")
        admin.create_topic(T, 2)
        _, coord = admin.find_coordinator(G, 0)
        _, txn_coord = admin.find_coordinator("app-1", 1)
        member_conn = Conn(coord, "member")
        generation, member = member_conn.join_classic(G, T, session_ms=120000)
        producer = Conn(txn_coord, "client-producer")
        client = Conn(coord, "client-to-coordinator")  # the connection the proxy rewrites on
        init = producer.init_pid("app-1")
        pid, epoch = init.producer_id, init.producer_epoch

        say("\n## 1-2. commit {orders.kr4-1: 50, orders.kr4-6: 70}; S carried as what this instance knows (0)")
        answers, took = pipelined(client, rewrite("app-1", pid, epoch, generation, member, {1: 50, 6: 70},
                                                  {0: 0, 1: 0}, seq=1))
        show(answers, took)
        check("all accepted", all(set(r.values()) == {0} for _, r in answers))
        end = producer.end_txn("app-1", pid, epoch, True)
        epoch = end.producer_epoch
        state = fetch_all(client)
        say(f"  after EndTxn commit: {state}")
        # settle: S of each real partition = min over the K shares' watermarks, a share without
        # one counting as S; here shares 0 and 3 have none, so S stays: shown for partition 0
        # with every share given (as when all four have committed)
        marks = {i: state.get(shadow_group(G, f".kr{K}/{i}"), {}).get((T, 0), -1) for i in range(K)}
        say(f"  settle: watermarks of partition 0 per share {marks} -> S stays {state[G][(T, 0)]} until every share "
            f"has one")
        res = client.offset_commit(G, {(T, 0): 40}, generation=generation, member=member)
        say(f"  settle write, as if min over the shares were 40: plain OffsetCommit G orders-0=40 with the member's "
            f"generation: {[err(c) for c in res.values()]}")
        answers, took = pipelined(client, rewrite("app-1", pid, epoch, generation, member, {1: 90, 6: 95},
                                                  {0: 40, 1: 0}, seq=2))
        producer.end_txn("app-1", pid, epoch, False)
        epoch += 1
        state = fetch_all(client)
        check(f"abort leaves everything: {state}", state[shadow_group(G, '.kr4/1')][(T, 0)] == 50
              and state[shadow_group(G, '.kr4/2')][(T, 1)] == 70)

        say("\n## 3. a zombie member: stale generation")
        answers, took = pipelined(client, rewrite("app-1", pid, epoch, generation + 3, member, {1: 111, 6: 111},
                                                  {0: 40, 1: 0}, seq=3))
        show(answers, took)
        check("carrier refused with ILLEGAL_GENERATION, shadows accepted pending", set(answers[-1][1].values()) == {22}
              and all(set(r.values()) == {0} for _, r in answers[:-1]))
        say("  the proxy answers every virtual partition ILLEGAL_GENERATION; the client aborts:")
        end = producer.end_txn("app-1", pid, epoch, False)
        epoch = end.producer_epoch
        state = fetch_all(client)
        check(f"nothing of the zombie's commit is visible: {state}",
              state[shadow_group(G, '.kr4/1')][(T, 0)] == 50)

        say("\n## 4. proxy killed after the shadow commits, before the carrier")
        doomed = Conn(coord, "client-via-proxy-1")
        requests = rewrite("app-1", pid, epoch, generation, member, {1: 120, 6: 130}, {0: 40, 1: 0}, seq=4)
        for _, body in requests[:-1]:
            doomed.raw.send(ApiKey.TXN_OFFSET_COMMIT, 5, body)
        for _ in requests[:-1]:
            doomed.raw.receive()
        doomed.close()
        say("  shadow commits sent and answered, connection closed: the client got no answer and retries")
        retry = Conn(coord, "client-via-proxy-2")
        answers, took = pipelined(retry, requests)
        show(answers, took)
        end = producer.end_txn("app-1", pid, epoch, True)
        epoch = end.producer_epoch
        state = fetch_all(retry)
        check(f"after the retry and commit: {state}", state[shadow_group(G, '.kr4/1')][(T, 0)] == 120
              and state[shadow_group(G, '.kr4/2')][(T, 1)] == 130)

        say("\n## 5. transaction timeout: the client never ends its transaction (timeout 2 s)")
        _, c2 = admin.find_coordinator("app-2", 1)
        lazy = Conn(c2, "lazy-producer")
        init = lazy.init_pid("app-2", timeout_ms=2000)
        answers, took = pipelined(retry, [(g, txn_commit_body("app-2", init.producer_id, init.producer_epoch,
                                                              body.group_id, {(t.name, p.partition_index): 999
                                                                              for t in body.topics
                                                                              for p in t.partitions},
                                                              body.generation_id, body.member_id))
                                          for g, body in rewrite("app-2", 0, 0, generation, member, {1: 999, 6: 999},
                                                                 {0: 40, 1: 0}, seq=5)])
        show(answers, took)
        a = retry.offset_fetch({shadow_group(G, ".kr4/1"): [(T, 0)]}, require_stable=True)
        say(f"  right after: RequireStable -> {err(a[shadow_group(G, '.kr4/1')][(T, 0)][2])}")
        a, waited = wait_stable(retry, {shadow_group(G, ".kr4/1"): [(T, 0)], G: [(T, 0)]}, timeout=30)
        say(f"  stable again after {waited:.1f} s: shadow orders-0 = {a[shadow_group(G, '.kr4/1')][(T, 0)][0]}, "
            f"G orders-0 = {a[G][(T, 0)][0]}")
        check("the broker aborted the timed-out transaction", a[shadow_group(G, ".kr4/1")][(T, 0)][0] == 120)
        end = lazy.end_txn("app-2", init.producer_id, init.producer_epoch, True)
        say(f"  the late client's EndTxn commit: {err(end.error_code)}")
        for conn in (admin, member_conn, producer, client, retry, lazy):
            conn.close()


if __name__ == "__main__":
    main()
