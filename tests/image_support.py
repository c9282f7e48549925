"""docker/Dockerfile built and run without a Docker engine.

buildah builds it (chroot isolation, vfs storage, everything under one directory) on a Debian base made by
debootstrap and passed as PYTHON_IMAGE; podman runs it with runc, which, unlike crun, accepts hybrid cgroup
hierarchies. The base rootfs is cached as a tarball outside the repository, keyed by a hash of its inputs.
"""

from __future__ import annotations

import hashlib
import os
import re
import resource
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

BASE_IMAGE = "localhost/base:bookworm"
# Debian 12, as python:3.12-slim-bookworm; pip for install.sh, python3-venv for `python3 -m venv`.
DEBOOTSTRAP = ("--variant=minbase", "--include=python3,python3-venv,python3-pip,ca-certificates", "bookworm")
# What Debian's slim images leave out, plus apt's downloads and indexes: nothing in the image reads them.
PRUNED = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale")
EXTRA_CAS = Path("/usr/local/share/ca-certificates")  # where Debian keeps the CAs trusted beyond its defaults
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# pip settings that decide how it reaches an index (proxies pass to the build through buildah's environment)
PIP_NETWORK_KEYS = {"index-url", "extra-index-url", "trusted-host", "proxy", "timeout", "default-timeout"}
CONTAINER_LIMIT = 4096  # open files and processes: the exporter needs a few dozen of each
PIP_SETTING = re.compile(r"^[^.]*\.([\w-]+)='(.*)'$")  # a `pip config list` line: section.key='value'


class ImageError(Exception):
    """A step failed; the message says which, with its command and the tail of its output."""


def run(command: list[str], timeout: float) -> str:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise ImageError(f"`{shlex.join(command)}` did not finish within {timeout:.0f} s") from exc
    if result.returncode != 0:
        output = (result.stdout + result.stderr)[-4000:]
        raise ImageError(f"`{shlex.join(command)}` exited with {result.returncode}:\n{output}")
    return result.stdout


def cache_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "smlens" / "image-base"
    return Path(os.environ.get("SMLENS_IMAGE_CACHE") or default)


def extra_cas() -> dict[str, bytes]:
    return {str(p.relative_to(EXTRA_CAS)): p.read_bytes() for p in sorted(EXTRA_CAS.rglob("*.crt"))}


def pip_network_config() -> str:
    """This machine's pip settings that decide how pip reaches an index, for the base's /etc/pip.conf.

    Local paths and file:// indexes are left out (they do not exist in the base); `cert` points at the
    base's own bundle, which trusts this machine's extra CAs.
    """
    listed = run(["python3", "-m", "pip", "config", "list"], timeout=60)
    settings = {"cert": CA_BUNDLE}
    for line in listed.splitlines():
        match = PIP_SETTING.match(line)
        if match and match.group(1) in PIP_NETWORK_KEYS:
            values = [v for v in match.group(2).split() if not v.startswith(("file:", "/"))]
            if values:
                settings[match.group(1)] = " ".join(values)
    return "[global]\n" + "".join(f"{key} = {value}\n" for key, value in sorted(settings.items()))


def base_tarball(timeout: float = 900) -> Path:
    """The base rootfs as a tar file, from the cache when its inputs are unchanged."""
    pip_conf = pip_network_config()
    cas = extra_cas()
    debootstrap_version = run(["dpkg-query", "-W", "-f=${Version}", "debootstrap"], timeout=30)
    key = hashlib.sha256()
    for part in (debootstrap_version, *DEBOOTSTRAP, *PRUNED, pip_conf, *cas):
        key.update(part.encode() + b"\0")
    for data in (*cas.values(), Path(__file__).read_bytes()):  # this recipe is an input too
        key.update(data)
    tarball = cache_dir() / f"bookworm-{key.hexdigest()[:16]}.tar"
    if tarball.exists():
        return tarball
    tarball.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=tarball.parent))
    rootfs = work / "rootfs"
    try:
        run(["debootstrap", *DEBOOTSTRAP, str(rootfs)], timeout=timeout)
        unmount_below(rootfs)
        for name, certificate in cas.items():
            target = rootfs / "usr/local/share/ca-certificates" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(certificate)
        run(["chroot", str(rootfs), "update-ca-certificates"], timeout=120)
        (rootfs / "etc/pip.conf").write_text(pip_conf)
        for pruned in PRUNED:
            for entry in (rootfs / pruned).glob("*"):
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        partial = work / "rootfs.tar"
        run(["tar", "-C", str(rootfs), "--one-file-system", "--numeric-owner", "-cf", str(partial), "."], 300)
        os.replace(partial, tarball)  # atomic: concurrent runs never see half a tarball
    finally:
        unmount_below(rootfs)  # raises rather than let rmtree reach into a mounted /proc or /sys
        shutil.rmtree(work)
    return tarball


def unmount_below(path: Path) -> None:
    """debootstrap mounts /proc and /sys in its target, and its own unmount can fail (seen here)."""
    prefix = f"{path.resolve()}/"
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for mountpoint in sorted((m for m in mounts if m.startswith(prefix)), reverse=True):
        run(["umount", "--lazy", mountpoint], timeout=60)


def ulimits() -> list[str]:
    """Limits for the container that any process may set: podman's defaults for root (over a million open
    files and processes) exceed the hard limits of some machines, and raising those needs a capability
    (CAP_SYS_RESOURCE) that sandboxes withhold, so runc then fails."""
    options = []
    for name, limit in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        _soft, hard = resource.getrlimit(limit)
        value = CONTAINER_LIMIT if hard == resource.RLIM_INFINITY else min(CONTAINER_LIMIT, hard)
        options += ["--ulimit", f"{name}={value}:{value}"]
    return options


@dataclass(frozen=True)
class Containers:
    """buildah and podman sharing one private storage directory."""

    root: Path

    def storage(self) -> list[str]:
        return ["--root", f"{self.root}/storage", "--runroot", f"{self.root}/run", "--storage-driver", "vfs"]

    def buildah(self, *args: str, timeout: float = 300) -> str:
        return run(["buildah", *self.storage(), *args], timeout)

    def podman(self, *args: str, timeout: float = 120) -> str:
        runtime = ["--runtime", "runc", "--cgroup-manager", "cgroupfs", "--events-backend", "file"]
        return run(["podman", *self.storage(), *runtime, "--tmpdir", f"{self.root}/libpod", *args], timeout)

    def import_base(self, tarball: Path) -> None:
        container = self.buildah("from", "scratch").strip()
        self.buildah("add", container, str(tarball), "/")
        self.buildah("commit", "--rm", container, BASE_IMAGE)

    def build(self, dockerfile: Path, context: Path, tag: str, timeout: float = 900) -> None:
        self.buildah(
            *("bud", "--isolation", "chroot", "--format", "docker", "--pull=never"),
            *("--build-arg", f"PYTHON_IMAGE={BASE_IMAGE}", "-f", str(dockerfile), "-t", tag, str(context)),
            timeout=timeout,
        )

    def image_size(self, image: str) -> int:
        return int(self.podman("image", "inspect", "--format", "{{.Size}}", image))
