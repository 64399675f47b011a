"""The chaos matrix's smoke (``chaos.matrix.SMOKE``): a kill of each kind of process, each
under another consumer, on the three-node cluster with a sidecar proxy per broker, a
rolling restart of the sidecars under cooperative members, and a replica killed behind the
load balancer of the replicas topology, while a producer writes. Each cell must lose
nothing acknowledged, keep per-key order except where re-delivery explains it, and end
with the group committed at the log end. ``make chaos`` runs the whole matrix and writes
the figures; this only guards the smoke.
"""

from __future__ import annotations

import os

import pytest

from chaos import matrix, report
from chaos.env import ChaosEnv
from chaos.runner import run_cell

pytestmark = [pytest.mark.kafka, pytest.mark.cluster, pytest.mark.timeout(600)]

SEED = int(os.environ.get("KEYRANGE_CHAOS_SEED", 20261125))


@pytest.fixture(scope="module")
def chaos_env(kafka_cluster, tmp_path_factory):
    """The deployment of a topology on the module's cluster, one at a time (the smoke's
    cells come grouped by topology): asking for another closes the one before."""
    current: dict[str, ChaosEnv] = {}

    def env(topology: str) -> ChaosEnv:
        if topology not in current:
            for other in current.values():
                other.close()
            current.clear()
            current[topology] = ChaosEnv(tmp_path_factory.mktemp(f"chaos-{topology}"), SEED, cluster=kafka_cluster,
                                         topology=topology).start()
        return current[topology]

    try:
        yield env
    finally:
        for other in current.values():
            other.close()


@pytest.mark.parametrize("cell", [f"{w}:{f}@{t}" for w, f, t in matrix.SMOKE])
def test_chaos_smoke_cell(chaos_env, tmp_path, cell):
    cell, _, topology = cell.partition("@")
    workload, fault = cell.split(":")
    result = run_cell(chaos_env(topology), workload, fault, SEED, workdir=tmp_path)
    summary = report.one_line(result)
    assert "error" not in result, f"{summary}\n{result.get('traceback', '')}"
    assert result["actions"] or fault == "none", f"the fault never struck: {summary}"
    assert result["lost"] == 0, f"{summary}; lost {result['lost_examples']}"
    assert result["strays"] == 0, summary
    assert result["order_violations"] == 0, f"{summary}; {result['order_examples']}"
    assert not result["committed_behind"], f"{summary}; {result['committed_behind']}"
    assert result["ok"], f"{summary}; notes {result['notes']}"
    print(summary, result["actions"])
