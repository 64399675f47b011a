"""The feature example of docs/architecture.md works as the page says."""

from __future__ import annotations

import re
from pathlib import Path

from proxy.pipeline import ConnectionContext, FeatureChain
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.framing import peek_request_header

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _example() -> dict:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    (code,) = [block for block in blocks if "class CommitCounter(Feature)" in block]
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102 - our own documentation
    return namespace


async def test_the_documented_feature_observes_commits_and_reads_metadata_responses():
    example = _example()
    feature = example["CommitCounter"]()
    chain = FeatureChain([feature])
    ctx = ConnectionContext(1, "127.0.0.1:1", "bootstrap")

    header = messages.new_request_header(ApiKey.OFFSET_COMMIT, 9, 1, "app-1")
    commit = messages.encode_request(header, messages.new_body(ApiKey.OFFSET_COMMIT, 9, "request", group_id="g"))
    route = await chain.route(ctx, peek_request_header(commit), commit)
    assert route.upstream_frame is commit  # observed, passed on
    assert ctx.state(example["SEEN"]) == {"app-1": 1}

    header = messages.new_request_header(ApiKey.METADATA, 12, 2, "app-1")
    metadata = messages.encode_request(header, messages.new_body(ApiKey.METADATA, 12, "request", topics=None))
    route = await chain.route(ctx, peek_request_header(metadata), metadata)
    response = messages.encode_response(ApiKey.METADATA, 12, messages.new_response_header(2),
                                        messages.new_body(ApiKey.METADATA, 12, "response", throttle_time_ms=25))
    assert await route.transform(response) is response  # read, not changed: the broker's bytes
    assert feature.throttled_ms == 25


def test_the_documented_settings_and_metrics_declare_their_keys_once():
    from prometheus_client import CollectorRegistry, generate_latest

    from proxy.settings import ConfigError, make, settings_of

    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    (code,) = [block for block in blocks if "class CommitCounterSettings(Settings)" in block]
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102 - our own documentation
    settings_class = namespace["CommitCounterSettings"]
    assert [spec.name for spec in settings_of(settings_class)] == ["commit.counter.enabled",
                                                                   "commit.counter.max.clients"]
    settings = make(settings_class, {"commit.counter.max.clients": 5})
    assert (settings.enabled, settings.max_clients) == (False, 5)
    spec = settings_of(settings_class)[1]
    try:
        spec.read("0", spec.name)
    except ConfigError as exc:
        assert str(exc) == "commit.counter.max.clients: must be at least 1 (got '0')"
    else:
        raise AssertionError("a bad value must be refused")
    registry = CollectorRegistry()
    namespace["CommitCounterMetrics"](registry).commits.inc()
    assert b"kafka_proxy_commit_counter_commits_total 1.0" in generate_latest(registry)
