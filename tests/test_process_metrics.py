"""The process_* families equal prometheus_client's ProcessCollector's, byte for byte, for the same /proc.

Both read a frozen copy of this process' /proc files (so that the values cannot move between the two
reads); tests/test_serving.py checks the values a real ``smlens serve`` exports.
"""

from __future__ import annotations

import os
from pathlib import Path

import prometheus_client
import pytest
from prometheus_client.openmetrics import exposition as openmetrics

from smlens.process_metrics import ProcessCollector
from smlens.textformat import OPENMETRICS_EOF, render

# In the order prometheus_client's ProcessCollector gives them; counters named without _total.
PROCESS_FAMILIES = [
    "process_virtual_memory_bytes",
    "process_resident_memory_bytes",
    "process_start_time_seconds",
    "process_cpu_seconds",
    "process_open_fds",
    "process_max_fds",
]


def frozen_proc(root: Path, command: bytes = b"python3") -> Path:
    """/proc/stat and /proc/self/{stat,limits,fd} as this process has them now, its command name replaced."""
    (root / "self" / "fd").mkdir(parents=True)
    (root / "stat").write_bytes(Path("/proc/stat").read_bytes())
    own = Path("/proc/self/stat").read_bytes()
    (root / "self" / "stat").write_bytes(own[: own.index(b"(") + 1] + command + own[own.rindex(b")") :])
    (root / "self" / "limits").write_bytes(Path("/proc/self/limits").read_bytes())
    for fd in range(7):
        (root / "self" / "fd" / str(fd)).touch()
    return root


def oracle(proc: Path, openmetrics_format: bool) -> bytes:
    registry = prometheus_client.CollectorRegistry()
    prometheus_client.ProcessCollector(proc=str(proc), registry=registry)
    if openmetrics_format:
        rendered: bytes = openmetrics.generate_latest(registry)  # type: ignore[no-untyped-call]
        return rendered
    return prometheus_client.generate_latest(registry)


@pytest.mark.parametrize("command", [b"python3", b"a) b (c", b"smlens: serve"])
@pytest.mark.parametrize("openmetrics_format", [False, True])
def test_process_families_are_prometheus_clients(
    tmp_path: Path, command: bytes, openmetrics_format: bool
) -> None:
    proc = frozen_proc(tmp_path, command)
    families = ProcessCollector(proc).collect()
    assert [f.name for f in families] == PROCESS_FAMILIES
    ours = render(families, openmetrics_format) + (OPENMETRICS_EOF if openmetrics_format else b"")
    assert ours == oracle(proc, openmetrics_format)
    assert b"\nprocess_open_fds 7.0\n" in ours


def test_without_proc_there_are_none(tmp_path: Path) -> None:
    assert ProcessCollector(tmp_path / "absent").collect() == []
    assert oracle(tmp_path / "absent", openmetrics_format=False) == b""


def test_unreadable_files_drop_only_their_families(tmp_path: Path) -> None:
    proc = frozen_proc(tmp_path)
    (proc / "self" / "limits").unlink()
    assert [f.name for f in ProcessCollector(proc).collect()][-1] == "process_cpu_seconds"
    (proc / "self" / "stat").write_bytes(b"garbage")
    assert ProcessCollector(proc).collect() == []


def test_without_sysconf_there_are_none(monkeypatch: pytest.MonkeyPatch) -> None:
    def absent(name: str) -> int:
        raise ValueError(f"unrecognized configuration name {name}")

    monkeypatch.setattr(os, "sysconf", absent)
    assert ProcessCollector().collect() == []
