"""Two members of one partition, each in its own open transaction.

Member A reads share 0 and member B share 1 of T partition 0 (T.kr2 partitions 0 and 1),
each with its own transactional producer (as Kafka Streams exactly_once_v2 has, one per
thread). The proxy writes, in each one's transaction, G's own commit of (T, 0) (the
"carrier": the member's generation, and S) and the share's shadow group commit.

Observed:
  1. Both transactions hold pending offsets at once and neither commit waits for the other
     (latencies printed); each share's shadow key has its own writer.
  2. While either is open, OffsetFetch(RequireStable) answers 88 for the keys it wrote.
  3. Two open transactions writing the same key (here G's (T, 0), the carrier): whichever
     was *written* later wins, whatever order the transactions commit in (Kafka keeps the
     record with the higher __consumer_offsets offset). So every (S, W) state kept in ONE
     key (mechanism C: all watermarks in the metadata of G's (T, 0) commit, or one IC log
     record) loses the other member's update when their transactions overlap: a
     read-modify-write inside a transaction cannot see the other's pending write.
  4. The S written in the carrier from the committed watermarks at commit time is a lower
     bound; after both commit, S is corrected by a plain OffsetCommit of G with a member's
     generation (the "settle"), computed from the committed shadow offsets.

    .venv/bin/python experiments/transactions/04_concurrent_members.py
"""

import time

from common import Conn, check, err, kafka, say, shadow_group, wait_stable

T = "orders"
G = "billing"


def timed(fn, *args, **kwargs):
    began = time.monotonic()
    out = fn(*args, **kwargs)
    return out, (time.monotonic() - began) * 1000


