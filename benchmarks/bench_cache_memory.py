"""What a share held by the key-range result cache costs in memory.

``max.bytes.key.range.results`` caps the bytes the cache charges its shares
(``CachedShare.size``, ``proxy/keyrange/cache.py``); this measures what they take, so the
charge can be checked against it. Each case fills a ``ShareCache`` (cap out of reach) with
N shares built the way the engine builds them, every share from a read of its own and for a
range set of its own, the worst case and the common one: a set's share is served and gone
by the time its consumer's next read caches another. So each share owns its offsets
(distinct int objects past 2**30, as Kafka offsets become), its partition tuple, its
metadata ints and aborted-transaction list, its key in the LRU, and its range set's entry
in the index; and its range set, as a request decoded it (the tracker of active sets keeps
the latest copy of a set, a share the one its read was split with). One case holds many
shares per set, to tell the index entry of a set from the share.

Two counts per case, each in a fresh process:
* ``traced``: ``tracemalloc``'s bytes held after the fill less before it, per share: every
  Python allocation, at the size requested;
* ``rss``: the process's resident set growth per share, the allocator's rounding, pool
  and chunk headers included (pages freed and reused make it noisier than ``traced``).
``charged`` is ``CachedShare.size`` plus the index entry the cache charges, per share.
Several N are run because the LRU's and the index's hash tables grow in steps: the
per-share cost is highest just after a resize.

Run: ``.venv/bin/python -m benchmarks.bench_cache_memory [--shares N ...] [--case NAME ...]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.benchmark import Benchmark  # noqa: E402
from proxy.keyrange.cache import CachedShare, ShareCache  # noqa: E402
from proxy.protocol import messages  # noqa: E402
from proxy.protocol.messages import ApiKey  # noqa: E402
from proxy.ranges import KeyRange  # noqa: E402


@dataclass(frozen=True)
class Case:
    offsets: int | None = None  # offsets-only share listing that many offsets
    records: int | None = None  # records share of that many bytes
    aborted: int = 0  # aborted transactions the read listed
    ranges: int = 1  # key ranges in the share's range set
    per_set: int = 1  # shares of one range set held at once


CASES: dict[str, Case] = {
    "offsets, none matched": Case(offsets=0),
    "offsets, 1": Case(offsets=1),
    "offsets, 10": Case(offsets=10),
    "offsets, 100": Case(offsets=100),
    "offsets, 1000": Case(offsets=1000),
    "records, empty": Case(records=0),
    "records, 100 B": Case(records=100),
    "records, 1 KiB": Case(records=1024),
    "records, 16 KiB": Case(records=16 << 10),
    "records, 1 MiB": Case(records=1 << 20),
    "records, 1 KiB, 3 aborted": Case(records=1024, aborted=3),
    "records, 1 KiB, 4 ranges": Case(records=1024, ranges=4),
    "records, 1 KiB, 50 per set": Case(records=1024, per_set=50),
}
BASE_OFFSET = 5_000_000_000


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _fill(cache: ShareCache, case: Case, n: int) -> None:
    aborted_class = messages.body_class(ApiKey.FETCH, "response").AbortedTransaction
    ranges: tuple = ()
    for i in range(n):
        # Fresh int objects, as a decoded response and the offset matcher give them; a
        # fresh range set per set, as a request decodes it (the share may outlive the
        # tracker's copy).
        start = BASE_OFFSET + i * 1000
        end = start + 1000
        if i % case.per_set == 0:
            low = (1 << 62) + i * 100
            ranges = tuple(KeyRange(low + 10 * k, low + 10 * k + 5) for k in range(case.ranges))
        share = CachedShare(
            ("orders", (i // case.per_set) & 7), ranges, start, end, 1,
            records=None if case.records is None else (b"\x01" * case.records if case.records else bytes(0)),
            offsets=None if case.offsets is None else tuple(range(start, start + case.offsets)),
            high_watermark=end + 7, last_stable_offset=end + 5, log_start_offset=start - 1000,
            aborted_transactions=[aborted_class(producer_id=10**12 + k, first_offset=start + k)
                                  for k in range(case.aborted)],
        )
        cache.put(share)


def measure(name: str, n: int, count: str) -> dict:
    """One case in this process, counted by ``tracemalloc`` (``traced``) or by the resident
    set (``rss``, without tracemalloc, whose own records would count too); and the charge."""
    cache = ShareCache(1 << 62)
    gc.collect()
    if count == "traced":
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0] if count == "traced" else _rss()
    _fill(cache, CASES[name], n)
    gc.collect()
    held = (tracemalloc.get_traced_memory()[0] if count == "traced" else _rss()) - before
    tracemalloc.stop()
    assert len(cache) == n
    return {count: held / n, "charged": cache.bytes_held / n}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shares", type=int, nargs="+", default=[20_000, 45_000, 90_000])
    parser.add_argument("--case", nargs="+", choices=list(CASES), default=list(CASES), help="only these cases")
    parser.add_argument("--one", nargs=3, metavar=("CASE", "N", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one[0], int(args.one[1]), args.one[2])))
        return 0
    print(f"{'case':28} {'shares':>7} {'traced':>10} {'rss':>10} {'charged':>10}  (bytes per share)")
    for case in args.case:
        spec = CASES[case]
        for n in args.shares:
            if spec.records is not None and spec.records >= 1 << 20:
                n = min(n, 200)  # 1 MiB each: enough to count, within the machine's memory
            row: dict = {}
            for count in ("traced", "rss"):
                out = subprocess.run([sys.executable, __file__, "--one", case, str(n), count],
                                     check=True, capture_output=True, text=True).stdout
                row.update(json.loads(out))
            print(f"{case:28} {n:7d} {row['traced']:10.1f} {row['rss']:10.1f} {row['charged']:10.1f}")
    return 0


BENCHMARK = Benchmark("bench_cache_memory", "What a share held by the key-range result cache costs in memory",
                      main=main)


if __name__ == "__main__":
    sys.exit(main())
