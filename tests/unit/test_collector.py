"""The garbage-collector tuning: when the frozen heap is walked again, and what the pause
clock and the metrics report."""

from __future__ import annotations

import gc
import weakref

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from proxy.server.collector import FLOOR, CollectorTuner, FullCollectionPolicy, PauseClock, heap_blocks


def test_a_steady_heap_is_never_walked_again():
    policy = FullCollectionPolicy(walked=2_800_000)
    assert not any(policy.due(2_800_000 + drift) for drift in range(-200_000, 700_000, 40_000))


def test_a_quarter_of_growth_is_due():
    policy = FullCollectionPolicy(walked=2_800_000)
    assert not policy.due(3_500_000)
    assert policy.due(3_500_001)


def test_a_small_heap_waits_for_the_floor():
    policy = FullCollectionPolicy(walked=40_000)
    assert not policy.due(40_000 + FLOOR)
    assert policy.due(40_001 + FLOOR)


def test_growth_walks_in_a_geometric_series():
    """A heap growing from 400,000 to 40,000,000 blocks is walked O(log) times."""
    policy = FullCollectionPolicy(walked=400_000)
    walks = 0
    for heap in range(400_000, 40_000_001, 4_000):
        if policy.due(heap):
            policy.collected(heap)
            walks += 1
    assert 10 <= walks <= 25


def test_the_pause_clock_sums_each_generation():
    clock = PauseClock()
    for generation in (0, 0, 2):
        clock("start", {"generation": generation})
        clock("stop", {"generation": generation})
    assert clock.counts == [2, 0, 1]
    assert all(seconds >= 0 for seconds in clock.seconds)
    assert clock.longest >= 0


@pytest.fixture
def frozen_heap():
    yield
    gc.unfreeze()


def test_a_step_freezes_survivors_and_walks_when_due(frozen_heap):
    tuner = CollectorTuner(interval=1.0)
    tuner.policy = FullCollectionPolicy(walked=0, floor=0, growth=0.0)
    survivors = [[index] for index in range(1_000)]  # noqa: F841 - alive across the step
    assert tuner.step()  # grown past nothing: walked
    assert tuner.full_walks == 1
    assert gc.get_freeze_count() >= len(survivors)
    tuner.policy = FullCollectionPolicy(walked=heap_blocks())
    assert not tuner.step()  # nothing new: only frozen
    assert tuner.full_walks == 1


def test_cycles_among_frozen_objects_are_reclaimed_by_the_walk(frozen_heap):
    class Node:
        pass

    tuner = CollectorTuner(interval=1.0)
    tuner.policy = FullCollectionPolicy(walked=heap_blocks(), floor=10**9)
    first, second = Node(), Node()
    first.other, second.other = second, first
    alive = weakref.ref(first)
    tuner.step()  # frozen, not walked
    del first, second
    gc.collect()  # the collector's own collections do not see the frozen cycle
    assert alive() is not None
    tuner.policy = FullCollectionPolicy(walked=0, floor=0, growth=0.0)
    assert tuner.step()
    assert alive() is None


def test_metrics_report_pauses_and_the_frozen_heap():
    registry = CollectorRegistry()
    tuner = CollectorTuner(interval=1.0)
    registry.register(tuner)
    tuner.install()
    try:
        gc.collect()
    finally:
        tuner.uninstall()
    text = generate_latest(registry).decode()
    assert 'kafka_proxy_gc_collections_total{generation="2"} 1.0' in text
    assert "kafka_proxy_heap_blocks" in text
    assert "kafka_proxy_gc_frozen_walks_total 0.0" in text
    assert "kafka_proxy_gc_longest_pause_seconds" in text
