"""The proxy's container image, built and run where no registry and no container runtime is.

- The base: a Debian root filesystem made by ``mmdebstrap`` from Debian packages (Python,
  venv, a C compiler, the Python and xxHash headers, CA certificates) and imported into
  podman, ``localhost/keyrange-proxy-base:<suite>-<hash of what it holds>``. Built once
  and kept: a later run finds it by its tag (about 100 s the first time, on 2 cores).
- The image: the repository's ``Containerfile`` on that base, with ``podman build
  --isolation=chroot`` (its RUN steps need no cgroups, which nested containers and many CI
  machines cannot give ``podman run``). Podman's layer cache makes a rebuild of unchanged
  sources take seconds.
- Running it: ``podman create`` and ``podman mount`` give the image's root filesystem, where
  the image's entrypoint runs under ``chroot`` as the image's user, with the image's
  environment, on this host's network.

Podman, mmdebstrap and chroot need root: as another user every such command goes through
``sudo -n`` (CI machines allow it; ``scripts/install-system-deps`` installs the packages).
Where podman's overlay storage does not work (root on an overlay file system, as inside
another container), the vfs driver is used with a store of its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness.processes import spawn
from proxy.local_kafka import cache_root

ROOT = Path(__file__).resolve().parents[1]
SUITE = "bookworm"  # Python 3.11, the oldest the proxy runs on
MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "python3-dev", "gcc", "libc6-dev", "libxxhash-dev", "ca-certificates")
BASE_REPOSITORY = "localhost/keyrange-proxy-base"
DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
VFS_ROOT = "/var/lib/containers/keyrange-proxy-vfs"
# where the build sees the CA bundle of the host's pip, when there is one
BUILD_CA = "/run/keyrange-build/pip-ca.pem"


class ImageError(RuntimeError):
    """A step of making or running the image failed; the message says which and why."""


def _privileged() -> list[str]:
    """The prefix that runs a command as root: none for root, else ``sudo -n``."""
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo") is None:
        raise ImageError("podman, mmdebstrap and chroot need root here: run as root or with sudo")
    return ["sudo", "-n"]


def missing_tools() -> list[str]:
    """The commands this module needs that are not installed (scripts/install-system-deps
    installs them), by the Debian package that has them."""
    wanted = {"podman": "podman", "mmdebstrap": "mmdebstrap", "chroot": "coreutils", "newuidmap": "uidmap"}
    return [package for command, package in wanted.items() if shutil.which(command) is None]


@dataclass(frozen=True)
class Podman:
    """``podman`` with the options this host needs (root, storage driver)."""

    prefix: tuple[str, ...]
    options: tuple[str, ...]

    @classmethod
    def detect(cls) -> Podman:
        prefix = tuple(_privileged())
        plain = cls(prefix, ())
        info = plain.run("info", "--format", "{{.Store.GraphDriverName}}", check=False)
        if info.returncode == 0:
            return plain
        if "overlay" not in info.stderr:
            raise ImageError(f"podman info failed: {info.stderr.strip()[-2000:]}")
        vfs = cls(prefix, ("--storage-driver=vfs", f"--root={VFS_ROOT}"))
        vfs.run("info")
        return vfs

    def command(self, *args: str) -> list[str]:
        return [*self.prefix, "podman", *self.options, *args]

    def run(self, *args: str, check: bool = True, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
        done = subprocess.run(self.command(*args), capture_output=True, text=True, timeout=timeout, **kwargs)
        if check and done.returncode != 0:
            raise ImageError(f"podman {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-3000:]}")
        return done

    def exists(self, image: str) -> bool:
        return self.run("image", "exists", image, check=False).returncode == 0

    def dangling(self) -> set[str]:
        """The images with neither a tag nor a child."""
        return set(self.run("images", "--all", "--quiet", "--no-trunc", "--filter", "dangling=true").stdout.split())


def base_tag() -> str:
    """The base's tag: names the suite and hashes everything that goes into it."""
    recipe = json.dumps([SUITE, MIRROR, sorted(BASE_PACKAGES)]).encode()
    return f"{BASE_REPOSITORY}:{SUITE}-{hashlib.sha256(recipe).hexdigest()[:12]}"


@contextmanager
def _locked(name: str) -> Iterator[None]:
    """One build at a time on this machine (two test runs share podman's store)."""
    import fcntl

    path = cache_root() / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_base(podman: Podman, log_path: Path) -> str:
    """The base image's tag, made with mmdebstrap and imported unless podman has it."""
    tag = base_tag()
    with _locked("image-base"):
        if podman.exists(tag):
            return tag
        keyring = [f"--keyring={DEBIAN_KEYRING}"] if DEBIAN_KEYRING.exists() else []
        debootstrap = [*_privileged(), "mmdebstrap", "--variant=apt", f"--include={','.join(BASE_PACKAGES)}",
                       *keyring, SUITE, "-", MIRROR]
        with open(log_path, "ab") as log:
            maker = subprocess.Popen(debootstrap, stdout=subprocess.PIPE, stderr=log)
            assert maker.stdout is not None
            try:
                imported = subprocess.run(podman.command("import", "-", tag), stdin=maker.stdout,
                                          capture_output=True, text=True, timeout=900)
            finally:
                maker.stdout.close()
                maker_code = maker.wait(timeout=900)
        if maker_code != 0 or imported.returncode != 0:
            podman.run("rmi", tag, check=False)
            raise ImageError(f"making the base {tag} failed: mmdebstrap exited {maker_code} (log: {log_path}), "
                             f"podman import {imported.returncode}: {imported.stderr.strip()[-2000:]}")
        return tag


