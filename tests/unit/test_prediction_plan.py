"""Fetch prediction: pure functions over decoded requests and responses."""

from __future__ import annotations

import dataclasses
import struct
import uuid

import pytest

from proxy.prediction import plan
from proxy.protocol import messages
from proxy.protocol.messages import ApiKey
from proxy.records.builder import build_batch, encode_record

REQUEST = messages.body_class(ApiKey.FETCH, "request")
RESPONSE = messages.body_class(ApiKey.FETCH, "response")
TOPIC_ID = uuid.UUID("81f35466-6298-4391-a23f-ba4ec22b93fd")
VERSION = 17


def batch(base_offset: int, count: int, epoch: int = 5) -> bytes:
    records = [encode_record(offset_delta=i, key=None, value=b"v%d" % i) for i in range(count)]
    return build_batch(base_offset=base_offset, last_offset_delta=count - 1, records=records, record_count=count,
                       base_timestamp=0, max_timestamp=0, partition_leader_epoch=epoch)


def request(offsets: dict[int, int], *, epoch: int = -1, isolation: int = 0, session_epoch: int = -1):
    partitions = [REQUEST.FetchPartition(partition=p, current_leader_epoch=5, fetch_offset=offset,
                                         last_fetched_epoch=epoch, log_start_offset=-1, partition_max_bytes=1 << 20)
                  for p, offset in offsets.items()]
    return messages.new_body(ApiKey.FETCH, VERSION, "request", max_wait_ms=500, min_bytes=1, max_bytes=50 << 20,
                             isolation_level=isolation, session_id=0, session_epoch=session_epoch,
                             topics=[REQUEST.FetchTopic(topic_id=TOPIC_ID, partitions=partitions)])


def response(records: dict[int, bytes | None], *, high_watermark: int = 1000, error: int = 0,
             last_stable: int | None = None, preferred: int = -1):
    partitions = [RESPONSE.PartitionData(partition_index=p, error_code=error, high_watermark=high_watermark,
                                         last_stable_offset=high_watermark if last_stable is None else last_stable,
                                         log_start_offset=0, aborted_transactions=None,
                                         preferred_read_replica=preferred, records=blob)
                  for p, blob in records.items()]
    return messages.new_body(ApiKey.FETCH, VERSION, "response", throttle_time_ms=0, error_code=0, session_id=0,
                             responses=[RESPONSE.FetchableTopicResponse(topic_id=TOPIC_ID, partitions=partitions)])


def offsets_of(body) -> dict[int, tuple[int, int]]:
    return {p.partition: (p.fetch_offset, p.last_fetched_epoch) for t in body.topics for p in t.partitions}


# -- resume_point ---------------------------------------------------------------------------

def test_resume_point_is_after_the_last_whole_batch():
    blob = batch(10, 3, epoch=2) + batch(13, 4, epoch=3)
    assert plan.resume_point(blob) == (17, 3)


def test_a_cut_off_last_batch_is_not_counted():
    whole = batch(10, 3)
    cut = batch(13, 4)
    assert plan.resume_point(whole + cut[: len(cut) - 1]) == (13, 5)
    assert plan.resume_point(whole + cut[:20]) == (13, 5)


def test_no_whole_batch_means_no_resume_point():
    assert plan.resume_point(b"") is None
    assert plan.resume_point(None) is None
    assert plan.resume_point(batch(0, 2)[:30]) is None


def test_epoch_kept_when_batches_carry_none():
    assert plan.resume_point(batch(0, 2, epoch=-1), last_epoch=7) == (2, 7)


def test_legacy_message_set_resumes_after_its_offset():
    # magic 1 entry: offset, size, crc, magic, attributes, timestamp, key, value
    message = struct.pack(">IbbqiI", 0, 1, 0, 0, -1, 1) + b"x"
    entry = struct.pack(">qi", 41, len(message)) + message
    assert plan.resume_point(entry, last_epoch=3) == (42, 3)


# -- sessions and eligibility ----------------------------------------------------------------

def test_session_opening_becomes_sessionless():
    opening = request({0: 0}, session_epoch=0)
    assert plan.without_session(opening, VERSION).session_epoch == plan.SESSIONLESS_EPOCH
    sessionless = request({0: 0})
    assert plan.without_session(sessionless, VERSION) is sessionless


def test_requests_inside_a_session_are_left_alone():
    incremental = dataclasses.replace(request({0: 0}), session_id=12, session_epoch=3)
    assert plan.without_session(incremental, VERSION) is None


def test_old_versions_have_no_sessions():
    body = request({0: 0}, session_epoch=0)
    assert plan.without_session(body, 6) is body


