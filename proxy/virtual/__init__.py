"""Virtual range topics (docs/wire-contract.md#9-virtual-range-topics): standard clients
read one key range of a partition by naming ``<topic><suffix><K>``, or one stripe of whole
batches by naming ``<topic><coop suffix><K>`` (no key order; ``proxy.records.stripes``).

- ``names``: parsing names, mapping partitions, deterministic topic ids (pure);
- ``rewrite``: Metadata, ListOffsets, OffsetsForLeaderEpoch, DescribeConfigs and refusals (pure);
- ``fetch``: fetch sessions and the answers standard clients accept (pure);
- ``commits``: share watermarks and the real partition's stable offset (pure);
- ``feature``: the I/O edge, one feature of the chain.
"""
