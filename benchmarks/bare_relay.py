"""The least any TCP proxy can do: relay bytes, nothing else. A reference point for
``bench_hop``, not a product part.

Two threads per connection, blocking sockets; responses (broker to client) go through a
pipe with ``splice``, so they never enter user space. No framing, no decoding, no
address rewriting: the broker must advertise this relay's port itself (a listener whose
advertised address is the relay's), or clients would go around it.

Usage: ``python -m benchmarks.bare_relay LISTEN_PORT TARGET_HOST:TARGET_PORT``
(loopback only).
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import threading
from collections.abc import Callable

_PIPE_BYTES = 1 << 20


def _requests(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    finally:
        target.close()


def _responses(source: socket.socket, target: socket.socket) -> None:
    read_end, write_end = os.pipe()
    try:
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
        while moved := os.splice(source.fileno(), write_end, _PIPE_BYTES, flags=os.SPLICE_F_MOVE):
            while moved:
                moved -= os.splice(read_end, target.fileno(), moved, flags=os.SPLICE_F_MOVE)
    except OSError:
        pass
    finally:
        os.close(read_end)
        os.close(write_end)
        target.close()


def accept_forever(port: int, target_host: str, target_port: int,
                   start: Callable[[socket.socket, socket.socket], None]) -> None:
    """Each client connection gets a connection to the target; ``start(client, upstream)``
    starts whatever moves bytes between them."""
    listener = socket.create_server(("127.0.0.1", port))
    while True:
        client, _ = listener.accept()
        upstream = socket.create_connection((target_host, target_port))
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        start(client, upstream)


def serve(port: int, target_host: str, target_port: int) -> None:
    def start(client: socket.socket, upstream: socket.socket) -> None:
        threading.Thread(target=_requests, args=(client, upstream), daemon=True).start()
        threading.Thread(target=_responses, args=(upstream, client), daemon=True).start()

    accept_forever(port, target_host, target_port, start)


if __name__ == "__main__":
    host, _, target_port = sys.argv[2].rpartition(":")
    serve(int(sys.argv[1]), host, int(target_port))
