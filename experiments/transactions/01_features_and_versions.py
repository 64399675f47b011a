"""Which transaction protocol a fresh Kafka cluster speaks.

Prints the finalized features (ApiVersions v3: transaction.version, group.version, ...),
the version ranges of the transaction APIs, and what Kafka's own FeatureCommand says.
Under transaction.version >= 2 (KIP-890 part 2) a Java 4.x producer skips AddOffsetsToTxn:
it sends TxnOffsetCommit v5, which adds the group's __consumer_offsets partition to the
transaction itself, and EndTxn v5 bumps the producer epoch on every transaction.

    .venv/bin/python experiments/transactions/01_features_and_versions.py
"""

from common import Conn, check, finalized_features, kafka, say

from harness.java_tools import run_java_tool
from proxy.protocol.messages import ApiKey

APIS = {
    "InitProducerId": ApiKey.INIT_PRODUCER_ID, "AddPartitionsToTxn": ApiKey.ADD_PARTITIONS_TO_TXN,
    "AddOffsetsToTxn": ApiKey.ADD_OFFSETS_TO_TXN, "EndTxn": ApiKey.END_TXN,
    "TxnOffsetCommit": ApiKey.TXN_OFFSET_COMMIT, "OffsetFetch": ApiKey.OFFSET_FETCH,
    "OffsetCommit": ApiKey.OFFSET_COMMIT, "Produce": ApiKey.PRODUCE,
    "DescribeProducers": 61, "DescribeTransactions": 65, "ListTransactions": 66,
}


def main() -> None:
    with kafka() as cluster:
        conn = Conn(cluster.bootstrap_servers, "features")
        body = conn.api_versions()
        say(f"\n## ApiVersions v3: finalized features (epoch {body.finalized_features_epoch})")
        features = finalized_features(conn)
        for name, (lo, hi) in sorted(features.items()):
            say(f"  {name}: min level {lo}, max level {hi}")
        say("  supported:", ", ".join(f"{f.name} {f.min_version}-{f.max_version}" for f in body.supported_features))
        check("transaction.version is finalized at 2 (KIP-890 part 2 on)", features.get("transaction.version", (0, 0))[1] == 2)
        say("\n## API versions the broker advertises")
        versions = {a.api_key: (a.min_version, a.max_version) for a in body.api_keys}
        for name, key in APIS.items():
            say(f"  {name} ({int(key)}): {versions.get(key)}")
        check("TxnOffsetCommit up to v5 (v5 = implicit AddOffsetsToTxn under TV2)",
              versions.get(ApiKey.TXN_OFFSET_COMMIT, (0, 0))[1] >= 5)
        say("\n## kafka-features.sh describe (org.apache.kafka.tools.FeatureCommand)")
        result = run_java_tool("org.apache.kafka.tools.FeatureCommand",
                               ["--bootstrap-server", cluster.bootstrap_servers, "describe"], check=False, timeout=90)
        for line in result.stdout.splitlines():
            say("  " + line.strip())
        if result.returncode:
            say("  (exit", result.returncode, result.stderr[-500:], ")")
        conn.close()


if __name__ == "__main__":
    main()
