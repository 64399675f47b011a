"""Mechanism A: a share's watermark as the committed offset of a shadow group, written by
a second connection (the proxy's) inside the client's own transaction.

Shares of topic T partition 0 read as T.kr4: share i's watermark W(i) is the committed
offset of (T, 0) in the shadow group ``G.kr4/i#<salt>`` (the salt puts the shadow group
on G's own __consumer_offsets partition). The "client" connection holds the transactional
producer; every shadow write goes over a different connection, with the client's
transactional id, producer id and epoch, generation -1 and no member id.

Observed:
  1. transaction.version 2 (TxnOffsetCommit v5, EndTxn v5, no AddOffsetsToTxn): the
     shadow commit is accepted; pending, OffsetFetch(RequireStable) answers 88 for it and
     OffsetFetch without RequireStable the old value; after EndTxn(commit) it is visible;
     after EndTxn(abort) the old value stays.
  2. transaction.version 1 style (AddOffsetsToTxn + TxnOffsetCommit v4 + EndTxn v4): a
     shadow group on G's __consumer_offsets partition needs nothing more than the client's
     own AddOffsetsToTxn(G); a shadow group on another partition is refused until
     AddOffsetsToTxn names it, which a different connection may send.
  3. TxnOffsetCommit v5 of a group on another partition adds that partition by itself.

    .venv/bin/python experiments/transactions/02_shadow_group_txn.py
"""

from common import Conn, check, err, group_partition, kafka, other_partition_group, say, shadow_group, wait_stable

T = "orders"
G = "billing"


def show_fetch(conn: Conn, groups: dict, label: str, require_stable: bool) -> dict:
    answer = conn.offset_fetch(groups, require_stable=require_stable)
    for group, parts in answer.items():
        for key, value in parts.items():
            if key is None:
                continue
            offset, _metadata, code = value
            say(f"    OffsetFetch(RequireStable={str(require_stable).lower()}) {label} {group} {key}: "
                f"offset {offset}, error {err(code)}")
    return answer


