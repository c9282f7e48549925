"""bench/peer_compare.py without a GPU: smlens on the sim node, compared with a second sim smlens standing in
for nvitop-exporter (the real comparison runs on a GPU host: docs/performance.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STAND_IN = "{python} -m smlens serve --backend sim --interval 1 --listen 127.0.0.1:{port}"


def compare(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "exporter")}
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "peer_compare.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def test_both_exporters_measured_with_their_ratio(tmp_path: Path) -> None:
    out = tmp_path / "rss.json"
    done = compare(
        "--duration",
        "3",
        "--scrapes",
        "20",
        "--idle",
        "1",
        "--idle-rounds",
        "2",
        "--json",
        str(out),
        "--other",
        STAND_IN,
        "--",
        "--backend",
        "sim",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    smlens, other = report["exporters"]["smlens"], report["exporters"]["other"]
    for row in (smlens, other):
        assert (
            row["scrapes"] >= 3 and row["failed_scrapes"] == 0 and row["metrics_bytes"] > 3_000
        )  # gzipped, as Prometheus asks
        assert 10 < row["rss_mib"] < 200
        assert row["anonymous_mib"] + row["file_backed_mib"] == pytest.approx(row["rss_mib"])
        assert row["vm_hwm_mib"] >= row["vm_rss_mib"] > 0 and row["cpu_seconds"] >= 0
        assert 0 < row["scrape_p50_ms"] <= row["scrape_p99_ms"] and row["first_after_idle_over_p50"] > 0
    assert "--backend sim" in smlens["command"] and "--interval 1" in smlens["command"]
    ratio = report["ratio_smlens_over_other"]
    assert ratio["rss_mib"] == smlens["rss_mib"] / other["rss_mib"]
    assert "smlens/other" in done.stdout and "vm_rss_mib" in done.stdout


def test_an_exporter_that_does_not_start_is_one_sentence_and_its_log() -> None:
    broken = "{python} -c \"import sys; print('no NVML here'); sys.exit(3)\""
    done = compare("--duration", "2", "--other", broken, "--", "--backend", "sim")
    assert done.returncode == 1
    assert done.stderr.startswith("peer_compare: other exited before it served /metrics.\n")
    assert "no NVML here" in done.stderr and "Traceback" not in done.stderr
