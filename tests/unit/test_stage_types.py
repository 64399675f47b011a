"""A stage that declares the body it takes (``Request[FetchRequest]``,
``DecodedResponse[FetchResponse]``) declares the class of the API key it is registered
for: the chain hands a stage only that key's messages, so mypy's view of its body is the
truth only if the two agree. Checked on the server's own feature list, every feature on."""

from __future__ import annotations

import inspect
import re

import pytest

from proxy.pipeline.feature import ResponseStageSpec
from proxy.pipeline.request import Request
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey, api_name
from proxy.protocol.message_types import MetadataRequest
from proxy.server.app import ProxyServer
from proxy.server.config import build_config

_DECLARED = re.compile(r"\b(Request|DecodedResponse)\[([\w.]+)\]")


def _stages() -> list[tuple[str, int, str, object]]:
    config = build_config({
        "bootstrap.servers": "127.0.0.1:9", "listen.port": "0", "virtual.topics.enabled": "true",
        "cooperative.fetch.enabled": "true", "fetch.prediction.enabled": "true", "individual.commit.enabled": "true"})
    server = ProxyServer(config)  # it listens at once (on a port of the system's choosing)
    server._main_socket.close()
    found = []
    for feature in server.chain.features:
        for api_key, stage in feature.request_stages().items():
            found.append((feature.name, api_key, "request", stage))
        for api_key, spec in feature.response_stages().items():
            stage = spec.stage if isinstance(spec, ResponseStageSpec) else spec[1]
            found.append((feature.name, api_key, "response", stage))
    return found


def _declared(stage: object) -> tuple[str, type] | None:
    """(what the stage takes, the message class it names), or None when it names none."""
    function = inspect.unwrap(getattr(stage, "__func__", stage))
    for parameter in inspect.signature(function, eval_str=False).parameters.values():
        match = _DECLARED.search(str(parameter.annotation))
        if match:
            value: object = function.__globals__[match.group(2).split(".")[0]]
            for attribute in match.group(2).split(".")[1:]:
                value = getattr(value, attribute)
            assert isinstance(value, type)
            return match.group(1), value
    return None


STAGES = _stages()


def test_the_features_declare_typed_stages():
    assert sum(_declared(stage) is not None for *_, stage in STAGES) >= 20


async def _misregistered(ctx: object, request: Request[MetadataRequest]) -> None: ...


def test_a_stage_naming_another_api_is_seen():
    assert _declared(_misregistered) == ("Request", MetadataRequest)
    assert MetadataRequest is not messages.body_class(ApiKey.FETCH, "request")


@pytest.mark.parametrize(("feature", "api_key", "kind", "stage"), STAGES,
                         ids=[f"{name}-{api_name(key)}-{kind}" for name, key, kind, _ in STAGES])
def test_a_stage_declares_the_class_of_its_api_key(feature, api_key, kind, stage):
    declared = _declared(stage)
    if declared is None:
        return  # a stage for any API (or that reads no field) names no class
    wrapper, cls = declared
    assert wrapper == ("Request" if kind == "request" else "DecodedResponse")
    assert cls is messages.body_class(api_key, kind), f"{feature}: {api_name(api_key)} {kind} stage takes {cls}"
