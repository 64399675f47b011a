"""Mechanism C: the share watermarks as G's own committed offsets of a real, empty "alias"
topic with one partition per virtual partition, in the client's own TxnOffsetCommit.

For T.kr4 of a 2-partition topic the proxy keeps a real topic ``orders.kr4.offsets`` with
8 partitions (never written). Virtual partition v of T.kr4 (share v mod 4 of partition
v div 4) is committed as (G, orders.kr4.offsets, v): the client's TxnOffsetCommit keeps
its group, generation and member, only the topic name changes, and S of the real partition
can ride in the same request. One request, one round trip, the client's own connection.

Observed:
  1. The alias topic is created with tiny index files (segment.index.bytes) and the
     renamed commit, carrying G's (T, 0) as well, is accepted in one request; pending it
     answers 88 with RequireStable; commit makes it visible, abort leaves it.
  2. KIP-447 fencing is the request's own: a stale generation is refused for every
     partition of the request, shares included.
  3. Two members' open transactions on two shares of one real partition: no waiting, no
     lost update (one key per share).
  4. kafka-consumer-groups --describe of G lists the alias partitions (log end 0, negative
     lag) next to T: what tools see when they bypass the proxy.
  5. Offsets of a topic the group's members do not subscribe to expire
     offsets.retention.minutes after their commit even while the group is Stable (KIP-496;
     1 minute here). The member subscribes as a consumer of the virtual topic does, to
     ``orders.kr4`` (and to a topic ``kept``): the alias topic's offsets expire, and so do
     G's offsets of the real ``orders`` (S); G's offset of ``kept`` stays. So an idle
     share's watermark kept only at the coordinator is lost after the retention, with
     alias topics as with shadow groups (05_groups_visibility.py).
  6. A virtual partition beyond the alias topic's partitions (T grew, the alias did not):
     UNKNOWN_TOPIC_OR_PARTITION until CreatePartitions grows the alias.

    .venv/bin/python experiments/transactions/08_alias_topic.py
"""

import time

from common import Conn, check, err, kafka, say, wait_stable

from harness.java_tools import CONSUMER_GROUP_COMMAND, run_java_tool
from proxy.protocol.messages import ApiKey

T = "orders"
G = "billing"
K = 4
ALIAS = f"{T}.kr{K}.offsets"


