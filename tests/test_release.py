"""What a release ships, built here as docs/release.md builds it: the sdist and wheel (python -m build,
twine check) and the Helm chart archive (helm package), all carrying the one version: smlens.__version__."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import helm_python
import pytest
import yaml

from conftest import REPO
from helm_support import CHART_DIR, helm_sync
from smlens import __version__ as VERSION

# What a fresh checkout holds; anything else in the working tree (caches, builds) stays out of the copy.
UNTRACKED = shutil.ignore_patterns(
    ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", ".venv"
)


@pytest.mark.parametrize(
    ("pep440", "semver"),
    [("0.1.0", "0.1.0"), ("1.12.3", "1.12.3"), ("0.2.0rc1", "0.2.0-rc.1"), ("2.0.0a3", "2.0.0-alpha.3")],
)
def test_chart_version_is_the_semver_form_of_the_package_version(pep440: str, semver: str) -> None:
    assert helm_sync.chart_version(pep440) == semver


@pytest.mark.parametrize("version", ["0.1", "0.1.0.post1", "0.1.0.dev2", "0.1.0+local"])
def test_versions_helm_cannot_carry_get_one_sentence(version: str) -> None:
    sentence = f"version '{version}' (smlens.__version__) is not a release version"
    with pytest.raises(ValueError, match=re.escape(sentence)):
        helm_sync.chart_version(version)


def test_helm_sync_writes_the_version_into_chart_yaml_and_nothing_else() -> None:
    current = (CHART_DIR / "Chart.yaml").read_text()
    assert helm_sync.expected_files()[CHART_DIR / "Chart.yaml"] == current  # in step now
    bumped = helm_sync.chart_yaml_text(current, "0.3.0-rc.2")
    chart, before = yaml.safe_load(bumped), yaml.safe_load(current)
    assert chart["version"] == "0.3.0-rc.2" and chart["appVersion"] == "0.3.0-rc.2"
    assert {k: v for k, v in chart.items() if "ersion" not in k} == {
        k: v for k, v in before.items() if "ersion" not in k
    }
    assert before["version"] == before["appVersion"] == helm_sync.chart_version(VERSION)


def test_chart_packages_with_the_package_version(tmp_path: Path) -> None:
    archive = Path(helm_python.package(CHART_DIR, destination=tmp_path))
    assert archive.name == f"smlens-{helm_sync.chart_version(VERSION)}.tgz"
    metadata = helm_python.Chart.load_archive(archive.read_bytes()).metadata
    assert metadata["version"] == metadata["appVersion"] == helm_sync.chart_version(VERSION)
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {"smlens/files/rules/smlens-alerts.rules.yaml", "smlens/values.schema.json"} <= names
    assert not any(name.startswith("smlens/ci/") for name in names)  # .helmignore keeps CI values out


def test_sdist_and_wheel_build_pass_twine_check_and_install(tmp_path: Path) -> None:
    source = tmp_path / "checkout"
    shutil.copytree(REPO, source, ignore=UNTRACKED)
    dist = tmp_path / "dist"
    # --no-isolation: the build backend comes from this environment, so the test needs no index.
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    sdist, wheel = dist / f"smlens-{VERSION}.tar.gz", dist / f"smlens-{VERSION}-py3-none-any.whl"
    assert set(dist.iterdir()) == {sdist, wheel}
    twine = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert twine.returncode == 0, twine.stdout + twine.stderr
    assert twine.stdout.count("PASSED") == 2
    shipped = {"smlens/verdicts/thresholds.yaml", "smlens/py.typed", "smlens/web/status/static/status.js"}
    with zipfile.ZipFile(wheel) as archive:
        assert shipped <= set(archive.namelist())
    with tarfile.open(sdist) as archive:
        assert {f"smlens-{VERSION}/exporter/{name}" for name in shipped} <= set(archive.getnames())

    # The wheel installs and runs; its dependencies come from this environment (no index here): a .pth
    # file puts this environment's site-packages after the new venv's own. (system_site_packages alone
    # would reach only the base interpreter's, which lacks them when this runs from a venv, as
    # scripts/test-all.sh runs it.)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=True)
    python = env_dir / "bin" / "python"
    (site_packages,) = env_dir.glob("lib/python3*/site-packages")
    ours = dict.fromkeys(sysconfig.get_path(name) for name in ("purelib", "platlib"))
    (site_packages / "outer.pth").write_text("".join(f"{path}\n" for path in ours))
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        env=clean,
        timeout=300,
    )
    where = subprocess.run(
        [str(python), "-c", "import smlens; print(smlens.__file__, smlens.__version__)"],
        capture_output=True,
        text=True,
        env=clean,
        check=True,
    )
    assert where.stdout.startswith(str(env_dir)) and where.stdout.split()[-1] == VERSION
    smlens = str(env_dir / "bin" / "smlens")
    check = subprocess.run(
        [smlens, "check", "--backend", "sim", "--sim-gpus", "2", "--duration", "0.5"],
        capture_output=True,
        text=True,
        env=clean,
        timeout=60,
    )
    assert check.returncode == 3 and "busy but SMs mostly idle" in check.stdout  # GPU 1 of the sim is hollow
