"""Real network faults between a client and a server, made by Toxiproxy.

Faults faked inside a client (a patched socket, a mocked timeout) only reach the code paths
their author thought of. Toxiproxy (Shopify's TCP proxy for fault injection, pinned to
``VERSION``) sits on a real loopback port between the two processes and breaks the real
connections: it delays the bytes, resets the connections, swallows everything, throttles,
cuts a stream into small pieces or after a number of bytes, or stops listening, while the
client's and the server's own code react as they would in production.

The server binary is built once with ``go install`` into
``${KEYRANGE_CACHE:-~/.cache/keyrange-proxy}/toxiproxy-<version>/bin/server``
(``python -m harness.toxiproxy install``; ``make test`` runs it). A Go older than
the one Toxiproxy's module asks for gets the newer toolchain through the Go module proxy
(Go 1.21 and later switch by themselves; older ones, as Debian 12 ships, are helped).

    with ToxiproxyServer.start() as toxiproxy:
        link = toxiproxy.create_proxy("kafka", upstream=("127.0.0.1", 9092))
        with link.latency(200, jitter=50):
            ...  # every byte through link.address is late
        with link.down():
            ...

Each server process is started by this process, stopped by its PID (``stop``, and at
interpreter exit), and killed by the kernel if this process dies first.

The module uses only the standard library.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.processes import spawn
from proxy.local_kafka import cache_root, terminate

__all__ = [
    "VERSION",
    "Proxy",
    "Toxic",
    "ToxiproxyError",
    "ToxiproxyServer",
    "install",
    "server_binary",
]

VERSION = "2.12.0"
MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server"
HOST = "127.0.0.1"
# Toxiproxy 2.12.0's go.mod says "go 1.23.0". Go 1.21+ fetches such a toolchain itself
# (GOTOOLCHAIN=auto); an older go fetches this one as a module and hands over to it.
GO_NEEDED = (1, 23)
BOOTSTRAP_TOOLCHAIN = "go1.23.12"
# Listening ports are taken below the kernel's ephemeral range, and apart from the Kafka
# harness's range (20000-32000): a port given up while a proxy is disabled must still be
# free when it is enabled again, so no outgoing connection may borrow it meanwhile.
_PORT_RANGE = (12000, 20000)
STREAMS = ("downstream", "upstream")
_Placed = contextlib.AbstractContextManager[list["Toxic"]]


class ToxiproxyError(RuntimeError):
    """Toxiproxy cannot be installed, started or asked; ``str()`` says what and why."""


# --------------------------------------------------------------------------------------
# Installing the server


def install_dir(cache_dir: Path | None = None) -> Path:
    return (Path(cache_dir) if cache_dir is not None else cache_root()) / f"toxiproxy-{VERSION}"


def server_binary(cache_dir: Path | None = None) -> Path:
    """Where the server binary lives once installed (whether it is yet or not)."""
    return install_dir(cache_dir) / "bin" / "server"


def install(cache_dir: Path | None = None, *, verbose: bool = False, timeout: float = 900.0) -> Path:
    """Make sure the pinned Toxiproxy server is built into the cache; return the binary.

    Does nothing (and prints nothing) when it is there already. The build goes into a
    staging directory that is renamed into place, so a binary at ``server_binary()`` is
    always complete; a lock keeps two processes from building at once."""
    binary = server_binary(cache_dir)
    if os.access(binary, os.X_OK):
        return binary
    root = install_dir(cache_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ToxiproxyError(f"cannot create the Toxiproxy cache {root} ({exc.strerror}); "
                             "set KEYRANGE_CACHE to a writable directory") from None
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.access(binary, os.X_OK):
            return binary
        go = find_go()
        if go is None:
            raise ToxiproxyError(
                f"Go is not installed (no go on PATH or in /usr/local/go/bin) and Toxiproxy {VERSION} is not "
                f"built in {binary}: run scripts/install-system-deps (it installs golang-go) or install Go")
        print(f"building Toxiproxy {VERSION} into {binary.parent} with {go}", file=sys.stderr)
        deadline = time.monotonic() + timeout
        env = dict(os.environ)
        version = go_version(go)
        if version < (1, 21):
            go = _bootstrap_toolchain(go, env, deadline, verbose)
        env["GOTOOLCHAIN"] = "auto"  # a distribution's go.env may say "local"
        staging = Path(tempfile.mkdtemp(prefix="bin.partial-", dir=root))
        try:
            _run_go([go, "install", f"{MODULE}@v{VERSION}"], {**env, "GOBIN": str(staging)}, deadline, verbose,
                    f"go install {MODULE}@v{VERSION}")
            built = staging / "server"
            if not os.access(built, os.X_OK):
                raise ToxiproxyError(f"go install finished but left no server binary in {staging}")
            binary.parent.mkdir(parents=True, exist_ok=True)
            os.replace(built, binary)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return binary


def find_go() -> str | None:
    """``go`` on PATH, else the usual places of an unpacked release or a Debian package."""
    found = shutil.which("go")
    if found:
        return found
    candidates = [Path("/usr/local/go/bin/go"), *sorted(Path("/usr/lib").glob("go-*/bin/go"), reverse=True)]
    return next((str(path) for path in candidates if os.access(path, os.X_OK)), None)


def go_version(go: str) -> tuple[int, int]:
    """(major, minor) of ``go version``: "go version go1.19.8 linux/amd64" -> (1, 19)."""
    try:
        out = subprocess.run([go, "version"], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToxiproxyError(f"{go} version failed: {exc}") from None
    return parse_go_version(out)


def parse_go_version(text: str) -> tuple[int, int]:
    match = re.search(r"\bgo(\d+)\.(\d+)", text)
    if not match:
        raise ToxiproxyError(f"cannot read a Go version from {text.strip()!r}")
    return int(match.group(1)), int(match.group(2))


def toolchain_module(goos: str, goarch: str) -> str:
    """The module the Go project publishes a whole toolchain as (what GOTOOLCHAIN fetches)."""
    return f"golang.org/toolchain@v0.0.1-{BOOTSTRAP_TOOLCHAIN}.{goos}-{goarch}"


def _bootstrap_toolchain(go: str, env: dict[str, str], deadline: float, verbose: bool) -> str:
    """A go too old to switch toolchains itself downloads the newer one as a module; its
    ``bin/go`` then builds Toxiproxy. Module zips keep no file modes, so the executables
    are made executable again (as Go 1.21+ does when it switches)."""
    platform = _run_go([go, "env", "GOOS", "GOARCH"], env, deadline, False, "go env").split()
    if len(platform) != 2:
        raise ToxiproxyError(f"go env GOOS GOARCH printed {platform!r}")
    module = toolchain_module(*platform)
    out = _run_go([go, "mod", "download", "-json", module], env, deadline, verbose, f"go mod download {module}")
    try:
        root = Path(json.loads(out)["Dir"])
    except (ValueError, KeyError) as exc:
        raise ToxiproxyError(f"go mod download {module} printed no module directory: {out[-500:]!r}") from exc
    for folder in (root / "bin", *(root / "pkg" / "tool").glob("*")):
        for path in folder.iterdir() if folder.is_dir() else ():
            if path.is_file():
                path.chmod(path.stat().st_mode | 0o555)
    newer = root / "bin" / "go"
    if go_version(str(newer)) < GO_NEEDED:
        raise ToxiproxyError(f"{newer} is not Go {GO_NEEDED[0]}.{GO_NEEDED[1]} or newer")
    return str(newer)


def _run_go(cmd: Sequence[str], env: Mapping[str, str], deadline: float, verbose: bool, what: str) -> str:
    """Run a go command outside any module (the repository has none, but a parent folder
    might), returning its standard output; its errors name the command and its output."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise ToxiproxyError(f"no time left for {what}")
    with tempfile.TemporaryDirectory(prefix="toxiproxy-build-") as cwd:
        try:
            proc = subprocess.run(list(cmd), cwd=cwd, env={**env, "GO111MODULE": "on"}, capture_output=True,
                                  text=True, timeout=remaining)
        except subprocess.TimeoutExpired:
            raise ToxiproxyError(f"{what} did not finish in time; is the Go module proxy reachable "
                                 f"(GOPROXY={env.get('GOPROXY', 'default')})?") from None
    if verbose and proc.stderr:
        sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        raise ToxiproxyError(f"{what} failed with exit code {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc.stdout


# --------------------------------------------------------------------------------------
# Ports


def _listening_port_candidates() -> Iterator[int]:
    ports = list(range(*_PORT_RANGE))
    random.shuffle(ports)
    yield from ports


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    for port in _listening_port_candidates():
        if _port_is_free(port):
            return port
    raise ToxiproxyError(f"no free TCP port on {HOST} in {_PORT_RANGE}")


def _accepts(port: int, timeout: float = 0.5) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect((HOST, port))
        except OSError:
            return False
    return True


# --------------------------------------------------------------------------------------
# The server and its HTTP API


_running: set[ToxiproxyServer] = set()


def _stop_all_at_exit() -> None:
    for server in list(_running):
        server.stop(timeout=5.0)


atexit.register(_stop_all_at_exit)


class ToxiproxyServer:
    """One Toxiproxy server process with its HTTP API on a loopback port."""

    def __init__(self, process: subprocess.Popen[Any], api_port: int, log_path: Path) -> None:
        self.process = process
        self.api_port = api_port
        self.log_path = log_path
        self._request_timeout = 10.0

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def api_url(self) -> str:
        return f"http://{HOST}:{self.api_port}"

    @classmethod
    def start(cls, *, workdir: Path | None = None, binary: Path | None = None, timeout: float = 30.0,
              seed: int | None = None) -> ToxiproxyServer:
        """Start the server (installing it first if needed) and wait until its API answers.

        ``seed`` makes Toxiproxy's own randomness (jitter, toxicity, slice sizes)
        repeatable. A port taken between the probe and the server's bind is tried again
        on another port."""
        binary = binary or install()
        workdir = Path(workdir or tempfile.mkdtemp(prefix="toxiproxy-"))
        workdir.mkdir(parents=True, exist_ok=True)
        last_problem = ""
        for _ in range(3):
            port = _free_port()
            log_path = workdir / f"toxiproxy-{port}.log"
            cmd = [str(binary), "-host", HOST, "-port", str(port)]
            if seed is not None:
                cmd += ["-seed", str(seed)]
            with open(log_path, "wb") as log_file:
                process = spawn(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            server = cls(process, port, log_path)
            _running.add(server)
            try:
                server._wait_ready(time.monotonic() + timeout)
                return server
            except ToxiproxyError as exc:
                server.stop(timeout=5.0)
                last_problem = str(exc)
                if "address already in use" not in server.log_text().lower():
                    raise
        raise ToxiproxyError(f"Toxiproxy could not take a port after 3 tries: {last_problem}")

    def _wait_ready(self, deadline: float) -> None:
        while True:
            code = self.process.poll()
            if code is not None:
                raise ToxiproxyError(f"Toxiproxy exited with code {code} before its API answered; log "
                                     f"{self.log_path}:\n{self.log_text()[-2000:]}")
            try:
                self.request("GET", "/version", timeout=1.0)
                return
            except ToxiproxyError:
                if time.monotonic() >= deadline:
                    raise ToxiproxyError(f"Toxiproxy's API on port {self.api_port} did not answer in time; log "
                                         f"{self.log_path}:\n{self.log_text()[-2000:]}") from None
            time.sleep(0.05)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL past ``timeout``; returns the exit code."""
        _running.discard(self)
        return terminate(self.process, timeout)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(log unreadable: {exc})"

    def __enter__(self) -> ToxiproxyServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- the HTTP API ------------------------------------------------------------------
    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None, *,
                timeout: float | None = None) -> Any:
        """One API call; the decoded JSON answer (None for an empty one). An error status
        or an unreachable server raises ``ToxiproxyError`` with Toxiproxy's own message."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.api_url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout or self._request_timeout) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace").strip()
            with contextlib.suppress(ValueError):
                detail = json.loads(detail).get("error", detail)
            raise ToxiproxyError(f"Toxiproxy {method} {path}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise ToxiproxyError(f"Toxiproxy {method} {path}: API at {self.api_url} unreachable ({exc})") from None
        return json.loads(text) if text.strip() else None

    def version(self) -> str:
        answer = self.request("GET", "/version")
        return str(answer.get("version", answer)) if isinstance(answer, dict) else str(answer)

    def create_proxy(self, name: str, upstream: tuple[str, int], *, listen_port: int | None = None) -> Proxy:
        """A proxy listening on ``127.0.0.1:listen_port`` (default: a free port below the
        ephemeral range, tried again elsewhere if taken meanwhile) that relays every
        connection to ``upstream``, which need not be listening yet."""
        last = ""
        for _ in range(1 if listen_port is not None else 5):
            port = listen_port if listen_port is not None else _free_port()
            try:
                answer = self.request("POST", "/proxies", {"name": name, "listen": f"{HOST}:{port}",
                                                           "upstream": _address(upstream), "enabled": True})
            except ToxiproxyError as exc:
                last = str(exc)
                if "address already in use" in last and listen_port is None:
                    continue
                raise
            return Proxy(self, name, _port_of(answer["listen"]), upstream)
        raise ToxiproxyError(f"cannot create proxy {name!r}: {last}")

    def proxies(self) -> dict[str, Any]:
        return self.request("GET", "/proxies") or {}

    def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        self.request("POST", "/reset")


def _address(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _port_of(listen: str) -> int:
    return int(listen.rpartition(":")[2])


@dataclass
class Toxic:
    """A toxic in place on one stream of a proxy."""

    proxy: Proxy
    name: str
    kind: str
    stream: str
    attributes: dict[str, Any]

    def remove(self) -> None:
        self.proxy.remove_toxic(self.name)


@dataclass(eq=False)
class Proxy:
    """One listening port of the server and its upstream; toxics and outages on it.

    The toxic methods are context managers: the toxic is in place for the block and
    removed after it (also when the block raises). ``stream`` is "downstream" (what the
    upstream sends the client), "upstream" (what the client sends) or "both"."""

    server: ToxiproxyServer
    name: str
    listen_port: int
    upstream: tuple[str, int]
    _names: Iterator[int] = field(default_factory=lambda: iter(range(1, 1 << 62)), repr=False)

    @property
    def listen(self) -> tuple[str, int]:
        return (HOST, self.listen_port)

    @property
    def address(self) -> str:
        return f"{HOST}:{self.listen_port}"

    # -- the proxy itself ----------------------------------------------------------------
    def set_upstream(self, upstream: tuple[str, int]) -> None:
        """Relay to another upstream; Toxiproxy restarts the listener on the same port and
        drops the connections it had."""
        self.server.request("PATCH", f"/proxies/{self.name}", {"upstream": _address(upstream)})
        self.upstream = upstream

    def disable(self) -> None:
        """Stop listening (new connections are refused) and close every connection."""
        self.server.request("PATCH", f"/proxies/{self.name}", {"enabled": False})

    def enable(self, timeout: float = 10.0) -> None:
        """Listen again on the same port; returns once the port accepts connections."""
        self.server.request("PATCH", f"/proxies/{self.name}", {"enabled": True})
        deadline = time.monotonic() + timeout
        while not _accepts(self.listen_port):
            if time.monotonic() >= deadline:
                raise ToxiproxyError(f"proxy {self.name!r} enabled but port {self.listen_port} refuses connections "
                                     f"after {timeout:g} s")
            time.sleep(0.02)

    @property
    def enabled(self) -> bool:
        return bool(self.server.request("GET", f"/proxies/{self.name}")["enabled"])

    @contextlib.contextmanager
    def down(self) -> Iterator[None]:
        """Refused for the block: the port is closed and every connection cut."""
        self.disable()
        try:
            yield
        finally:
            self.enable()

    def delete(self) -> None:
        self.server.request("DELETE", f"/proxies/{self.name}")

    # -- toxics ----------------------------------------------------------------------------
    def add_toxic(self, kind: str, attributes: Mapping[str, Any], *, stream: str = "downstream",
                  toxicity: float = 1.0, name: str | None = None) -> list[Toxic]:
        """Put a toxic on ``stream`` ("both": one on each); ``toxicity`` is the share of
        connections it applies to. Returns the toxics put in place."""
        streams = STREAMS if stream == "both" else (stream,)
        if not set(streams) <= set(STREAMS):
            raise ValueError(f"stream must be downstream, upstream or both, got {stream!r}")
        base = name or f"{kind}-{next(self._names)}"
        placed: list[Toxic] = []
        try:
            for direction in streams:
                toxic_name = f"{base}-{direction}"
                self.server.request("POST", f"/proxies/{self.name}/toxics",
                                    {"name": toxic_name, "type": kind, "stream": direction,
                                     "toxicity": toxicity, "attributes": dict(attributes)})
                placed.append(Toxic(self, toxic_name, kind, direction, dict(attributes)))
        except BaseException:
            for toxic in placed:
                with contextlib.suppress(ToxiproxyError):
                    toxic.remove()
            raise
        return placed

    def remove_toxic(self, name: str) -> None:
        self.server.request("DELETE", f"/proxies/{self.name}/toxics/{name}")

    def toxics(self) -> list[dict[str, Any]]:
        return list(self.server.request("GET", f"/proxies/{self.name}/toxics") or [])

    @contextlib.contextmanager
    def toxic(self, kind: str, attributes: Mapping[str, Any], *, stream: str = "downstream",
              toxicity: float = 1.0) -> Iterator[list[Toxic]]:
        placed = self.add_toxic(kind, attributes, stream=stream, toxicity=toxicity)
        try:
            yield placed
        finally:
            for toxic in placed:
                toxic.remove()

    def latency(self, ms: int, *, jitter: int = 0, stream: str = "downstream") -> _Placed:
        """Every chunk of data waits ``ms`` plus or minus up to ``jitter`` milliseconds."""
        return self.toxic("latency", {"latency": ms, "jitter": jitter}, stream=stream)

    def reset_peer(self, *, after_ms: int = 0, stream: str = "downstream",
                   toxicity: float = 1.0) -> _Placed:
        """Connections that carry data on ``stream`` are reset (TCP RST) ``after_ms`` later."""
        return self.toxic("reset_peer", {"timeout": after_ms}, stream=stream, toxicity=toxicity)

    def blackhole(self, *, close_after_ms: int = 0, stream: str = "both") -> _Placed:
        """Nothing gets through; with ``close_after_ms`` the connection is closed that long
        after it is hit, else it stays open (and silent) until the block ends, when
        Toxiproxy closes it."""
        return self.toxic("timeout", {"timeout": close_after_ms}, stream=stream)

    def bandwidth(self, kb_per_second: int, *, stream: str = "downstream") -> _Placed:
        """A slow link: at most ``kb_per_second`` KB/s."""
        return self.toxic("bandwidth", {"rate": kb_per_second}, stream=stream)

    def limit_data(self, nbytes: int, *, stream: str = "downstream") -> _Placed:
        """A connection is closed once ``nbytes`` went through it on ``stream``."""
        return self.toxic("limit_data", {"bytes": nbytes}, stream=stream)

    def slicer(self, average_size: int, *, size_variation: int = 0, delay_us: int = 0,
               stream: str = "downstream") -> _Placed:
        """The stream arrives cut into pieces of about ``average_size`` bytes, ``delay_us``
        microseconds apart (frames split at arbitrary points)."""
        return self.toxic("slicer", {"average_size": average_size, "size_variation": size_variation,
                                     "delay": delay_us}, stream=stream)


# --------------------------------------------------------------------------------------
# Command line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.toxiproxy")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("install", help=f"build Toxiproxy {VERSION} into the cache once (quiet when it is there)")
    build.add_argument("-v", "--verbose", action="store_true")
    sub.add_parser("path", help="print where the server binary is (or will be) installed")
    args = parser.parse_args(argv)
    try:
        if args.command == "install":
            install(verbose=args.verbose)
        else:
            print(server_binary())
    except ToxiproxyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
