"""Shared test helpers: free ports, external tools, and a real exporter process on the sim backend."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() == "true"


def require_tool(name: str) -> str:
    """Path of an external tool; fails under CI (the test command installs it), skips elsewhere."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (the README's test command installs it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return path


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
