"""One module per peer the proxy is compared with: how to start it and how to drive it,
reused by the benchmarks (``benchmarks.workloads``) and by their smoke tests
(tests/integration/test_bench_peers.py)."""
