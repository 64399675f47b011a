"""What shadow groups look like to tools, how to remove them, how long their offsets live,
and how much a commit's metadata may hold.

Observed:
  1. ListGroups lists shadow groups (classic, protocol type "", state Empty) next to G;
     DescribeGroups answers them; kafka-consumer-groups --list shows them and --describe
     of G shows only G's own offsets.
  2. DeleteGroups removes an (empty) shadow group and its offsets.
  3. The offsets of a group without members expire offsets.retention.minutes after their
     commit (here 1 minute): a shadow group's watermark is not kept forever, while G's,
     with a live member, stays.
  4. offset.metadata.max.bytes (4096) counts Java chars (UTF-16 units), not bytes: 4096
     CJK characters (12288 UTF-8 bytes) are accepted, 4097 ASCII ones refused
     (OFFSET_METADATA_TOO_LARGE), in TxnOffsetCommit as in OffsetCommit.

    .venv/bin/python experiments/transactions/05_groups_visibility.py
"""

import time

from common import Conn, check, err, kafka, say, shadow_group

from harness.java_tools import CONSUMER_GROUP_COMMAND, run_java_tool

T = "orders"
G = "billing"


def main() -> None:
    with kafka(**{"offsets.retention.minutes": "1", "offsets.retention.check.interval.ms": "5000"}) as cluster:
        admin = Conn(cluster.bootstrap_servers, "admin")
        admin.create_topic(T, 2)
        shadows = [shadow_group(G, f".kr2/{i}") for i in range(2)]
        _, coord = admin.find_coordinator(G, 0)
        _, txn_coord = admin.find_coordinator("app-1", 1)
        client = Conn(txn_coord, "client")
        proxy = Conn(coord, "proxy")
        member_conn = Conn(coord, "member")
        generation, member = member_conn.join_classic(G, T, session_ms=120000)
        init = client.init_pid("app-1")
        pid, epoch = init.producer_id, init.producer_epoch
        proxy.txn_offset_commit("app-1", pid, epoch, G, {(T, 0): 10, (T, 1): 10}, generation=generation, member=member)
        for i, shadow in enumerate(shadows):
            proxy.txn_offset_commit("app-1", pid, epoch, shadow, {(T, 0): 20 + i, (T, 1): 30 + i})
        epoch = client.end_txn("app-1", pid, epoch, True).producer_epoch
        committed_at = time.monotonic()
        time.sleep(0.5)

        say("\n## 1. how tools see them")
        for row in sorted(proxy.list_groups()):
            say(f"  ListGroups: id {row[0]!r}, protocol type {row[1]!r}, state {row[2]!r}, type {row[3]!r}")
        for row in proxy.describe_groups([G, *shadows]):
            say(f"  DescribeGroups: {row[0]!r} error {err(row[1])}, state {row[2]!r}, protocol type {row[3]!r}, "
                f"{row[4]} members")
        listed = run_java_tool(CONSUMER_GROUP_COMMAND, ["--bootstrap-server", cluster.bootstrap_servers, "--list"],
                               check=False, timeout=90)
        say("  kafka-consumer-groups --list:", listed.stdout.split())
        check("shadow groups are listed by the standard tool", all(s in listed.stdout.split() for s in shadows))
        described = run_java_tool(CONSUMER_GROUP_COMMAND, ["--bootstrap-server", cluster.bootstrap_servers,
                                                            "--describe", "--group", G], check=False, timeout=90)
        say("  kafka-consumer-groups --describe --group billing:")
        for line in described.stdout.strip().splitlines():
            say("    " + line)
        described = run_java_tool(CONSUMER_GROUP_COMMAND, ["--bootstrap-server", cluster.bootstrap_servers,
                                                            "--describe", "--group", shadows[0]], check=False,
                                  timeout=90)
        say(f"  kafka-consumer-groups --describe --group {shadows[0]}:")
        for line in (described.stdout.strip() + "\n" + described.stderr.strip()).strip().splitlines():
            say("    " + line)

        say("\n## 4. metadata size (offset.metadata.max.bytes = 4096)")
        cases = [("4096 ASCII chars", "a" * 4096), ("4097 ASCII chars", "a" * 4097),
                 ("4096 CJK chars (12288 UTF-8 bytes)", "\u4e00" * 4096), ("4097 CJK chars", "\u4e00" * 4097)]
        for label, metadata in cases:
            res = proxy.txn_offset_commit("app-1", pid, epoch, shadows[1], {(T, 0): 40}, metadata=metadata)
            plain = proxy.offset_commit(shadows[1], {(T, 1): 40}, metadata=metadata)
            say(f"  {label}: TxnOffsetCommit {[err(c) for c in res.values()]}, OffsetCommit "
                f"{[err(c) for c in plain.values()]}")
        epoch = client.end_txn("app-1", pid, epoch, True).producer_epoch
        time.sleep(0.3)
        a = proxy.offset_fetch({shadows[1]: [(T, 0)]}, require_stable=True)
        back = a[shadows[1]][(T, 0)][1]
        check(f"4096 CJK chars come back intact ({len(back)} chars)", back == "\u4e00" * 4096)

        say("\n## 2. DeleteGroups of a shadow group")
        say(f"  DeleteGroups([{shadows[1]!r}]): {[err(c) for c in proxy.delete_groups([shadows[1]]).values()]}")
        a = proxy.offset_fetch({shadows[1]: [(T, 0)]}, require_stable=True)
        say(f"  its (T,0) afterwards: {a[shadows[1]][(T, 0)][0]}")

        say("\n## 3. retention (offsets.retention.minutes=1, checked every 5 s)")
        while time.monotonic() - committed_at < 75:
            member_conn.heartbeat(G, generation, member)  # keeps G's member alive
            time.sleep(3)
        a = proxy.offset_fetch({G: [(T, 0)], shadows[0]: [(T, 0)]}, require_stable=True)
        say(f"  {time.monotonic() - committed_at:.0f} s after the commit: G (T,0) = {a[G][(T, 0)][0]}, "
            f"{shadows[0]} (T,0) = {a[shadows[0]][(T, 0)][0]}")
        check("the shadow group's offsets expired, G's (live member) did not",
              a[shadows[0]][(T, 0)][0] == -1 and a[G][(T, 0)][0] == 10)
        say("  ListGroups now: " + ", ".join(sorted(r[0] for r in proxy.list_groups())))
        for conn in (admin, client, proxy, member_conn):
            conn.close()


if __name__ == "__main__":
    main()
