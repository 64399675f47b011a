"""Start the proxy as a real process (``keyrange-proxy``) for tests, the demo and benchmarks.

The proxy runs in its own process, as in production, so clients that block (kafka-python,
librdkafka, the Java tools) and the proxy never share an event loop or a GIL.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from proxy.testing.kafka_cluster import terminate

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


class ProxyStartError(RuntimeError):
    pass


class ProxyProcess:
    def __init__(self, process: subprocess.Popen, info: dict, log_path: Path, workdir: Path) -> None:
        self.process = process
        self.info = info
        self.log_path = log_path
        self.workdir = workdir

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def port(self) -> int:
        return self.info["port"]

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.info['host']}:{self.info['port']}"

    @property
    def node_ports(self) -> dict[int, int]:
        return {int(node): port for node, port in self.info["node_ports"].items()}

    @property
    def metrics_url(self) -> str | None:
        port = self.info.get("metrics_port")
        return f"http://{self.info['host']}:{port}/metrics" if port else None

    @classmethod
    def start(
        cls,
        bootstrap_servers: str,
        *,
        overrides: dict[str, str] | None = None,
        workdir: Path | None = None,
        listen_port: int = 0,
        timeout: float = 30.0,
        source: Path | None = None,
    ) -> ProxyProcess:
        """``source``: run the proxy of another checkout (its root folder, C kernels built
        in place) instead of this one's, to compare two builds in one run."""
        workdir = Path(workdir or tempfile.mkdtemp(prefix="keyrange-proxy-"))
        workdir.mkdir(parents=True, exist_ok=True)
        ready = workdir / f"ready-{time.monotonic_ns()}.json"
        log_path = workdir / f"proxy-{time.monotonic_ns()}.log"
        command = [
            sys.executable, "-m", "proxy.server.cli",
            "--bootstrap-server", bootstrap_servers,
            "--listen", f"127.0.0.1:{listen_port}",
            "--ready-file", str(ready),
        ]
        for key, value in (overrides or {}).items():
            command += ["--override", f"{key}={value}"]
        log_file = open(log_path, "wb")
        env = None if source is None else {**os.environ, "PYTHONPATH": str(source)}
        process = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
            cwd=source, env=env,
        )
        log_file.close()
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if process.poll() is not None:
                raise ProxyStartError(
                    f"proxy exited with {process.returncode} before listening:\n{log_path.read_text(errors='replace')[-3000:]}"
                )
            if time.monotonic() > deadline:
                process.kill()
                process.wait()
                raise ProxyStartError(f"proxy not listening after {timeout}s; log: {log_path}")
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        return cls(process, info, log_path, workdir)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (the proxy drains), then SIGKILL past ``timeout``. Returns the exit code."""
        return terminate(self.process, timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def __enter__(self) -> ProxyProcess:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()
