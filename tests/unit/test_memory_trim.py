"""The heap trimmer gives freed pages back and counts it; an interval of 0 turns it off."""

from __future__ import annotations

import subprocess
import sys

import pytest
import trio

from proxy.server.config import ConfigError, load_config
from proxy.server.memory import HeapTrimmer, resident_bytes
from proxy.server.metrics import ProxyMetrics


def test_resident_bytes_is_this_process_size():
    assert resident_bytes() > 1024 * 1024


_BURST = """
import sys
from proxy.server.memory import HeapTrimmer, resident_bytes, tune_malloc
tune_malloc()
trimmer = HeapTrimmer(30.0)
if not trimmer.available:
    sys.exit(3)
# Medium buffers as frames are: with tune_malloc they come from the heap, and freed they
# stay resident until trimmed.
burst = [bytearray(256 * 1024) for _ in range(240)]
for buffer in burst:
    buffer[::4096] = b"x" * len(buffer[::4096])  # touch every page
keep = bytearray(1024)  # allocated after the burst: the heap's top stays in use
del burst
held = resident_bytes()
returned = trimmer.trim_once()
print(held, returned, resident_bytes())
"""


def test_trim_gives_back_a_freed_burst():
    done = subprocess.run([sys.executable, "-c", _BURST], capture_output=True, text=True, timeout=60, check=False)
    if done.returncode == 3:
        pytest.skip("no malloc_trim in this C library")
    assert done.returncode == 0, done.stderr
    held, returned, after = map(int, done.stdout.split())
    assert returned >= 40 * 1024 * 1024, (held, returned, after)  # of the 60 MiB burst
    assert after <= held - returned + 1024 * 1024


def test_trims_are_counted():
    metrics = ProxyMetrics()
    trimmer = HeapTrimmer(30.0, metrics)
    if not trimmer.available:
        pytest.skip("no malloc_trim in this C library")
    returned = trimmer.trim_once() + trimmer.trim_once()
    assert metrics.memory_trims._value.get() == 2
    assert metrics.memory_returned_bytes._value.get() == returned
    assert metrics.memory_trim_seconds._value.get() > 0


def test_interval_zero_returns_at_once():
    trimmer = HeapTrimmer(0.0)
    assert not trimmer.available

    async def main():
        with trio.fail_after(1):
            await trimmer.run()

    trio.run(main)


def test_negative_interval_is_a_configuration_error():
    with pytest.raises(ConfigError, match="memory.trim.interval.ms"):
        load_config(None, ["bootstrap.servers=127.0.0.1:9092", "memory.trim.interval.ms=-1"])
