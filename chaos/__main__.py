"""``python -m chaos``: the chaos matrix (``make chaos``), or a part of it.

    python -m chaos                      # every cell; writes benchmarks/results/reliability.json
    python -m chaos --smoke              # the few cells `make test` runs
    python -m chaos 'group-*:*kill'      # cells matching workload:fault globs
    python -m chaos --topology replicas --replicas 3 '*:replica-*'
                                         # R port-per-broker replicas behind a load balancer
    python -m chaos --seed 7             # another seeded schedule (the default replays the last)
    python -m chaos --list
    python -m chaos --report             # only regenerate docs/reliability.md from the JSON

The topology is the sidecars' unless ``--topology replicas`` (docs/reliability.md says what
each is); a fault that means nothing in a topology (``proxy-kill`` of a sidecar,
``replica-kill``) is not one of its cells. ``--smoke`` runs its cells in the topology each
names. Each cell's result replaces that cell's entry in ``benchmarks/results/reliability.json``
(other cells stay), then ``docs/reliability.md`` is written from the JSON. Exit status 1 if
any cell run now failed its goals.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

from chaos import matrix, report
from chaos.env import SIDECAR, TOPOLOGIES, ChaosEnv
from chaos.runner import run_cell

DEFAULT_SEED = 20261125


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description="Run the chaos matrix.")
    parser.add_argument("cells", nargs="*", help="workload:fault globs (default: every cell)")
    parser.add_argument("--smoke", action="store_true", help="only the smoke cells")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--records", type=int, default=2400, help="records written per cell")
    parser.add_argument("--seconds", type=float, default=16.0, help="seconds the producer writes per cell")
    parser.add_argument("--topology", choices=TOPOLOGIES, default=SIDECAR,
                        help="a sidecar proxy per broker, or replicas of a port-per-broker proxy behind a load balancer")
    parser.add_argument("--replicas", type=int, default=2, help="with --topology replicas: how many (2 to 8)")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--report", action="store_true", help="only regenerate docs/reliability.md")
    parser.add_argument("--no-save", action="store_true", help="do not write the JSON or the page")
    args = parser.parse_args(argv)
    if not 2 <= args.replicas <= 8:
        parser.error(f"--replicas {args.replicas}: expected 2 to 8")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    matrix.load_optional()
    if args.report:
        report.write_page()
        return 0
    if args.smoke:
        runs = [(topology, [(w, f) for w, f, t in matrix.SMOKE if t == topology])
                for topology in dict.fromkeys(t for _, _, t in matrix.SMOKE)]
    else:
        runs = [(args.topology, matrix.select(args.cells, args.topology))]
    runs = [(topology, cells) for topology, cells in runs if cells]
    total = sum(len(cells) for _, cells in runs)
    if args.list:
        for topology, cells in runs:
            for workload, fault in cells:
                print(f"{workload}:{fault}" + ("" if topology == SIDECAR else f" ({topology})"))
        return 0
    if not runs:
        parser.error(f"no cell matches {args.cells} in the {args.topology} topology; see --list")
    given = argv if argv is not None else sys.argv[1:]
    # a long list of cells is recorded as the part of the matrix it is
    command = "python -m chaos " + " ".join(given if len(args.cells) <= 8 else
                                            [a for a in given if a not in args.cells] + ["<cells>"])
    failed = done = 0
    with tempfile.TemporaryDirectory(prefix="keyrange-chaos-") as tmp:
        for topology, cells in runs:
            with ChaosEnv(Path(tmp) / topology, args.seed, topology=topology, replicas=args.replicas) as env:
                for workload, fault in cells:
                    done += 1
                    began = time.monotonic()
                    result = run_cell(env, workload, fault, args.seed, records=args.records, seconds=args.seconds,
                                      workdir=Path(tmp) / topology)
                    failed += not result["ok"]
                    print(report.one_line(result) + f"  [{done}/{total}, {time.monotonic() - began:.0f} s]",
                          flush=True)
                    if not args.no_save:
                        report.save_cell(result, command)
    if not args.no_save:
        report.write_page()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
