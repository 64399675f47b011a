"""The container image (Containerfile): built on a base made from Debian packages, then the
proxy it holds (its entrypoint, as its user, with its environment) serves a real client
against the test broker, configured by a properties file in the image and KEYRANGE_*
variables, as a pod would configure it. See harness/container_image.py for how the image
is built and run without a registry or a container runtime."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from harness.clients import confluent_roundtrip
from harness.container_image import (
    ImageConfig,
    ImageError,
    Podman,
    RootFs,
    build_image,
    ensure_base,
    leaf_uids,
    missing_tools,
    mounted,
    start_in_rootfs,
)
from harness.kafka_cluster import KafkaCluster
from harness.wait import wait_until
from proxy.local_kafka import terminate

from .conftest import free_ports

pytestmark = pytest.mark.image

TAG = "localhost/keyrange-proxy:test"


def _can_be_root() -> bool:
    if os.geteuid() == 0:
        return True
    try:
        return subprocess.run(["sudo", "-n", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="module")
def podman() -> Podman:
    missing = missing_tools()
    if missing:
        pytest.fail(f"the image test needs the Debian packages {', '.join(missing)} "
                    f"(scripts/install-system-deps installs them)", pytrace=False)
    if not _can_be_root():
        pytest.skip("podman, mmdebstrap and chroot need root: run as root or with passwordless sudo")
    try:
        return Podman.detect()
    except ImageError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="module")
def image(podman: Podman, tmp_path_factory) -> str:
    """The image, built from the working tree (the base once per machine, then cached)."""
    logs = tmp_path_factory.mktemp("image")
    try:
        started = time.monotonic()
        base = ensure_base(podman, logs / "base.log")
        based = time.monotonic()
        build_image(podman, base, TAG, logs / "build.log")
    except ImageError as exc:
        pytest.fail(str(exc), pytrace=False)
    print(f"image: base {based - started:.1f} s, build {time.monotonic() - based:.1f} s")
    return TAG


@pytest.fixture
def rootfs(podman: Podman, image: str) -> Iterator[RootFs]:
    with mounted(podman, image, f"keyrange-proxy-test-{os.getpid()}") as root:
        yield root


def test_the_image_runs_the_proxy_as_a_user_without_privileges_with_every_accelerator(podman, image, rootfs,
                                                                                   tmp_path):
    config = ImageConfig.of(podman, image)
    assert config.entrypoint == ("keyrange-proxy",)
    assert config.cmd == ()  # not the base's python3: the arguments are the proxy's
    assert config.user == "10001:10001"  # numeric, for runAsNonRoot
    assert config.exposed == ("9192/tcp", "9404/tcp")
    # the runtime stage holds the virtualenv, without pip or a source tree
    assert rootfs.exists("opt/keyrange-proxy/bin/keyrange-proxy")
    assert not rootfs.exists("opt/keyrange-proxy/lib/python3*/site-packages/pip")
    assert not rootfs.exists("src")

    log = tmp_path / "version.log"
    process = start_in_rootfs(rootfs, config, ["--version"], log)
    assert process.wait(timeout=60) == 0, log.read_text()
    lines = log.read_text().splitlines()
    assert lines[0] == "keyrange-proxy 0.1.0"
    assert lines[2:] == ["record kernels: C", "native relay: C", "range commits: C"]


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def test_a_client_is_served_by_the_proxy_in_the_image_configured_by_file_and_environment(
        podman, image, rootfs, kafka: KafkaCluster, new_topic: str, tmp_path):
    config = ImageConfig.of(podman, image)
    port, metrics_port = free_ports(2)
    node = kafka.nodes[0]
    # the file a pod mounts (deploy/sidecar.properties' shape), and variables beside it:
    # the port in the file is overridden by the environment
    rootfs.write_text("etc/keyrange-proxy/proxy.properties",
        "topology=sidecar\n"
        f"bootstrap.servers={kafka.bootstrap_servers}\n"
        "listen.host=127.0.0.1\n"
        "listen.port=1\n"
        f"sidecar.node.addresses={node.node_id}@127.0.0.1:{port}\n"
        "log.format=json\n")
    env = {"KEYRANGE_LISTEN_PORT": str(port), "KEYRANGE_METRICS_PORT": str(metrics_port)}
    log = tmp_path / "proxy.log"
    process = start_in_rootfs(rootfs, config, ["/etc/keyrange-proxy/proxy.properties"], log, env)
    try:
        def ready() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"the proxy exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            return _status(f"http://127.0.0.1:{metrics_port}/readyz") == 200

        wait_until(ready, timeout=60, interval=0.2, what=lambda: f"ready; log:\n{log.read_text()[-3000:]}")
        # it runs as the image's user, not as root (with sudo in between, as sudo's child)
        assert list(leaf_uids(process.pid).values()) == [10001]

        count = 200
        ports, values = confluent_roundtrip({"bootstrap.servers": f"127.0.0.1:{port}"}, new_topic, count)
        assert ports == {port}  # every broker address the client learnt is the proxy's
        assert sorted(values) == sorted(f"v{i}".encode() for i in range(count))  # acknowledged = delivered
        assert len(values) == count
    finally:
        code = terminate(process, 30)
    assert code == 0, log.read_text()[-3000:]
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert any("accelerators record_kernels=C native_relay=C range_commits=C" in line.get("msg", "")
               for line in lines), log.read_text()[-3000:]
