"""The sticky balancer of the several-instance tests reads the client id from the first
bytes of a request and keeps each client on its replica while that one answers."""

from __future__ import annotations

import struct

from harness.sticky_balancer import client_id_of, replica_order


def _frame(client_id: bytes | None, body: bytes = b"\x00\x00") -> bytes:
    header = struct.pack(">hhi", 18, 3, 7)  # ApiVersions v3, correlation id 7
    header += struct.pack(">h", -1) if client_id is None else struct.pack(">h", len(client_id)) + client_id
    payload = header + b"\x00" + body  # header v2's tagged fields, then the body
    return struct.pack(">i", len(payload)) + payload


def test_the_client_id_is_read_once_enough_bytes_arrived():
    frame = _frame(b"m1")
    assert [client_id_of(frame[:n]) for n in (0, 13, 14, 15)] == [None, None, None, None]
    assert client_id_of(frame[:16]) == "m1"
    assert client_id_of(frame) == "m1"


def test_a_null_or_empty_client_id_is_empty():
    assert client_id_of(_frame(None)) == ""
    assert client_id_of(_frame(b"")) == ""


def test_a_routed_client_tries_its_replica_first_then_the_others_in_order():
    assert replica_order("m1", {"m1": 1}, 3) == [1, 2, 0]
    assert replica_order("m0", {"m0": 0}, 2) == [0, 1]


def test_an_unrouted_client_keeps_one_replica():
    orders = {tuple(replica_order("console-consumer-1", {}, 3)) for _ in range(5)}
    assert len(orders) == 1 and sorted(next(iter(orders))) == [0, 1, 2]
