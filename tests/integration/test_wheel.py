"""The wheel, as a user installs it: built from a clean copy of the sources (no build/ or
in-place extensions of the checkout can slip in), installed with its dependencies into a
fresh virtualenv, its ``keyrange-proxy`` reports every C accelerator and serves a real
client against the test broker, importing nothing from the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

from harness.clients import confluent_roundtrip
from harness.kafka_cluster import KafkaCluster
from proxy.local_kafka import ProxyProcess

from .conftest import proxy_ports

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "proxy", "protocol_schemas")
EXTENSIONS = ("proxy/records/_ckernels", "proxy/net/_cpump", "proxy/commits/_cpacked")


def _run(command: list, cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    done = subprocess.run([str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The bin/ of a fresh virtualenv holding the wheel built from the sources."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.so", "_native_table.h"))
        else:
            source.mkdir(exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    # what the user has, not this test run's: no PYTHONPATH into the checkout
    env = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "VIRTUAL_ENV")}
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", work / "dist", source],
         work, env)
    wheels = list((work / "dist").glob("keyrange_proxy-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = wheel.namelist()
    for extension in EXTENSIONS:  # the three accelerators were compiled into it
        assert any(name.startswith(extension) and name.endswith(".so") for name in names), (extension, names)
    assert any(name.startswith("protocol_schemas/") and name.endswith(".json") for name in names)
    assert "proxy/protocol/message_types.pyi" in names
    assert not [name for name in names if name.split("/")[0] in ("tests", "harness", "benchmarks", "chaos", "fuzz")]

    venv = work / "venv"
    _run([sys.executable, "-m", "venv", venv], work, env)
    _run([venv / "bin/python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", wheels[0]], work, env)
    return venv / "bin"


def test_the_installed_command_reports_every_c_accelerator(installed: Path, tmp_path):
    lines = _run([installed / "keyrange-proxy", "--version"], tmp_path, {"PATH": os.environ["PATH"]}).splitlines()
    assert lines[0] == "keyrange-proxy 0.1.0"
    assert lines[2:] == ["record kernels: C", "native relay: C", "range commits: C"]
    where = _run([installed / "python", "-c", "import proxy, proxy.net._cpump; print(proxy.__file__)"], tmp_path,
                 {"PATH": os.environ["PATH"]})
    assert Path(where.strip()).is_relative_to(installed.parent), where  # the virtualenv's, not the checkout's


def test_a_client_is_served_by_the_installed_proxy(installed: Path, kafka: KafkaCluster, new_topic: str, tmp_path):
    proxy = ProxyProcess.start(kafka.bootstrap_servers, overrides={"metrics.port": "0"}, workdir=tmp_path,
                               cwd=tmp_path, env={"PATH": os.environ["PATH"]},
                               program=[str(installed / "keyrange-proxy")])
    try:
        count = 200
        ports, values = confluent_roundtrip({"bootstrap.servers": proxy.bootstrap_servers}, new_topic, count)
        assert ports <= proxy_ports(proxy)  # every broker address the client learnt is the proxy's
        assert sorted(values) == sorted(f"v{i}".encode() for i in range(count))  # acknowledged = delivered
        assert len(values) == count
        assert proxy.metrics_url is not None
        with urllib.request.urlopen(proxy.metrics_url, timeout=5) as answer:
            exported = answer.read().decode()
        assert "\nkafka_proxy_ready 1.0\n" in exported
        assert 'kafka_proxy_requests_total{api="Produce"}' in exported
    finally:
        code = proxy.stop()
    assert code == 0, proxy.log_text()[-3000:]
    assert "accelerators record_kernels=C native_relay=C range_commits=C" in proxy.log_text()
