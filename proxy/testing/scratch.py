"""Scratch directories for benchmarks and the demo, removed when the process exits.

A benchmark run writes gigabytes of Kafka logs (a 1 GB topic, the produce rounds'
topics); left behind, a few runs fill a disk. ``KEYRANGE_KEEP_WORKDIR=1`` keeps the
directory for inspection (its path is printed).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path


def scratch_dir(prefix: str) -> Path:
    """A new directory under the system's temporary directory, removed at exit."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if os.environ.get("KEYRANGE_KEEP_WORKDIR"):
        print(f"working directory kept: {path}", file=sys.stderr, flush=True)
    else:
        atexit.register(shutil.rmtree, path, True)
    return path
