"""docker/Dockerfile built and run for real, without a Docker engine (tests/image_support.py says how).

The image serves the sim node as its own non-root USER on a read-only root filesystem, writes nothing
outside /tmp, passes its own HEALTHCHECK, and carries no pip or setuptools. Needs root, buildah, podman,
runc and debootstrap (the README's test command installs them), a Debian mirror and PyPI. Locally:
``CI=true python3 -m pytest -p no:cacheprovider tests/test_image.py``; the base rootfs is cached under
``~/.cache/smlens/image-base`` (or ``$SMLENS_IMAGE_CACHE``), so only the first run pays for debootstrap.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import httpx
import pytest

from conftest import IN_CI, REPO, free_port, require_tool, wait_ready
from image_support import Containers, ImageError, base_tarball, ulimits, unmount_below
from test_docker import build_context

IMAGE = "localhost/smlens:test"
GOLDEN = REPO / "tests" / "golden" / "sim_8gpu.prom"  # every family the sim node exposes
TYPE_LINE = re.compile(r"^# TYPE (\S+) ", re.MULTILINE)
INSTALLER = re.compile(r"(pip|setuptools|wheel|easy_install)([-_.\d]|$)")  # pip3, pip-23.0.dist-info, ...
# Bytes the Dockerfile may add to its base (docs/deploy.md): room for the venv, not for an installer left
# behind in it.
ADDED_LAYER_BUDGET = 55_000_000


@pytest.fixture(scope="module")
def containers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containers]:
    """docker/Dockerfile built on the debootstrap base; fails with the build's reason when it fails."""
    for tool in ("buildah", "podman", "runc", "debootstrap"):
        require_tool(tool)
    if os.geteuid() != 0:
        cannot_run("building the base rootfs (debootstrap) and the image needs root")
    root = tmp_path_factory.mktemp("containers")
    engine = Containers(root)
    try:
        engine.buildah("info", timeout=60)
    except ImageError as exc:
        cannot_run(str(exc))
    try:
        try:
            engine.import_base(base_tarball())
            engine.build(REPO / "docker" / "Dockerfile", build_context(root), IMAGE)
        except ImageError as exc:
            pytest.fail(f"docker/Dockerfile was not built: {exc}")
        yield engine
    finally:  # vfs storage holds a full copy of the image per container: leave none behind
        with contextlib.suppress(ImageError):
            engine.podman("rm", "--all", "--force")
        unmount_below(root)
        shutil.rmtree(root, ignore_errors=True)


def cannot_run(reason: str) -> NoReturn:
    message = f"buildah cannot run here: {reason}"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def start(engine: Containers, *options: str, args: tuple[str, ...]) -> str:
    return engine.podman("run", "--detach", "--tmpfs", "/tmp", *ulimits(), *options, IMAGE, *args).strip()


def test_image_serves_the_sim_node_as_its_user_on_a_read_only_root(containers: Containers) -> None:
    port = free_port()
    container = start(
        containers,
        *("--read-only", "--read-only-tmpfs=false", "--network", "host", "--no-healthcheck"),
        args=("serve", "--backend", "sim", "--listen", f"127.0.0.1:{port}"),
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base + "/-/ready", timeout=60)  # generous: the suite shares 2 cores
    except TimeoutError as exc:
        pytest.fail(f"{exc}; container log:\n{containers.podman('logs', container)[-3000:]}")
    served = set(TYPE_LINE.findall(httpx.get(base + "/metrics", timeout=5).text))
    contract = set(TYPE_LINE.findall(GOLDEN.read_text()))
    assert len(contract) > 30, "the golden exposition lost its families"
    missing = contract - served
    assert not missing, f"the image's /metrics lacks {sorted(missing)}"

    user = containers.podman("image", "inspect", "--format", "{{.Config.User}}", IMAGE).strip()
    uid, gid = user.split(":")
    pid = containers.podman("inspect", "--format", "{{.State.Pid}}", container).strip()
    status = Path(f"/proc/{pid}/status").read_text()
    assert "smlens" in Path(f"/proc/{pid}/cmdline").read_text()
    assert re.search(rf"^Uid:\s+{uid}\s+{uid}\s+{uid}\s+{uid}$", status, re.MULTILINE), status
    assert re.search(rf"^Gid:\s+{gid}\s+{gid}\s+{gid}\s+{gid}$", status, re.MULTILINE), status
    assert int(uid) != 0 and int(gid) != 0


def test_image_writes_nothing_outside_tmp_and_passes_its_healthcheck(containers: Containers) -> None:
    # A writable root this time, so a write anywhere shows in `podman diff` instead of failing (maybe
    # silently). podman itself touches /etc for any container: a container that runs only /bin/true
    # shows what it does. Own network namespace: the HEALTHCHECK probes the default port, 10132.
    isolated = ("--network", "none", "--passwd=false")
    reference = start(containers, *isolated, "--entrypoint", "/bin/true", args=())
    containers.podman("wait", reference)
    exporter = start(containers, *isolated, args=("serve", "--backend", "sim", "--listen", "127.0.0.1:10132"))
    deadline = time.monotonic() + 60
    while True:
        try:
            containers.podman("healthcheck", "run", exporter)
            break
        except ImageError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    scrape = (
        "import time, urllib.request as u\n"
        "for _ in range(100):\n"  # ready: after the first complete sampling interval
        "    try: u.urlopen('http://127.0.0.1:10132/-/ready'); break\n"
        "    except OSError: time.sleep(0.2)\n"
        "print(u.urlopen('http://127.0.0.1:10132/metrics').read().decode())\n"
    )
    assert "gpu_sm_active_ratio{" in containers.podman("exec", exporter, "python", "-c", scrape)
    time.sleep(2)  # a few more sampling intervals
    assert containers.podman("diff", exporter) == containers.podman("diff", reference)


def test_image_adds_only_the_exporter_without_pip(containers: Containers) -> None:
    base, image = containers.image_size("localhost/base:bookworm"), containers.image_size(IMAGE)
    assert image - base < ADDED_LAYER_BUDGET, f"the Dockerfile adds {image - base} bytes to its base"
    root = Path(containers.podman("image", "mount", IMAGE).strip())
    try:
        venv = root / "opt" / "smlens"
        listing = [p.name for p in [*venv.glob("bin/*"), *venv.glob("lib/python3*/site-packages/*")]]
    finally:
        containers.podman("image", "unmount", IMAGE)
    assert "smlens" in listing
    installers = [name for name in listing if INSTALLER.match(name)]
    assert not installers, f"the image keeps installers: {installers}"
