"""One Maven run of the Java programs under ``benchmarks/java`` (the benchmark peers and the
Streams programs), with the cache's local repository, so later runs work offline."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from proxy.local_kafka import LocalKafkaError, cache_root


class MavenError(LocalKafkaError):
    """Maven is missing, timed out or failed; the message carries the tail of its output."""


def package(pom: Path, *, what: str, projects: Sequence[str] = (), timeout: float = 900.0) -> None:
    """``mvn -B -q package`` on ``pom``: every module, or only ``projects`` and the modules
    they need. ``what`` names the build in errors."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MavenError(f"Maven (mvn) is needed to build {what}: apt-get install maven.")
    command = [mvn, "-B", "-q", "-Dstyle.color=never", "-f", str(pom), f"-Dmaven.repo.local={cache_root() / 'm2'}"]
    if projects:
        command += ["-pl", ",".join(projects), "-am"]
    command.append("package")
    try:
        result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise MavenError(f"building {what} took longer than {timeout:.0f} s (is Maven Central reachable?)") from None
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-30:])
        raise MavenError(f"building {what} failed (exit code {result.returncode}):\n{tail}")
