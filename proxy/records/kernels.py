"""Pick the record-walking kernels: the C accelerator when built, else pure Python.

Both produce identical results (tests check this). Set ``KEYRANGE_PURE_PYTHON=1`` to force
the Python kernels, for example to compare them.
"""

from __future__ import annotations

import os

from proxy.records import _kernels_py

try:
    if os.environ.get("KEYRANGE_PURE_PYTHON"):
        raise ImportError("pure Python kernels requested")
    from proxy.records import _ckernels as _impl  # type: ignore[attr-defined]

    ACCELERATED = True
except ImportError:
    _impl = _kernels_py
    ACCELERATED = False

split = _impl.split
match = _impl.match
keep = _impl.keep
