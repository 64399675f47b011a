"""One tapped Kafka node per test session, shared by the modules that need raw traffic.

``TappedKafka`` (harness/tap.py) is a dedicated single node that advertises a
recording tap's address, so every client connection crosses the tap. Test modules declare
their own session-scoped fixture calling :func:`session_tapped_kafka`; the node is started
on first use, kept in the pytest config and closed when the session ends.
"""

from __future__ import annotations

import pytest

from harness.tap import TappedKafka
from proxy.local_kafka import LocalKafkaError

_TAPPED = pytest.StashKey[TappedKafka]()


def session_tapped_kafka(request: pytest.FixtureRequest) -> TappedKafka:
    config = request.config
    tapped = config.stash.get(_TAPPED, None)
    if tapped is None:
        workdir = request.getfixturevalue("tmp_path_factory").mktemp("kafka-tapped")
        try:
            tapped = TappedKafka.start(workdir)
        except LocalKafkaError as exc:
            pytest.fail(str(exc), pytrace=False)
        config.stash[_TAPPED] = tapped
        config.add_cleanup(tapped.close)
    tapped.tap.transform = None
    return tapped
