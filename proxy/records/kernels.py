"""Pick the record-walking kernels: the C accelerator when built, else pure Python.

Both produce identical results (tests check this). Set ``KEYRANGE_PURE_PYTHON=1`` to force
the Python kernels, for example to compare them.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from types import ModuleType

from proxy.accelerators import choose
from proxy.records import _kernels_py

_impl, ACCELERATED = choose("proxy.records._ckernels", _kernels_py)

split = _impl.split
match = _impl.match
keep = _impl.keep


@contextlib.contextmanager
def using(impl: str | ModuleType) -> Iterator[None]:
    """Route every caller of this module through one implementation (``"python"``, ``"c"``
    or the module itself) for the block: tests, fuzzing and benchmarks compare the two."""
    if isinstance(impl, str):
        impl = _kernels_py if impl == "python" else importlib.import_module("proxy.records._ckernels")
    global split, match, keep
    saved = (split, match, keep)
    split, match, keep = impl.split, impl.match, impl.keep
    try:
        yield
    finally:
        split, match, keep = saved
