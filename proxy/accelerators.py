"""Choose between a C accelerator and its pure-Python reference.

Each accelerator is optional (``setup.py`` builds it when it can) and gives the reference's
results exactly (tests compare them). ``KEYRANGE_PURE_PYTHON=1`` forces every reference,
for example to compare the two.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def choose(accelerated: str, reference: ModuleType) -> tuple[ModuleType, bool]:
    """The module named ``accelerated`` if it is built and not refused, else ``reference``;
    and whether the accelerator was taken."""
    module = optional(accelerated)
    return (reference, False) if module is None else (module, True)


def optional(accelerated: str) -> ModuleType | None:
    """The module named ``accelerated`` if it is built and not refused, else None: for an
    accelerator with no Python reference (the proxy then goes without what it offers)."""
    if os.environ.get("KEYRANGE_PURE_PYTHON"):
        return None
    try:
        return importlib.import_module(accelerated)
    except ImportError:
        return None
