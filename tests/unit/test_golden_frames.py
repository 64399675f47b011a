"""Golden frames recorded from real clients and a real broker (no broker needed here).

tests/golden/kafka-traffic.jsonl holds request and response frames that the Java clients,
librdkafka and kafka-python exchanged with Apache Kafka through a recording tap
(tests/integration/test_golden_traffic.py, rerun with KEYRANGE_UPDATE_GOLDEN=1 to refresh).
Each frame must decode with our codec and re-encode to exactly the recorded bytes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.golden import read_golden
from proxy.protocol.api_keys import api_name
from proxy.protocol.framing import peek_correlation_id, peek_request_header
from proxy.protocol.messages import decode_request, decode_response, encode_request, encode_response

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "kafka-traffic.jsonl"
META, EXCHANGES = read_golden(GOLDEN)


def _id(index: int) -> str:
    ex = EXCHANGES[index]
    return f"{index:03d}-{ex.client}-{api_name(ex.api_key)}-v{ex.api_version}"


@pytest.mark.parametrize("index", range(len(EXCHANGES)), ids=_id)
def test_golden_exchange_roundtrips_byte_identical(index):
    ex = EXCHANGES[index]
    head = peek_request_header(ex.request)
    assert (head.api_key, head.api_version) == (ex.api_key, ex.api_version)

    header, body = decode_request(ex.request)
    assert header.request_api_key == ex.api_key and header.request_api_version == ex.api_version
    assert encode_request(header, body) == ex.request

    if ex.response is None:  # the client closed while this request was parked (long poll)
        return
    assert peek_correlation_id(ex.response) == head.correlation_id
    header, body = decode_response(ex.api_key, ex.api_version, ex.response)
    assert header.correlation_id == head.correlation_id
    assert encode_response(ex.api_key, ex.api_version, header, body) == ex.response


def test_golden_file_covers_every_client_family_and_core_api():
    assert META["kafka"] and META["librdkafka"] and META["kafka-python"]
    seen = {(ex.client, ex.api_key) for ex in EXCHANGES}
    for client in ("java", "librdkafka", "kafka-python"):
        for key in (0, 1, 3, 8, 9, 10, 11, 14, 18):  # Produce .. ApiVersions
            assert (client, key) in seen, f"golden file lacks {client} {api_name(key)}"
    # Fetch responses that carry records, not only empty long polls.
    assert any(ex.api_key == 1 and ex.response and len(ex.response) > 1000 for ex in EXCHANGES)


def test_golden_file_is_small():
    assert GOLDEN.stat().st_size < 2 * 1024 * 1024