def test_only_plain_consumer_fetches_are_predicted():
    plain = request({0: 0})
    assert plan.is_plain_consumer_fetch(plain, VERSION)
    follower = dataclasses.replace(plain, replica_state=REQUEST.ReplicaState(replica_id=2, replica_epoch=1))
    assert not plan.is_plain_consumer_fetch(follower, VERSION)
    forgetting = dataclasses.replace(plain, forgotten_topics_data=[REQUEST.ForgottenTopic(topic_id=TOPIC_ID,
                                                                                          partitions=[0])])
    assert not plan.is_plain_consumer_fetch(forgetting, VERSION)
    assert not plan.is_plain_consumer_fetch(dataclasses.replace(plain, topics=[]), VERSION)


# -- next_request ---------------------------------------------------------------------------

def test_next_request_continues_every_partition():
    asked = request({0: 10, 1: 0})
    got = response({0: batch(10, 5) + batch(15, 5), 1: batch(0, 3)})
    assert offsets_of(plan.next_request(asked, got)) == {0: (20, -1), 1: (3, -1)}


def test_epochs_are_predicted_only_for_a_client_that_reports_them():
    got = response({0: batch(10, 5, epoch=4)})
    assert offsets_of(plan.next_request(request({0: 10}, epoch=2), got)) == {0: (15, 4)}
    assert offsets_of(plan.next_request(request({0: 10}, epoch=-1), got)) == {0: (15, -1)}


def test_partition_without_records_keeps_its_offset():
    asked = request({0: 10, 1: 7})
    got = response({0: batch(10, 5), 1: b""})
    assert offsets_of(plan.next_request(asked, got)) == {0: (15, -1), 1: (7, -1)}


def test_the_rest_of_the_request_is_unchanged():
    asked = request({0: 10})
    predicted = plan.next_request(asked, response({0: batch(10, 5)}))
    assert dataclasses.replace(predicted, topics=asked.topics) == asked


def test_no_prediction_at_the_log_end():
    assert plan.next_request(request({0: 10}), response({0: batch(10, 5)}, high_watermark=15)) is None
    assert plan.next_request(request({0: 10}), response({0: b""}, high_watermark=10)) is None


def test_read_committed_looks_at_the_last_stable_offset():
    got = response({0: batch(10, 5)}, high_watermark=100, last_stable=15)
    assert plan.next_request(request({0: 10}, isolation=plan.READ_COMMITTED), got) is None
    assert plan.next_request(request({0: 10}, isolation=0), got) is not None


@pytest.mark.parametrize("spoil", ["error", "preferred", "missing", "top_error", "behind"])
def test_no_prediction_from_an_unusual_response(spoil):
    asked = request({0: 10, 1: 0})
    records = {0: batch(10, 5), 1: batch(0, 5)}
    if spoil == "error":
        got = response(records, error=6)
    elif spoil == "preferred":
        got = response(records, preferred=2)
    elif spoil == "missing":
        got = response({0: records[0]})
    elif spoil == "top_error":
        got = dataclasses.replace(response(records), error_code=15)
    else:  # a batch that ends before the requested offset
        got = response({0: batch(0, 5), 1: records[1]})
    assert plan.next_request(asked, got) is None


def test_diverging_epoch_stops_the_prediction():
    got = response({0: batch(10, 5)})
    partition = got.responses[0].partitions[0]
    partition.diverging_epoch = RESPONSE.EpochEndOffset(epoch=3, end_offset=8)
    assert plan.next_request(request({0: 10}), got) is None


def test_early_request_caps_only_max_bytes():
    predicted = request({0: 10})
    assert plan.early_request(predicted, 1 << 30) is predicted
    capped = plan.early_request(predicted, 1 << 20)
    assert capped.max_bytes == 1 << 20
    assert dataclasses.replace(capped, max_bytes=predicted.max_bytes) == predicted


# -- the edge's pure parts: matching a frame, the byte budget ---------------------------------

def test_a_prediction_matches_the_clients_frame_whatever_its_correlation_id():
    from proxy.prediction.held import Prediction

    header = messages.new_request_header(ApiKey.FETCH, VERSION, 7, "consumer-1")
    asked = request({0: 10}, session_epoch=0)
    predicted = plan.next_request(plan.without_session(asked, VERSION), response({0: batch(10, 5)}))
    prediction = Prediction(predicted, header, asked.session_epoch, predicted)
    client_next = dataclasses.replace(predicted, session_epoch=0)
    for correlation_id in (8, 9, 123456):
        frame = messages.encode_request(dataclasses.replace(header, correlation_id=correlation_id), client_next)
        assert prediction.matches(frame)
        assert prediction.matches(bytearray(frame))
    elsewhere = dataclasses.replace(client_next, topics=request({0: 11}).topics)
    assert not prediction.matches(messages.encode_request(header, elsewhere))
    other_client = dataclasses.replace(header, client_id="consumer-2")
    assert not prediction.matches(messages.encode_request(other_client, client_next))


def test_byte_budget_refuses_beyond_its_limit():
    from proxy.prediction.held import ByteBudget

    budget = ByteBudget(100)
    assert budget.take(60)
    assert not budget.take(41)
    assert budget.take(40)
    budget.give(100)
    assert budget.used == 0
    assert not ByteBudget(0).take(1)
