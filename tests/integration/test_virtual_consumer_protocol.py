"""A KIP-848 group (``group.protocol=consumer``) subscribing to a virtual range topic is
refused with a clear error: the broker assigns such groups and knows no virtual topic, so
without the refusal the member would wait for an assignment that never comes
(docs/virtual-topics.md, Limits)."""

from __future__ import annotations

import re
import time
import uuid

import pytest

from harness import java_tools
from tests.integration.virtual_checks import PARTITIONS, SHARES

pytestmark = pytest.mark.kafka


def test_java_consumer_protocol_group_on_a_virtual_topic_gets_the_reason(kafka, proxy, topic_factory):
    topic = topic_factory(kafka, partitions=PARTITIONS)
    result = java_tools.console_consumer(
        proxy.bootstrap_servers, f"{topic}.kr{SHARES}", group=f"kip848-{uuid.uuid4().hex[:8]}", timeout_ms=20000,
        consumer_config={"group.protocol": "consumer"}, timeout=120, check=False)
    output = result.stdout + result.stderr
    # The member goes to its fatal state and the tool stops on the error (its exit code is 0).
    assert "InvalidTopicException" in output and "Processed a total of 0 messages" in output, output[-3000:]
    assert "group.protocol=classic" in output and f"{topic}.kr{SHARES}" in output, output[-3000:]


def test_java_consumer_protocol_group_on_the_real_topic_still_works(kafka, proxy, topic_factory):
    """Only virtual names are refused: the same client reads the real topic through the proxy."""
    from tests.integration import virtual_checks as checks

    topic = topic_factory(kafka, partitions=PARTITIONS)
    checks.produce(proxy.bootstrap_servers, topic, 20)
    result = java_tools.console_consumer(
        proxy.bootstrap_servers, topic, group=f"kip848-{uuid.uuid4().hex[:8]}", max_messages=20, timeout_ms=30000,
        consumer_config={"group.protocol": "consumer"}, timeout=120)
    assert len([line for line in result.stdout.splitlines() if line.strip()]) == 20, result.stdout[-2000:]


def _librdkafka_pattern_group(bootstrap: str, pattern: str, want: int, seconds: float) -> tuple[int, list[str]]:
    """A librdkafka KIP-848 member subscribed to ``pattern`` (sent to the broker as the
    heartbeat's regular expression): (records read, errors) once ``want`` records or an
    error arrived, or ``seconds`` passed."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"kip848-{uuid.uuid4().hex[:8]}",
                         "group.protocol": "consumer", "auto.offset.reset": "earliest"})
    read, errors = 0, []
    try:
        consumer.subscribe([pattern])
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and read < want and not errors:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                errors.append(str(message.error()))
            else:
                read += 1
    finally:
        consumer.close()
    return read, errors


def test_librdkafka_consumer_protocol_pattern_matching_a_virtual_topic_gets_the_reason(kafka, proxy, topic_factory):
    """A pattern that does not spell a virtual name but matches one (``<topic>\\.kr[0-9]+``)
    is tried against the known real topics and refused like a subscribed virtual name."""
    topic = topic_factory(kafka, partitions=PARTITIONS)
    read, errors = _librdkafka_pattern_group(proxy.bootstrap_servers, f"^{re.escape(topic)}\\.kr[0-9]+$", 1, 60)
    assert read == 0 and errors and "Invalid topic" in errors[0], errors
    log = proxy.log_path.read_text()
    assert f"virtual range topic {topic}.kr2 (matched by the regular expression" in log, log[-3000:]


def test_librdkafka_consumer_protocol_pattern_of_real_topics_still_works(kafka, proxy, topic_factory):
    """A pattern that does not mention the suffix is the broker's to resolve, as without the proxy."""
    from tests.integration import virtual_checks as checks

    topic = topic_factory(kafka, partitions=PARTITIONS)
    checks.produce(proxy.bootstrap_servers, topic, 20)
    read, errors = _librdkafka_pattern_group(proxy.bootstrap_servers, f"^{re.escape(topic)}$", 20, 90)
    assert (read, errors) == (20, []), (read, errors)
