"""Individual commit (docs/individual-commit.md): each consumer commits exactly the offsets
it processed, gaps and all, as offset ranges; the group's committed offset moves as
standard tools expect.

- ``answers``: refused partitions in a commit's answer, (S, R) in an OffsetFetch answer (pure);
- ``txn``: a TxnOffsetCommit with offset ranges as its range shadow and carrier (pure);
- ``feature``: the I/O edge, one feature of the chain, over the commit layer (``proxy.commits``).
"""
