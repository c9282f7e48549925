"""The container images, as far as this machine can check them without a Docker engine.

The Dockerfiles are checked structurally (pinned bases, non-root user, no compiler, health check);
the image's install step (docker/install.sh) runs for real in a clean virtual environment from the
files the Dockerfile copies, and the installed exporter serves; the pinned dependencies must resolve
to wheels for the image's Python on amd64 and arm64. The pip steps need PyPI: without it they skip,
or fail under CI=true.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from conftest import REPO, free_port, missing_dependency, wait_ready
from helm_support import render
from smlens.settings import DEFAULT_PORT
from smlens.sources.dcgm.bindings import BINDING_DIRS

DOCKER = REPO / "docker"
IMAGE_PYTHON = "3.12"  # the Python of docker/Dockerfile's base image
PINNED = re.compile(r"^[\w./-]+:[\w.-]*\d[\w.-]*@sha256:[0-9a-f]{64}$")  # a versioned tag and a digest
COMPILERS = re.compile(r"\b(gcc|g\+\+|clang|build-essential|make|cmake|python3-dev|libc6-dev)\b")


@dataclass
class Instruction:
    keyword: str
    arguments: str
    stage: int  # index of the FROM it belongs to; -1 before the first FROM


def instructions(dockerfile: Path) -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, f"{dockerfile.name} ends inside a continuation"
    parsed: list[Instruction] = []
    stage = -1
    for line in logical:
        keyword, _, arguments = line.partition(" ")
        if keyword.upper() == "FROM":
            stage += 1
        parsed.append(Instruction(keyword.upper(), arguments.strip(), stage))
    return parsed


def arg_defaults(parsed: list[Instruction]) -> dict[str, str]:
    return {
        name: value
        for i in parsed
        if i.keyword == "ARG" and "=" in i.arguments
        for name, value in [i.arguments.split("=", 1)]
    }


def final_stage(parsed: list[Instruction]) -> list[Instruction]:
    last = max(i.stage for i in parsed)
    return [i for i in parsed if i.stage == last]


def base_images(parsed: list[Instruction]) -> list[str]:
    defaults = arg_defaults(parsed)
    images = []
    for i in parsed:
        if i.keyword == "FROM":
            image = i.arguments.split()[0]
            images.append(re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], image))
    return images


def last_user(dockerfile: Path) -> str:
    """The user the image runs as; a Dockerfile built FROM the smlens image inherits its USER."""
    parsed = instructions(dockerfile)
    users = [i.arguments for i in final_stage(parsed) if i.keyword == "USER"]
    if users:
        return users[-1]
    assert base_images(parsed)[-1].startswith("smlens:"), f"{dockerfile.name} sets no USER"
    return last_user(DOCKER / "Dockerfile")


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.dcgm"])
def test_dockerfile_final_stage_is_non_root_without_compilers(name: str) -> None:
    uid = last_user(DOCKER / name).split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "the image must run as a numeric, non-root uid"
    # The chart's strict non-root mode runs the image's own user (its default runs uid 0, with no
    # capability, for the kubelet's socket).
    strict = render({"podResources": {"enabled": False}})
    assert uid == str(strict.container["securityContext"]["runAsUser"])
    for instruction in final_stage(instructions(DOCKER / name)):
        if instruction.keyword == "RUN":
            assert not COMPILERS.search(instruction.arguments), instruction.arguments
            assert "apt-get install" not in instruction.arguments


def test_dockerfile_bases_are_pinned_by_version_and_digest() -> None:
    exporter = base_images(instructions(DOCKER / "Dockerfile"))
    dcgm_parsed = instructions(DOCKER / "Dockerfile.dcgm")
    dcgm = base_images(dcgm_parsed)
    for image in exporter + dcgm[:-1]:
        assert PINNED.match(image), f"{image} is not pinned to a version and a digest"
    # The DCGM variant builds on the exporter image, and takes DCGM from the same Debian base.
    assert dcgm[-1] == "smlens:0.1.0" == f"smlens:{render().container['image'].split(':')[-1]}"
    assert set(dcgm[:-1]) == set(exporter)


def test_exporter_image_runs_the_exporter_as_the_chart_expects() -> None:
    parsed = instructions(DOCKER / "Dockerfile")
    final = final_stage(parsed)
    by_keyword = {i.keyword: i.arguments for i in final}
    assert by_keyword["ENTRYPOINT"] == '["smlens"]' and by_keyword["CMD"] == '["serve"]'
    assert by_keyword["EXPOSE"] == str(DEFAULT_PORT) == str(render().container["ports"][0]["containerPort"])
    assert f"127.0.0.1:{DEFAULT_PORT}/-/healthy" in by_keyword["HEALTHCHECK"]
    env = " ".join(i.arguments for i in final if i.keyword == "ENV")
    assert "NVIDIA_DRIVER_CAPABILITIES=utility" in env and "NVIDIA_VISIBLE_DEVICES=all" in env
    runs = [i.arguments for i in parsed if i.keyword == "RUN"]
    # The one install step; SMLENS_EXTRAS (empty unless --build-arg SMLENS_EXTRAS=profile) adds extras.
    assert runs == ['sh docker/install.sh /src /opt/smlens "$SMLENS_EXTRAS"']
    assert 'SMLENS_EXTRAS=""' in [i.arguments for i in parsed if i.keyword == "ARG"]


def test_dcgm_image_verifies_what_it_downloads_and_puts_bindings_where_smlens_looks() -> None:
    text = (DOCKER / "Dockerfile.dcgm").read_text()
    parsed = instructions(DOCKER / "Dockerfile.dcgm")
    (install,) = [i.arguments for i in parsed if i.keyword == "RUN" and "apt-get" in i.arguments]
    assert "--no-install-recommends" in install
    assert "datacenter-gpu-manager-4-core=${DCGM_VERSION}" in install
    assert re.search(r"gpg --show-keys .*grep -q .*\$\{CUDA_KEY_FINGERPRINT\}", install)
    assert re.fullmatch(r"[0-9A-F]{40}", arg_defaults(parsed)["CUDA_KEY_FINGERPRINT"])
    assert f"COPY --from=dcgm /dcgm/bindings {BINDING_DIRS[0]}" in text
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in text
    (check,) = [i.arguments for i in final_stage(parsed) if i.keyword == "RUN"]
    assert "libdcgm.so.4" in check and "dcgm_agent" in check


def build_context(tmp_path: Path) -> Path:
    """The build stage's files, copied as docker/Dockerfile COPYs them from the repository root."""
    parsed = instructions(DOCKER / "Dockerfile")
    context = tmp_path / "context"
    for instruction in parsed:
        if instruction.keyword != "COPY" or instruction.arguments.startswith("--from"):
            continue
        *sources, _destination = shlex.split(instruction.arguments)
        for source in sources:
            origin = REPO / source
            assert origin.exists(), f"docker/Dockerfile copies {source}, which does not exist"
            ignored = (DOCKER / "Dockerfile.dockerignore").read_text()
            assert f"!{source.rstrip('/')}" in ignored, f"{source} is excluded from the build context"
            target = context / source
            target.parent.mkdir(parents=True, exist_ok=True)
            if origin.is_dir():
                shutil.copytree(origin, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(origin, target)
    return context


def require_pypi() -> None:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
    except OSError as exc:
        missing_dependency(f"PyPI is not reachable ({exc}); the image's pip steps cannot be tried")


def pins() -> dict[str, str]:
    pinned = {}
    for line in (DOCKER / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pinned[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pinned


def test_install_step_in_a_clean_venv_gives_a_working_exporter(tmp_path: Path) -> None:
    require_pypi()
    context = build_context(tmp_path)
    venv = tmp_path / "venv"
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    result = subprocess.run(
        ["sh", str(DOCKER / "install.sh"), str(context), str(venv)],
        capture_output=True,
        text=True,
        timeout=600,
        env=clean_env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not (venv / "bin" / "pip").exists(), "install.sh must leave no pip in the image's venv"

    listed = subprocess.run(
        [str(venv / "bin" / "python"), "-c", LIST_DISTRIBUTIONS], capture_output=True, text=True, check=True
    ).stdout.split()
    installed = dict(line.split("==") for line in listed)
    assert installed.pop("smlens") == render().container["image"].split(":")[-1]
    # Exactly the pins: no pip, setuptools or anything else the runtime does not need.
    assert installed == pins(), "docker/constraints.txt must pin exactly what the image installs"

    port = free_port()
    exporter = subprocess.Popen(
        [str(venv / "bin" / "smlens"), "serve", "--backend", "sim", "--listen", f"127.0.0.1:{port}"],
        cwd=tmp_path,
        env=clean_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}/-/healthy", exporter)
        wait_ready(f"http://127.0.0.1:{port}/-/ready", exporter)  # after the first complete interval
        assert "gpu_sm_active_ratio{" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        exporter.terminate()
        exporter.wait(timeout=10)


LIST_DISTRIBUTIONS = (
    "import importlib.metadata as m, re\n"
    "for d in m.distributions():\n"
    "    print(re.sub(r'[-_.]+', '-', d.metadata['Name']).lower() + '==' + d.version)\n"
)


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_pinned_dependencies_have_wheels_for_the_image(arch: str, tmp_path: Path) -> None:
    # Debian 12 has glibc 2.36: wheels for any manylinux up to 2.36 install there without a compiler,
    # on amd64 and on arm64 (GH200 nodes).
    platforms = [f"--platform=manylinux_2_{minor}_{arch}" for minor in range(17, 37)]
    require_pypi()
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("\n".join(f"{name}=={version}" for name, version in pins().items()) + "\n")
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps"),
            *("--only-binary=:all:", *platforms, f"--python-version={IMAGE_PYTHON}"),
            *("--implementation=cp", f"--target={tmp_path / 'target'}", "--requirement", str(requirements)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (would,) = [line for line in result.stdout.splitlines() if line.startswith("Would install")]
    assert len(would.split()) - 2 == len(pins())
