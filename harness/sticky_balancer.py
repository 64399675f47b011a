"""A TCP load balancer with sticky sessions in front of proxy replicas, for the tests of
several instances (docs/high-availability.md: R replicas of a port-per-broker proxy behind a
balancer). ``harness.balancer`` spreads connections round robin; this one keeps each
client's connections on one replica, so a test decides which members share a replica.

    python -m harness.sticky_balancer --host 127.0.0.1 --port 41000 --port 41001 \
        --replica 127.0.0.2 --replica 127.0.0.3 --route m0=0 --route m1=1 \
        --events /tmp/lb.events --ready /tmp/lb.ready

Every replica listens on the balancer's ports at a loopback address of its own and
advertises the balancer's host (``advertised.host``), so every address a client learns
(bootstrap, Metadata, FindCoordinator) leads back here, whichever replica answered.

Each connection goes to one replica, picked by the client id its first request names (every
Kafka request header from v1 on carries it): ``--route NAME=INDEX``, else a hash of the id.
A replica that refuses the connection (killed) is skipped for the next one in order, as a
balancer's health check would take it out: the clients of a replica that dies reconnect to
another.

Lines appended to ``--events`` (one ``os.write`` each, ``time.monotonic()`` times, the
clock of every process on the machine):

    C <time> <client id> <port> <replica>    a connection relayed to replica <replica>
    E <time> <client id> <port> <replica>    that connection ended (either side closed)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import trio

from harness import ROOT
from harness.processes import spawn

HEAD = 14  # size (4), api key (2), version (2), correlation id (4), client id length (2)
FIRST_REQUEST_TIMEOUT = 10.0  # a client that names itself in no request within this is dropped
CHUNK = 1 << 16


def client_id_of(head: bytes) -> str | None:
    """The client id named by the request frame that ``head`` begins (its first bytes,
    size prefix included); None while ``head`` is too short to tell. A null id is ""."""
    if len(head) < HEAD:
        return None
    length = int.from_bytes(head[12:14], "big", signed=True)
    if length < 0:
        return ""
    if len(head) < HEAD + length:
        return None
    return head[HEAD:HEAD + length].decode("utf-8", "replace")


def replica_order(client_id: str, routes: Mapping[str, int], replicas: int) -> list[int]:
    """The replicas to try for ``client_id``, its own first (routed, else by a hash of the
    id), then the others in order."""
    first = routes.get(client_id, zlib.crc32(client_id.encode()) % replicas)
    return [(first + step) % replicas for step in range(replicas)]


class _Events:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, kind: str, client_id: str, port: int, replica: int) -> None:
        name = client_id.replace(" ", "_") or "-"
        os.write(self._fd, f"{kind} {time.monotonic():.6f} {name} {port} {replica}\n".encode())


async def _pump(source: trio.SocketStream, sink: trio.SocketStream, done: trio.CancelScope) -> None:
    try:
        while data := await source.receive_some(CHUNK):
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    finally:
        done.cancel()  # one direction ended: the connection is over for both


async def _relay(args: argparse.Namespace, events: _Events, port: int, client: trio.SocketStream) -> None:
    async with client:
        head = b""
        client_id: str | None = None
        with trio.move_on_after(FIRST_REQUEST_TIMEOUT):
            while (client_id := client_id_of(head)) is None:
                data = await client.receive_some(CHUNK)
                if not data:
                    return
                head += data
        if client_id is None:
            return
        for replica in replica_order(client_id, args.routes, len(args.replica)):
            try:
                upstream = await trio.open_tcp_stream(args.replica[replica], port)
            except OSError:
                continue  # refused: that replica is down
            break
        else:
            return  # no replica answers: the client sees its connection close
        events.write("C", client_id, port, replica)
        try:
            async with upstream:
                await upstream.send_all(head)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_pump, client, upstream, nursery.cancel_scope)
                    nursery.start_soon(_pump, upstream, client, nursery.cancel_scope)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            events.write("E", client_id, port, replica)


async def serve(args: argparse.Namespace) -> None:
    events = _Events(args.events)
    async with trio.open_nursery() as nursery:
        for port in args.port:
            listeners = await trio.open_tcp_listeners(port, host=args.host)
            nursery.start_soon(trio.serve_listeners, partial(_relay, args, events, port), listeners)
        Path(args.ready).write_text(json.dumps({"pid": os.getpid()}))


def _route(text: str) -> tuple[str, int]:
    name, sep, index = text.rpartition("=")
    if not sep or not name or not index.isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME=INDEX (a client id and a replica's index), got {text!r}")
    return name, int(index)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="the address clients connect to")
    parser.add_argument("--port", type=int, action="append", required=True,
                        help="a port to balance (the bootstrap port, each node port); the replicas listen on it too")
    parser.add_argument("--replica", action="append", required=True, help="a replica's host, in index order")
    parser.add_argument("--route", type=_route, action="append", default=[],
                        help="CLIENT_ID=INDEX: that client's connections go to that replica first")
    parser.add_argument("--events", required=True)
    parser.add_argument("--ready", required=True, help="written once every port listens")
    args = parser.parse_args(argv)
    args.routes = dict(args.route)
    bad = {name: index for name, index in args.routes.items() if index >= len(args.replica)}
    if bad:
        parser.error(f"--route to a replica that is not listed (indexes from 0 to {len(args.replica) - 1}): {bad}")
    trio.run(serve, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())


# -- the parent's side ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Connection:
    """A ``C`` or ``E`` line."""

    kind: str
    time: float
    client_id: str
    port: int
    replica: int


class StickyBalancer:
    """The balancer as a child process (started by :meth:`start`, stopped by its PID)."""

    def __init__(self, process: subprocess.Popen[bytes], events: Path, log: Path) -> None:
        self.process = process
        self.events_path = events
        self.log_path = log

    @classmethod
    def start(cls, *, host: str, ports: Sequence[int], replicas: Sequence[str], routes: Mapping[str, int],
              workdir: Path, timeout: float = 15.0) -> StickyBalancer:
        workdir.mkdir(parents=True, exist_ok=True)
        ready, events, log = workdir / "balancer.ready", workdir / "balancer.events", workdir / "balancer.log"
        command = [sys.executable, "-m", "harness.sticky_balancer", "--host", host, "--events", str(events),
                   "--ready", str(ready)]
        command += [arg for port in ports for arg in ("--port", str(port))]
        command += [arg for replica in replicas for arg in ("--replica", replica)]
        command += [arg for name, index in routes.items() for arg in ("--route", f"{name}={index}")]
        with open(log, "wb") as out:
            process = spawn(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        balancer = cls(process, events, log)
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                balancer.stop()
                raise RuntimeError(f"the balancer did not listen on {host}:{list(ports)} within {timeout:g} s: "
                                   f"{log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.05)  # polling the ready file, bounded by the deadline
        return balancer

    def connections(self) -> list[Connection]:
        try:
            lines = self.events_path.read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            cells = line.split()
            if len(cells) == 5 and cells[0] in ("C", "E"):
                out.append(Connection(cells[0], float(cells[1]), cells[2], int(cells[3]), int(cells[4])))
        return out

    def replicas_of(self, client_id: str, *, before: float | None = None, after: float | None = None) -> set[int]:
        """The replicas ``client_id`` was relayed to, in connections made in the window."""
        return {c.replica for c in self.connections() if c.kind == "C" and c.client_id == client_id
                and (before is None or c.time < before) and (after is None or c.time > after)}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
