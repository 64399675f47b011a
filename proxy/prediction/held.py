"""What fetch prediction holds, as plain values: the byte budget, the predicted request,
the held reads of one connection. No I/O here; ``feature`` does the sending and the waiting."""

from __future__ import annotations

import collections
import dataclasses

from proxy.pipeline.route import LocalAnswer
from proxy.protocol import messages
from proxy.protocol.message_types import FetchRequest, RequestHeader


class ByteBudget:
    """Bytes all early fetches may reserve or hold together."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, count: int) -> bool:
        if self.used + count > self.limit:
            return False
        self.used += count
        return True

    def give(self, count: int) -> None:
        self.used -= count
        assert self.used >= 0

    def resize(self, old: int, new: int) -> None:
        """A reservation of ``old`` bytes now holds ``new``: what actually arrived, which
        may exceed the limit (a broker returns a first batch larger than max_bytes whole)."""
        self.used += new - old


class Prediction:
    """The request a consumer is expected to send next, ready to compare and to send.

    ``expected`` is the client's frame as it will arrive, correlation id aside; a frame
    matches when its bytes before and after the correlation id are these, so a hit costs
    a comparison, not a decoding.
    """

    __slots__ = ("predicted", "header", "client_epoch", "expected", "upstream_body")

    def __init__(self, predicted: FetchRequest, header: RequestHeader, client_epoch: int,
                 upstream_body: FetchRequest) -> None:
        self.predicted = predicted  # sessionless, as the proxy forwards it
        self.header = header  # the client's request header (client id), for our own requests
        self.client_epoch = client_epoch  # the session epoch the client sends (0 or -1)
        as_sent = predicted if predicted.session_epoch == client_epoch else dataclasses.replace(
            predicted, session_epoch=client_epoch)
        self.expected = messages.encode_request(header, as_sent)
        self.upstream_body = upstream_body

    def matches(self, frame: bytes | bytearray | memoryview) -> bool:
        expected = self.expected
        view = memoryview(frame)
        return len(view) == len(expected) and view[:4] == expected[:4] and view[8:] == expected[8:]


class HeldRead:
    """One early fetch: the request it answers, and the broker's response once it arrives."""

    __slots__ = ("prediction", "reserved", "frame", "after", "claim")

    def __init__(self, prediction: Prediction, reserved: int) -> None:
        self.prediction = prediction
        self.reserved = reserved  # bytes of the budget this holds
        self.frame: bytearray | None = None  # the response frame, ready for a client
        self.after: Prediction | None = None  # the request expected once this is consumed
        self.claim: tuple[LocalAnswer, int] | None = None  # a client request waiting for it


class ConnectionPredictions:
    """Fetch prediction state of one client connection."""

    __slots__ = ("queue", "claimed", "newest", "wasted", "paused_until", "_budget")

    def __init__(self, budget: ByteBudget) -> None:
        self.queue: collections.deque[HeldRead] = collections.deque()  # not matched yet, in order
        self.claimed: list[HeldRead] = []  # ones a request matched before they arrived
        self.newest: HeldRead | None = None  # the last one started: the next follows on from it
        self.wasted = 0
        self.paused_until = -float("inf")
        self._budget = budget

    @property
    def outstanding(self) -> int:
        return len(self.queue) + len(self.claimed)

    def release(self, held: HeldRead) -> None:
        if held.reserved:
            self._budget.give(held.reserved)
            held.reserved = 0

    def close(self) -> None:
        """The connection ended: whatever it held goes back to the budget."""
        for held in (*self.queue, *self.claimed):
            self.release(held)
        self.queue.clear()
        self.claimed.clear()
        self.newest = None
