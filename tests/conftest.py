"""Shared test helpers: free ports, external tools, and a real exporter process on the sim backend."""

from __future__ import annotations

import importlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from fakes import dcgm_hostengine
from smlens.sources.dcgm.bindings import BINDING_DIRS

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() == "true"
DCGM_DOUBLE_DIR = REPO / "tests" / "fakes" / "fake_dcgm"
DCGM_BINDINGS_ENV = "SMLENS_DCGM_BINDINGS"
DCGM_BINDING_MODULES = ("dcgm_agent", "dcgm_structs", "dcgm_fields", "dcgmvalue")


# Under CI=true only tests that need NVIDIA's hardware or NVIDIA's own DCGM bindings (not on any package
# registry, never vendored) may skip; their reasons start with one of these tags. Any other skip, from a
# helper here or a plugin's importorskip, turns into a failure (pytest_runtest_makereport).
GPU_ONLY = "[GPU] "
DCGM_BINDINGS_ONLY = "[DCGM] "


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        if not reason.removeprefix("Skipped: ").startswith((GPU_ONLY, DCGM_BINDINGS_ONLY)):
            report.outcome = "failed"
            report.longrepr = f"skipped under CI=true, where only GPU- or DCGM-only tests may skip: {reason}"


def missing_dependency(message: str) -> None:
    """A test dependency is absent: fail under CI (the test command installs it), skip elsewhere."""
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def skip_without_nvidia_dcgm_bindings(what: str) -> None:
    """Skips, in CI too, when NVIDIA's DCGM bindings are absent: they come from a DCGM host or from
    scripts/fetch-dcgm-bindings.sh, never from the test command, which reaches no GitHub."""
    if not nvidia_dcgm_binding_dirs():
        pytest.skip(
            f"{DCGM_BINDINGS_ONLY}{DCGM_BINDINGS_ENV} is not set and no DCGM is installed: {what} "
            "(scripts/fetch-dcgm-bindings.sh fetches NVIDIA's bindings)"
        )


def require_tool(name: str) -> str:
    """Path of an external tool; fails under CI (the test command installs it), skips elsewhere."""
    path = shutil.which(name)
    if path is None:
        missing_dependency(f"{name} is not installed (the README's test command installs it)")
    assert path is not None
    return path


def require_module(name: str) -> ModuleType:
    """Import a test dependency; fails under CI (the test command installs it), skips elsewhere."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing_dependency(f"Python module {name} is not installed ({exc}); pip install -e '.[test]'")
        raise


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, process: subprocess.Popen[bytes] | None = None, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before {url} was ready")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout} s")


ExporterFactory = Callable[..., str]


@pytest.fixture
def start_exporter(tmp_path: Path) -> Iterator[ExporterFactory]:
    """Starts ``python -m smlens serve`` with extra args on a free loopback port; returns its base URL."""
    processes: list[subprocess.Popen[bytes]] = []

    def start(*args: str, env: dict[str, str] | None = None) -> str:
        port = free_port()
        log = open(tmp_path / f"exporter-{port}.log", "wb")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(
            [sys.executable, "-m", "smlens", "serve", "--listen", f"127.0.0.1:{port}", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO / "exporter"), **(env or {})},
        )
        processes.append(process)
        base = f"http://127.0.0.1:{port}"
        wait_ready(base + "/-/ready", process)
        return base

    yield start
    for process in processes:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "smlens", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO / "exporter"), **(env or {})},
    )


def import_dcgm_bindings(monkeypatch: pytest.MonkeyPatch, directory: Path) -> dict[str, ModuleType]:
    """Fresh imports of the binding modules in ``directory`` (undone after the test)."""
    monkeypatch.syspath_prepend(str(directory))
    for name in DCGM_BINDING_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    modules = {name: importlib.import_module(name) for name in DCGM_BINDING_MODULES}
    assert all(Path(m.__file__ or "").parent == directory for m in modules.values())
    return modules


def _dcgm_binding_sets() -> list[str]:
    """The double, then each directory of NVIDIA's bindings named in $SMLENS_DCGM_BINDINGS."""
    return ["double", *(f"nvidia:{d}" for d in nvidia_dcgm_binding_dirs())]


def nvidia_dcgm_binding_dirs() -> list[str]:
    """$SMLENS_DCGM_BINDINGS, else the bindings of a DCGM installed on this machine, if any."""
    named = [d for d in os.environ.get(DCGM_BINDINGS_ENV, "").split(os.pathsep) if d]
    return named or [d for d in BINDING_DIRS if (Path(d) / "dcgm_structs.py").is_file()]


def _binding_id(param: str) -> str:
    return "double" if param == "double" else "nvidia-" + Path(param[7:]).name


@pytest.fixture(params=_dcgm_binding_sets(), ids=_binding_id)
def fake_dcgm(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """DCGM's Python bindings over the stub libdcgm and fresh fake hostengines; yields
    ``fakes.dcgm_hostengine``. Runs each test with the double and with every copy of NVIDIA's own
    bindings named in $SMLENS_DCGM_BINDINGS (scripts/fetch-dcgm-bindings.sh fetches them)."""
    param: str = request.param
    directory = DCGM_DOUBLE_DIR if param == "double" else Path(param[7:])
    if param != "double" and not (directory / "dcgm_structs.py").is_file():
        pytest.fail(f"{DCGM_BINDINGS_ENV} names {directory}, which holds no dcgm_structs.py")
    structs = import_dcgm_bindings(monkeypatch, directory)["dcgm_structs"]
    if param != "double":  # stands where libdcgm.so.4 would be loaded
        monkeypatch.setattr(structs, "dcgmLib", dcgm_hostengine.LIBDCGM)
    registry = dcgm_hostengine.reset()
    yield dcgm_hostengine
    assert registry.crashes == [], "the stub libdcgm failed inside a call"
    dcgm_hostengine.reset()


CUPTI_DOUBLE_DIR = Path(__file__).parent / "fakes" / "fake_cupti"


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _forget_cupti() -> None:
    for name in [m for m in sys.modules if m == "cupti" or m.startswith("cupti.")]:
        del sys.modules[name]


@pytest.fixture
def cupti(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The cupti-python 13.4.0 double (tests/fakes/fake_cupti), fresh; yields its ``cupti.cupti``."""
    _forget_cupti()
    monkeypatch.syspath_prepend(str(CUPTI_DOUBLE_DIR))  # a spawned evaluator inherits sys.path
    monkeypatch.setattr("smlens.profile.cuda.retain_primary_context", lambda ordinal: None)
    import cupti.cupti as cu

    yield cu
    _forget_cupti()
