"""The chaos matrix: every consumption path under live production and real faults.

``python -m chaos`` (``make chaos``) runs each (workload, fault) cell on a three-node
cluster with a sidecar proxy per broker (or, ``--topology replicas``, with replicas of a
port-per-broker proxy behind a load balancer), checks the recorded history
(``chaos.verdict``) and writes ``benchmarks/results/reliability.json`` and
``docs/reliability.md``. A smoke of a few cells runs in ``make test``
(``tests/integration/test_chaos_smoke.py``).
"""
