"""The supervisor's arithmetic for ``workers``: how many, each one's settings, restart backoff
and the merged ready file."""

from __future__ import annotations

import socket

import pytest

from proxy.server.workers import (
    AUTO_LIMIT,
    RESTART_BACKOFF,
    STEADY_SECONDS,
    merge_ready,
    next_delay,
    worker_count,
    worker_overrides,
)


def test_a_positive_setting_is_taken_as_it_is():
    assert worker_count(3, 64) == 3


def test_zero_means_one_per_core_up_to_the_limit():
    assert worker_count(0, 2) == 2
    assert worker_count(0, 256) == AUTO_LIMIT
    assert worker_count(0, None) == 1


def test_a_cgroup_quota_counts_as_the_cores_it_amounts_to_rounded_up():
    from proxy.server.workers import cpu_limit

    assert cpu_limit("max 100000\n") is None
    assert cpu_limit("100000 100000\n") == 1
    assert cpu_limit("150000 100000\n") == 2
    assert cpu_limit("20000 100000\n") == 1  # a fifth of a core still runs one worker
    assert cpu_limit(None, "-1\n", "100000\n") is None
    assert cpu_limit(None, "300000\n", "100000\n") == 3
    assert cpu_limit(None) is None
    assert cpu_limit("garbage") is None


def test_usable_cpus_is_no_more_than_the_affinity_allows():
    import os

    from proxy.server.workers import usable_cpus

    assert 1 <= usable_cpus() <= len(os.sched_getaffinity(0))


def test_a_sidecar_fronts_one_node_so_zero_means_one_worker_there():
    assert worker_count(0, 8, "sidecar") == 1
    assert worker_count(3, 8, "sidecar") == 3  # asked for: its workers share the one port


def test_the_default_is_one_worker_per_core():
    from proxy.server.settings import OperationsSettings

    assert OperationsSettings().workers == 0


def test_each_worker_shares_the_port_and_gets_its_own_metrics_port():
    assert worker_overrides(2, 9192, 9404) == ["listen.port=9192", "listen.reuse.port=true", "workers=1",
                                               "metrics.port=9407"]  # 9404 is the supervisor's
    assert "metrics.port=0" not in worker_overrides(1, 9192, 0)  # each picks a free one itself
    assert not any(o.startswith("metrics.port") for o in worker_overrides(1, 9192, -1))


def test_restarts_back_off_and_reset_after_a_steady_run():
    first, longest = RESTART_BACKOFF
    delay = None
    seen = []
    for _ in range(10):
        delay = next_delay(delay, ran_for=0.5)
        seen.append(delay)
    assert seen[0] == first and seen[1] == 2 * first and max(seen) == longest
    assert next_delay(longest, ran_for=STEADY_SECONDS) == first


def test_the_ready_file_names_the_shared_ports_and_every_worker():
    merged = merge_ready([
        {"pid": 11, "host": "127.0.0.1", "port": 9192, "node_ports": {"2": 9202}, "metrics_port": 9405},
        {"pid": 12, "host": "127.0.0.1", "port": 9192, "node_ports": {"1": 9201, "3": 9203}, "metrics_port": 9406},
    ], 9404)
    assert merged["port"] == 9192 and merged["metrics_port"] == 9404
    assert merged["node_ports"] == {"1": 9201, "2": 9202, "3": 9203}
    assert [w["pid"] for w in merged["workers"]] == [11, 12]
    assert [w["metrics_port"] for w in merged["workers"]] == [9405, 9406]


def test_a_block_of_ports_is_held_for_the_bootstrap_and_the_node_listeners():
    from proxy.server.workers import reserve_block

    held, port = reserve_block("127.0.0.1", 4)
    try:
        assert [sock.getsockname()[1] for sock in held] == list(range(port, port + 5))
        for taken in range(port, port + 5):  # a program that does not share them cannot take them
            other = socket.socket()
            with pytest.raises(OSError):
                other.bind(("127.0.0.1", taken))
            other.close()
    finally:
        for sock in held:
            sock.close()


def test_a_port_another_proxy_shares_is_not_reserved_again():
    from proxy.server.workers import reserve_port

    first, port = reserve_port("127.0.0.1", 0)
    try:
        listener = socket.socket()  # a worker of the first proxy binds beside it
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(1)
        with pytest.raises(OSError):
            reserve_port("127.0.0.1", port)  # a second proxy's supervisor
        listener.close()
    finally:
        first.close()


def test_blocks_are_drawn_below_the_ephemeral_range():
    from proxy.server.workers import _ephemeral_low, reserve_block

    held, port = reserve_block("127.0.0.1", 16)
    try:
        assert port + 16 < _ephemeral_low()
    finally:
        for sock in held:
            sock.close()
