"""Offset ranges packed as they travel: 17 bytes each, an int64 Start and End (big-endian)
and an empty tagged-field section.

That is the element layout of OffsetCommit's ``OffsetRanges`` (tag 10000), so a range
commit's ranges go from the client's frame through validation and the merge rule to the
log record as bytes, never as a Python object per range. The log value (version 1) holds
them as varint deltas from S, several times smaller (``to_deltas``/``from_deltas``). The kernels come from the C accelerator when it is built,
else from the pure-Python reference with identical results (tests check this); set
``KEYRANGE_PURE_PYTHON=1`` to force the latter.
"""

from __future__ import annotations

from proxy.accelerators import choose
from proxy.commits import _packed_py
from proxy.commits._packed_py import MAX_OFFSET, RANGE_SIZE, OffsetRange, invalid, pack, unpack

_impl, ACCELERATED = choose("proxy.commits._cpacked", _packed_py)

# (reason or None, ranges sorted): a commit's ranges checked (bytes in, bytes out).
sort_checked = _impl.sort_checked
# (S', R'): the merge rule of docs/wire-contract.md#33-offsetcommit over packed R and commit.
merge = _impl.merge
# S' alone.
stable_after = _impl.stable_after
# R as varint deltas from S (the log value's version 1), and back.
to_deltas = _impl.to_deltas
from_deltas = _impl.from_deltas

__all__ = ["ACCELERATED", "MAX_OFFSET", "RANGE_SIZE", "OffsetRange", "from_deltas", "invalid", "merge", "pack",
           "sort_checked", "stable_after", "to_deltas", "unpack"]
