"""Pick the record-walking kernels: the C accelerator when built, else pure Python.

Both produce identical results (tests check this). Set ``KEYRANGE_PURE_PYTHON=1`` to force
the Python kernels, for example to compare them.

``split_blob`` is the C module's whole-blob split (``split_records`` in one GIL-free call
for uncompressed and control batches); it has no Python counterpart, since the Python loop
of ``split_records`` is its reference, so it is None whenever the Python kernels are used.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from proxy.accelerators import choose
from proxy.records import _kernels_py

_impl, ACCELERATED = choose("proxy.records._ckernels", _kernels_py)

split = _impl.split
match = _impl.match
keep = _impl.keep
split_blob: Callable[..., Any] | None = getattr(_impl, "split_blob", None)


@contextlib.contextmanager
def using(impl: str | ModuleType, *, whole_blob: bool = True) -> Iterator[None]:
    """Route every caller of this module through one implementation (``"python"``, ``"c"``
    or the module itself) for the block: tests, fuzzing and benchmarks compare the two.

    ``whole_blob=False`` keeps ``split_records`` on its per-batch loop even with the C
    kernels, so a benchmark can set the two paths side by side."""
    if isinstance(impl, str):
        impl = _kernels_py if impl == "python" else importlib.import_module("proxy.records._ckernels")
    global split, match, keep, split_blob
    saved = (split, match, keep, split_blob)
    split, match, keep = impl.split, impl.match, impl.keep
    split_blob = getattr(impl, "split_blob", None) if whole_blob else None
    try:
        yield
    finally:
        split, match, keep, split_blob = saved
