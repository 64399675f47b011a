"""Key-range split throughput, records/s on one core.

Workload: 100-byte records (16-byte random keys, random values), in batches of about
16 KiB (the Java producer's default batch.size) inside a ~1 MiB Records blob (the
consumer's default max.partition.fetch.bytes), uncompressed and lz4. Each case splits the
blob into range sets in one ``split_records`` call, CRC check and rebuilding included:

* ``1-full``: one set with the whole space (the pass-through shortcut, no hashing);
* ``1-half``: one set holding one range of half the space (every record hashed);
* ``4`` and ``16``: that many sets, the equal shares of docs/wire-contract.md#2-key-hash-and-ranges.

Both kernel implementations are measured: ``c`` (the accelerator, when built) and
``python`` (the pure-Python fallback). The C kernels run twice, on the two paths of
``split_records``: ``whole-blob`` (``split_blob``: the whole blob in one GIL-free C call,
the default; compressed blobs fall back to the per-batch loop, which ``whole_blob_taken``
says) and ``per-batch`` (the Python batch loop around the C record walk). ``speedups``
sets the two side by side. Results go to ``benchmarks/results/split.json``; profiles of the
4- and 16-set cases go to ``benchmarks/results/split_profile.txt``.

Run: ``.venv/bin/python benchmarks/bench_split.py [--seconds S]``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import platform
import pstats
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cramjam  # noqa: E402
import xxhash  # noqa: E402

from benchmarks.benchmark import Benchmark  # noqa: E402
from proxy.ranges import KeyRange, equal_shares  # noqa: E402
from proxy.records import kernels  # noqa: E402
from proxy.records.builder import build_batch, encode_record  # noqa: E402
from proxy.records.compression import Codec  # noqa: E402
from proxy.records.plan import RangePlan  # noqa: E402
from proxy.records.split import split_records  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
RECORD_BYTES = 100
KEY_BYTES = 16
BATCH_BYTES = 16 * 1024
BLOB_BYTES = 1024 * 1024
GOAL = 1_000_000

CASES = {
    "1-full": [None],
    "1-half": [[KeyRange(0, (1 << 62) - 1)]],
    "4": [[r] for r in equal_shares(4)],
    "16": [[r] for r in equal_shares(16)],
}


def make_blob(codec: Codec, seed: int = 7) -> tuple[bytes, int]:
    """A Records blob of ~1 MiB (uncompressed size) of 100-byte records; (blob, count)."""
    rnd = random.Random(seed)
    value_len = RECORD_BYTES - 2 - 1 - 1 - 2 - 1 - KEY_BYTES - 1 - 1  # fields around the value
    batches, offset, count = [], 0, 0
    per_batch = BATCH_BYTES // RECORD_BYTES
    while count * RECORD_BYTES < BLOB_BYTES:
        records = [
            encode_record(
                offset_delta=i,
                timestamp_delta=i // 10,
                key=rnd.randbytes(KEY_BYTES),
                value=rnd.randbytes(value_len // 2) * 2,  # compressible like real payloads
            )
            for i in range(per_batch)
        ]
        assert all(len(r) == RECORD_BYTES for r in records[64:]), len(records[100])
        batches.append(
            build_batch(
                base_offset=offset, last_offset_delta=per_batch - 1, records=records,
                record_count=per_batch, base_timestamp=1_700_000_000_000,
                max_timestamp=1_700_000_000_000 + per_batch, codec=codec,
            )
        )
        offset += per_batch
        count += per_batch
    return b"".join(batches), count


def measure(blob: bytes, count: int, plan: RangePlan, seconds: float) -> float:
    """Best records/s over repeated one-pass splits lasting ``seconds`` in total."""
    best = float("inf")
    deadline = time.perf_counter() + seconds
    runs = 0
    while runs < 3 or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        split_records(blob, plan)
        best = min(best, time.perf_counter() - t0)
        runs += 1
    return count / best


def whole_blob_taken(blob: bytes, plan: RangePlan) -> bool:
    """Whether ``split_records`` runs this blob through ``split_blob`` (not its fallback)."""
    whole = kernels.split_blob
    all_full = len(plan.full_sets) == len(plan)
    return whole is not None and whole(blob, plan.bounds, plan.members, len(plan), all_full, True) is not None


def speedups(results: list[dict]) -> list[dict]:
    """Whole-blob against per-batch records/s, C kernels, per codec and case."""
    rate = {(r["codec"], r["sets"], r["path"]): r["records_per_s"] for r in results if r["kernels"] == "c"}
    return [
        {"codec": codec, "sets": sets, "whole_blob_over_per_batch": round(whole / rate[codec, sets, "per-batch"], 2)}
        for (codec, sets, path), whole in rate.items()
        if path == "whole-blob"
    ]


def profile_case(blob: bytes, plan: RangePlan, top: int = 12) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(5):
        split_records(blob, plan)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def machine() -> dict:
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "cramjam": cramjam.__version__,
        "xxhash": xxhash.VERSION,
        "c_accelerator_built": kernels.ACCELERATED,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="time per case")
    args = parser.parse_args(argv)
    runs = ([("c", "whole-blob"), ("c", "per-batch")] if kernels.ACCELERATED else []) + [("python", "per-batch")]
    results = []
    profiles = []
    for codec in (Codec.NONE, Codec.LZ4):
        blob, count = make_blob(codec)
        for impl, path in runs:
            with kernels.using(impl, whole_blob=path == "whole-blob"):
                for case, sets in CASES.items():
                    plan = RangePlan(sets)
                    rate = measure(blob, count, plan, args.seconds)
                    row = {
                        "codec": codec.name.lower(), "sets": case, "kernels": impl, "path": path,
                        "whole_blob_taken": whole_blob_taken(blob, plan),
                        "records": count, "blob_bytes": len(blob),
                        "records_per_s": round(rate), "meets_1M_goal": rate >= GOAL,
                    }
                    results.append(row)
                    print(json.dumps(row), flush=True)
                    if case in ("4", "16"):
                        profiles.append(
                            f"=== {impl} kernels, {path}, {codec.name.lower()}, {case} sets ===\n"
                            + profile_case(blob, plan)
                        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "key-range split throughput (one core, one thread)",
        "command": " ".join([os.path.relpath(sys.executable, ROOT), *sys.argv]),
        "cwd": str(ROOT),
        "workload": {
            "record_bytes": RECORD_BYTES, "key_bytes": KEY_BYTES, "batch_bytes": BATCH_BYTES,
            "blob_bytes_uncompressed": BLOB_BYTES, "output_codec": "same as source",
            "crc_verified": True, "timing": "best of repeated runs",
        },
        "goal_records_per_s": GOAL,
        "machine": machine(),
        "results": results,
        "speedups": speedups(results),
        "profile_file": "benchmarks/results/split_profile.txt",
    }
    (RESULTS / "split.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS / "split_profile.txt").write_text(
        "cProfile, sorted by own time; 5 splits of the ~1 MiB blob per case.\n\n"
        + "\n".join(profiles)
    )


BENCHMARK = Benchmark("bench_split", "Key-range split throughput, records/s on one core", main=main, with_all=True)


if __name__ == "__main__":
    main()