def host_pip_ca() -> str | None:
    """The CA bundle the host's pip is told to trust (PIP_CERT, or pip's ``cert`` setting),
    if any: a build behind a proxy that re-signs TLS needs it to reach the package index."""
    configured = os.environ.get("PIP_CERT")
    if not configured:
        import sys

        done = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.cert"],
                              capture_output=True, text=True, timeout=60)
        configured = done.stdout.strip() if done.returncode == 0 else ""
    return configured if configured and Path(configured).is_file() else None


def build_image(podman: Podman, base: str, tag: str, log_path: Path) -> None:
    """``podman build`` of the Containerfile on ``base`` as ``tag``, its build stage tagged
    ``tag-build`` (so the layers it was built from are the cache of the next build). The
    images the two tags leave behind, now with neither a tag nor a child, are removed, so
    rebuilds do not fill the disk."""
    dangling_before = podman.dangling()
    options = ["--isolation=chroot", "--layers", f"--build-arg=BASE={base}"]
    ca = host_pip_ca()
    if ca:
        options += [f"--volume={ca}:{BUILD_CA}:ro", f"--build-arg=PIP_CERT={BUILD_CA}"]
    with _locked("image-build"), open(log_path, "ab") as log:
        for stage in (["--target=build", f"--tag={tag}-build"], [f"--tag={tag}"]):
            done = subprocess.run(podman.command("build", *options, *stage, "--file", str(ROOT / "Containerfile"),
                                                 str(ROOT)), stdout=log, stderr=subprocess.STDOUT, timeout=1800)
            if done.returncode != 0:
                tail = log_path.read_text(errors="replace")[-4000:]
                raise ImageError(f"podman build failed ({done.returncode}); log {log_path}:\n{tail}")
    left = podman.dangling() - dangling_before
    if left:
        podman.run("rmi", *sorted(left), check=False)


@dataclass(frozen=True)
class ImageConfig:
    """What the image says about running it."""

    user: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    env: dict[str, str]
    workdir: str
    exposed: tuple[str, ...]

    @classmethod
    def of(cls, podman: Podman, image: str) -> ImageConfig:
        config = json.loads(podman.run("image", "inspect", "--format", "{{json .Config}}", image).stdout)
        env = dict(item.partition("=")[::2] for item in config.get("Env") or [])
        return cls(config.get("User") or "0", tuple(config.get("Entrypoint") or ()), tuple(config.get("Cmd") or ()),
                   env, config.get("WorkingDir") or "/", tuple(sorted(config.get("ExposedPorts") or {})))


@dataclass(frozen=True)
class RootFs:
    """A container's root filesystem, mounted on this host. Only root may look into
    podman's store, so as another user each access goes through ``sudo -n``."""

    path: Path

    def _root(self, *command: str, input: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([*_privileged(), *command], input=input, capture_output=True, text=True, timeout=60)

    def exists(self, pattern: str) -> bool:
        """Whether something inside matches ``pattern`` (a shell glob, relative to the root)."""
        if os.geteuid() == 0:
            return any(self.path.glob(pattern))
        return self._root("sh", "-c", 'for f in "$0"/$1; do [ -e "$f" ] && exit 0; done; exit 1',
                          str(self.path), pattern).returncode == 0

    def write_text(self, relative: str, text: str) -> None:
        if os.geteuid() == 0:
            (self.path / relative).write_text(text)
            return
        done = self._root("tee", str(self.path / relative), input=text)
        if done.returncode != 0:
            raise ImageError(f"cannot write {relative} in the image's root filesystem: {done.stderr.strip()}")


@contextmanager
def mounted(podman: Podman, image: str, name: str) -> Iterator[RootFs]:
    """The root filesystem of a new container of ``image`` (created, not started), writable;
    unmounted and removed afterwards."""
    podman.run("rm", "--force", name, check=False)  # left over by a run that was killed
    podman.run("create", "--name", name, image)
    try:
        yield RootFs(Path(podman.run("mount", name).stdout.strip()))
    finally:
        podman.run("umount", name, check=False)
        podman.run("rm", "--force", name, check=False)


def leaf_uids(pid: int) -> dict[int, int]:
    """The real uid of each process at the bottom of the tree under ``pid`` (``pid`` itself
    when it has no children), by pid: the command that was started, even through sudo."""
    children: dict[int, list[int]] = {}
    uids: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        uids[int(entry.name)] = int(fields["Uid"].split()[0])
        children.setdefault(int(fields["PPid"]), []).append(int(entry.name))
    found, stack = {}, [pid]
    while stack:
        each = stack.pop()
        if each in children:
            stack += children[each]
        elif each in uids:
            found[each] = uids[each]
    return found


def start_in_rootfs(rootfs: RootFs, config: ImageConfig, args: Sequence[str], log_path: Path,
                    env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """The image's entrypoint with ``args`` (in place of its command), chrooted into
    ``rootfs`` as the image's user, in its working directory and with only its environment
    and ``env``, as a container would run it; output to ``log_path``. Each step execs the
    next, so the process is the proxy itself and signals reach it; it dies with this one."""
    if not config.entrypoint:
        raise ImageError("the image has no entrypoint")
    user = config.user if ":" in config.user else f"{config.user}:{config.user}"
    environment = [f"{name}={value}" for name, value in {**config.env, **(env or {})}.items()]
    command = [*_privileged(), shutil.which("env") or "/usr/bin/env", "-i", *environment,
               shutil.which("chroot") or "/usr/sbin/chroot", f"--userspec={user}", str(rootfs.path),
               "/bin/sh", "-c", 'cd "$0" && exec "$@"', config.workdir, *config.entrypoint, *args]
    with open(log_path, "ab") as log:
        return spawn(command, stdout=log, stderr=subprocess.STDOUT)
