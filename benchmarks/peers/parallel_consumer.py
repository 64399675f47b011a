"""Confluent Parallel Consumer as a peer: ``parallel-consumer-core`` 0.5.3.3 with KEY
ordering and ``maxConcurrency`` = the worker count, on kafka-clients 3.9.1 (the only line it
supports; a 3.9 client talks to our 4.x broker). Driven by ``benchmarks/java/parallel``,
which does the same paced work and order check as every other key-ordered peer."""

from __future__ import annotations

from benchmarks.peers import java_harness

MAIN = "io.keyrange.bench.ParallelBench"


def key_ordered(bootstrap: str, topic: str, group: str, workers: int, *, work_ms: float = 1.0,
                warmup: float = 3.0, window: float = 8.0, records: int = 0, timeout: float = 180.0) -> dict:
    args = ["--bootstrap", bootstrap, "--topic", topic, "--group", group, "--workers", workers,
            "--work-ms", work_ms, "--warmup", warmup, "--window", window, "--records", records,
            "--timeout", timeout]
    return java_harness.run_json("bench-parallel", MAIN, args, timeout=timeout + 60)
