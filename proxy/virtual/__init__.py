"""Virtual range topics (docs/wire-contract.md#9-virtual-range-topics): standard clients
read one key range of a partition by naming ``<topic><suffix><K>``, or one stripe of whole
batches by naming ``<topic><coop suffix><K>`` (no key order; ``proxy.records.stripes``).

The rules, without I/O:

- ``names``: parsing names, mapping partitions, deterministic topic ids;
- ``precheck``: which request bytes may name a virtual topic at all;
- ``rewrite``: Metadata, ListOffsets, OffsetsForLeaderEpoch, DescribeConfigs, DescribeTopicPartitions;
- ``refusals``: writes and topic administration naming a virtual topic, KIP-848 groups;
- ``fetch``: fetch sessions and the answers standard clients accept;
- ``commits``: share watermarks and the real partition's stable offset;
- ``txn``: commits of virtual partitions inside transactions (share shadows, the carrier).

The I/O edges, one feature of the chain per concern over one shared ``resolver``
(``VirtualResolver``: which names and ids are virtual topics):

- ``naming_feature``: requests naming topics rewritten onto the real topic, and their responses back;
- ``refusal_feature``: writes and KIP-848 groups naming a virtual topic refused;
- ``fetch_feature``: Fetch of virtual partitions, from shared broker reads;
- ``commit_feature``: OffsetCommit, OffsetFetch and TxnOffsetCommit of virtual partitions,
  over the commit layer (``proxy.commits``).
"""