def main() -> None:
    with kafka() as cluster:
        admin = Conn(cluster.bootstrap_servers, "admin")
        admin.create_topic(T, 2)
        s0, s1 = shadow_group(G, ".kr4/0"), shadow_group(G, ".kr4/1")
        far = other_partition_group(G, ".kr4/2")
        say(f"\n# groups: G={G!r} -> __consumer_offsets-{group_partition(G, 4)}; shadow share 0 {s0!r} -> "
            f"{group_partition(s0, 4)}; shadow share 1 {s1!r} -> {group_partition(s1, 4)}; "
            f"a shadow on another partition {far!r} -> {group_partition(far, 4)}")

        # -- 1. transaction version 2 --------------------------------------------------------
        say("\n## 1. TV2: client's producer on one connection, shadow commits on another")
        _, txn_coord = admin.find_coordinator("app-1", 1)
        _, group_coord = admin.find_coordinator(G, 0)
        client = Conn(txn_coord, "client")
        proxy = Conn(group_coord, "proxy")
        init = client.init_pid("app-1")
        pid, epoch = init.producer_id, init.producer_epoch
        say(f"  InitProducerId(app-1) on the client's connection: {err(init.error_code)}, producer id {pid}, epoch {epoch}")

        res = proxy.txn_offset_commit("app-1", pid, epoch, s0, {(T, 0): 100}, version=5,
                                      metadata="keyrange.txn/1:0:1")
        say(f"  proxy: TxnOffsetCommit v5 {s0} (T,0)=100, generation -1, member '': {[err(c) for c in res.values()]}")
        check("shadow commit accepted from a second connection, no AddOffsetsToTxn", set(res.values()) == {0})
        a = show_fetch(proxy, {s0: [(T, 0)]}, "pending", True)
        check("pending shadow offset: UNSTABLE_OFFSET_COMMIT (88) with RequireStable", a[s0][(T, 0)][2] == 88)
        a = show_fetch(proxy, {s0: [(T, 0)]}, "pending", False)
        check("pending shadow offset: not visible without RequireStable (-1)", a[s0][(T, 0)][0] == -1)
        end = client.end_txn("app-1", pid, epoch, True)
        say(f"  client: EndTxn v5 commit: {err(end.error_code)}; response producer id {end.producer_id}, "
            f"epoch {end.producer_epoch} (TV2 bumps the epoch on every EndTxn)")
        a, waited = wait_stable(proxy, {s0: [(T, 0)]})
        say(f"    stable after {waited * 1000:.0f} ms: {s0} (T,0) = {a[s0][(T, 0)][0]}, metadata {a[s0][(T, 0)][1]!r}")
        check("committed: visible (100) with its metadata", a[s0][(T, 0)][:2] == (100, "keyrange.txn/1:0:1"))

        epoch = end.producer_epoch
        res = proxy.txn_offset_commit("app-1", pid, epoch, s0, {(T, 0): 200}, version=5)
        say(f"  next transaction, proxy: TxnOffsetCommit v5 {s0} (T,0)=200 with epoch {epoch}: "
            f"{[err(c) for c in res.values()]}")
        end = client.end_txn("app-1", pid, epoch, False)
        say(f"  client: EndTxn v5 abort: {err(end.error_code)}; new epoch {end.producer_epoch}")
        a, _ = wait_stable(proxy, {s0: [(T, 0)]})
        check(f"aborted: {s0} (T,0) still 100 (got {a[s0][(T, 0)][0]})", a[s0][(T, 0)][0] == 100)
        client.close()
        proxy.close()

        # -- 2. transaction version 1 style --------------------------------------------------
        say("\n## 2. TV1 style: AddOffsetsToTxn(G) by the client, TxnOffsetCommit v4 by the proxy")
        _, txn_coord = admin.find_coordinator("app-2", 1)
        client = Conn(txn_coord, "client")
        proxy = Conn(group_coord, "proxy")
        init = client.init_pid("app-2")
        pid, epoch = init.producer_id, init.producer_epoch
        code = client.add_offsets("app-2", pid, epoch, G)
        say(f"  client: AddOffsetsToTxn(app-2, {G}): {err(code)}")
        res = proxy.txn_offset_commit("app-2", pid, epoch, s1, {(T, 0): 300}, version=4)
        say(f"  proxy: TxnOffsetCommit v4 {s1} (same __consumer_offsets partition as G): {[err(c) for c in res.values()]}")
        check("a shadow on G's partition is covered by the client's AddOffsetsToTxn(G)", set(res.values()) == {0})
        res = proxy.txn_offset_commit("app-2", pid, epoch, far, {(T, 0): 300}, version=4)
        say(f"  proxy: TxnOffsetCommit v4 {far} (another partition, never added): {[err(c) for c in res.values()]}")
        check("a shadow on another partition is refused under TV1 until added", set(res.values()) != {0})
        code = proxy.add_offsets("app-2", pid, epoch, far)
        say(f"  proxy: AddOffsetsToTxn(app-2, {far}) on the proxy's connection: {err(code)}")
        check("AddOffsetsToTxn with the client's transactional id/producer id/epoch from another connection",
              code == 0)
        res = proxy.txn_offset_commit("app-2", pid, epoch, far, {(T, 0): 300}, version=4)
        say(f"  proxy: TxnOffsetCommit v4 {far} again: {[err(c) for c in res.values()]}")
        end = client.end_txn("app-2", pid, epoch, True, version=4)
        say(f"  client: EndTxn v4 commit: {err(end.error_code)}")
        a, _ = wait_stable(proxy, {s1: [(T, 0)], far: [(T, 0)]})
        check(f"both visible after commit: {s1}={a[s1][(T, 0)][0]}, {far}={a[far][(T, 0)][0]}",
              a[s1][(T, 0)][0] == 300 and a[far][(T, 0)][0] == 300)
        client.close()
        proxy.close()

        # -- 3. TV2, a group on another partition ---------------------------------------------
        say("\n## 3. TV2: TxnOffsetCommit v5 of a group on another __consumer_offsets partition")
        _, txn_coord = admin.find_coordinator("app-3", 1)
        client = Conn(txn_coord, "client")
        proxy = Conn(group_coord, "proxy")
        init = client.init_pid("app-3")
        pid, epoch = init.producer_id, init.producer_epoch
        res = proxy.txn_offset_commit("app-3", pid, epoch, far, {(T, 1): 400}, version=5)
        say(f"  proxy: TxnOffsetCommit v5 {far} (T,1)=400, no AddOffsetsToTxn: {[err(c) for c in res.values()]}")
        res4 = proxy.txn_offset_commit("app-3", pid, epoch, s0, {(T, 1): 400}, version=4)
        say(f"  proxy: TxnOffsetCommit v4 {s0} (G's partition, never added in this transaction): "
            f"{[err(c) for c in res4.values()]}")
        end = client.end_txn("app-3", pid, epoch, True)
        say(f"  client: EndTxn v5 commit: {err(end.error_code)}")
        a, _ = wait_stable(proxy, {far: [(T, 1)], s0: [(T, 1)]})
        check(f"v5 adds the partition itself: {far} (T,1) = {a[far][(T, 1)][0]}", a[far][(T, 1)][0] == 400)
        say(f"    {s0} (T,1) = {a[s0][(T, 1)][0]} (the v4 write was {[err(c) for c in res4.values()]})")
        client.close()
        proxy.close()
        admin.close()


if __name__ == "__main__":
    main()
