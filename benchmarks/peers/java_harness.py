"""The Java programs under ``benchmarks/java/``, built with Maven on first use.

Each module has a classpath of its own (the peers need different kafka-clients versions),
under ``build/bench-java/<module>/``. Maven runs only when a pom or a source file changed
since the last build (a digest of them is kept next to the output), with its local
repository in the harness cache, so later runs work offline.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

from harness import maven
from harness.processes import spawn
from proxy.local_kafka import LocalKafkaError, find_java, kafka_dist_dir

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "benchmarks" / "java"
OUTPUT = ROOT / "build" / "bench-java"
MODULES = ("bench-share", "bench-parallel", "bench-kroxylicious", "bench-streams")
JVM_OPTIONS = ("-Xms64m", "-Xmx384m", "-XX:+UseSerialGC", "-Djava.awt.headless=true")


class HarnessError(LocalKafkaError):
    """A Java harness program failed; the message carries what it printed."""


def _digest() -> str:
    sha = hashlib.sha256()
    for path in sorted(SOURCES.rglob("*")):
        if path.is_file() and (path.suffix in (".java", ".xml")):
            sha.update(str(path.relative_to(SOURCES)).encode())
            sha.update(path.read_bytes())
    return sha.hexdigest()


def build(*, timeout: float = 900.0) -> Path:
    """Build the harness unless it is up to date; return the output directory."""
    stamp = OUTPUT / ".stamp.json"
    digest = _digest()

    def current() -> bool:
        try:
            return json.loads(stamp.read_text())["digest"] == digest and all(
                (OUTPUT / module / f"{module}.jar").is_file() for module in MODULES)
        except (OSError, ValueError, KeyError):
            return False

    if current():
        return OUTPUT
    OUTPUT.mkdir(parents=True, exist_ok=True)
    with open(OUTPUT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a test run and a benchmark may both build
        if current():
            return OUTPUT
        try:
            maven.package(SOURCES / "pom.xml", what="benchmarks/java", timeout=timeout)
        except maven.MavenError as exc:
            raise HarnessError(str(exc)) from None
        stamp.write_text(json.dumps({"digest": digest}))
    return OUTPUT


def command(module: str, main_class: str, args: Sequence[str] = (), *,
            jvm_options: Sequence[str] = JVM_OPTIONS) -> list[str]:
    """``java ... -cp <module's classpath> main_class args``, building first if needed."""
    if module not in MODULES:
        raise ValueError(f"unknown harness module {module!r}; one of {MODULES}")
    out = build() / module
    return [find_java(), *jvm_options, f"-Dlog4j2.configurationFile={kafka_dist_dir() / 'tools-log4j2.properties'}",
            "-cp", f"{out / (module + '.jar')}:{out / 'lib'}/*", main_class, *map(str, args)]


def run_json(module: str, main_class: str, args: Sequence[str], *, timeout: float) -> dict:
    """Run a harness program to its end and return the JSON line it printed last."""
    process = spawn(command(module, main_class, args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:
        process.kill()
        process.communicate()
        raise
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if process.returncode != 0 or not lines:
        tail = "\n".join((stderr or stdout).strip().splitlines()[-20:])
        raise HarnessError(f"{main_class.rsplit('.', 1)[-1]} {' '.join(map(str, args))} failed "
                           f"(exit code {process.returncode}):\n{tail}")
    return json.loads(lines[-1])
