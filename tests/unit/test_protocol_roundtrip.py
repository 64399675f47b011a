"""Round-trip properties for every message and every version of the merged schemas.

For random values generated from the schema itself: encode -> decode gives an equal
value, decode -> encode gives the same bytes, and the interpreted construct tree agrees
with the compiled code byte for byte.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from harness.message_strategies import message_values
from proxy.protocol.compiler import compile_message
from proxy.protocol.schema import registry


def _all_versions() -> list[tuple[str, int, bool]]:
    cases = []
    for name, message in sorted(registry("ours").by_name.items()):
        versions = range(message.valid_versions.lo, message.valid_versions.hi + 1)
        for version in versions:
            cases.append((name, version, version == message.valid_versions.hi))
    return cases


CASES = _all_versions()


def _check_roundtrip(name: str, version: int, value) -> None:
    compiled = compile_message("ours", name, version)
    interpreted = compile_message("ours", name, version, "interpreted")
    data = compiled.encode(value)
    assert interpreted.encode(value) == data
    decoded = compiled.decode(data)
    assert decoded == value
    assert interpreted.decode(data) == value
    assert compiled.encode(decoded) == data


def test_every_schema_version_is_covered():
    assert len(CASES) > 400
    names = {name for name, _, _ in CASES}
    for required in (
        "FetchRequest",
        "ShareFetchResponse",
        "ShareAcknowledgeResponse",
        "IndividualCommitKey",
        "IndividualCommitValue",
        "ConsumerProtocolSubscription",
        "ConsumerProtocolAssignment",
        "RequestHeader",
        "ResponseHeader",
    ):
        assert required in names


@pytest.mark.parametrize(("name", "version"), [(n, v) for n, v, _ in CASES])
def test_default_value_roundtrips(name, version):
    """The all-defaults value, the one a freshly built body starts from."""
    codec = compile_message("ours", name, version)
    _check_roundtrip(name, version, codec.root_class())


@pytest.mark.parametrize(("name", "version", "newest"), CASES)
def test_random_values_roundtrip(name, version, newest):
    # Older versions get fewer examples: they share most of their layout with the newest.
    examples = 10 if newest else 3

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(message_values("ours", name, version))
    def check(value):
        _check_roundtrip(name, version, value)

    check()


def test_construct_interface():
    """The compiled and interpreted trees are ordinary constructs: parse/build work too."""
    compiled = compile_message("ours", "FetchRequest", 18)
    interpreted = compile_message("ours", "FetchRequest", 18, "interpreted")
    body = compiled.root_class(max_wait_ms=5, topics=[])
    data = compiled.encode(body)
    for construct in (compiled.construct, interpreted.construct):
        assert construct.parse(data) == body
        assert construct.build(body) == data
    assert "def k_parse_" in compiled.construct.source