def main() -> None:
    with kafka() as cluster:
        admin = Conn(cluster.bootstrap_servers, "admin")
        admin.create_topic(T, 1)
        s0, s1 = shadow_group(G, ".kr2/0"), shadow_group(G, ".kr2/1")
        _, coord = admin.find_coordinator(G, 0)
        members = Conn(coord, "members")
        # One classic member joins for the two (a real group would have two; one suffices for
        # the generation checks): both carriers use its generation and id.
        generation, member = members.join_classic(G, T)
        producers = {}
        for name in ("A", "B"):
            _, txn_coord = admin.find_coordinator(f"app-{name}", 1)
            conn = Conn(txn_coord, f"producer-{name}")
            init = conn.init_pid(f"app-{name}")
            producers[name] = [conn, init.producer_id, init.producer_epoch]
        proxy = Conn(coord, "proxy")

        # committed starting point: W0 = W1 = 100, S = 100
        for name, shadow in (("A", s0), ("B", s1)):
            conn, pid, epoch = producers[name]
            proxy.txn_offset_commit(f"app-{name}", pid, epoch, shadow, {(T, 0): 100})
            proxy.txn_offset_commit(f"app-{name}", pid, epoch, G, {(T, 0): 100}, generation=generation, member=member)
            end = conn.end_txn(f"app-{name}", pid, epoch, True)
            producers[name][2] = end.producer_epoch
        wait_stable(proxy, {G: [(T, 0)], s0: [(T, 0)], s1: [(T, 0)]})
        say("\n# committed start: W0 = W1 = S = 100")

        say("\n## 1-2. both transactions open at once")
        # A: W0 -> 150, S_A = min(150, W1 committed 100) = 100; B: W1 -> 180, S_B = min(W0 committed 100, 180) = 100
        # (with B's carrier given S_B = 140 here, as if W0 were 140, to see which S survives)
        a_conn, a_pid, a_epoch = producers["A"]
        b_conn, b_pid, b_epoch = producers["B"]
        r1, t1 = timed(proxy.txn_offset_commit, "app-A", a_pid, a_epoch, G, {(T, 0): 100}, generation=generation,
                       member=member, metadata="A")
        r2, t2 = timed(proxy.txn_offset_commit, "app-A", a_pid, a_epoch, s0, {(T, 0): 150})
        say(f"  A: carrier G (T,0)=100 {[err(c) for c in r1.values()]} in {t1:.1f} ms; shadow {s0}=150 "
            f"{[err(c) for c in r2.values()]} in {t2:.1f} ms")
        r3, t3 = timed(proxy.txn_offset_commit, "app-B", b_pid, b_epoch, G, {(T, 0): 140}, generation=generation,
                       member=member, metadata="B")
        r4, t4 = timed(proxy.txn_offset_commit, "app-B", b_pid, b_epoch, s1, {(T, 0): 180})
        say(f"  B (A still open): carrier G (T,0)=140 {[err(c) for c in r3.values()]} in {t3:.1f} ms; shadow "
            f"{s1}=180 {[err(c) for c in r4.values()]} in {t4:.1f} ms")
        check("no commit waited for the other member's transaction", max(t1, t2, t3, t4) < 1000
              and {0} == set(r1.values()) | set(r2.values()) | set(r3.values()) | set(r4.values()))
        a = proxy.offset_fetch({G: [(T, 0)], s0: [(T, 0)], s1: [(T, 0)]}, require_stable=True)
        say("  RequireStable while both open: " + ", ".join(f"{g} {err(v[(T, 0)][2])}" for g, v in a.items()))
        check("88 for every key with a pending write", all(v[(T, 0)][2] == 88 for v in a.values()))

        say("\n## 3. B commits first, then A")
        end_b = b_conn.end_txn("app-B", b_pid, b_epoch, True)
        say(f"  B EndTxn commit: {err(end_b.error_code)}")
        a, _ = wait_stable(proxy, {s1: [(T, 0)]})
        a = proxy.offset_fetch({G: [(T, 0)], s0: [(T, 0)], s1: [(T, 0)]}, require_stable=False)
        say("  after B: " + ", ".join(f"{g}={v[(T, 0)][0]} ({v[(T, 0)][1]!r})" for g, v in a.items()))
        end = a_conn.end_txn("app-A", a_pid, a_epoch, True)
        say(f"  A EndTxn commit: {err(end.error_code)}")
        a, _ = wait_stable(proxy, {G: [(T, 0)], s0: [(T, 0)], s1: [(T, 0)]})
        say("  after A: " + ", ".join(f"{g}={v[(T, 0)][0]} ({v[(T, 0)][1]!r})" for g, v in a.items()))
        check("shares keep both updates (separate keys): W0=150, W1=180",
              a[s0][(T, 0)][0] == 150 and a[s1][(T, 0)][0] == 180)
        check("the shared key G (T,0) holds B's write (written later), though A committed later",
              a[G][(T, 0)][:2] == (140, "B"))

        say("\n## 3b. mechanism C: both watermarks in the metadata of G's own (T,0), read-modify-write")
        a_epoch, b_epoch = end.producer_epoch, end_b.producer_epoch
        # both read the committed state "W0=150,W1=180", each changes its own share
        r = proxy.txn_offset_commit("app-A", a_pid, a_epoch, G, {(T, 0): 180}, generation=generation, member=member,
                                    metadata="W0=200,W1=180")
        say(f"  A writes G (T,0)=180 metadata 'W0=200,W1=180': {[err(c) for c in r.values()]}")
        r = proxy.txn_offset_commit("app-B", b_pid, b_epoch, G, {(T, 0): 150}, generation=generation, member=member,
                                    metadata="W0=150,W1=230")
        say(f"  B writes G (T,0)=150 metadata 'W0=150,W1=230': {[err(c) for c in r.values()]}")
        say(f"  B commits: {err(b_conn.end_txn('app-B', b_pid, b_epoch, True).error_code)}; "
            f"then A commits: {err(a_conn.end_txn('app-A', a_pid, a_epoch, True).error_code)}")
        a, _ = wait_stable(proxy, {G: [(T, 0)]})
        say(f"  G (T,0) = {a[G][(T, 0)][0]} metadata {a[G][(T, 0)][1]!r}")
        check("one key: A's W0=200 is lost though both committed and A committed last", "W0=200" not in a[G][(T, 0)][1])

        say("\n## 4. settle S after both committed: plain OffsetCommit of G with the member's generation")
        a = proxy.offset_fetch({s0: [(T, 0)], s1: [(T, 0)]}, require_stable=True)
        marks = [a[s0][(T, 0)][0], a[s1][(T, 0)][0]]
        settled = min(marks)
        res = proxy.offset_commit(G, {(T, 0): settled}, generation=generation, member=member, metadata="settled")
        a = proxy.offset_fetch({G: [(T, 0)]}, require_stable=True)
        say(f"  shadows W = {marks}; OffsetCommit G (T,0)={settled}: {[err(c) for c in res.values()]}; "
            f"G (T,0) now {a[G][(T, 0)][0]}")
        check("S = min of the committed watermarks", a[G][(T, 0)][0] == settled)
        for conn in (admin, members, proxy, a_conn, b_conn):
            conn.close()


if __name__ == "__main__":
    main()
