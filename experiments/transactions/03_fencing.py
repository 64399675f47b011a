"""Fencing of shadow-group commits: zombie producers (an old epoch) and zombie group
members (an old generation, KIP-447).

Observed:
  1. After a new instance's InitProducerId bumps the epoch, the old epoch's TxnOffsetCommit
     of a shadow group and its EndTxn are refused (PRODUCER_FENCED / INVALID_PRODUCER_EPOCH),
     and the old transaction's pending shadow offset is aborted.
  2. Under transaction version 2 every EndTxn bumps the epoch: a commit with the epoch of
     the previous transaction is refused once that transaction's markers are written; sent
     right after EndTxn returned it is sometimes accepted and then committed with that
     transaction (it arrived before the markers). So nothing may be sent in a client's
     transaction after the client had its answer.
  3. Generation checks happen only in the client's own group G: TxnOffsetCommit of G with
     a stale generation or an unknown member is refused (ILLEGAL_GENERATION,
     UNKNOWN_MEMBER_ID); generation -1 with no member id is accepted even though G has
     members (transactional commits skip the check then, as Kafka's ClassicGroup does for
     old clients). A shadow group (no members) accepts only generation -1: the client's
     generation/member there is refused. So the proxy must send the client's generation in
     G's own commit (the carrier) before the shadow commits, to keep KIP-447 fencing.
  4. Plain OffsetCommit of G (the later S write) needs a member's generation and id
     (generation -1: UNKNOWN_MEMBER_ID while G has members); a shadow group takes
     generation -1 plain commits from anyone.
  5. A TV1-style transaction (AddOffsetsToTxn, EndTxn v4) in which the proxy would send
     TxnOffsetCommit v5: what EndTxn v4 says afterwards.

    .venv/bin/python experiments/transactions/03_fencing.py
"""

from common import Conn, check, err, kafka, say, shadow_group, wait_stable

T = "orders"
G = "billing"


