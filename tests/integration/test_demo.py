"""`make demo` runs end to end: its own broker and proxy, standard clients, and range
members that commit individually until the group's committed offset reaches the end."""

from __future__ import annotations

import subprocess
import sys


def test_demo_runs_to_the_end():
    result = subprocess.run([sys.executable, "-m", "proxy.demo"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "together: 40 of 40 orders; every customer handled by exactly one consumer: True" in result.stdout
    assert "committed offset 40 of 40" in result.stdout
    assert "together: 600 of 600 records in" in result.stdout
    assert "every record exactly once: True; group 'demo-click-mailers' committed offset at the broker: 600" \
        in result.stdout
    assert "6 members on 2 partitions: generation" in result.stdout
    assert "a 7th member joined: generation" in result.stdout
    assert "member-0 left: generation" in result.stdout
    assert "every rebalance settled with the whole of both partitions shared out: True" in result.stdout
    assert "committed receipts: 40 for 40 of 40 orders; every order exactly once: True" in result.stdout
    assert "group 'demo-receipt-writers' at the broker: committed offset 40 of 40" in result.stdout
    assert "done: every order reached exactly one range consumer" in result.stdout
