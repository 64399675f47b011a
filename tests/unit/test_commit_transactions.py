"""The one wait for a transaction's end (proxy.commits.transactions.until_ended): shadow
groups asked with RequireStable, with backoff, until none is pending."""

from __future__ import annotations

import trio
import trio.testing

from proxy.commits.transactions import AFTER_COMMIT, BEFORE_WRITE, until_ended
from proxy.protocol.constants import ErrorCode

KEY = ("t", 0)
PENDING = {"g.kr2/0#1": {KEY: (-1, None, int(ErrorCode.UNSTABLE_OFFSET_COMMIT))}}
SETTLED = {"g.kr2/0#1": {KEY: (40, "keyrange.txn/1:0:3:", int(ErrorCode.NONE))}}


def _asked(answers: list) -> tuple[list[float], object]:
    """When each question was asked (virtual time), and a question answering ``answers``
    in turn, the last one ever after."""
    times: list[float] = []

    async def ask():
        times.append(trio.current_time())
        return answers[min(len(times), len(answers)) - 1]

    return times, ask


def _run(patience, answers: list):
    clock = trio.testing.MockClock(autojump_threshold=0)
    times, ask = _asked(answers)
    result = trio.run(until_ended, ask, patience, clock=clock)
    return result, times


def test_after_a_commit_the_shadows_are_asked_after_a_delay_then_with_backoff_until_settled():
    (found, settled), times = _run(AFTER_COMMIT, [PENDING, PENDING, PENDING, SETTLED])
    assert settled and found == SETTLED
    gaps = [round(b - a, 6) for a, b in zip([0.0, *times], times)]
    assert gaps == [0.02, 0.04, 0.08, 0.16]


def test_the_backoff_stops_growing_at_its_cap():
    (_, settled), times = _run(AFTER_COMMIT, [PENDING] * 12 + [SETTLED])
    assert settled
    gaps = [round(b - a, 6) for a, b in zip(times, times[1:])]
    assert max(gaps) == AFTER_COMMIT.max_delay and gaps[-1] == AFTER_COMMIT.max_delay


def test_before_a_write_the_shadow_is_asked_at_once_and_given_up_on_after_its_wait():
    (found, settled), times = _run(BEFORE_WRITE, [PENDING])
    assert times[0] == 0.0  # no delay before the first question
    assert not settled and found == PENDING  # the caller answers the client retriable
    assert times[-1] <= BEFORE_WRITE.wait < times[-1] + 2 * BEFORE_WRITE.max_delay


def test_nothing_pending_is_settled_at_the_first_answer():
    (found, settled), times = _run(BEFORE_WRITE, [SETTLED])
    assert settled and found == SETTLED and times == [0.0]
