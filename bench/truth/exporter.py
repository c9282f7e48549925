"""The shipped smlens CLI as a child process: ``smlens serve`` over real HTTP, and ``smlens check``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import httpx
from bench.truth.metrics import Scrape, parse

REPO = Path(__file__).resolve().parents[2]
# What Prometheus 2.x sends when it scrapes.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
# The metric groups every exporter of the harness serves: the accounting group's counters are checked too.
METRIC_GROUP_ARGS = ("--metrics", "default,accounting")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def latencies(client: httpx.Client, path: str, n: int, headers: dict[str, str]) -> list[float]:
    """Seconds of each of ``n`` requests of ``path`` over one keep-alive connection, after 50 unrecorded."""
    for _ in range(50):
        client.get(path, headers=headers)
    out = []
    for _ in range(n):
        start = time.perf_counter()
        response = client.get(path, headers=headers)
        out.append(time.perf_counter() - start)
        response.raise_for_status()
    return out


def smlens_env(source: Path = REPO / "exporter", **extra: str) -> dict[str, str]:
    """This process' environment with smlens' source first on PYTHONPATH (other entries kept)."""
    path = os.pathsep.join(p for p in (str(source), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


class Exporter:
    """``python3 -m smlens serve`` on a free loopback port, until closed."""

    def __init__(
        self,
        log: Path,
        interval: float,
        *extra_args: str,
        backend: str = "auto",
        env: dict[str, str] | None = None,
        user: int | None = None,
        group: int | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self._log: IO[bytes] = log.open("wb")
        argv = [sys.executable, "-m", "smlens", "serve", "--backend", backend]
        argv += ["--listen", f"127.0.0.1:{self.port}", "--interval", str(interval), *extra_args]
        self.argv = argv
        self._process = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env or smlens_env(),
            user=user,
            group=group,
            cwd=cwd,
            extra_groups=[] if user is not None else None,
        )
        self._client = httpx.Client(base_url=self.base, timeout=10)

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"smlens serve exited with {self._process.returncode} before it was ready")
            try:
                if self._client.get("/-/ready").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"smlens serve not ready after {timeout:.0f} s")

    @property
    def client(self) -> httpx.Client:
        return self._client

    def scrape(self) -> Scrape:
        response = self._client.get("/metrics", headers={"Accept-Encoding": "identity"})
        response.raise_for_status()
        return parse(response.text, time.monotonic())

    def gpus(self) -> Any:
        response = self._client.get("/api/v1/gpus")
        response.raise_for_status()
        return response.json()

    def close(self) -> None:
        self._client.close()
        self._process.terminate()
        try:
            self._process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.close()

    def __enter__(self) -> Exporter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


class CheckRun:
    """``python3 -m smlens check --json`` started now, read when done. The harness judges the verdicts
    itself, so check's gate is off (``--fail-on none``): a hollow GPU is an expected answer here."""

    def __init__(self, duration: float, backend: str = "auto", *extra_args: str) -> None:
        argv = [sys.executable, "-m", "smlens", "check", "--backend", backend, "--json", "--fail-on", "none"]
        self._process = subprocess.Popen(
            [*argv, "--duration", str(duration), *extra_args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=smlens_env(),
        )

    def result(self, timeout: float = 60) -> Any:
        """The parsed JSON report; RuntimeError with smlens' own message when it failed."""
        try:
            out, err = self._process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.communicate()
            raise RuntimeError(f"smlens check did not finish within {timeout:.0f} s") from None
        if self._process.returncode != 0:
            raise RuntimeError(f"smlens check exited with {self._process.returncode}: {err.strip()}")
        return json.loads(out)


def verdict_of(report: Any, gpu: int) -> tuple[str, str, dict[str, float | None], str | None]:
    """(code, text, means, pipe) of one GPU in a ``smlens check --json`` report; pipe: the busiest compute
    pipe a compute-bound verdict names, else None."""
    for entry in report["gpus"]:
        if entry["index"] == gpu:
            verdict = entry["verdict"]
            return verdict["code"], verdict["text"], entry["means"], verdict.get("pipe")
    raise KeyError(f"GPU {gpu} is not in the smlens check report")
