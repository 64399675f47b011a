"""Key-range delivery over several proxy instances (docs/high-availability.md): N raw
clients of equal key ranges of one partition, client i through instance i mod R of R fresh
port-per-broker proxies in front of one broker (as a load balancer in front of proxy
replicas spreads them), against one raw client reading the partition direct in the same
round; R = 1, 2, 3 (``--instances``), N = every ``--workers`` count above 1.

Each instance reads a batch once for the ranges it serves, so R instances read the
partition up to R times: the broker read amplification (record bytes all R proxies read
for the partition / its size) is the figure, beside the records/s against one instance in
the same round. The machinery, sizes and checks are ``keyrange_delivery``'s (its
``instances`` kind); only the results are kept apart (``keyrange_instances.json``).

    python -m benchmarks keyrange_instances                 # 3 rounds: about 4 minutes on 2 cores
    python -m benchmarks keyrange_instances --instances 1 4
"""

from __future__ import annotations

import argparse

from benchmarks.benchmark import Benchmark, Progress
from benchmarks.workloads import keyrange_delivery


def _from_args(report: dict, progress: Progress, args: argparse.Namespace) -> None:
    keyrange_delivery.run(report, progress, mb=args.delivery_mb, value_size=100, consumers=args.workers,
                          rounds=args.rounds, share_records=args.share_records, kinds=["instances"],
                          instances=args.instances)


def _steps(args: argparse.Namespace) -> int:
    return 3 + args.rounds * (1 + len([n for n in args.workers if n > 1]) * len(set(args.instances)))


BENCHMARK = Benchmark(
    "keyrange_instances", "Key-range delivery over R proxy instances: N range consumers of one partition",
    method="No work per record. N raw header-counting clients of equal key ranges, client i through instance "
           "i mod R of R fresh proxies, against one raw client direct in the same round, the order rotating; "
           "broker read amplification summed over the R instances.",
    steps=_steps, run=_from_args, default=False)
