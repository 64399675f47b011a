"""Kafka record batches (magic 2), sans-IO: pure functions over bytes.

* ``batch``: header parsing, walking a Fetch ``Records`` blob, lazy zero-copy records;
* ``compression``: the four codecs, bounded decompression, Java-compatible output;
* ``builder``: batches that keep a source batch's identity with any subset of its records;
* ``keyhash``: the key hash of docs/wire-contract.md#2-key-hash-and-ranges (ranges live in ``proxy.ranges``);
* ``plan`` and ``split``: one-pass split of a blob into per-requester filtered blobs,
  plus the offsets-only variant for the result cache;
* ``kernels``: the record-walking hot loops, C-accelerated when built.

Bad bytes raise ``proxy.protocol.errors.ProtocolError`` and nothing else.
"""
