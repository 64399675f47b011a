"""Pick the record-walking kernels: the C accelerator when built, else pure Python.

Both produce identical results (tests check this). Set ``KEYRANGE_PURE_PYTHON=1`` to force
the Python kernels, for example to compare them.
"""

from __future__ import annotations

from proxy.accelerators import choose
from proxy.records import _kernels_py

_impl, ACCELERATED = choose("proxy.records._ckernels", _kernels_py)

split = _impl.split
match = _impl.match
keep = _impl.keep