def main() -> None:
    with kafka(**{"offsets.retention.minutes": "1", "offsets.retention.check.interval.ms": "5000"}) as cluster:
        admin = Conn(cluster.bootstrap_servers, "admin")
        admin.create_topic(T, 2)
        admin.create_topic("kept", 1)
        c = admin.cls(ApiKey.CREATE_TOPICS)
        body = admin.call(ApiKey.CREATE_TOPICS, 7, topics=[c.CreatableTopic(
            name=ALIAS, num_partitions=2 * K, replication_factor=1, assignments=[], configs=[
                c.CreatableTopicConfig(name="segment.index.bytes", value="4096"),
                c.CreatableTopicConfig(name="retention.ms", value="3600000")])],
            timeout_ms=30000, validate_only=False)
        say(f"\n# CreateTopics {ALIAS} (8 partitions, segment.index.bytes=4096): {err(body.topics[0].error_code)}")
        _, coord = admin.find_coordinator(G, 0)
        member_conn = Conn(coord, "member")
        generation, member = member_conn.join_classic(G, [f"{T}.kr{K}", "kept"], session_ms=120000)
        producers = {}
        for name in ("A", "B"):
            _, txn_coord = admin.find_coordinator(f"app-{name}", 1)
            conn = Conn(txn_coord, f"client-{name}")
            init = conn.init_pid(f"app-{name}")
            producers[name] = [conn, init.producer_id, init.producer_epoch]
        client = Conn(coord, "client-to-coordinator")  # the client's connection to G's coordinator

        say("\n## 1. the client's TxnOffsetCommit of orders.kr4 partition 1 = 50, renamed")
        a_conn, a_pid, a_epoch = producers["A"]
        began = time.monotonic()
        res = client.txn_offset_commit("app-A", a_pid, a_epoch, G, {(ALIAS, 1): 50, (T, 0): 0, ("kept", 0): 7},
                                       generation=generation, member=member)
        say(f"  TxnOffsetCommit v5 G {{{ALIAS}-1: 50, {T}-0: 0 (S)}}: "
            f"{ {f'{k[0]}-{k[1]}': err(v) for k, v in res.items()} } in {(time.monotonic() - began) * 1000:.1f} ms")
        check("accepted in one request", set(res.values()) == {0})
        a = client.offset_fetch({G: [(ALIAS, 1)]}, require_stable=True)
        check(f"pending: {err(a[G][(ALIAS, 1)][2])} with RequireStable", a[G][(ALIAS, 1)][2] == 88)
        a_epoch = a_conn.end_txn("app-A", a_pid, a_epoch, True).producer_epoch
        a, _ = wait_stable(client, {G: [(ALIAS, 1)]})
        check(f"committed: {ALIAS}-1 = {a[G][(ALIAS, 1)][0]}", a[G][(ALIAS, 1)][0] == 50)
        client.txn_offset_commit("app-A", a_pid, a_epoch, G, {(ALIAS, 1): 99}, generation=generation, member=member)
        a_epoch = a_conn.end_txn("app-A", a_pid, a_epoch, False).producer_epoch
        a, _ = wait_stable(client, {G: [(ALIAS, 1)]})
        check(f"aborted 99: {ALIAS}-1 still {a[G][(ALIAS, 1)][0]}", a[G][(ALIAS, 1)][0] == 50)

        say("\n## 2. a zombie member (stale generation)")
        res = client.txn_offset_commit("app-A", a_pid, a_epoch, G, {(ALIAS, 1): 70, (T, 0): 0},
                                       generation=generation + 5, member=member)
        say(f"  {[f'{k[0]}-{k[1]}: {err(v)}' for k, v in res.items()]}")
        check("every partition of the request refused", set(res.values()) == {22})

        say("\n## 3. two members, shares 1 and 2 of partition 0, both transactions open")
        b_conn, b_pid, b_epoch = producers["B"]
        r1 = client.txn_offset_commit("app-A", a_pid, a_epoch, G, {(ALIAS, 1): 120}, generation=generation,
                                      member=member)
        began = time.monotonic()
        r2 = client.txn_offset_commit("app-B", b_pid, b_epoch, G, {(ALIAS, 2): 130}, generation=generation,
                                      member=member)
        took = (time.monotonic() - began) * 1000
        say(f"  A {ALIAS}-1=120 {[err(v) for v in r1.values()]}; B {ALIAS}-2=130 {[err(v) for v in r2.values()]} "
            f"({took:.1f} ms, A still open)")
        b_conn.end_txn("app-B", b_pid, b_epoch, True)
        a_conn.end_txn("app-A", a_pid, a_epoch, True)
        a, _ = wait_stable(client, {G: [(ALIAS, 1), (ALIAS, 2)]})
        check(f"both kept: share 1 = {a[G][(ALIAS, 1)][0]}, share 2 = {a[G][(ALIAS, 2)][0]}",
              (a[G][(ALIAS, 1)][0], a[G][(ALIAS, 2)][0]) == (120, 130))

        say("\n## 4. kafka-consumer-groups --describe (straight at the broker)")
        out = run_java_tool(CONSUMER_GROUP_COMMAND, ["--bootstrap-server", cluster.bootstrap_servers, "--describe",
                                                     "--group", G, "--offsets"], check=False, timeout=90)
        for line in out.stdout.strip().splitlines():
            say("    " + line)

        say("\n## 6. T grows to 3 partitions: virtual partition 9 (share 1 of partition 2)")
        c = admin.cls(ApiKey.CREATE_PARTITIONS)
        admin.call(ApiKey.CREATE_PARTITIONS, 3, topics=[c.CreatePartitionsTopic(name=T, count=3, assignments=None)],
                   timeout_ms=30000, validate_only=False)
        a_epoch = producers["A"][0].init_pid("app-A").producer_epoch
        res = client.txn_offset_commit("app-A", a_pid, a_epoch, G, {(ALIAS, 9): 10}, generation=generation,
                                       member=member)
        say(f"  {ALIAS}-9 before the alias grows: {[err(v) for v in res.values()]}")
        body = admin.call(ApiKey.CREATE_PARTITIONS, 3, topics=[c.CreatePartitionsTopic(name=ALIAS, count=3 * K,
                                                                                        assignments=None)],
                          timeout_ms=30000, validate_only=False)
        say(f"  CreatePartitions {ALIAS} -> {3 * K}: {err(body.results[0].error_code)}")
        time.sleep(1)
        res = client.txn_offset_commit("app-A", a_pid, a_epoch, G, {(ALIAS, 9): 10}, generation=generation,
                                       member=member)
        say(f"  {ALIAS}-9 after: {[err(v) for v in res.values()]}")
        producers["A"][0].end_txn("app-A", a_pid, a_epoch, True)

        say("\n## 5. retention (offsets.retention.minutes=1): G's live member subscribes to orders.kr4 and kept")
        began = time.monotonic()
        while time.monotonic() - began < 75:
            member_conn.heartbeat(G, generation, member)
            time.sleep(3)
        a = client.offset_fetch({G: [(ALIAS, 1), (ALIAS, 2), (T, 0), ("kept", 0)]}, require_stable=True)
        say(f"  after 75 s: {ALIAS}-1 = {a[G][(ALIAS, 1)][0]}, {ALIAS}-2 = {a[G][(ALIAS, 2)][0]}, "
            f"{T}-0 = {a[G][(T, 0)][0]}, kept-0 = {a[G][('kept', 0)][0]}")
        check("alias and real-topic offsets (not subscribed) expired; the subscribed topic's did not",
              (a[G][(ALIAS, 1)][0], a[G][(ALIAS, 2)][0], a[G][(T, 0)][0]) == (-1, -1, -1)
              and a[G][("kept", 0)][0] == 7)
        for conn in (admin, member_conn, client, a_conn, b_conn):
            conn.close()


if __name__ == "__main__":
    main()
