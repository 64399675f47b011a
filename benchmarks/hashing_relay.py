"""The least a key-range proxy can do: relay bytes, and split every record set it relays
into N key ranges. A reference point for ``keyrange_delivery`` (its floor rows), not a
product part.

N consumers sharing a partition by key range together receive each record once, so
whatever serves them must at least read every record from the broker, hash its key, cut
the batches into N sets and write as many bytes as it read. This relay does exactly that
for one consumer reading the whole partition: each Fetch response is read into memory,
every record set in it goes through the proxy's own C split (``split_records``: the
CRC check, xxh3 of every key, the N rebuilt outputs; without the GIL), and the response
is passed on unchanged. What it lacks against the proxy is everything else: no event loop,
no request decoding, no cache, no per-consumer responses. A consumer through it reads at
the rate that the hashing and the copies allow on this machine: the physical floor of the
proxy's figure.

Two threads per connection, blocking sockets, the request direction framed (to know which
responses are Fetches); no address rewriting, so the broker must advertise this relay's
port (as for ``bare_relay``).

Usage: ``python -m benchmarks.hashing_relay LISTEN_PORT TARGET_HOST:TARGET_PORT N``
(loopback only).
"""

from __future__ import annotations

import collections
import socket
import struct
import sys
import threading

from benchmarks.bare_relay import accept_forever
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.ranges import equal_shares
from proxy.records.plan import RangePlan
from proxy.records.split import split_records

_HEADER = struct.Struct(">ihhi")  # size, api key, version, correlation id


def _read_exactly(sock: socket.socket, view: memoryview) -> bool:
    filled = 0
    while filled < len(view):
        received = sock.recv_into(view[filled:])
        if not received:
            return False
        filled += received
    return True


def _send_all(sock: socket.socket, buffers: list) -> None:
    """Like sendall over several buffers, without joining them (a copy of the frame)."""
    while buffers:
        sent = sock.sendmsg(buffers)
        while buffers and sent >= len(buffers[0]):
            sent -= len(buffers.pop(0))
        if buffers and sent:
            buffers[0] = memoryview(buffers[0])[sent:]


def _requests(source: socket.socket, target: socket.socket, pending: collections.deque) -> None:
    head = bytearray(12)
    try:
        while _read_exactly(source, memoryview(head)):
            size, api_key, version, _ = _HEADER.unpack(head)
            body = bytearray(size - 8)
            if not _read_exactly(source, memoryview(body)):
                break
            pending.append((api_key, version))
            target.sendall(head + body)
    except OSError:
        pass
    finally:
        target.close()


def _responses(source: socket.socket, target: socket.socket, pending: collections.deque, plan: RangePlan) -> None:
    prefix = bytearray(4)
    try:
        while _read_exactly(source, memoryview(prefix)):
            (size,) = struct.unpack(">i", prefix)
            frame = bytearray(size)
            if not _read_exactly(source, memoryview(frame)):
                break
            api_key, version = pending.popleft()
            if api_key == ApiKey.FETCH:
                _, body = messages.decode_response(api_key, version, frame)
                for topic in body.responses:
                    for partition in topic.partitions:
                        if partition.records:
                            split_records(partition.records, plan)
            _send_all(target, [prefix, memoryview(frame)])
    except OSError:
        pass
    finally:
        target.close()


def serve(port: int, target_host: str, target_port: int, shares: int) -> None:
    plan = RangePlan([[share] for share in equal_shares(shares)])

    def start(client: socket.socket, upstream: socket.socket) -> None:
        pending: collections.deque = collections.deque()
        threading.Thread(target=_requests, args=(client, upstream, pending), daemon=True).start()
        threading.Thread(target=_responses, args=(upstream, client, pending, plan), daemon=True).start()

    accept_forever(port, target_host, target_port, start)


if __name__ == "__main__":
    host, _, target_port = sys.argv[2].rpartition(":")
    serve(int(sys.argv[1]), host, int(target_port), int(sys.argv[3]))
