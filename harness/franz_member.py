"""franz-go, the Go Kafka client, as a consumer group member (``harness/franz_member/``).

The Go program is built with the machine's ``go`` on first use, into the cache
(``<cache>/go/franz_member-<hash of its sources>``), its modules fetched by ``go`` itself
(``go.sum`` pins them). ``build()`` says why it cannot be had (no toolchain, modules not
reachable) instead of raising, so a test can skip.

A member prints each record it gets as ``partition<TAB>offset<TAB>key<TAB>value`` and
commits as franz-go does by default: autocommit of the offset after the last record
polled. It stops (commits what it polled, leaves the group) when its standard input closes.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import threading
from pathlib import Path

from harness.processes import spawn
from proxy.local_kafka import cache_root

SOURCE = Path(__file__).resolve().parent / "franz_member"
BUILD_TIMEOUT = 600.0

Received = list[tuple[int, int, bytes, bytes]]  # (partition, offset, key, value)


def build() -> tuple[Path | None, str]:
    """(the built program, "") or (None, why it could not be built)."""
    go = shutil.which("go")
    if go is None:
        return None, "no go toolchain on PATH"
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((SOURCE / name).read_bytes())
    target = cache_root() / "go" / f"franz_member-{digest.hexdigest()[:16]}"
    if target.exists():
        return target, ""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    try:
        result = subprocess.run([go, "build", "-o", str(partial), "."], cwd=SOURCE, capture_output=True, text=True,
                                timeout=BUILD_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return None, f"go build did not finish within {BUILD_TIMEOUT:g} s"
    if result.returncode != 0:
        return None, f"go build failed: {result.stderr.strip()[-2000:]}"
    partial.replace(target)
    return target, ""


class FranzMember:
    """One running member; ``received`` fills as it prints records."""

    def __init__(self, program: Path, bootstrap: str, topic: str, group: str, *, commit_ms: int = 500) -> None:
        self.received: Received = []
        self.errors: list[str] = []
        self._process = spawn([str(program), "-brokers", bootstrap, "-topic", topic, "-group", group,
                               "-commit-ms", str(commit_ms)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._readers = [threading.Thread(target=self._read_records, daemon=True),
                         threading.Thread(target=self._read_errors, daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read_records(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            cells = line.rstrip(b"\n").split(b"\t")
            if len(cells) == 4:
                self.received.append((int(cells[0]), int(cells[1]), cells[2], cells[3]))

    def _read_errors(self) -> None:
        assert self._process.stderr is not None
        for line in self._process.stderr:
            self.errors.append(line.decode(errors="replace").rstrip())

    def stop(self, timeout: float = 30.0) -> int:
        """Close its standard input (it commits and leaves the group); its exit code.
        Killed, by its PID, if it has not exited within ``timeout``."""
        process = self._process
        if process.stdin is not None and not process.stdin.closed:
            process.stdin.close()
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait(10)
        for reader in self._readers:
            reader.join(10)
        return code