def main() -> None:
    with kafka() as cluster:
        admin = Conn(cluster.bootstrap_servers, "admin")
        admin.create_topic(T, 2)
        s0 = shadow_group(G, ".kr4/0")
        _, coord = admin.find_coordinator(G, 0)
        _, txn_coord = admin.find_coordinator("app-z", 1)

        # -- 1. zombie producer ---------------------------------------------------------------
        say("\n## 1. a zombie producer (old epoch) after a new instance's InitProducerId")
        zombie = Conn(txn_coord, "zombie")
        proxy = Conn(coord, "proxy")
        init = zombie.init_pid("app-z")
        pid, old = init.producer_id, init.producer_epoch
        res = proxy.txn_offset_commit("app-z", pid, old, s0, {(T, 0): 50}, version=5)
        say(f"  epoch {old}: shadow commit (T,0)=50: {[err(c) for c in res.values()]}")
        end = zombie.end_txn("app-z", pid, old, True)
        say(f"  epoch {old}: EndTxn commit: {err(end.error_code)}, next epoch {end.producer_epoch}")
        old = end.producer_epoch
        res = proxy.txn_offset_commit("app-z", pid, old, s0, {(T, 0): 60}, version=5)
        say(f"  epoch {old}: shadow commit (T,0)=60 (pending): {[err(c) for c in res.values()]}")
        fresh = Conn(txn_coord, "new-instance")
        init2 = fresh.init_pid("app-z")
        say(f"  new instance: InitProducerId(app-z): {err(init2.error_code)}, producer id {init2.producer_id}, "
            f"epoch {init2.producer_epoch}")
        for version in (5, 4):
            res = proxy.txn_offset_commit("app-z", pid, old, s0, {(T, 0): 70}, version=version)
            say(f"  zombie (epoch {old}): TxnOffsetCommit v{version} shadow (T,0)=70: {[err(c) for c in res.values()]}")
            check("zombie's shadow commit refused", set(res.values()) != {0})
        code = proxy.add_offsets("app-z", pid, old, s0)
        say(f"  zombie: AddOffsetsToTxn: {err(code)}")
        end = zombie.end_txn("app-z", pid, old, True)
        say(f"  zombie: EndTxn v5 commit: {err(end.error_code)}")
        check("zombie's EndTxn refused", end.error_code != 0)
        a, _ = wait_stable(proxy, {s0: [(T, 0)]})
        check(f"the zombie's pending 60 was aborted by the new InitProducerId: (T,0) = {a[s0][(T, 0)][0]}",
              a[s0][(T, 0)][0] == 50)

        # -- 2. TV2 epoch per transaction -------------------------------------------------------
        say("\n## 2. TV2: the epoch of the previous transaction, 20 rounds")
        pid, epoch = init2.producer_id, init2.producer_epoch
        late_joined, late_refused, after_markers = [], 0, set()
        for k in range(20):
            proxy.txn_offset_commit("app-z", pid, epoch, s0, {(T, 0): 100 + k}, version=5)
            end = fresh.end_txn("app-z", pid, epoch, True)
            late = proxy.txn_offset_commit("app-z", pid, epoch, s0, {(T, 0): 1000 + k}, version=5)  # right away
            a, _ = wait_stable(proxy, {s0: [(T, 0)]})
            if set(late.values()) == {0}:
                late_joined.append((k, a[s0][(T, 0)][0]))
            else:
                late_refused += 1
            stale = proxy.txn_offset_commit("app-z", pid, epoch, s0, {(T, 0): 5000 + k}, version=5)  # markers written
            after_markers |= set(stale.values())
            epoch = end.producer_epoch
        say(f"  a commit with the old epoch sent right after EndTxn returned: refused {late_refused} times; "
            f"accepted {len(late_joined)} times, and then committed: (round, value) {late_joined}")
        say("  (accepted ones reached the broker before the commit markers: they joined the transaction that was "
            "completing)")
        check(f"once the markers are written, the old epoch is refused: {[err(c) for c in after_markers]}",
              after_markers == {47})

        # -- 3. generation checks ----------------------------------------------------------------
        say("\n## 3. generations: G has one live member (classic protocol)")
        member_conn = Conn(coord, "member")
        generation, member = member_conn.join_classic(G, T)
        say(f"  member joined G: generation {generation}, member id {member[:24]}...")
        cases = [
            ("G, the member's generation and id", G, generation, member, {0}),
            ("G, stale generation", G, generation - 1 if generation > 0 else generation + 7, member, {22}),
            ("G, unknown member id", G, generation, "nobody-123", {25}),
            ("G, generation -1, no member id (old clients)", G, -1, "", {0}),
            ("shadow group, generation -1, no member id", s0, -1, "", {0}),
            ("shadow group, the member's generation and id", s0, generation, member, None),
        ]
        for label, group, gen, mid, expected in cases:
            res = proxy.txn_offset_commit("app-z", pid, epoch, group, {(T, 0): 100}, version=5, generation=gen,
                                          member=mid)
            got = set(res.values())
            say(f"  TxnOffsetCommit {label}: {[err(c) for c in res.values()]}")
            if expected is not None:
                check(label, got == expected)
        end = fresh.end_txn("app-z", pid, epoch, False)
        epoch = end.producer_epoch

        say("\n## 4. plain OffsetCommit (the later write of S)")
        for label, group, gen, mid in [("G, generation -1", G, -1, ""),
                                       ("G, the member's generation and id, from another connection", G, generation,
                                        member),
                                       ("shadow group, generation -1", s0, -1, "")]:
            res = proxy.offset_commit(group, {(T, 0): 42}, generation=gen, member=mid)
            say(f"  OffsetCommit {label}: {[err(c) for c in res.values()]}")
        member_conn.close()

        # -- 5. TV1 transaction, v5 commit from the proxy ----------------------------------------
        say("\n## 5. TV1-style transaction (AddOffsetsToTxn, EndTxn v4) with a TxnOffsetCommit v5 inside")
        _, c2 = admin.find_coordinator("app-v1", 1)
        client = Conn(c2, "client-v1")
        init = client.init_pid("app-v1")
        pid, epoch = init.producer_id, init.producer_epoch
        say(f"  AddOffsetsToTxn(G): {err(client.add_offsets('app-v1', pid, epoch, G))}")
        res = proxy.txn_offset_commit("app-v1", pid, epoch, s0, {(T, 1): 11}, version=5)
        say(f"  proxy: TxnOffsetCommit v5 shadow (T,1)=11: {[err(c) for c in res.values()]}")
        end = client.end_txn("app-v1", pid, epoch, True, version=4)
        say(f"  client: EndTxn v4 commit: {err(end.error_code)}")
        a, _ = wait_stable(proxy, {s0: [(T, 1)]})
        say(f"  shadow (T,1) = {a[s0][(T, 1)][0]}")
        res = proxy.txn_offset_commit("app-v1", pid, epoch, s0, {(T, 1): 12}, version=4)
        say(f"  next transaction, no AddOffsetsToTxn yet, v4 commit with the same epoch {epoch}: "
            f"{[err(c) for c in res.values()]}")
        for conn in (zombie, fresh, proxy, client, admin):
            conn.close()


if __name__ == "__main__":
    main()
