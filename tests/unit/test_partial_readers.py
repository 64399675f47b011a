"""Every hand-written partial reader states the fields it reads as ``Walk``s; each walk is
what the message definitions say, in every version it covers."""

from __future__ import annotations

import importlib

import pytest

from proxy.protocol import message_versions
from proxy.protocol.schema import registry
from proxy.protocol.walks import Walk

# The modules that read frames by hand; each exports its walks as WALKS.
READERS = ["proxy.protocol.framing", "proxy.protocol.peek", "proxy.commits.codec", "proxy.commits.wire",
           "proxy.virtual.precheck"]


def _walks() -> list[tuple[str, Walk]]:
    found = []
    for name in READERS:
        module = importlib.import_module(name)
        assert module.WALKS, f"{name} declares no walk"
        found += [(name, walk) for walk in module.WALKS]
    return found


@pytest.mark.parametrize(("module", "walk"), _walks(),
                         ids=lambda value: value if isinstance(value, str) else f"{value.message}.{value.path}")
def test_walk_matches_the_schema(module, walk):
    assert walk.mismatches() == []


def test_a_walk_that_differs_from_the_schema_is_caught():
    swapped = Walk("FetchResponse", "Responses.Partitions.AbortedTransactions", 12, None,
                   ("FirstOffset int64", "ProducerId int64"))
    assert len(swapped.mismatches()) == registry().by_name["FetchResponse"].valid_versions.hi - 12 + 1
    not_compact = Walk("FetchResponse", "Responses", 12, 12, ("Topic string", "Partitions compact []PartitionData"))
    assert not_compact.mismatches() == [
        "FetchResponse Responses v12: the schema has ['Topic compact string', 'Partitions compact []PartitionData']"]
    assert Walk("FetchResponse", "Nope", 12, None, ()).mismatches() == ["FetchResponse has no struct Nope"]
    with pytest.raises(ValueError):
        swapped.size("Nope")
    assert swapped.size() == 16


def test_node_endpoints_tag_is_the_schema_tag():
    from proxy.protocol import peek

    node_endpoints = next(f for f in registry().by_name["FetchResponse"].fields if f.name == "NodeEndpoints")
    assert peek.NODE_ENDPOINTS_TAG == node_endpoints.tag
    assert node_endpoints.versions.lo == message_versions.FETCH_FIRST_NODE_ENDPOINTS
